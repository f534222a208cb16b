//! The store conformance suite (`idem::testkit`), run on every store idem ships: memory, SQLite,
//! PostgreSQL and Redis (standalone and on a cluster), the memory store behind `CachedStore` and
//! `SharedStore`, and the transactional cases on both SQL stores. The same kit is what a store
//! written elsewhere runs to prove it keeps the contract.
//!
//! PostgreSQL runs when `DATABASE_URL` points at it at build time (each case in a schema of its
//! own); otherwise its cases are listed as ignored.

mod common;

use idem::testkit::Env;
use idem::{
    CachedStore, GroupCommit, ManualClock, MemoryStore, MySqlStore, PgStore, RedisStore,
    SharedStore, SqliteStore,
};

use common::{MyDatabase, PgSchema, RedisKeys, SqliteFile};

async fn memory() -> Env<MemoryStore> {
    let clock = ManualClock::new();
    Env::with_clock(MemoryStore::with_clock(clock.clone()), clock)
}

async fn sqlite() -> Env<SqliteStore> {
    let file = SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.expect("open SQLite");
    Env::new(store).keep(file)
}

/// Group commit off: every write runs its own statement on the writer.
async fn sqlite_no_group() -> Env<SqliteStore> {
    let file = SqliteFile::new();
    let store = SqliteStore::builder()
        .group_commit(false)
        .connect(&file.url)
        .await
        .expect("open SQLite");
    Env::new(store).keep(file)
}

/// Group commit with every first claim and completion sent through the lane, alone or not:
/// the sequential cases check the batched path's semantics record by record.
async fn sqlite_group_always() -> Env<SqliteStore> {
    let file = SqliteFile::new();
    let store = SqliteStore::builder()
        .group_commit_alone()
        .connect(&file.url)
        .await
        .expect("open SQLite");
    Env::new(store).keep(file)
}

/// Claims read on the readers first (`read_first`): replays never take the writer.
async fn sqlite_read_first() -> Env<SqliteStore> {
    let file = SqliteFile::new();
    let store = SqliteStore::builder()
        .read_first(true)
        .connect(&file.url)
        .await
        .expect("open SQLite");
    Env::new(store).keep(file)
}

/// Group commit off: every request runs the single-row statements.
async fn postgres() -> Env<PgStore> {
    let schema = PgSchema::create(&common::pg_url(), 16).await;
    let store = PgStore::builder()
        .group_commit(None)
        .build(schema.pool.clone())
        .await
        .expect("create the table");
    Env::new(store).keep(schema)
}

/// Group commit as by default: concurrent claims and completions share statements (a lone one
/// runs the single-row statement, which is what most sequential cases exercise).
async fn postgres_group() -> Env<PgStore> {
    let schema = PgSchema::create(&common::pg_url(), 16).await;
    let store = PgStore::builder()
        .build(schema.pool.clone())
        .await
        .expect("create the table");
    Env::new(store).keep(schema)
}

/// Group commit with every request sent through the batch statements, alone or not: the
/// sequential cases check the batch statements' semantics record by record.
async fn postgres_group_always() -> Env<PgStore> {
    let schema = PgSchema::create(&common::pg_url(), 16).await;
    let store = PgStore::builder()
        .group_commit(GroupCommit::default().batch_alone(true))
        .build(schema.pool.clone())
        .await
        .expect("create the table");
    Env::new(store).keep(schema)
}

/// Group commit as by default, each claim's end announced with `NOTIFY`.
async fn postgres_notify() -> Env<PgStore> {
    let schema = PgSchema::create(&common::pg_url(), 16).await;
    let store = PgStore::builder()
        .notify(true)
        .build(schema.pool.clone())
        .await
        .expect("create the table");
    Env::new(store).keep(schema)
}

/// MySQL (MariaDB here) in a database of the case's own, through the store's own pool
/// (`READ COMMITTED`, strict mode).
async fn mysql() -> Env<MySqlStore> {
    let db = MyDatabase::create(&common::mysql_url(), 4).await;
    let store = MySqlStore::builder()
        .connect(&db.url)
        .await
        .expect("create the table");
    Env::new(store).keep(db)
}

/// MySQL whose transactional claims read the record with the probe first, as on MySQL 8, where
/// MariaDB claims at once with a lock wait of zero.
async fn mysql_probe_first() -> Env<MySqlStore> {
    let db = MyDatabase::create(&common::mysql_url(), 4).await;
    let store = MySqlStore::builder()
        .probe_first(true)
        .connect(&db.url)
        .await
        .expect("create the table");
    Env::new(store).keep(db)
}

/// MySQL with every claim reading first.
async fn mysql_read_first() -> Env<MySqlStore> {
    let db = MyDatabase::create(&common::mysql_url(), 4).await;
    let store = MySqlStore::builder()
        .read_first(true)
        .connect(&db.url)
        .await
        .expect("create the table");
    Env::new(store).keep(db)
}

/// Redis under a key prefix of the case's own. Records leave by their time to live, so
/// `purge_expired` has nothing to delete.
async fn redis() -> Env<RedisStore> {
    let (keys, store) = common::redis_store().await;
    Env::new(store).expires_by_itself().keep(keys)
}

/// Redis with each claim's end announced with `PUBLISH`.
async fn redis_notify() -> Env<RedisStore> {
    let (keys, store) = common::redis_store_with(|builder| builder.notify(true)).await;
    Env::new(store).expires_by_itself().keep(keys)
}

/// Redis with every claim reading its record with `GET` first
/// (`RedisStoreBuilder::read_first(true)`): each case's replays and refusals as a read answers
/// them, and everything else through the script after the read.
async fn redis_read_first() -> Env<RedisStore> {
    let (keys, store) = common::redis_store_with(|builder| builder.read_first(true)).await;
    Env::new(store).expires_by_itself().keep(keys)
}

/// The same on a cluster of three primaries (announcing with `PUBLISH`, which a cluster
/// passes to every node), each claim running the script on its record's node.
async fn redis_cluster() -> Env<RedisStore> {
    redis_cluster_with(false).await
}

/// The cluster with each claim reading with `GET` first, routed to its record's node, then
/// running the script when the read does not answer.
async fn redis_cluster_read_first() -> Env<RedisStore> {
    redis_cluster_with(true).await
}

async fn redis_cluster_with(read_first: bool) -> Env<RedisStore> {
    let nodes = common::redis_cluster();
    let keys = RedisKeys::new(&nodes);
    let store = RedisStore::builder()
        .prefix(keys.prefix.clone())
        .notify(true)
        .read_first(read_first)
        .connect_cluster(&nodes)
        .await
        .expect("connect to the Redis cluster");
    Env::new(store).expires_by_itself().keep(keys)
}

/// The cache in front of a store keeps the store's contract.
async fn cached() -> Env<CachedStore<MemoryStore>> {
    let clock = ManualClock::new();
    Env::with_clock(
        CachedStore::new(MemoryStore::with_clock(clock.clone()), 1024),
        clock,
    )
}

/// So does a store behind `SharedStore` (what `set_default_store` installs).
async fn shared() -> Env<SharedStore> {
    let clock = ManualClock::new();
    Env::with_clock(
        SharedStore::new(MemoryStore::with_clock(clock.clone())),
        clock,
    )
}

mod memory_store {
    idem::testkit::conformance_tests!(super::memory);
}

mod cached_store {
    idem::testkit::conformance_tests!(super::cached);
}

mod shared_store {
    idem::testkit::conformance_tests!(super::shared);
}

mod sqlite_store {
    idem::testkit::conformance_tests!(super::sqlite);
}

mod sqlite_no_group_commit {
    idem::testkit::conformance_tests!(super::sqlite_no_group);
}

mod sqlite_group_commit_always {
    idem::testkit::conformance_tests!(super::sqlite_group_always);
}

mod sqlite_read_first {
    idem::testkit::conformance_tests!(super::sqlite_read_first);
}

mod postgres_store {
    idem::testkit::conformance_tests!(
        #[cfg_attr(
            not(idem_postgres),
            ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
        )]
        super::postgres
    );
}

mod postgres_group_commit {
    idem::testkit::conformance_tests!(
        #[cfg_attr(
            not(idem_postgres),
            ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
        )]
        super::postgres_group
    );
}

mod postgres_group_commit_always {
    idem::testkit::conformance_tests!(
        #[cfg_attr(
            not(idem_postgres),
            ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
        )]
        super::postgres_group_always
    );
}

mod postgres_notify {
    idem::testkit::conformance_tests!(
        #[cfg_attr(
            not(idem_postgres),
            ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
        )]
        super::postgres_notify
    );
}

mod mysql_store {
    idem::testkit::conformance_tests!(
        #[cfg_attr(
            not(idem_mysql),
            ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
        )]
        super::mysql
    );
}

mod mysql_read_first {
    idem::testkit::conformance_tests!(
        #[cfg_attr(
            not(idem_mysql),
            ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
        )]
        super::mysql_read_first
    );
}

mod redis_store {
    idem::testkit::conformance_tests!(
        #[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
        super::redis
    );
}

mod redis_notify {
    idem::testkit::conformance_tests!(
        #[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
        super::redis_notify
    );
}

mod redis_read_first {
    idem::testkit::conformance_tests!(
        #[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
        super::redis_read_first
    );
}

mod redis_cluster_store {
    idem::testkit::conformance_tests!(
        #[cfg_attr(
            not(idem_redis_cluster),
            ignore = "needs a Redis Cluster: set IDEM_REDIS_CLUSTER=redis://host:port,…"
        )]
        super::redis_cluster
    );
}

mod redis_cluster_read_first {
    idem::testkit::conformance_tests!(
        #[cfg_attr(
            not(idem_redis_cluster),
            ignore = "needs a Redis Cluster: set IDEM_REDIS_CLUSTER=redis://host:port,…"
        )]
        super::redis_cluster_read_first
    );
}

mod sqlite_transactional {
    idem::testkit::tx_conformance_tests!(super::sqlite);
}

mod postgres_transactional {
    idem::testkit::tx_conformance_tests!(
        #[cfg_attr(
            not(idem_postgres),
            ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
        )]
        super::postgres
    );
}

mod mysql_transactional {
    idem::testkit::tx_conformance_tests!(
        #[cfg_attr(
            not(idem_mysql),
            ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
        )]
        super::mysql
    );
}

mod mysql_probe_first_transactional {
    idem::testkit::tx_conformance_tests!(
        #[cfg_attr(
            not(idem_mysql),
            ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
        )]
        super::mysql_probe_first
    );
}

/// A record idem cannot read exactly (written by something else, or damaged) is an error that
/// names it, never a state a body may run on.
mod unreadable_records {
    use idem::{BeginRequest, Error, Fingerprint, Key, Policy, Store};

    /// `(key, state, fingerprint length, stored status)`, each wrong in one way.
    const BAD: [(&str, &str, usize, i32); 3] = [
        ("k-state", "bogus", 32, 200),
        ("k-fingerprint", "completed", 5, 200),
        ("k-status", "completed", 32, 70_000),
    ];

    async fn check<S: Store>(store: &S) {
        let fp = Fingerprint::from_bytes([7; 32]);
        for (key, what, ..) in BAD {
            let k = Key::parse(key).unwrap();
            let begun = store
                .begin(BeginRequest {
                    scope: "s",
                    key: k.as_str(),
                    fingerprint: &fp,
                    policy: &Policy::DEFAULT,
                    request: None,
                })
                .await;
            match begun {
                Err(Error::Store(e)) => {
                    assert!(e.to_string().contains(key), "{what}: {e}")
                }
                other => panic!("{what}: an unreadable record must be an error, got {other:?}"),
            }
            assert!(
                matches!(store.lookup("s", key).await, Err(Error::Store(_))),
                "{what}: lookup"
            );
        }
    }

    #[tokio::test]
    async fn sqlite() {
        let env = super::sqlite().await;
        let mut conn = env.store().pool().acquire().await.unwrap();
        // The table's own CHECK refuses an unknown state: a foreign writer might not have it.
        sqlx::query("PRAGMA ignore_check_constraints = ON")
            .execute(&mut *conn)
            .await
            .unwrap();
        for (key, state, len, status) in BAD {
            sqlx::query(
                "INSERT INTO idem_records (scope, key, fingerprint, state, fence, lease_until, \
                 expires_at, response_status, response_body, created_at, updated_at) \
                 VALUES ('s', $1, $2, $3, 1, 0, 9e15, $4, x'7b7d', 0, 0)",
            )
            .bind(key)
            .bind(vec![7u8; len])
            .bind(state)
            .bind(status)
            .execute(&mut *conn)
            .await
            .unwrap();
        }
        drop(conn);
        check(env.store()).await;
    }

    #[tokio::test]
    #[cfg_attr(
        not(idem_postgres),
        ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
    )]
    async fn postgres() {
        let env = super::postgres().await;
        // The column's domain refuses an unknown state: make it plain text, as a foreign
        // writer's table might have it.
        sqlx::query("ALTER TABLE idem_records ALTER COLUMN state TYPE text")
            .execute(env.store().pool())
            .await
            .unwrap();
        for (key, state, len, status) in BAD {
            sqlx::query(
                "INSERT INTO idem_records (scope, key, fingerprint, state, fence, lease_until, \
                 expires_at, response_status, response_body, created_at, updated_at) \
                 VALUES ('s', $1, $2, $3, 1, now(), now() + interval '1 day', $4, '\\x7b7d', \
                 now(), now())",
            )
            .bind(key)
            .bind(vec![7u8; len])
            .bind(state)
            .bind(status)
            .execute(env.store().pool())
            .await
            .unwrap();
        }
        check(env.store()).await;
    }
}

/// A records table created before a column was added gets it when the store migrates, keeps its
/// records, and works with it at once.
mod older_tables {
    use idem::store::StoreAdmin as _;
    use idem::{BeginOutcome, BeginRequest, ClaimRef, Fingerprint, Key, Policy, Store};

    const OLD_SQLITE: &str = "CREATE TABLE idem_records (scope TEXT NOT NULL, key TEXT NOT NULL, \
        fingerprint BLOB NOT NULL, state TEXT NOT NULL CHECK (state IN ('in_progress', 'completed', 'released')), \
        fence INTEGER NOT NULL, lease_until INTEGER NOT NULL, expires_at INTEGER NOT NULL, \
        recovery_point BLOB, response_status INTEGER, response_error INTEGER NOT NULL DEFAULT 0, \
        response_body BLOB, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, \
        PRIMARY KEY (scope, key)) WITHOUT ROWID";

    const OLD_POSTGRES: &str = "CREATE TABLE idem_records (scope text NOT NULL, key text NOT NULL, \
        fingerprint bytea NOT NULL, state text NOT NULL CHECK (state IN ('in_progress', 'completed', 'released')), \
        fence bigint NOT NULL, lease_until timestamptz NOT NULL, expires_at timestamptz NOT NULL, \
        recovery_point bytea, response_status integer, response_error boolean NOT NULL DEFAULT false, \
        response_body bytea, created_at timestamptz NOT NULL DEFAULT now(), \
        updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, key)) WITH (fillfactor = 80)";

    async fn attempts_work<S: Store>(store: &S) {
        let k = Key::parse("k-upgrade").unwrap();
        let f = Fingerprint::of("a").unwrap();
        let req = || BeginRequest {
            scope: "s",
            key: k.as_str(),
            fingerprint: &f,
            policy: &Policy::DEFAULT,
            request: None,
        };
        let BeginOutcome::Claimed(first) = store.begin(req()).await.unwrap() else {
            panic!("a first claim")
        };
        assert_eq!(first.attempt, 1);
        store
            .release(ClaimRef {
                scope: "s",
                key: k.as_str(),
                fence: first.fence,
            })
            .await
            .unwrap();
        let BeginOutcome::Claimed(second) = store.begin(req()).await.unwrap() else {
            panic!("a second claim")
        };
        assert_eq!(second.attempt, 2);
        // Listed by scope prefix on the table as it was created (on PostgreSQL, its scopes in
        // the database's collation, not byte order).
        let listed = store
            .list(&idem::store::RecordQuery::new().scope_prefix("s"))
            .await
            .unwrap();
        assert_eq!(listed.len(), 1);
        assert!(
            store
                .list(&idem::store::RecordQuery::new().scope_prefix("S"))
                .await
                .unwrap()
                .is_empty()
        );
    }

    /// A SQLite file with the records table `ddl` creates, as an earlier version created it,
    /// and a store on it that does not migrate.
    async fn sqlite_created_by(ddl: &[&str]) -> (crate::SqliteFile, idem::SqliteStore) {
        let file = crate::SqliteFile::new();
        let old = idem::SqliteStore::builder()
            .create_table(false)
            .connect(&file.url)
            .await
            .unwrap();
        for stmt in ddl {
            sqlx::query(sqlx::AssertSqlSafe(stmt.to_string()))
                .execute(old.pool())
                .await
                .unwrap();
        }
        (file, old)
    }

    #[tokio::test]
    async fn sqlite() {
        let (file, old) = sqlite_created_by(&[OLD_SQLITE]).await;
        drop(old);
        let store = idem::SqliteStore::connect(&file.url).await.unwrap();
        attempts_work(&store).await;
        // Migrating again changes nothing.
        store.migrate().await.unwrap();
    }

    /// A SQLite table of the first format as it was created before its check on `state` was
    /// written as comparisons (an `IN` list, which SQLite evaluates through a temporary index on
    /// every write that sets the state) is rebuilt with today's check when a store opens it:
    /// its records kept and answered, its indexes there, the check still refusing a state
    /// outside the list.
    #[tokio::test]
    async fn sqlite_with_the_state_check_as_a_list() {
        use idem::store::schema::SQLITE_RECORDS;
        const LIST: &str = "state IN ('in_progress', 'completed', 'released', 'parked')";
        const COMPARISONS: &str = "state = 'in_progress' OR state = 'completed' \
            OR state = 'released' OR state = 'parked'";
        let ddl = SQLITE_RECORDS[0].replace(COMPARISONS, LIST);
        assert_ne!(
            ddl, SQLITE_RECORDS[0],
            "today's check is written as comparisons"
        );
        let old_ddl: Vec<&str> = std::iter::once(ddl.as_str())
            .chain(SQLITE_RECORDS[1..].iter().copied())
            .collect();
        let (file, old) = sqlite_created_by(&old_ddl).await;
        let f = Fingerprint::of("before").unwrap();
        let before = BeginRequest::new("t", "k-before", &f, &Policy::DEFAULT);
        let BeginOutcome::Claimed(c) = old.begin(before).await.unwrap() else {
            panic!("a first claim")
        };
        let answer = idem::StoredResponse::ok(b"kept".to_vec());
        old.complete(
            ClaimRef {
                scope: "t",
                key: "k-before",
                fence: c.fence,
            },
            &answer,
        )
        .await
        .unwrap();
        drop(old);

        let store = idem::SqliteStore::connect(&file.url).await.unwrap();
        let sql: String = sqlx::query_scalar(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'idem_records'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert!(sql.contains(COMPARISONS), "{sql}");
        let indexes: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'idem_records' \
             AND sql IS NOT NULL",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(indexes, SQLITE_RECORDS.len() as i64 - 1, "{sql}");
        match store.begin(before).await.unwrap() {
            BeginOutcome::Replay(stored) => assert_eq!(stored.body.as_ref(), b"kept"),
            other => panic!("the record written before is replayed, not {other:?}"),
        }
        let refused = sqlx::query("UPDATE idem_records SET state = 'done' WHERE key = 'k-before'")
            .execute(store.pool())
            .await;
        assert!(refused.is_err(), "a state outside the list is refused");
        attempts_work(&store).await;
        // Migrating again changes nothing.
        store.migrate().await.unwrap();
    }

    #[tokio::test]
    #[cfg_attr(
        not(idem_postgres),
        ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
    )]
    async fn postgres() {
        let schema = crate::PgSchema::create(&crate::common::pg_url(), 4).await;
        sqlx::query(OLD_POSTGRES)
            .execute(&schema.pool)
            .await
            .unwrap();
        let store = idem::PgStore::builder()
            .build(schema.pool.clone())
            .await
            .unwrap();
        attempts_work(&store).await;
        // Its states are the domain's now, and its own check (which did not allow `parked`)
        // is gone: the domain refuses a state outside the list, and allows `parked`.
        assert_eq!(
            states_of(&schema.pool).await,
            (Some("idem_records_state".into()), 0)
        );
        let set = |state: &'static str| {
            sqlx::query("UPDATE idem_records SET state = $1 WHERE key = 'k-upgrade'")
                .bind(state)
                .execute(&schema.pool)
        };
        assert!(set("done").await.is_err(), "a state outside the list");
        set("parked").await.unwrap();
        store.migrate().await.unwrap();
        // Migrated, it names the format it now has.
        let comment: Option<String> =
            sqlx::query_scalar("SELECT obj_description(to_regclass('idem_records'), 'pg_class')")
                .fetch_one(&schema.pool)
                .await
                .unwrap();
        assert_eq!(
            comment,
            Some(format!(
                "idem records, format {}",
                idem::store::schema::RECORDS_FORMAT
            ))
        );
    }

    /// Stores that open a table of an earlier version all at once: one moves its states to the
    /// domain, every one of them starts, and the records written before are answered by each.
    #[tokio::test]
    #[cfg_attr(
        not(idem_postgres),
        ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
    )]
    async fn postgres_stores_migrate_an_older_table_at_once() {
        let schema = crate::PgSchema::create(&crate::common::pg_url(), 16).await;
        sqlx::query(OLD_POSTGRES)
            .execute(&schema.pool)
            .await
            .unwrap();
        let f = Fingerprint::of("before").unwrap();
        for i in 0..50 {
            sqlx::query(
                "INSERT INTO idem_records (scope, key, fingerprint, state, fence, lease_until, \
                 expires_at, response_status, response_body) \
                 VALUES ('s', $1, $2, 'completed', 1, now(), now() + interval '1 day', NULL, '\\x7b7d')",
            )
            .bind(format!("k-{i}"))
            .bind(f.as_bytes().to_vec())
            .execute(&schema.pool)
            .await
            .unwrap();
        }
        let opened = futures_util::future::join_all((0..8).map(|_| {
            idem::PgStore::builder()
                .background_purge(false)
                .build(schema.pool.clone())
        }))
        .await;
        for store in opened {
            let store = store.expect("every store starts");
            for key in ["k-0", "k-49"] {
                match store
                    .begin(BeginRequest::new("s", key, &f, &Policy::DEFAULT))
                    .await
                    .unwrap()
                {
                    BeginOutcome::Replay(stored) => assert_eq!(stored.body.as_ref(), b"{}"),
                    other => panic!("{key}: a replay, not {other:?}"),
                }
            }
        }
        assert_eq!(
            states_of(&schema.pool).await,
            (Some("idem_records_state".into()), 0)
        );
    }

    /// The domain of the records table's `state` column, if it has one, and how many checks
    /// of its own the table has.
    async fn states_of(pool: &sqlx::PgPool) -> (Option<String>, i64) {
        sqlx::query_as(
            "SELECT (SELECT domain_name::text FROM information_schema.columns \
                     WHERE table_schema = current_schema() AND table_name = 'idem_records' \
                     AND column_name = 'state'), \
                    (SELECT count(*) FROM pg_constraint \
                     WHERE conrelid = 'idem_records'::regclass AND contype = 'c')",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    }
}

/// A records table created before the index of unfinished work (every column there, the
/// index not) gains it when a store opens it, and its unfinished work is listed from it at once.
mod tables_before_the_work_index {
    use idem::store::schema::{MYSQL_RECORDS, POSTGRES_RECORDS, SQLITE_RECORDS};
    use idem::store::{RecordQuery, StoreAdmin as _};
    use idem::{BeginOutcome, BeginRequest, ClaimRef, Fingerprint, Policy, Store};

    /// A claim suspended (work a retry or an operator finishes), then the unfinished work
    /// listed.
    async fn lists_its_work<S: Store>(store: &S) {
        let f = Fingerprint::of("a").unwrap();
        let BeginOutcome::Claimed(c) = store
            .begin(BeginRequest::new("s", "k-work", &f, &Policy::DEFAULT))
            .await
            .unwrap()
        else {
            panic!("a first claim")
        };
        let claim = ClaimRef {
            scope: "s",
            key: "k-work",
            fence: c.fence,
        };
        store
            .suspend(claim, "no answer", std::time::Duration::ZERO)
            .await
            .unwrap();
        let work = store
            .listing(&RecordQuery::new().holding_work(true))
            .await
            .unwrap();
        assert_eq!(work.records.len(), 1);
        assert!(work.complete);
    }

    #[tokio::test]
    async fn sqlite() {
        let file = crate::SqliteFile::new();
        let old = idem::SqliteStore::builder()
            .create_table(false)
            .connect(&file.url)
            .await
            .unwrap();
        for statement in &SQLITE_RECORDS[..3] {
            sqlx::query(*statement).execute(old.pool()).await.unwrap();
        }
        drop(old);
        let store = idem::SqliteStore::connect(&file.url).await.unwrap();
        let index: Option<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name = 'idem_records_work_idx'",
        )
        .fetch_optional(store.pool())
        .await
        .unwrap();
        assert!(index.is_some(), "the migration created the index");
        lists_its_work(&store).await;
    }

    #[tokio::test]
    #[cfg_attr(
        not(idem_postgres),
        ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
    )]
    async fn postgres() {
        let schema = crate::PgSchema::create(&crate::common::pg_url(), 4).await;
        // The state's domain, the table, and its first two indexes.
        for statement in &POSTGRES_RECORDS[..4] {
            sqlx::query(*statement).execute(&schema.pool).await.unwrap();
        }
        let store = idem::PgStore::builder()
            .build(schema.pool.clone())
            .await
            .unwrap();
        let index: Option<String> =
            sqlx::query_scalar("SELECT to_regclass('idem_records_work_idx')::text")
                .fetch_one(&schema.pool)
                .await
                .unwrap();
        assert!(index.is_some(), "the migration created the index");
        lists_its_work(&store).await;
    }

    #[tokio::test]
    #[cfg_attr(
        not(idem_mysql),
        ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
    )]
    async fn mysql() {
        let db = crate::MyDatabase::create(&crate::common::mysql_url(), 4).await;
        // A table from before the work index, whose resume index was on `resume_at` alone.
        let old: String = MYSQL_RECORDS[0]
            .lines()
            .filter(|l| !l.contains("work"))
            .collect::<Vec<_>>()
            .join("\n")
            .replace("(resume_at, created_at),\n)", "(resume_at)\n)");
        assert!(!old.contains("work"), "{old}");
        assert!(old.contains("(resume_at)\n)"), "{old}");
        sqlx::query(sqlx::AssertSqlSafe(old))
            .execute(&db.pool)
            .await
            .unwrap();
        let store = idem::MySqlStore::builder()
            .build(db.pool.clone())
            .await
            .unwrap();
        /// An index's columns, in order.
        async fn columns(pool: &sqlx::MySqlPool, index: &str) -> Vec<String> {
            sqlx::query_scalar(
                "SELECT column_name FROM information_schema.statistics \
                 WHERE table_schema = DATABASE() AND table_name = 'idem_records' \
                 AND index_name = ? ORDER BY seq_in_index",
            )
            .bind(index)
            .fetch_all(pool)
            .await
            .unwrap()
        }
        let work = columns(&db.pool, "idem_records_work_idx").await;
        assert_eq!(work, ["work_fence", "created_at"]);
        assert_eq!(
            columns(&db.pool, "idem_records_resume_at_idx").await,
            ["resume_at", "created_at"],
            "the older resume index is rebuilt to end in created_at"
        );
        lists_its_work(&store).await;
        store.migrate().await.unwrap();

        // A table with both indexes, each on its column alone: not up to date, rebuilt.
        let both = crate::MyDatabase::create(&crate::common::mysql_url(), 4).await;
        let old = MYSQL_RECORDS[0]
            .replace("(resume_at, created_at)", "(resume_at)")
            .replace("(work_fence, created_at)", "(work_fence)");
        sqlx::query(sqlx::AssertSqlSafe(old))
            .execute(&both.pool)
            .await
            .unwrap();
        idem::MySqlStore::builder()
            .build(both.pool.clone())
            .await
            .unwrap();
        for (index, column) in [
            ("idem_records_resume_at_idx", "resume_at"),
            ("idem_records_work_idx", "work_fence"),
        ] {
            assert_eq!(
                columns(&both.pool, index).await,
                [column, "created_at"],
                "{index}"
            );
        }
    }
}

/// A records table names the format of its records. A new table names this version's; a table
/// that names a later one is refused, whether the store would create its table or not, and is
/// left as it was; a table that names none (created before formats were named) is opened.
mod records_format {
    use idem::store::schema::{MYSQL_RECORDS, POSTGRES_RECORDS, RECORDS_FORMAT, SQLITE_RECORDS};
    use idem::{Error, Fingerprint, Policy, Store};

    fn this_format() -> String {
        format!("idem records, format {RECORDS_FORMAT}")
    }

    /// A table of a later format is refused with an error that says which and what to do.
    fn refused<S>(opened: Result<S, Error>) {
        match opened {
            Err(Error::Config(message)) => {
                assert!(
                    message.contains("format 99") && message.contains("upgrade idem"),
                    "{message}"
                );
            }
            Err(other) => panic!("refused as a configuration error, not {other:?}"),
            Ok(_) => panic!("a table of a later format is refused"),
        }
    }

    /// One record written and read back: the store works on the table.
    async fn works<S: Store>(store: &S) {
        let f = Fingerprint::of("a").unwrap();
        let claimed = store
            .begin(idem::BeginRequest::new(
                "s",
                "k-format",
                &f,
                &Policy::DEFAULT,
            ))
            .await
            .unwrap();
        assert!(matches!(claimed, idem::BeginOutcome::Claimed(_)));
    }

    #[tokio::test]
    async fn sqlite() {
        let definition = |file: &crate::SqliteFile| {
            let url = file.url.clone();
            async move {
                let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
                let sql: String = sqlx::query_scalar(
                    "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'idem_records'",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                pool.close().await;
                sql
            }
        };
        let new = crate::SqliteFile::new();
        let store = idem::SqliteStore::connect(&new.url).await.unwrap();
        works(&store).await;
        drop(store);
        assert!(definition(&new).await.contains(&this_format()));

        let later = crate::SqliteFile::new();
        let raw = idem::SqliteStore::builder()
            .create_table(false)
            .connect(&later.url)
            .await
            .unwrap();
        let ddl = SQLITE_RECORDS[0].replace(&this_format(), "idem records, format 99");
        sqlx::query(sqlx::AssertSqlSafe(ddl))
            .execute(raw.pool())
            .await
            .unwrap();
        drop(raw);
        refused(idem::SqliteStore::connect(&later.url).await);
        refused(
            idem::SqliteStore::builder()
                .create_table(false)
                .connect(&later.url)
                .await,
        );
        assert!(definition(&later).await.contains("format 99"));
    }

    #[tokio::test]
    #[cfg_attr(
        not(idem_postgres),
        ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
    )]
    async fn postgres() {
        let comment = |pool: sqlx::PgPool| async move {
            sqlx::query_scalar::<_, Option<String>>(
                "SELECT obj_description(to_regclass('idem_records'), 'pg_class')",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        };
        let new = crate::PgSchema::create(&crate::common::pg_url(), 4).await;
        let store = idem::PgStore::builder()
            .build(new.pool.clone())
            .await
            .unwrap();
        works(&store).await;
        assert_eq!(comment(new.pool.clone()).await, Some(this_format()));

        let later = crate::PgSchema::create(&crate::common::pg_url(), 4).await;
        for stmt in POSTGRES_RECORDS {
            let stmt = stmt.replace(&this_format(), "idem records, format 99");
            sqlx::query(sqlx::AssertSqlSafe(stmt))
                .execute(&later.pool)
                .await
                .unwrap();
        }
        refused(idem::PgStore::builder().build(later.pool.clone()).await);
        refused(
            idem::PgStore::builder()
                .create_table(false)
                .build(later.pool.clone())
                .await,
        );
        assert_eq!(
            comment(later.pool.clone()).await.as_deref(),
            Some("idem records, format 99")
        );
    }

    #[tokio::test]
    #[cfg_attr(
        not(idem_mysql),
        ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
    )]
    async fn mysql() {
        let comment = |pool: sqlx::MySqlPool| async move {
            sqlx::query_scalar::<_, String>(
                "SELECT table_comment FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = 'idem_records'",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        };
        let new = crate::MyDatabase::create(&crate::common::mysql_url(), 4).await;
        let store = idem::MySqlStore::builder()
            .build(new.pool.clone())
            .await
            .unwrap();
        works(&store).await;
        assert_eq!(comment(new.pool.clone()).await, this_format());

        let later = crate::MyDatabase::create(&crate::common::mysql_url(), 4).await;
        let ddl = MYSQL_RECORDS[0].replace(&this_format(), "idem records, format 99");
        sqlx::query(sqlx::AssertSqlSafe(ddl))
            .execute(&later.pool)
            .await
            .unwrap();
        refused(idem::MySqlStore::builder().build(later.pool.clone()).await);
        refused(
            idem::MySqlStore::builder()
                .create_table(false)
                .build(later.pool.clone())
                .await,
        );
        assert_eq!(comment(later.pool.clone()).await, "idem records, format 99");
    }
}

/// An instance that starts while others work on the table (a rolling restart, a restart after a
/// crash) finds the table up to date and takes no lock on it. Its migration used to lock the
/// table before finding nothing to do (`ALTER TABLE … ADD COLUMN IF NOT EXISTS`): it queued
/// behind the transactions in flight, every claim queued behind it, and a claim that had read
/// the table deadlocked with it (found by the crash loop, `tests/crash_loop.rs`).
#[tokio::test]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn postgres_starts_next_to_busy_instances_without_locking_the_table() {
    use std::time::Duration;

    let schema = PgSchema::create(&common::pg_url(), 4).await;
    let first = PgStore::builder().build(schema.pool.clone()).await.unwrap();
    // Another instance's transaction, still open, that has written to the table.
    let mut busy = schema.pool.begin().await.unwrap();
    sqlx::query("DELETE FROM idem_records WHERE false")
        .execute(&mut *busy)
        .await
        .unwrap();
    let second = tokio::time::timeout(
        Duration::from_secs(5),
        PgStore::builder().build(schema.pool.clone()),
    )
    .await;
    // Let the other instance go before judging: a start-up still waiting on the table would
    // otherwise hold up dropping the schema.
    busy.rollback().await.unwrap();
    let second = second
        .expect("a store starting next to a busy one waited for a lock on the table")
        .unwrap();
    drop((first, second));
}

/// A store creates its table while other tables of the database come and go (other services'
/// migrations, other tests' schemas dropped). The migration's probe of the table's state check
/// used to read the definition of every check constraint a sequential scan of the catalog came
/// to, and one whose table had just been dropped failed the store's start ("could not open
/// relation with OID …"): PostgreSQL scans the catalog sequentially while it is small. Here the
/// scan is the only plan the store's connections may use, and tables with checks are created
/// and dropped beside the stores being opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn postgres_creates_its_table_while_other_tables_are_dropped() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let schema = PgSchema::create(&common::pg_url(), 4).await;
    let checks: Vec<String> = (0..20)
        .map(|i| format!("c{i} int CHECK (c{i} > {i})"))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let churn: Vec<_> = (0..2)
        .map(|t| {
            let (pool, stop) = (schema.pool.clone(), stop.clone());
            let create = format!("CREATE TABLE churn_{t} ({})", checks.join(", "));
            tokio::spawn(async move {
                let mut rounds = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let create = sqlx::AssertSqlSafe(create.clone());
                    sqlx::query(create).execute(&pool).await.unwrap();
                    let drop = sqlx::AssertSqlSafe(format!("DROP TABLE churn_{t}"));
                    sqlx::query(drop).execute(&pool).await.unwrap();
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    let settings = [("enable_indexscan", "off"), ("enable_bitmapscan", "off")];
    let pool = schema.pool_with_settings(2, &settings).await;
    // A probe that read every check's definition failed one of the first thirty or so stores
    // in every run.
    let mut failed = None;
    for i in 0..60 {
        let store = PgStore::builder()
            .table(format!("idem_records_{i}"))
            .background_purge(false)
            .group_commit(None)
            .build(pool.clone())
            .await;
        if let Err(e) = store {
            failed = Some((i, e));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for task in churn {
        assert!(task.await.unwrap() > 0, "the other tables came and went");
    }
    if let Some((i, e)) = failed {
        panic!("store {i} of 60 failed to create its table: {e}");
    }
}

/// A store whose records table's state domain would have the name of another table of its
/// schema (`<table>_state`) refuses to start, saying so, rather than create its table with a
/// `state` of that table's row type.
#[tokio::test]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn postgres_refuses_a_state_domain_named_as_another_table() {
    let schema = PgSchema::create(&common::pg_url(), 2).await;
    sqlx::query("CREATE TABLE payments_state (id int)")
        .execute(&schema.pool)
        .await
        .unwrap();
    let refused = PgStore::builder()
        .table("payments")
        .background_purge(false)
        .build(schema.pool.clone())
        .await;
    let Err(e) = refused else {
        panic!("a store whose state domain is another table's name started")
    };
    assert!(e.to_string().contains("already exists"), "{e}");
    let created: Option<String> = sqlx::query_scalar("SELECT to_regclass('payments')::text")
        .fetch_one(&schema.pool)
        .await
        .unwrap();
    assert_eq!(created, None, "no records table was created");
    // Under another name it starts.
    PgStore::builder()
        .table("payments_records")
        .background_purge(false)
        .build(schema.pool.clone())
        .await
        .unwrap();
}

/// A store on a pool of one connection in a schema of its own (so that the connection's
/// statistics can be flushed on demand), and how to read them.
async fn one_connection(schema: &PgSchema) -> (PgStore, sqlx::PgPool) {
    let pool = schema.pool_with_settings(1, &[]).await;
    let store = PgStore::builder()
        .background_purge(false)
        .group_commit(None)
        .build(pool.clone())
        .await
        .unwrap();
    (store, pool)
}

/// The records table's statistics so far: sequential scans, index entries read, updates and
/// heap-only updates.
async fn table_stats(pool: &sqlx::PgPool) -> (i64, i64, i64, i64) {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query_as(
        "SELECT t.seq_scan, \
           (SELECT coalesce(sum(i.idx_tup_read), 0)::int8 FROM pg_stat_user_indexes i \
            WHERE i.relid = t.relid), \
           t.n_tup_upd, t.n_tup_hot_upd \
         FROM pg_stat_user_tables t \
         WHERE t.schemaname = current_schema() AND t.relname = 'idem_records'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// An operator's page on a large table reads a bounded part of its indexes and never the table:
/// with 200,000 records (most completed, some released, in progress, holding work, expired),
/// every listing the admin view and `idem records list` make, and the counts, run without a
/// sequential scan, each reading at most about what it examines (10,000 records) of an index,
/// and say what they did not cover. The listing of unfinished work and the parked records read
/// the index of unfinished work alone. (The counts grouped the whole table, and listings sorted
/// everything they matched by fence.)
#[tokio::test]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn postgres_an_operators_page_reads_a_bounded_part_of_a_large_table() {
    use std::time::Duration;

    use idem::lifecycle::State;
    use idem::store::{RecordQuery, StoreAdmin as _, StoreStats};

    let schema = PgSchema::create(&common::pg_url(), 1).await;
    let (store, pool) = one_connection(&schema).await;
    // In the order they were claimed, as a live table is: retention follows the claim.
    sqlx::query(
        "INSERT INTO idem_records (scope, key, fingerprint, state, fence, lease_until, \
           expires_at, response_status, response_body, request, resume_at, note, created_at, \
           updated_at) \
         SELECT 'order:' || (i % 500), 'k-' || i, decode(repeat('00', 32), 'hex'), \
           CASE WHEN i % 1000 = 7 THEN 'parked' \
                WHEN i % 200 = 3 OR i % 1000 = 5 THEN 'in_progress' \
                WHEN i % 50 = 1 THEN 'released' ELSE 'completed' END, \
           (extract(epoch FROM t) * 1000)::int8, t + interval '5 minutes', \
           t + interval '24 hours', \
           CASE WHEN i % 50 IN (1, 3, 5, 7) THEN NULL ELSE 201 END, \
           CASE WHEN i % 50 IN (1, 3, 5, 7) THEN NULL ELSE '\\x7b7d'::bytea END, \
           CASE WHEN i % 1000 = 5 THEN '\\x7b7d'::bytea END, \
           CASE WHEN i % 1000 = 5 THEN t + interval '5 minutes' END, \
           CASE WHEN i % 1000 IN (5, 7) THEN 'the bank timed out' END, t, t \
         FROM generate_series(1, 200000) AS i, \
           LATERAL (SELECT now() - interval '30 hours' + i * interval '500 milliseconds' AS t) c",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE idem_records")
        .execute(&pool)
        .await
        .unwrap();

    let bound = RecordQuery::EXAMINE as i64;
    let (scans, _, _, _) = table_stats(&pool).await;
    for query in [
        RecordQuery::new(),
        RecordQuery::new().state(State::InProgress),
        RecordQuery::new()
            .state(State::Released)
            .older_than(Duration::from_secs(3600)),
        RecordQuery::new().scope_prefix("order:"),
        RecordQuery::new().scope_prefix("order:42"),
        RecordQuery::new()
            .scope_prefix("order:4")
            .state(State::InProgress),
        RecordQuery::new().holding_work(true),
        RecordQuery::new().state(State::Parked).limit(1000),
    ] {
        let (_, read, _, _) = table_stats(&pool).await;
        let listed = store.listing(&query).await.unwrap();
        let (scans_after, read_after, _, _) = table_stats(&pool).await;
        assert_eq!(scans_after, scans, "{query:?}: the table was scanned");
        assert!(
            read_after - read <= 2 * bound + 2,
            "{query:?}: {} index entries read",
            read_after - read
        );
        assert!(listed.records.iter().all(|r| query.matches(r)), "{query:?}");
        match query.order() {
            idem::store::ListOrder::Work => assert_eq!(
                listed.complete,
                listed.records.len() < query.limit,
                "{query:?}: the work is listed whole, up to the limit"
            ),
            _ if listed.records.len() < query.limit => {
                assert!(!listed.complete, "{query:?}: it examined part of the table");
            }
            _ => {}
        }
    }
    let work = store
        .listing(&RecordQuery::new().holding_work(true).limit(1000))
        .await
        .unwrap();
    assert_eq!(
        work.records.len(),
        400,
        "every record that holds work, from its index"
    );
    let parked = store
        .listing(&RecordQuery::new().state(State::Parked).limit(1000))
        .await
        .unwrap();
    assert_eq!(parked.records.len(), 200);
    let (_, read, _, _) = table_stats(&pool).await;
    let stats = store.stats(Duration::from_secs(3600)).await.unwrap();
    let (scans_after, read_after, _, _) = table_stats(&pool).await;
    assert_eq!(scans_after, scans, "the counts scanned the table");
    assert!(
        read_after - read <= 4 * StoreStats::BOUND as i64 + 400,
        "the counts read {} index entries",
        read_after - read
    );
    assert!(!stats.complete);
    assert_eq!(stats.counted, StoreStats::BOUND + 400, "{stats:?}");
    assert_eq!(stats.states.parked, 200, "every parked record is counted");
    assert_eq!(stats.unfinished, 200, "every suspended claim is counted");
    assert_eq!(stats.expired, StoreStats::BOUND, "that many or more");
}

/// A completion changes no column an index names, nor one an index's condition reads, so on
/// PostgreSQL it stays a heap-only (HOT) update, the index of unfinished work included: a
/// claim that holds no work leaves it untouched.
#[tokio::test]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn postgres_completions_stay_heap_only_updates() {
    use idem::{
        BeginOutcome, BeginRequest, ClaimRef, Fingerprint, Policy, Store as _, StoredResponse,
    };

    let schema = PgSchema::create(&common::pg_url(), 1).await;
    let (store, pool) = one_connection(&schema).await;
    let f = Fingerprint::of("a").unwrap();
    let (_, _, updates, hot) = table_stats(&pool).await;
    for i in 0..200 {
        let key = format!("k-{i}");
        let BeginOutcome::Claimed(c) = store
            .begin(BeginRequest::new("order:1", &key, &f, &Policy::DEFAULT))
            .await
            .unwrap()
        else {
            panic!("a new key is claimed")
        };
        let claim = ClaimRef {
            scope: "order:1",
            key: &key,
            fence: c.fence,
        };
        store
            .complete(claim, &StoredResponse::ok(&b"{\"ok\":true}"[..]))
            .await
            .unwrap();
    }
    let (_, _, updates_after, hot_after) = table_stats(&pool).await;
    assert_eq!(updates_after - updates, 200, "one update per completion");
    assert_eq!(
        hot_after - hot,
        200,
        "every completion is a heap-only update"
    );
}

/// On MariaDB a transactional first claim is one statement, the insert itself (sent with a lock
/// wait of zero): no read goes before it, so that the call sends no more than a hand-written
/// inbox. MySQL 8, or `probe_first(true)`, reads the record first, and that read is counted too.
#[tokio::test]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn mysql_transactional_first_claim_sends_no_read() {
    use idem::{
        BeginOutcome, BeginRequest, ClaimRef, Fingerprint, Policy, StoredResponse, TxStore,
    };

    /// The session's count of one statement kind (`Com_select`, `Com_insert`). `SHOW` is
    /// counted as neither.
    async fn count(conn: &mut sqlx::MySqlConnection, name: &str) -> u64 {
        let show = sqlx::AssertSqlSafe(format!("SHOW SESSION STATUS LIKE '{name}'"));
        let (_, value): (String, String) = sqlx::query_as(show).fetch_one(conn).await.unwrap();
        value.parse().unwrap()
    }

    let db = MyDatabase::create(&common::mysql_url(), 2).await;
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let mariadb = version.contains("MariaDB");
    let f = Fingerprint::of("a").unwrap();
    for probe_first in [false, true] {
        let store = MySqlStore::builder()
            .probe_first(probe_first)
            .build(db.pool.clone())
            .await
            .unwrap();
        let key = format!("k-{probe_first}");
        let mut tx = store.begin_transaction().await.unwrap();
        let (selects, inserts) = (
            count(&mut tx, "Com_select").await,
            count(&mut tx, "Com_insert").await,
        );
        let BeginOutcome::Claimed(c) = store
            .begin_in(
                &mut tx,
                BeginRequest::new("order:1", &key, &f, &Policy::DEFAULT),
            )
            .await
            .unwrap()
        else {
            panic!("a new key is claimed")
        };
        let reads = count(&mut tx, "Com_select").await - selects;
        let writes = count(&mut tx, "Com_insert").await - inserts;
        let claim = ClaimRef {
            scope: "order:1",
            key: &key,
            fence: c.fence,
        };
        store
            .complete_in(&mut tx, claim, &StoredResponse::ok(&b"{}"[..]))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            writes, 1,
            "the claim is one insert (probe_first {probe_first})"
        );
        let expected = u64::from(probe_first || !mariadb);
        assert_eq!(
            reads, expected,
            "reads before the claim's insert (probe_first {probe_first}, {version})"
        );
    }
}

/// A guarded body's transaction reads committed rows on MySQL, whoever set up the pool: the
/// store's own (`connect`, whose sessions are `READ COMMITTED` from the start and whose
/// transactions open with a plain `BEGIN`) and a pool of the caller's whose sessions run
/// `REPEATABLE READ` (which the transaction's own `SET TRANSACTION` overrides). A snapshot read
/// would keep seeing the table as at the transaction's first read.
#[tokio::test]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn mysql_guarded_transactions_read_committed() {
    use idem::TxStore;

    let db = MyDatabase::create(&common::mysql_url(), 2).await;
    sqlx::query("CREATE TABLE seen (id INT PRIMARY KEY) ENGINE = InnoDB")
        .execute(&db.pool)
        .await
        .unwrap();
    let own = MySqlStore::builder().connect(&db.url).await.unwrap();
    // The caller's pool: sessions at `REPEATABLE READ`, whatever the server's default.
    let repeatable = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                use sqlx::Executor as _;
                conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    .await
                    .map(drop)
            })
        })
        .connect(&db.url)
        .await
        .unwrap();
    let callers = MySqlStore::builder().build(repeatable).await.unwrap();
    for (id, (name, store)) in [("connect", &own), ("build", &callers)]
        .into_iter()
        .enumerate()
    {
        let mut tx = store.begin_transaction().await.unwrap();
        let count = "SELECT COUNT(*) FROM seen";
        let before: i64 = sqlx::query_scalar(count).fetch_one(&mut *tx).await.unwrap();
        sqlx::query("INSERT INTO seen (id) VALUES (?)")
            .bind(id as i64)
            .execute(&db.pool)
            .await
            .unwrap();
        let after: i64 = sqlx::query_scalar(count).fetch_one(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            after,
            before + 1,
            "a transaction of the store built with {name} reads the row committed since its first read"
        );
    }
}

/// Group commit under concurrency: many tasks on the same and on different keys, in batches.
mod group_commit_races {
    use std::sync::Arc;

    use idem::{
        BeginOutcome, BeginRequest, ClaimRef, Error, Fingerprint, GroupCommit, PgStore, Policy,
        Store, StoredResponse,
    };

    async fn races(config: GroupCommit) {
        let schema = crate::PgSchema::create(&crate::common::pg_url(), 16).await;
        let store = PgStore::builder()
            .group_commit(config)
            .build(schema.pool.clone())
            .await
            .unwrap();
        races_on(store).await;
    }

    /// 16 keys asked for 8 times each and 64 keys once, all at once: exactly one claim per key;
    /// every claim's completion persists, and every key then replays its own answer.
    async fn races_on<S: Store + Clone + 'static>(store: S) {
        let keys: Vec<String> = (0..16)
            .flat_map(|k| std::iter::repeat_n(format!("dup-{k}"), 8))
            .chain((0..64).map(|k| format!("one-{k}")))
            .collect();
        let fp = Fingerprint::of("same request").unwrap();
        let start = Arc::new(tokio::sync::Barrier::new(keys.len()));
        let mut tasks = Vec::new();
        for key in keys.clone() {
            let (store, start) = (store.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let outcome = store
                    .begin(BeginRequest {
                        scope: "race",
                        key: &key,
                        fingerprint: &fp,
                        policy: &Policy::DEFAULT,
                        request: None,
                    })
                    .await
                    .unwrap();
                let claim = match outcome {
                    BeginOutcome::Claimed(claim) => claim,
                    // A duplicate that came while the first ran, or after it completed.
                    BeginOutcome::InProgress { .. } => return (key, false),
                    BeginOutcome::Replay(stored) => {
                        assert_eq!(&stored.body[..], format!("answer of {key}").as_bytes());
                        return (key, false);
                    }
                    other => panic!("{key}: {other:?}"),
                };
                let body = format!("answer of {key}").into_bytes();
                store
                    .complete(
                        ClaimRef {
                            scope: "race",
                            key: &key,
                            fence: claim.fence,
                        },
                        &StoredResponse {
                            status: Some(201),
                            is_error: false,
                            body: body.into(),
                        },
                    )
                    .await
                    .unwrap();
                (key, true)
            }));
        }
        let mut claims = std::collections::HashMap::<String, usize>::new();
        for task in tasks {
            let (key, claimed) = task.await.unwrap();
            *claims.entry(key).or_default() += usize::from(claimed);
        }
        assert_eq!(claims.len(), 80);
        for (key, n) in &claims {
            assert_eq!(*n, 1, "{key} was claimed {n} times");
        }
        for key in claims.keys() {
            let outcome = store
                .begin(BeginRequest {
                    scope: "race",
                    key,
                    fingerprint: &fp,
                    policy: &Policy::DEFAULT,
                    request: None,
                })
                .await
                .unwrap();
            let BeginOutcome::Replay(stored) = outcome else {
                panic!("{key}: {outcome:?}")
            };
            assert_eq!(stored.status, Some(201));
            assert_eq!(&stored.body[..], format!("answer of {key}").as_bytes());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[cfg_attr(
        not(idem_postgres),
        ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
    )]
    async fn one_claim_per_key() {
        races(GroupCommit::default()).await;
    }

    /// The same races on SQLite, whose group commit runs each write's own statement in a
    /// shared transaction; the writes did share transactions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite_one_claim_per_key() {
        for store in [
            idem::SqliteStore::builder(),
            idem::SqliteStore::builder().group_commit_alone(),
        ] {
            let file = crate::SqliteFile::new();
            let store = store.connect(&file.url).await.unwrap();
            races_on(store.clone()).await;
            let stats = store.group_commit_stats().unwrap();
            let batched = stats.claims_batched + stats.completions_batched;
            assert!(stats.claim_batches > 0, "{stats:?}");
            assert!(
                batched >= 2 * stats.claim_batches.max(stats.completion_batches),
                "{stats:?}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[cfg_attr(
        not(idem_postgres),
        ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
    )]
    async fn one_claim_per_key_small_batches() {
        races(
            GroupCommit::default()
                .max_batch(3)
                .batches_in_flight(3)
                .batch_alone(true),
        )
        .await;
    }

    /// Claims of `tasks` concurrent requests, all let go at once; what group commit batched.
    async fn claim_all_at_once(config: GroupCommit, tasks: usize) -> idem::GroupCommitStats {
        let schema = crate::PgSchema::create(&crate::common::pg_url(), 8).await;
        let store = PgStore::builder()
            .group_commit(config)
            .build(schema.pool.clone())
            .await
            .unwrap();
        let fp = Fingerprint::of("same request").unwrap();
        let start = Arc::new(tokio::sync::Barrier::new(tasks));
        let mut all = Vec::new();
        for n in 0..tasks {
            let (store, start) = (store.clone(), start.clone());
            all.push(tokio::spawn(async move {
                start.wait().await;
                let key = format!("k-{n}");
                let outcome = store
                    .begin(BeginRequest {
                        scope: "threshold",
                        key: &key,
                        fingerprint: &fp,
                        policy: &Policy::DEFAULT,
                        request: None,
                    })
                    .await
                    .unwrap();
                assert!(matches!(outcome, BeginOutcome::Claimed(_)), "{outcome:?}");
            }));
        }
        for t in all {
            t.await.unwrap();
        }
        store.group_commit_stats().unwrap()
    }

    /// Below `min_in_flight` requests in flight nothing is batched (one request after another,
    /// or fewer at once than the threshold); far above it, claims share statements.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[cfg_attr(
        not(idem_postgres),
        ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
    )]
    async fn batches_only_above_the_threshold() {
        let few = claim_all_at_once(GroupCommit::default().min_in_flight(12), 8).await;
        assert_eq!(few.claims_batched, 0, "{few:?}");
        let lone = claim_all_at_once(GroupCommit::default().min_in_flight(2), 1).await;
        assert_eq!(lone.claims_batched, 0, "{lone:?}");
        let many = claim_all_at_once(GroupCommit::default().min_in_flight(4), 96).await;
        assert!(
            many.claims_batched > 0 && many.claim_batches < many.claims_batched,
            "{many:?}"
        );
    }

    /// A batch statement that fails answers every caller its error: no panic, no hang.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(
        not(idem_postgres),
        ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
    )]
    async fn a_failed_batch_answers_everyone() {
        let schema = crate::PgSchema::create(&crate::common::pg_url(), 8).await;
        let store = PgStore::builder()
            .group_commit(GroupCommit::default().batch_alone(true))
            .build(schema.pool.clone())
            .await
            .unwrap();
        sqlx::query("DROP TABLE idem_records")
            .execute(&schema.pool)
            .await
            .unwrap();
        let fp = Fingerprint::of("x").unwrap();
        let mut tasks = Vec::new();
        for k in 0..16 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let key = format!("k{k}");
                store
                    .begin(BeginRequest {
                        scope: "s",
                        key: &key,
                        fingerprint: &fp,
                        policy: &Policy::DEFAULT,
                        request: None,
                    })
                    .await
            }));
        }
        for task in tasks {
            let result = task.await.expect("no panic");
            assert!(matches!(result, Err(Error::Store(_))), "{result:?}");
        }
        let done = store
            .complete(
                ClaimRef {
                    scope: "s",
                    key: "k0",
                    fence: 1,
                },
                &StoredResponse {
                    status: None,
                    is_error: false,
                    body: Default::default(),
                },
            )
            .await;
        assert!(matches!(done, Err(Error::Store(_))), "{done:?}");
    }
}

/// Two instances on one table (or one prefix): the end of a claim in one wakes a duplicate
/// waiting in the other when both announce (`notify`), and only then.
mod announcements_across_instances {
    use std::time::{Duration, Instant};

    use idem::{BeginOutcome, BeginRequest, ClaimRef, Fingerprint, Policy, Store, StoredResponse};

    use super::common::{self, PgSchema, RedisKeys};
    use idem::{PgStore, RedisStore};

    const HEARD: Duration = Duration::from_secs(5);
    const QUIET: Duration = Duration::from_millis(400);

    /// Claims and completes a key on `a` while `b` listens for it; whether `b` heard.
    async fn heard<S: Store>(a: &S, b: &S, key: &str, bound: Duration) -> bool {
        let fp = Fingerprint::of("x").unwrap();
        let req = BeginRequest::new("s", key, &fp, &Policy::DEFAULT);
        let BeginOutcome::Claimed(claimed) = a.begin(req).await.unwrap() else {
            panic!("a new key was not claimed");
        };
        let mut ear = b.changes().expect("the store announces").listen("s", key);
        // The other instance's hearing task subscribes when its first listener does.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let claim = ClaimRef {
            scope: "s",
            key,
            fence: claimed.fence,
        };
        a.complete(claim, &StoredResponse::ok(&b"done"[..]))
            .await
            .unwrap();
        tokio::time::timeout(bound, ear.changed()).await.is_ok()
    }

    /// A waiting duplicate on `b` replays `a`'s answer long before its wait would have let it
    /// ask again at the polls' pace (250 ms apart once it has waited a second).
    async fn replays_promptly<S: Store + Clone>(a: &S, b: &S) {
        let fp = Fingerprint::of("x").unwrap();
        let policy = Policy::DEFAULT;
        let req = BeginRequest::new("s", "k-wait", &fp, &policy);
        let BeginOutcome::Claimed(claimed) = a.begin(req).await.unwrap() else {
            panic!("a new key was not claimed");
        };
        let waiting = {
            let b = b.clone();
            tokio::spawn(async move {
                let fp = Fingerprint::of("x").unwrap();
                let policy = Policy::DEFAULT.wait(Duration::from_secs(20));
                let key = idem::Key::parse("k-wait").unwrap();
                let began = idem::begin(&b, "s".into(), key, fp, policy).await;
                (
                    began.map(|b| matches!(b, idem::Begun::Replay(_))),
                    Instant::now(),
                )
            })
        };
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let claim = ClaimRef {
            scope: "s",
            key: "k-wait",
            fence: claimed.fence,
        };
        let completed = Instant::now();
        a.complete(claim, &StoredResponse::ok(&b"done"[..]))
            .await
            .unwrap();
        let (replayed, at) = waiting.await.unwrap();
        assert!(replayed.unwrap(), "the waiting duplicate did not replay");
        let after = at.saturating_duration_since(completed);
        assert!(
            after < Duration::from_millis(150),
            "the waiting duplicate replayed {after:?} after the completion: it was not woken"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(
        not(idem_postgres),
        ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
    )]
    async fn postgres_notify_wakes_the_other_instance() {
        let schema = PgSchema::create(&common::pg_url(), 4).await;
        // Pools of one connection: the listening connection is the store's own, so a waiting
        // duplicate never starves the pool its store answers from.
        let build = |notify| {
            let url = schema.url.clone();
            let name = schema.name.clone();
            async move {
                let pool = PgSchema::pool_for(&url, &name, 1).await;
                PgStore::builder()
                    .notify(notify)
                    .build(pool)
                    .await
                    .expect("create the table")
            }
        };
        let (a, b) = (build(true).await, build(true).await);
        assert!(
            heard(&a, &b, "k-1", HEARD).await,
            "the other instance did not hear"
        );
        replays_promptly(&a, &b).await;
        // Without `notify` on the completing side, nobody else hears.
        let quiet = build(false).await;
        assert!(
            !heard(&quiet, &b, "k-2", QUIET).await,
            "an instance that does not announce was heard"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
    async fn redis_notify_wakes_the_other_instance() {
        let url = common::redis_url();
        let keys = RedisKeys::new(std::slice::from_ref(&url));
        let build = |notify| {
            RedisStore::builder()
                .prefix(keys.prefix.clone())
                .notify(notify)
                .connect(&url)
        };
        let (a, b) = (build(true).await.unwrap(), build(true).await.unwrap());
        assert!(
            heard(&a, &b, "k-1", HEARD).await,
            "the other instance did not hear"
        );
        replays_promptly(&a, &b).await;
        let quiet = build(false).await.unwrap();
        assert!(
            !heard(&quiet, &b, "k-2", QUIET).await,
            "an instance that does not announce was heard"
        );
    }
}
