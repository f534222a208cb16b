//! Throughput of the guard against the unguarded handler and a hand-written guard,
//! measured side by side, interleaved, in one run.
//!
//! ```text
//! cargo run --release --example bench -- --store sqlite|postgres|mysql|memory|redis --concurrency N --seconds S
//!     [--rounds R]     rounds of every variant, interleaved (default 3)
//!     [--calls N]      N calls of each variant per round instead of `--seconds` of them (for
//!                      `benches/sql_instructions.sh`, which counts instructions per call)
//!     [--variants a,b] only these variants (unguarded always runs: ratios are against it)
//!     [--read-first true|false] SQLite: claims always (never) read on the readers first
//!                      (`SqliteStoreBuilder::read_first`; default: the store chooses as it goes)
//!     [--probe-first true] MySQL on MariaDB: transactional claims read the record with the
//!                      probe first, as on MySQL 8 (default: MariaDB claims at once)
//!     [--group-wait-us N] PostgreSQL, `separate_group`: the batch's `max_wait` (default 200)
//!     [--group-min N] PostgreSQL, `separate_group`: `GroupCommit::min_in_flight` (default its own)
//!     [--ping-always true] PostgreSQL: the run's pool pings every connection before lending it
//!                      (sqlx's default) instead of only one idle for half a second or more, as
//!                      `PgStore::connect`'s pool does (default false)
//!     [--sqlite-group-commit false] SQLite: the store's group commit off
//!                      (`SqliteStoreBuilder::group_commit`; default on, as the store's)
//! ```
//!
//! PostgreSQL needs `DATABASE_URL`; the run works in a schema of its own and drops it. MySQL
//! needs `IDEM_MYSQL_URL` (MariaDB here); the run works in a database of its own and drops it,
//! and its hand-written inbox claims with `INSERT IGNORE`, as one written for MySQL would. Each
//! request inserts one business row (`bench_orders`), guarded in each way:
//!
//! - `unguarded`: the insert alone;
//! - `separate`: `#[idempotent]` with separate commits (claim, insert, complete); on PostgreSQL
//!   with group commit off (`group_commit(None)`);
//! - `transactional`: `#[idempotent(transaction = tx)]` (claim, insert, complete, one commit);
//! - `separate_group`: `separate` on PostgreSQL with group commit (`PgStoreBuilder::group_commit`):
//!   concurrent claims share one statement, concurrent completions another;
//! - `handwritten`: the usual hand-written guard: INSERT placeholder, insert, UPDATE done;
//! - `handwritten_tx`: the inbox written by hand in one transaction, the limit of the
//!   transactional mode: `BEGIN`; `INSERT` the key `ON CONFLICT DO NOTHING` (on a conflict, read
//!   the stored answer); the insert; store the answer; `COMMIT`;
//! - `replay`: `#[idempotent]` answering an already completed key from the database;
//! - `cached_replay`: the same through the in-process cache of completed records.
//!
//! Then a storm: 200 concurrent duplicates of one request, in both modes.
//!
//! `--store redis` compares idempotency stores on one workload (the memory store's business
//! insert, a locked map, so that the store is what differs). It needs `IDEM_REDIS_URL`; with
//! `DATABASE_URL` it also runs the PostgreSQL store (records only), in a schema of its own:
//!
//! - `separate` / `replay` / `cached_replay`: `#[idempotent]` on `RedisStore`;
//! - `pg_separate` / `pg_replay`: `#[idempotent]` on `PgStore`;
//! - `peer_separate` / `peer_replay`: the `idempotent` crate's (0.3) Valkey store: `try_insert`,
//!   the body, `complete`, with the same arguments fingerprinted and the same answer encoded.
//!
//! Keys are written under a prefix of the run's own and deleted at the end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::{CachedStore, Error, MemoryStore, idempotent};
use serde::{Deserialize, Serialize};

#[path = "support/cli.rs"]
mod cli;
#[path = "support/my_database.rs"]
mod my_database;
#[path = "support/pg_schema.rs"]
mod pg_schema;
use my_database::RunDatabase;
use pg_schema::RunSchema;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    order_no: String,
    amount: i64,
}

fn db(e: sqlx::Error) -> Error {
    Error::Store(e.into())
}

/// Bodies that ran: the storm checks that duplicates ran it once.
static BODY_RUNS: AtomicUsize = AtomicUsize::new(0);

/// The statements of the unguarded and hand-written variants, in one database's terms. The
/// updates bind the answer, then the key.
mod numbered {
    pub const ORDER: &str = "INSERT INTO bench_orders (order_no, amount) VALUES ($1, $2)";
    pub const HW_CLAIM: &str =
        "INSERT INTO handwritten_records (key, request_hash, status) VALUES ($1, $2, 'PROCESSING')";
    pub const HW_DONE: &str =
        "UPDATE handwritten_records SET status = 'DONE', result = $1 WHERE key = $2";
    pub const INBOX_CLAIM: &str = "INSERT INTO handwritten_inbox (key, request_hash) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING";
    pub const INBOX_READ: &str =
        "SELECT request_hash, result FROM handwritten_inbox WHERE key = $1";
    pub const INBOX_DONE: &str = "UPDATE handwritten_inbox SET result = $1 WHERE key = $2";
}

mod mysql_sql {
    pub const ORDER: &str = "INSERT INTO bench_orders (order_no, amount) VALUES (?, ?)";
    pub const HW_CLAIM: &str =
        "INSERT INTO handwritten_records (`key`, request_hash, status) VALUES (?, ?, 'PROCESSING')";
    pub const HW_DONE: &str =
        "UPDATE handwritten_records SET status = 'DONE', result = ? WHERE `key` = ?";
    pub const INBOX_CLAIM: &str =
        "INSERT IGNORE INTO handwritten_inbox (`key`, request_hash) VALUES (?, ?)";
    pub const INBOX_READ: &str =
        "SELECT request_hash, result FROM handwritten_inbox WHERE `key` = ?";
    pub const INBOX_DONE: &str = "UPDATE handwritten_inbox SET result = ? WHERE `key` = ?";
}

/// The variants for one SQL database, with its statements (`$q`).
macro_rules! sql_variants {
    ($db:ty, $store:ty, $pool:ty, $q:ident) => {
        use super::$q as q;
        use super::*;

        pub async fn unguarded(pool: &$pool, order_no: &str, amount: i64) -> Result<Order, Error> {
            sqlx::query(q::ORDER)
                .bind(order_no)
                .bind(amount)
                .execute(pool)
                .await
                .map_err(db)?;
            Ok(Order {
                order_no: order_no.to_owned(),
                amount,
            })
        }

        #[idempotent(scope = "bench", key = key, store = store, skip(pool, order_no))]
        pub async fn separate<S: idem::Store + Clone>(
            store: &S,
            pool: &$pool,
            key: &str,
            order_no: &str,
            amount: i64,
        ) -> Result<Order, Error> {
            BODY_RUNS.fetch_add(1, Ordering::Relaxed);
            unguarded(pool, order_no, amount).await
        }

        #[idempotent(scope = "bench", key = key, store = store, skip(order_no), transaction = tx)]
        pub async fn transactional(
            store: &$store,
            key: &str,
            order_no: &str,
            amount: i64,
        ) -> Result<Order, Error> {
            BODY_RUNS.fetch_add(1, Ordering::Relaxed);
            sqlx::query(q::ORDER)
                .bind(order_no)
                .bind(amount)
                .execute(&mut **tx)
                .await
                .map_err(db)?;
            Ok(Order {
                order_no: order_no.to_owned(),
                amount,
            })
        }

        /// The usual hand-written guard: a placeholder row, the business insert, then the result.
        pub async fn handwritten(
            pool: &$pool,
            key: &str,
            order_no: &str,
            amount: i64,
        ) -> Result<Order, Error> {
            let body = serde_json::to_vec(&amount).map_err(|e| Error::Encode(e.to_string()))?;
            let hash = idem::Fingerprint::of(&body)?.to_string();
            sqlx::query(q::HW_CLAIM)
                .bind(key)
                .bind(&hash)
                .execute(pool)
                .await
                .map_err(db)?;
            let order = unguarded(pool, order_no, amount).await?;
            let result = serde_json::to_string(&order).map_err(|e| Error::Encode(e.to_string()))?;
            sqlx::query(q::HW_DONE)
                .bind(result)
                .bind(key)
                .execute(pool)
                .await
                .map_err(db)?;
            Ok(order)
        }

        /// The inbox written by hand in one transaction: the key first (a duplicate waits on
        /// the unique index until the first commits, then reads its answer), the effect, the
        /// answer, one commit.
        pub async fn handwritten_tx(
            pool: &$pool,
            key: &str,
            order_no: &str,
            amount: i64,
        ) -> Result<Order, Error> {
            let body = serde_json::to_vec(&amount).map_err(|e| Error::Encode(e.to_string()))?;
            let hash = idem::Fingerprint::of(&body)?.to_string();
            let mut tx = pool.begin().await.map_err(db)?;
            let inserted = sqlx::query(q::INBOX_CLAIM)
                .bind(key)
                .bind(&hash)
                .execute(&mut *tx)
                .await
                .map_err(db)?
                .rows_affected();
            if inserted == 0 {
                let (stored_hash, result): (String, Option<String>) = sqlx::query_as(q::INBOX_READ)
                    .bind(key)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                tx.rollback().await.map_err(db)?;
                if stored_hash != hash {
                    return Err(Error::KeyReused);
                }
                let result = result
                    .ok_or_else(|| Error::Decode("an inbox row without its answer".into()))?;
                return serde_json::from_str(&result).map_err(|e| Error::Decode(e.to_string()));
            }
            BODY_RUNS.fetch_add(1, Ordering::Relaxed);
            sqlx::query(q::ORDER)
                .bind(order_no)
                .bind(amount)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            let order = Order {
                order_no: order_no.to_owned(),
                amount,
            };
            let result = serde_json::to_string(&order).map_err(|e| Error::Encode(e.to_string()))?;
            sqlx::query(q::INBOX_DONE)
                .bind(result)
                .bind(key)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            tx.commit().await.map_err(db)?;
            Ok(order)
        }
    };
}

mod on_sqlite {
    sql_variants!(sqlx::Sqlite, idem::SqliteStore, sqlx::SqlitePool, numbered);
}

mod on_postgres {
    sql_variants!(sqlx::Postgres, idem::PgStore, sqlx::PgPool, numbered);
}

mod on_mysql {
    sql_variants!(sqlx::MySql, idem::MySqlStore, sqlx::MySqlPool, mysql_sql);
}

/// The `idempotent` crate's Valkey store, guarding the same body as `memory_separate`: the same
/// argument fingerprinted, the answer JSON-encoded, 24 h retention.
async fn peer_separate(
    store: &idempotent::store::valkey::ValkeyStore,
    table: &Table,
    key: &str,
    order_no: &str,
    amount: i64,
) -> Result<Order, Error> {
    use idempotent::entry::ExistingEntry;
    use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
    use idempotent::store::{IdempotencyStore, InsertResult};
    let peer = |e: idempotent::store::valkey::ValkeyError| Error::Unavailable(e.into());
    let key = idempotent::IdempotencyKey::new(key).map_err(|e| Error::Encode(e.to_string()))?;
    let request = serde_json::to_vec(&amount).map_err(|e| Error::Encode(e.to_string()))?;
    let fp = DefaultFingerprintStrategy.compute("bench", &request);
    let entry = idempotent::IdempotencyEntry::new(fp, Duration::from_secs(86_400));
    match store.try_insert(&key, entry.clone()).await.map_err(peer)? {
        InsertResult::Claimed { fencing_token } => {
            BODY_RUNS.fetch_add(1, Ordering::Relaxed);
            let out = table.insert(order_no, amount)?;
            let bytes = serde_json::to_vec(&out).map_err(|e| Error::Encode(e.to_string()))?;
            let response = idempotent::CachedResponse {
                status_code: 200,
                metadata: idempotent::Metadata::default(),
                body: bytes.into(),
            };
            store
                .complete(&key, entry.complete(response), fencing_token)
                .await
                .map_err(peer)?;
            Ok(out)
        }
        InsertResult::Exists(ExistingEntry::Completed(done)) if done.fingerprint == fp => {
            serde_json::from_slice(&done.response().body).map_err(|e| Error::Decode(e.to_string()))
        }
        InsertResult::Exists(ExistingEntry::Completed(_)) => Err(Error::KeyReused),
        InsertResult::Exists(ExistingEntry::Processing(_)) => Err(Error::InProgress {
            retry_after: Duration::from_secs(1),
        }),
    }
}

/// The memory variant's "table".
#[derive(Clone, Default)]
struct Table(Arc<Mutex<HashMap<String, i64>>>);

impl Table {
    fn insert(&self, order_no: &str, amount: i64) -> Result<Order, Error> {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        t.insert(order_no.to_owned(), amount);
        Ok(Order {
            order_no: order_no.to_owned(),
            amount,
        })
    }
}

#[idempotent(scope = "bench", key = key, store = store, skip(table, order_no))]
async fn memory_separate<S: idem::Store + Clone>(
    store: &S,
    table: &Table,
    key: &str,
    order_no: &str,
    amount: i64,
) -> Result<Order, Error> {
    BODY_RUNS.fetch_add(1, Ordering::Relaxed);
    table.insert(order_no, amount)
}

#[derive(Clone)]
enum Target {
    Memory {
        store: MemoryStore,
        cached: CachedStore<MemoryStore>,
        table: Table,
    },
    Sqlite {
        pool: sqlx::SqlitePool,
        store: idem::SqliteStore,
        cached: CachedStore<idem::SqliteStore>,
    },
    Mysql {
        pool: sqlx::MySqlPool,
        store: idem::MySqlStore,
        cached: CachedStore<idem::MySqlStore>,
    },
    Postgres {
        pool: sqlx::PgPool,
        store: idem::PgStore,
        /// The same table, with group commit.
        group: idem::PgStore,
        cached: CachedStore<idem::PgStore>,
    },
    Redis {
        store: idem::RedisStore,
        cached: CachedStore<idem::RedisStore>,
        table: Table,
        pg: Option<idem::PgStore>,
        peer: Arc<idempotent::store::valkey::ValkeyStore>,
        /// For `INFO cpu`: the server's own CPU time per operation.
        info: redis::aio::MultiplexedConnection,
    },
}

const VARIANTS: [&str; 12] = [
    "unguarded",
    "separate",
    "separate_group",
    "transactional",
    "handwritten",
    "handwritten_tx",
    "replay",
    "cached_replay",
    "pg_separate",
    "pg_replay",
    "peer_separate",
    "peer_replay",
];
const REPLAY_KEYS: u64 = 1000;

impl Target {
    /// The Redis server's CPU time so far (user + system, `INFO cpu`); zero for other stores.
    async fn redis_cpu(&self) -> Duration {
        let Target::Redis { info, .. } = self else {
            return Duration::ZERO;
        };
        let text: String = match redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut info.clone())
            .await
        {
            Ok(t) => t,
            Err(_) => return Duration::ZERO,
        };
        let secs: f64 = text
            .lines()
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| *k == "used_cpu_sys" || *k == "used_cpu_user")
            .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
            .sum();
        Duration::from_secs_f64(secs)
    }

    fn supports(&self, variant: &str) -> bool {
        match self {
            Target::Memory { .. } => !matches!(
                variant,
                "transactional"
                    | "separate_group"
                    | "handwritten"
                    | "handwritten_tx"
                    | "pg_separate"
                    | "pg_replay"
                    | "peer_separate"
                    | "peer_replay"
            ),
            Target::Sqlite { .. } | Target::Mysql { .. } => !matches!(
                variant,
                "separate_group" | "pg_separate" | "pg_replay" | "peer_separate" | "peer_replay"
            ),
            Target::Postgres { .. } => !matches!(
                variant,
                "pg_separate" | "pg_replay" | "peer_separate" | "peer_replay"
            ),
            Target::Redis { pg, .. } => match variant {
                "transactional" | "handwritten" | "handwritten_tx" | "separate_group" => false,
                "pg_separate" | "pg_replay" => pg.is_some(),
                _ => true,
            },
        }
    }

    /// One request of `variant`; `n` makes its key and order number unique.
    async fn call(&self, variant: &str, n: u64) -> Result<(), Error> {
        let (key, order_no) = (format!("k{n}"), format!("o{n}"));
        let replay_key = format!("replay-{}", n % REPLAY_KEYS);
        let replay_no = format!("r{}", n % REPLAY_KEYS);
        let amount = 100 + (n % 7) as i64;
        let amount_replay = 100;
        match (self, variant) {
            (Target::Memory { table, .. }, "unguarded") => {
                table.insert(&order_no, amount).map(drop)
            }
            (Target::Memory { store, table, .. }, "separate") => {
                memory_separate(store, table, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Memory { store, table, .. }, "replay") => {
                memory_separate(store, table, &replay_key, &replay_no, amount_replay)
                    .await
                    .map(drop)
            }
            (Target::Memory { cached, table, .. }, "cached_replay") => {
                memory_separate(cached, table, &replay_key, &replay_no, amount_replay)
                    .await
                    .map(drop)
            }
            (Target::Redis { table, .. }, "unguarded") => table.insert(&order_no, amount).map(drop),
            (Target::Redis { store, table, .. }, "separate") => {
                memory_separate(store, table, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Redis { store, table, .. }, "replay") => {
                memory_separate(store, table, &replay_key, &replay_no, amount_replay)
                    .await
                    .map(drop)
            }
            (Target::Redis { cached, table, .. }, "cached_replay") => {
                memory_separate(cached, table, &replay_key, &replay_no, amount_replay)
                    .await
                    .map(drop)
            }
            (
                Target::Redis {
                    pg: Some(pg),
                    table,
                    ..
                },
                "pg_separate",
            ) => memory_separate(pg, table, &key, &order_no, amount)
                .await
                .map(drop),
            (
                Target::Redis {
                    pg: Some(pg),
                    table,
                    ..
                },
                "pg_replay",
            ) => memory_separate(pg, table, &replay_key, &replay_no, amount_replay)
                .await
                .map(drop),
            (Target::Redis { peer, table, .. }, "peer_separate") => {
                peer_separate(peer, table, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Redis { peer, table, .. }, "peer_replay") => {
                peer_separate(peer, table, &replay_key, &replay_no, amount_replay)
                    .await
                    .map(drop)
            }
            (Target::Sqlite { pool, .. }, "unguarded") => {
                on_sqlite::unguarded(pool, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Sqlite { pool, store, .. }, "separate") => {
                on_sqlite::separate(store, pool, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Sqlite { store, .. }, "transactional") => {
                on_sqlite::transactional(store, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Sqlite { pool, .. }, "handwritten") => {
                on_sqlite::handwritten(pool, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Sqlite { pool, .. }, "handwritten_tx") => {
                on_sqlite::handwritten_tx(pool, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Sqlite { pool, store, .. }, "replay") => {
                on_sqlite::separate(store, pool, &replay_key, &replay_no, amount_replay)
                    .await
                    .map(drop)
            }
            (Target::Sqlite { pool, cached, .. }, "cached_replay") => {
                on_sqlite::separate(cached, pool, &replay_key, &replay_no, amount_replay)
                    .await
                    .map(drop)
            }
            (Target::Postgres { pool, .. }, "unguarded") => {
                on_postgres::unguarded(pool, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Postgres { pool, store, .. }, "separate") => {
                on_postgres::separate(store, pool, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Postgres { pool, group, .. }, "separate_group") => {
                on_postgres::separate(group, pool, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Postgres { store, .. }, "transactional") => {
                on_postgres::transactional(store, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Postgres { pool, .. }, "handwritten") => {
                on_postgres::handwritten(pool, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Postgres { pool, .. }, "handwritten_tx") => {
                on_postgres::handwritten_tx(pool, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Postgres { pool, store, .. }, "replay") => {
                on_postgres::separate(store, pool, &replay_key, &replay_no, amount_replay)
                    .await
                    .map(drop)
            }
            (Target::Postgres { pool, cached, .. }, "cached_replay") => {
                on_postgres::separate(cached, pool, &replay_key, &replay_no, amount_replay)
                    .await
                    .map(drop)
            }
            (Target::Mysql { pool, .. }, "unguarded") => {
                on_mysql::unguarded(pool, &order_no, amount).await.map(drop)
            }
            (Target::Mysql { pool, store, .. }, "separate") => {
                on_mysql::separate(store, pool, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Mysql { store, .. }, "transactional") => {
                on_mysql::transactional(store, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Mysql { pool, .. }, "handwritten") => {
                on_mysql::handwritten(pool, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Mysql { pool, .. }, "handwritten_tx") => {
                on_mysql::handwritten_tx(pool, &key, &order_no, amount)
                    .await
                    .map(drop)
            }
            (Target::Mysql { pool, store, .. }, "replay") => {
                on_mysql::separate(store, pool, &replay_key, &replay_no, amount_replay)
                    .await
                    .map(drop)
            }
            (Target::Mysql { pool, cached, .. }, "cached_replay") => {
                on_mysql::separate(cached, pool, &replay_key, &replay_no, amount_replay)
                    .await
                    .map(drop)
            }
            _ => unreachable!("unsupported variant {variant}"),
        }
    }

    /// The storm: `n` concurrent duplicates of one request. Transactional duplicates wait for
    /// the first and replay; separate-commit duplicates are answered at once (in progress, then
    /// replays).
    async fn duplicate(&self, transactional: bool, key: &str) -> Result<(), Error> {
        match (self, transactional) {
            (Target::Redis { store, table, .. }, _) => {
                memory_separate(store, table, key, "storm", 1)
                    .await
                    .map(drop)
            }
            (Target::Memory { store, table, .. }, _) => {
                memory_separate(store, table, key, "storm", 1)
                    .await
                    .map(drop)
            }
            (Target::Sqlite { pool, store, .. }, false) => {
                on_sqlite::separate(store, pool, key, key, 1)
                    .await
                    .map(drop)
            }
            (Target::Sqlite { store, .. }, true) => {
                on_sqlite::transactional(store, key, key, 1).await.map(drop)
            }
            (Target::Mysql { pool, store, .. }, false) => {
                on_mysql::separate(store, pool, key, key, 1).await.map(drop)
            }
            (Target::Mysql { store, .. }, true) => {
                on_mysql::transactional(store, key, key, 1).await.map(drop)
            }
            (Target::Postgres { pool, store, .. }, false) => {
                on_postgres::separate(store, pool, key, key, 1)
                    .await
                    .map(drop)
            }
            (Target::Postgres { store, .. }, true) => {
                on_postgres::transactional(store, key, key, 1)
                    .await
                    .map(drop)
            }
        }
    }
}

/// MySQL indexes a text only by a prefix, and `key` is a reserved word there.
const MYSQL_SCHEMA: [&str; 3] = [
    "CREATE TABLE bench_orders (order_no VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL)",
    "CREATE TABLE handwritten_records (`key` VARCHAR(255) PRIMARY KEY, request_hash VARCHAR(64) NOT NULL, status VARCHAR(16) NOT NULL, result TEXT)",
    "CREATE TABLE handwritten_inbox (`key` VARCHAR(255) PRIMARY KEY, request_hash VARCHAR(64) NOT NULL, result TEXT)",
];

const SCHEMA: [&str; 3] = [
    "CREATE TABLE bench_orders (order_no TEXT PRIMARY KEY, amount BIGINT NOT NULL)",
    "CREATE TABLE handwritten_records (key TEXT PRIMARY KEY, request_hash TEXT NOT NULL, status TEXT NOT NULL, result TEXT)",
    "CREATE TABLE handwritten_inbox (key TEXT PRIMARY KEY, request_hash TEXT NOT NULL, result TEXT)",
];

struct Args {
    store: String,
    concurrency: usize,
    seconds: f64,
    /// A fixed number of calls per variant and round instead of `seconds`.
    calls: Option<u64>,
    rounds: usize,
    only: Option<Vec<String>>,
    read_first: Option<bool>,
    probe_first: bool,
    group_wait_us: u64,
    group_min: Option<usize>,
    ping_always: bool,
    sqlite_group_commit: bool,
}

const USAGE: &str = "\
usage: bench --store sqlite|postgres|mysql|memory|redis [--concurrency N] [--seconds S] [--rounds R]
             [--calls N] [--variants a,b] [--read-first true|false] [--probe-first true|false] [--group-wait-us N] [--group-min N]
             [--ping-always true|false] [--sqlite-group-commit true|false]
(what each variant measures: the header of benches/programs/bench.rs)";

fn args() -> Args {
    let mut a = Args {
        store: "sqlite".into(),
        concurrency: 8,
        seconds: 2.0,
        calls: None,
        rounds: 3,
        only: None,
        read_first: None,
        probe_first: false,
        group_wait_us: 200,
        group_min: None,
        ping_always: false,
        sqlite_group_commit: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            cli::usage(USAGE, None);
        }
        let value = cli::value(&mut it, &flag, USAGE);
        match flag.as_str() {
            "--store" => a.store = value,
            "--concurrency" => a.concurrency = value.parse().expect("--concurrency N"),
            "--seconds" => a.seconds = value.parse().expect("--seconds S"),
            "--calls" => a.calls = Some(value.parse().expect("--calls N")),
            "--rounds" => a.rounds = value.parse().expect("--rounds R"),
            "--variants" => a.only = Some(value.split(',').map(str::to_owned).collect()),
            "--read-first" => a.read_first = Some(value.parse().expect("--read-first true|false")),
            "--probe-first" => a.probe_first = value.parse().expect("--probe-first true|false"),
            "--group-wait-us" => a.group_wait_us = value.parse().expect("--group-wait-us N"),
            "--group-min" => a.group_min = Some(value.parse().expect("--group-min N")),
            "--ping-always" => a.ping_always = value.parse().expect("--ping-always true|false"),
            "--sqlite-group-commit" => {
                a.sqlite_group_commit = value.parse().expect("--sqlite-group-commit true|false")
            }
            other => cli::usage(USAGE, Some(&format!("unknown flag {other}"))),
        }
    }
    a
}

#[derive(Default)]
struct Tally {
    ops: u64,
    busy: Duration,
    latencies_us: Vec<u32>,
    /// CPU time of this process (client side) while the variant ran.
    client_cpu: Duration,
    /// CPU time of the Redis server while the variant ran (`--store redis`).
    redis_cpu: Duration,
}

/// CPU time used by this process so far (user + system), from `/proc/self/stat`; zero where
/// there is no such file.
fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may hold spaces) start at its closing parenthesis;
    // utime and stime are the 14th and 15th fields, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn run_variant(
    target: &Target,
    variant: &'static str,
    a: &Args,
    counter: &Arc<AtomicU64>,
    tally: &mut Tally,
) {
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds);
    // With `--calls`, the tasks share a count of the calls left instead.
    let left = Arc::new(AtomicU64::new(a.calls.unwrap_or(0)));
    let fixed = a.calls.is_some();
    let (cpu_before, redis_before) = (process_cpu(), target.redis_cpu().await);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..a.concurrency {
        let (target, counter, left) = (target.clone(), counter.clone(), left.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let more = || {
                if fixed {
                    left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                        .is_ok()
                } else {
                    Instant::now() < deadline
                }
            };
            while more() {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                target
                    .call(variant, n)
                    .await
                    .unwrap_or_else(|e| panic!("{variant}: {e}"));
                lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                // A call answered from memory never yields; give the scheduler its turn now
                // and then, or a connection task that another call waits for never runs.
                tokio::task::consume_budget().await;
            }
            lat
        }));
    }
    for t in tasks {
        let lat = t.await.unwrap();
        tally.ops += lat.len() as u64;
        tally.latencies_us.extend(lat);
    }
    tally.busy += start.elapsed();
    tally.client_cpu += process_cpu().saturating_sub(cpu_before);
    tally.redis_cpu += target.redis_cpu().await.saturating_sub(redis_before);
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args();
    let _file;
    let mut pg_cleanup: Option<RunSchema> = None;
    let mut mysql_cleanup: Option<RunDatabase> = None;
    let mut redis_cleanup: Option<(String, String)> = None;
    let target = match a.store.as_str() {
        "memory" => {
            let store = MemoryStore::new();
            Target::Memory {
                cached: CachedStore::new(store.clone(), 10_000),
                store,
                table: Table::default(),
            }
        }
        "sqlite" => {
            let dir = tempfile::tempdir()?;
            let url = format!("sqlite://{}", dir.path().join("bench.db").display());
            _file = dir;
            // One writer connection for idem's writes and the business inserts alike; readers
            // for replays.
            let mut builder = idem::SqliteStore::builder().group_commit(a.sqlite_group_commit);
            if let Some(read_first) = a.read_first {
                builder = builder.read_first(read_first);
            }
            let store = builder.connect(&url).await?;
            let pool = store.pool().clone();
            for stmt in SCHEMA {
                sqlx::query(stmt).execute(&pool).await?;
            }
            Target::Sqlite {
                cached: CachedStore::new(store.clone(), 10_000),
                pool,
                store,
            }
        }
        "postgres" => {
            let url =
                std::env::var("DATABASE_URL").map_err(|_| "--store postgres needs DATABASE_URL")?;
            let schema = RunSchema::create(&url, "idem_bench").await?;
            let options = schema.connect_options(&url)?;
            pg_cleanup = Some(schema);
            // One connection per task, up to 64: the server's default `max_connections` is 100,
            // and other clients (the tests) share it. A connection is pinged before it is lent
            // as `PgStore::connect`'s are: only after half a second idle (`ping_when_idle`).
            let pool_options = match a.ping_always {
                true => sqlx::postgres::PgPoolOptions::new(),
                false => idem::store::ping_when_idle(sqlx::postgres::PgPoolOptions::new()),
            };
            let pool = pool_options
                .max_connections(a.concurrency.min(64) as u32)
                .connect_with(
                    options.options([(
                        "plan_cache_mode",
                        std::env::var("PLAN_CACHE_MODE")
                            .unwrap_or("auto".into())
                            .as_str(),
                    )]),
                )
                .await?;
            for stmt in SCHEMA {
                sqlx::query(stmt).execute(&pool).await?;
            }
            let store = idem::PgStore::builder()
                .group_commit(None)
                .build(pool.clone())
                .await?;
            let mut config =
                idem::GroupCommit::default().max_wait(Duration::from_micros(a.group_wait_us));
            if let Some(min) = a.group_min {
                config = config.min_in_flight(min);
            }
            let group = idem::PgStore::builder()
                .group_commit(config)
                .build(pool.clone())
                .await?;
            Target::Postgres {
                cached: CachedStore::new(store.clone(), 10_000),
                pool,
                store,
                group,
            }
        }
        "mysql" => {
            let url = std::env::var("IDEM_MYSQL_URL")
                .map_err(|_| "--store mysql needs IDEM_MYSQL_URL")?;
            // A database of the run's own, on the server the URL names.
            let database = RunDatabase::create(&url, "idem_bench").await?;
            let run_url = database.url();
            mysql_cleanup = Some(database);
            let store = idem::MySqlStore::builder()
                .probe_first(a.probe_first)
                .connect(&run_url)
                .await?;
            // The business statements on the store's own pool, as a service would share it.
            let pool = store.pool().clone();
            for stmt in MYSQL_SCHEMA {
                sqlx::query(stmt).execute(&pool).await?;
            }
            Target::Mysql {
                cached: CachedStore::new(store.clone(), 10_000),
                pool,
                store,
            }
        }
        "redis" => {
            let url = std::env::var("IDEM_REDIS_URL")
                .map_err(|_| "--store redis needs IDEM_REDIS_URL")?;
            let prefix = format!("idem-bench-{}:", std::process::id());
            redis_cleanup = Some((url.clone(), prefix.clone()));
            let store = idem::RedisStore::builder()
                .prefix(prefix.clone())
                .connect(&url)
                .await?;
            let peer = idempotent::store::valkey::ValkeyStore::with_prefix(
                redis::Client::open(url.as_str())?,
                Some(&format!("{prefix}peer")),
            )
            .await?;
            let pg = match std::env::var("DATABASE_URL") {
                Ok(pg_url) => {
                    let schema = RunSchema::create(&pg_url, "idem_bench").await?;
                    let options = schema.connect_options(&pg_url)?;
                    pg_cleanup = Some(schema);
                    let pool = sqlx::postgres::PgPoolOptions::new()
                        .max_connections(a.concurrency as u32)
                        .connect_with(options)
                        .await?;
                    Some(idem::PgStore::builder().build(pool).await?)
                }
                Err(_) => None,
            };
            Target::Redis {
                cached: CachedStore::new(store.clone(), 10_000),
                store,
                table: Table::default(),
                pg,
                peer: Arc::new(peer),
                info: redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            }
        }
        other => {
            return Err(format!("unknown store {other}: sqlite, postgres, memory or redis").into());
        }
    };

    // The keys that replays answer, completed once, and a warm-up of every variant.
    let counter = Arc::new(AtomicU64::new(1_000_000));
    for v in ["replay", "pg_replay", "peer_replay"] {
        if target.supports(v) {
            for n in 0..REPLAY_KEYS {
                target.call(v, n).await?;
            }
        }
    }
    let variants: Vec<&'static str> = VARIANTS
        .iter()
        .copied()
        .filter(|v| target.supports(v))
        .filter(|v| *v == "unguarded" || a.only.as_ref().is_none_or(|o| o.iter().any(|x| x == v)))
        .collect();
    for v in &variants {
        for _ in 0..200 {
            target
                .call(v, counter.fetch_add(1, Ordering::Relaxed))
                .await?;
        }
    }

    let mut tallies: HashMap<&str, Tally> = HashMap::new();
    for round in 0..a.rounds {
        // Interleaved, and rotated so that no variant always runs first.
        for i in 0..variants.len() {
            let v = variants[(i + round) % variants.len()];
            let tally = tallies.entry(v).or_default();
            run_variant(&target, v, &a, &counter, tally).await;
        }
    }

    let ops_per_sec = |t: &Tally| t.ops as f64 / t.busy.as_secs_f64();
    let base = ops_per_sec(&tallies["unguarded"]);
    let mut rows = Vec::new();
    for v in &variants {
        let t = tallies.get_mut(v).expect("ran");
        t.latencies_us.sort_unstable();
        let ops = ops_per_sec(t);
        let (p50, p99) = (
            percentile(&t.latencies_us, 0.50),
            percentile(&t.latencies_us, 0.99),
        );
        let per_op = |d: Duration| d.as_secs_f64() * 1e6 / t.ops.max(1) as f64;
        let redis_cpu = match target {
            Target::Redis { .. } => format!(" redis_cpu_us_per_op={:.1}", per_op(t.redis_cpu)),
            _ => String::new(),
        };
        println!(
            "RESULT store={} variant={v} ops_per_sec={:.0} p50_us={p50} p99_us={p99} ratio={:.2} client_cpu_us_per_op={:.1}{redis_cpu}",
            a.store,
            ops,
            ops / base,
            per_op(t.client_cpu),
        );
        rows.push((v, ops, p50, p99, ops / base));
    }
    println!();
    println!(
        "store {}, concurrency {}, {} rounds of {} s per variant, interleaved",
        a.store, a.concurrency, a.rounds, a.seconds
    );
    println!(
        "{:<14} {:>12} {:>9} {:>9} {:>8}",
        "variant", "ops/s", "p50 µs", "p99 µs", "ratio"
    );
    for (v, ops, p50, p99, ratio) in rows {
        println!("{v:<14} {ops:>12.0} {p50:>9} {p99:>9} {ratio:>8.2}");
    }

    // The storm: 200 concurrent duplicates of one request.
    println!();
    for transactional in [false, true] {
        if a.only.is_some() {
            break;
        }
        if transactional && matches!(target, Target::Memory { .. } | Target::Redis { .. }) {
            continue;
        }
        let key = format!("storm-{transactional}-{}", std::process::id());
        BODY_RUNS.store(0, Ordering::SeqCst);
        let barrier = Arc::new(tokio::sync::Barrier::new(200));
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let (target, key, barrier) = (target.clone(), key.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let t = Instant::now();
                let outcome = match target.duplicate(transactional, &key).await {
                    Ok(()) => "answered",
                    Err(Error::InProgress { .. }) => "in_progress",
                    Err(e) => panic!("storm: {e}"),
                };
                (outcome, t.elapsed().as_micros() as u32)
            }));
        }
        let mut lat = Vec::new();
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for t in tasks {
            let (outcome, us) = t.await?;
            *counts.entry(outcome).or_default() += 1;
            lat.push(us);
        }
        lat.sort_unstable();
        let mode = if transactional {
            "transactional"
        } else {
            "separate"
        };
        println!(
            "STORM store={} mode={mode} duplicates=200 body_runs={} answered={} in_progress={} min_us={} p50_us={} p99_us={} max_us={}",
            a.store,
            BODY_RUNS.load(Ordering::SeqCst),
            counts.get("answered").unwrap_or(&0),
            counts.get("in_progress").unwrap_or(&0),
            lat[0],
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat[lat.len() - 1]
        );
    }

    if let Some((url, prefix)) = redis_cleanup {
        let deleted = delete_prefix(&url, &prefix).await?;
        println!("deleted {deleted} Redis keys under {prefix}");
    }
    if let Some(database) = mysql_cleanup {
        database.drop().await?;
    }
    if let Some(schema) = pg_cleanup {
        schema.drop().await?;
    }
    Ok(())
}

/// Deletes every key under `prefix` (the run's records), in batches.
async fn delete_prefix(url: &str, prefix: &str) -> Result<u64, redis::RedisError> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut cursor = 0u64;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            deleted += redis::cmd("UNLINK")
                .arg(&keys)
                .query_async::<u64>(&mut conn)
                .await?;
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}
