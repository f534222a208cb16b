//! The outbox table of the SQL stores: its statements written once, in each database's terms
//! through the stores' [`Dialect`], and the backends that run them: [`PgOutbox`],
//! [`SqliteOutbox`] and [`MySqlOutbox`].
//!
//! What differs between the databases is [`OutboxDialect`]: the lock that keeps two relays off
//! one event (`FOR UPDATE SKIP LOCKED`; SQLite has one writer, so its claim is atomic as it
//! stands), whether a claim can lease its events and return them in one `UPDATE … RETURNING`
//! (MySQL cannot: it locks them in a transaction, then leases them), how an enqueue that finds
//! its id skips it, and PostgreSQL's `NOTIFY` trigger. The table, its indexes and the trigger
//! are created from the DDL of [`schema`](crate::store::schema).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::outbox::{ClaimedEvent, Event, OutboxBackend, OutboxCounts, PendingEvent};
use crate::store::schema;
use crate::store::sql::{
    AddColumn, Arg, Columns, Dialect, Migration, Stmt, Types, base_name, begin_on, map_err, ms,
    quote_table,
};

use super::DEFAULT_OUTBOX_TABLE;

/// What the outbox's statements need from a database beyond the stores' [`Dialect`]. The
/// defaults are PostgreSQL's and SQLite's SQL.
pub(crate) trait OutboxDialect: Dialect {
    /// What the claim's `SELECT` of partition heads ends with: the lock that keeps two relays
    /// off one event.
    const LOCK: &'static str;

    /// Whether an `UPDATE` can return the rows it wrote. Without it, a claim locks the heads
    /// with its `SELECT` in a transaction, then leases them by their sequence numbers.
    const UPDATE_RETURNS: bool = true;

    /// Statements run after the table is created (PostgreSQL's `NOTIFY` trigger).
    fn after_create(_table: &str) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// `insert` (an `INSERT` of one event) made to skip an event whose id is in the outbox
    /// already: it answers a row when it inserted one, none when it skipped it.
    fn enqueue(insert: String) -> Stmt {
        Self::stmt(format!(
            "{insert} ON CONFLICT (id) DO NOTHING RETURNING seq"
        ))
    }

    /// A statement that deletes at most `batch` events of table `t` for which `sent` (sent
    /// long enough ago) holds.
    fn purge_sent(t: &str, sent: &str, batch: i64) -> Stmt {
        Self::stmt(format!(
            "DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} WHERE {sent} LIMIT {batch})"
        ))
    }
}

/// How a relay claims the heads of partitions.
pub(crate) enum Claim {
    /// One statement that leases them and returns them (`UPDATE … RETURNING`); its arguments
    /// are the owner, the lease in milliseconds and the limit.
    Returning(Stmt),
    /// In a transaction: `heads` selects and locks them (same arguments), then `lease`
    /// followed by a parenthesised list of `$4`, `$5`, … (one per event) leases them.
    Locked { heads: Stmt, lease: String },
}

/// Every statement of one outbox table.
pub(crate) struct OutboxStatements {
    pub(crate) table: String,
    pub(crate) migration: Migration,
    pub(crate) enqueue: Stmt,
    pub(crate) claim: Claim,
    pub(crate) mark_sent: Stmt,
    pub(crate) retry: Stmt,
    pub(crate) park: Stmt,
    pub(crate) hold: Stmt,
    pub(crate) unpark: Stmt,
    pub(crate) unpark_all: Stmt,
    pub(crate) pending: Stmt,
    pub(crate) parked: Stmt,
    pub(crate) sent: Stmt,
    pub(crate) counts: Stmt,
    pub(crate) purge: Stmt,
    /// How many events one `purge` statement deletes at most.
    pub(crate) purge_batch: i64,
}

/// Columns added since the outbox table was first created, with their definitions: tables
/// created earlier get them when the outbox migrates.
const ADDED_COLUMNS: &[(&str, &str)] = &[
    ("failures", "{int4} NOT NULL DEFAULT 0"),
    ("parked_at", "{timestamp}"),
];

impl OutboxStatements {
    pub(crate) fn new<D: OutboxDialect>(table: &str) -> Result<OutboxStatements> {
        let t = quote_table(table, D::QUALIFIED_TABLES)?;
        let base = base_name(table);
        let now = D::NOW;
        let Types {
            int4, timestamp, ..
        } = D::TYPES;
        let parked_index = format!("{base}_parked_idx");
        // The table and its indexes. Where the parked events' index is a statement of its
        // own (the last), it is created once the columns it covers are there.
        let mut create = schema::outbox(D::DATABASE, table)?;
        let finish = if create.len() > 1 {
            create.split_off(create.len() - 1)
        } else {
            Vec::new()
        };
        create.extend(D::after_create(table)?);
        let upgrade: Vec<AddColumn> = ADDED_COLUMNS
            .iter()
            .map(|(column, definition)| {
                let definition = definition
                    .replace("{int4}", int4)
                    .replace("{timestamp}", timestamp);
                D::add_column(&t, table, column, &definition)
            })
            .collect();
        let columns = "seq, id, topic, partition_key, payload, attempts, failures";
        // Unsent and not parked: what a relay may still publish.
        let waiting = "sent_at IS NULL AND parked_at IS NULL";
        // What operators see of an event: its columns, its last error and how long ago it
        // was enqueued, in milliseconds by the database's clock.
        let listed = format!(
            "{columns}, last_error, -({}) AS age_ms",
            D::ms_until("created_at")
        );
        // Only the head of each partition (no waiting event before it) whose lease is free:
        // a partition's events are published one at a time, in order, by one relay. A parked
        // event is no head and holds nothing back. The check reads the partition without
        // locking it: only the heads are locked, and a head another relay holds is skipped.
        let heads = format!(
            "FROM {t} o \
             WHERE o.sent_at IS NULL AND o.parked_at IS NULL \
               AND (o.lease_until IS NULL OR o.lease_until <= {now}) \
               AND NOT EXISTS (SELECT 1 FROM {t} p WHERE p.partition_key = o.partition_key \
                               AND p.sent_at IS NULL AND p.parked_at IS NULL \
                               AND p.seq < o.seq) \
             ORDER BY o.seq LIMIT $3{lock}",
            lock = D::LOCK,
        );
        let lease = format!(
            "UPDATE {t} SET lease_until = {}, lease_owner = $1, attempts = attempts + 1 \
             WHERE seq IN ",
            D::after("$2"),
        );
        let claim = if D::UPDATE_RETURNS {
            Claim::Returning(D::stmt(format!(
                "{lease}(SELECT o.seq {heads}) RETURNING {columns}"
            )))
        } else {
            Claim::Locked {
                heads: D::stmt(format!("SELECT {columns} {heads}")),
                lease,
            }
        };
        Ok(OutboxStatements {
            table: table.to_owned(),
            migration: Migration {
                create: create.into_iter().map(D::stmt).collect(),
                upgrade,
                // After the columns it covers; the probe takes its presence as "up to date".
                finish: finish.into_iter().map(D::stmt).collect(),
                up_to_date: D::up_to_date(
                    &t,
                    std::slice::from_ref(&parked_index),
                    &ADDED_COLUMNS.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
                ),
                widen: None,
                // Outbox events keep the layout they were first written in.
                format: None,
            },
            enqueue: D::enqueue(format!(
                "INSERT INTO {t} (id, topic, partition_key, payload, created_at) \
                 VALUES ($1, $2, $3, $4, {now})"
            )),
            claim,
            mark_sent: D::stmt(format!(
                "UPDATE {t} SET sent_at = {now}, lease_until = NULL, lease_owner = NULL, \
                 last_error = NULL WHERE seq = $1 AND sent_at IS NULL"
            )),
            retry: D::stmt(format!(
                "UPDATE {t} SET lease_until = {}, lease_owner = NULL, last_error = $3, \
                 failures = failures + $4 WHERE seq = $1 AND sent_at IS NULL",
                D::after("$2"),
            )),
            park: D::stmt(format!(
                "UPDATE {t} SET parked_at = {now}, lease_until = NULL, lease_owner = NULL, \
                 last_error = $2, failures = failures + 1 WHERE seq = $1 AND sent_at IS NULL"
            )),
            // An operator's park: only an event still waiting, its refusals left as they are.
            hold: D::stmt(format!(
                "UPDATE {t} SET parked_at = {now}, lease_until = NULL, lease_owner = NULL, \
                 last_error = $2 WHERE seq = $1 AND sent_at IS NULL AND parked_at IS NULL"
            )),
            unpark: D::stmt(format!(
                "UPDATE {t} SET parked_at = NULL, failures = 0, lease_until = NULL, \
                 lease_owner = NULL WHERE seq = $1 AND parked_at IS NOT NULL AND sent_at IS NULL"
            )),
            unpark_all: D::stmt(format!(
                "UPDATE {t} SET parked_at = NULL, failures = 0, lease_until = NULL, \
                 lease_owner = NULL WHERE parked_at IS NOT NULL AND sent_at IS NULL"
            )),
            pending: D::stmt(format!(
                "SELECT {listed} FROM {t} WHERE {waiting} ORDER BY seq LIMIT $1"
            )),
            parked: D::stmt(format!(
                "SELECT {listed} FROM {t} \
                 WHERE parked_at IS NOT NULL AND sent_at IS NULL ORDER BY seq LIMIT $1"
            )),
            sent: D::stmt(format!(
                "SELECT {listed} FROM {t} WHERE sent_at IS NOT NULL ORDER BY seq DESC LIMIT $1"
            )),
            counts: D::stmt(format!(
                "SELECT (SELECT count(*) FROM {t} WHERE {waiting}) AS pending, \
                        (SELECT count(*) FROM {t} WHERE parked_at IS NOT NULL \
                           AND sent_at IS NULL) AS parked, \
                        (SELECT count(*) FROM {t} WHERE sent_at IS NOT NULL) AS sent"
            )),
            purge: D::purge_sent(
                &t,
                &format!("sent_at IS NOT NULL AND sent_at <= {}", D::after("$1")),
                D::PURGE_BATCH,
            ),
            purge_batch: D::PURGE_BATCH,
        })
    }
}

/// An event as a relay claims it, or an operator lists it.
fn read_claimed(row: &impl Columns) -> Result<ClaimedEvent> {
    let read = || -> std::result::Result<ClaimedEvent, sqlx::Error> {
        let count = |column: &str| -> std::result::Result<u32, sqlx::Error> {
            Ok(u32::try_from(row.int4(column)?).unwrap_or(0))
        };
        Ok(ClaimedEvent {
            seq: row.int8("seq")?,
            attempts: count("attempts")?,
            failures: count("failures")?,
            event: Event {
                id: row.text("id")?,
                topic: row.text("topic")?,
                partition_key: row.text("partition_key")?,
                payload: Bytes::from(row.bytes("payload")?),
            },
        })
    };
    read().map_err(map_err)
}

/// An outbox table on a pool of database `D`: what every backend runs, written once.
struct Outbox<D: OutboxDialect> {
    pool: sqlx::Pool<D::Db>,
    sql: Arc<OutboxStatements>,
}

impl<D: OutboxDialect> Clone for Outbox<D> {
    fn clone(&self) -> Self {
        Outbox {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
        }
    }
}

impl<D: OutboxDialect> Outbox<D> {
    fn new(pool: sqlx::Pool<D::Db>, table: &str) -> Result<Self> {
        Ok(Outbox {
            pool,
            sql: Arc::new(OutboxStatements::new::<D>(table)?),
        })
    }

    async fn enqueue(
        &self,
        conn: &mut <D::Db as sqlx::Database>::Connection,
        event: &Event,
    ) -> Result<bool> {
        event.validate()?;
        let args = [
            Arg::Text(&event.id),
            Arg::Text(&event.topic),
            Arg::Text(&event.partition_key),
            Arg::Bytes(&event.payload),
        ];
        Ok(D::fetch(conn, &self.sql.enqueue, &args).await?.is_some())
    }

    /// Runs the write `stmt` on a connection of the pool: how many events it matched.
    async fn write(&self, stmt: &Stmt, args: &[Arg<'_>]) -> Result<u64> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        D::execute(&mut conn, stmt, args).await
    }

    /// [`Self::write`] for a write that reads many events, in a transaction opened as the
    /// dialect opens them: on MySQL it reads committed rows and locks no gaps, whatever the
    /// pool's connections were set to, so that it holds up no enqueue and no claim.
    async fn write_many(&self, stmt: &Stmt, args: &[Arg<'_>]) -> Result<u64> {
        let mut tx = begin_on::<D>(&self.pool).await?;
        let done = D::execute(&mut tx, stmt, args).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(done)
    }

    async fn list(&self, stmt: &Stmt, limit: u32) -> Result<Vec<PendingEvent>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        let rows = D::fetch_all(&mut conn, stmt, &[Arg::Int(i64::from(limit))]).await?;
        rows.iter()
            .map(|row| {
                let claimed = read_claimed(row)?;
                let age_ms = row.int8("age_ms").map_err(map_err)?;
                Ok(PendingEvent {
                    age: Duration::from_millis(u64::try_from(age_ms).unwrap_or(0)),
                    seq: claimed.seq,
                    attempts: claimed.attempts,
                    failures: claimed.failures,
                    event: claimed.event,
                    last_error: row.opt_text("last_error").map_err(map_err)?,
                })
            })
            .collect()
    }

    async fn claim(&self, owner: &str, lease: Duration, limit: u32) -> Result<Vec<ClaimedEvent>> {
        let args = [
            Arg::Text(owner),
            Arg::Int(ms(lease)),
            Arg::Int(i64::from(limit)),
        ];
        let mut events = match &self.sql.claim {
            Claim::Returning(stmt) => {
                let mut conn = self.pool.acquire().await.map_err(map_err)?;
                let rows = D::fetch_all(&mut conn, stmt, &args).await?;
                rows.iter().map(read_claimed).collect::<Result<Vec<_>>>()?
            }
            Claim::Locked { heads, lease } => {
                // Locked until the transaction ends: no other relay's claim takes them (it
                // skips them), and this one's lease is written before anyone can look again.
                let mut tx = begin_on::<D>(&self.pool).await?;
                let rows = D::fetch_all(&mut tx, heads, &args).await?;
                let mut events = rows.iter().map(read_claimed).collect::<Result<Vec<_>>>()?;
                if !events.is_empty() {
                    let seqs: Vec<String> =
                        (0..events.len()).map(|i| format!("${}", i + 4)).collect();
                    let stmt = D::stmt(format!("{lease}({})", seqs.join(", ")));
                    let mut all = args.to_vec();
                    all.extend(events.iter().map(|e| Arg::Int(e.seq)));
                    let leased = D::execute(&mut tx, &stmt, &all).await?;
                    if leased != events.len() as u64 {
                        return Err(Error::Store(
                            format!(
                                "a claim locked {} outbox events and leased {leased}",
                                events.len()
                            )
                            .into(),
                        ));
                    }
                    // As the lease counted them: the rows were read under their lock.
                    for e in &mut events {
                        e.attempts += 1;
                    }
                }
                tx.commit().await.map_err(map_err)?;
                events
            }
        };
        events.sort_by_key(|e| e.seq);
        Ok(events)
    }

    async fn counts(&self) -> Result<OutboxCounts> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        let row = D::fetch(&mut conn, &self.sql.counts, &[])
            .await?
            .ok_or_else(|| Error::Store("the outbox's counts answered no row".into()))?;
        let get = |c: &str| -> Result<u64> {
            let n = row.int8(c).map_err(map_err)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        Ok(OutboxCounts {
            pending: get("pending")?,
            parked: get("parked")?,
            sent: get("sent")?,
        })
    }

    async fn purge_sent(&self, older_than: Duration) -> Result<u64> {
        let mut total = 0;
        loop {
            let done = self
                .write_many(&self.sql.purge, &[Arg::Int(-ms(older_than))])
                .await?;
            total += done;
            if done < self.sql.purge_batch.unsigned_abs() {
                return Ok(total);
            }
        }
    }
}

/// An outbox backend on one database: its public face, each method running the statements
/// written once above.
macro_rules! outbox_backend {
    ($name:ident, $dialect:ty, $pool:ty, $conn:ty, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone)]
        pub struct $name {
            inner: Outbox<$dialect>,
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("table", &self.inner.sql.table)
                    .finish_non_exhaustive()
            }
        }

        impl $name {
            /// The outbox in table `idem_outbox` of `pool`'s database. The table is not
            /// created: call `migrate`.
            pub fn new(pool: $pool) -> Self {
                Self::with_table(pool, DEFAULT_OUTBOX_TABLE)
                    .expect("the default table name is valid")
            }

            /// The outbox in `table` (an identifier, checked).
            pub fn with_table(pool: $pool, table: &str) -> Result<Self> {
                Ok($name {
                    inner: Outbox::new(pool, table)?,
                })
            }

            /// The pool.
            pub fn pool(&self) -> &$pool {
                &self.inner.pool
            }

            /// The table.
            pub fn table(&self) -> &str {
                &self.inner.sql.table
            }

            /// Creates the table, its indexes (and on PostgreSQL its `NOTIFY` trigger) if
            /// missing, and adds the columns a table created by an earlier version lacks; safe
            /// to run from many instances at once, and a table found up to date is not locked.
            pub async fn migrate(&self) -> Result<()> {
                self.inner
                    .sql
                    .migration
                    .run::<$dialect>(&self.inner.pool)
                    .await
            }

            /// Enqueues `event` on `conn`: inside the caller's transaction, so that it commits
            /// or rolls back with the state change it announces. An event whose id is already
            /// in the outbox is not enqueued again (`false`): a deterministic id makes a
            /// repeated transaction enqueue nothing new. An event no broker could take (see
            /// [`Event::validate`]) is refused with [`Error::Config`](crate::Error::Config), and
            /// nothing is written. A deadlock or a lock wait that ran out is
            /// [`Error::Unavailable`](crate::Error::Unavailable): the database rolled the
            /// caller's transaction back, and the whole transaction is to be retried.
            pub async fn enqueue(&self, conn: &mut $conn, event: &Event) -> Result<bool> {
                self.inner.enqueue(conn, event).await
            }

            /// The oldest events waiting to be published (unsent, not parked), at most
            /// `limit`.
            pub async fn pending(&self, limit: u32) -> Result<Vec<PendingEvent>> {
                self.inner.list(&self.inner.sql.pending, limit).await
            }

            /// The oldest parked events (see [`Relay::park_after`](crate::outbox::Relay::park_after)),
            /// at most `limit`, each with the error that parked it. They stay until an operator
            /// sends them back with [`Self::unpark`] or [`Self::unpark_all`].
            pub async fn parked(&self, limit: u32) -> Result<Vec<PendingEvent>> {
                self.inner.list(&self.inner.sql.parked, limit).await
            }

            /// The most recently sent events not yet purged, newest first, at most `limit`.
            pub async fn sent(&self, limit: u32) -> Result<Vec<PendingEvent>> {
                self.inner.list(&self.inner.sql.sent, limit).await
            }

            /// Parks the waiting event `seq` on an operator's word, with `reason` as its last
            /// error: no relay claims it, and its partition's later events go on without it
            /// (see the module's "Parking"), until [`Self::unpark`] sends it back. Its
            /// refusals are left as they are. `false` when no such event is waiting (sent,
            /// already parked, or not in the outbox). A relay publishing it at that moment
            /// still marks it sent once the broker confirmed it.
            pub async fn hold(&self, seq: i64, reason: &str) -> Result<bool> {
                let args = [Arg::Int(seq), Arg::Text(reason)];
                Ok(self.inner.write(&self.inner.sql.hold, &args).await? > 0)
            }

            /// Sends the parked event `seq` back to the relays, its refusals forgotten: it is
            /// published next in its partition (before the partition's events still waiting,
            /// after those sent while it was parked). `false` when no such event is parked.
            pub async fn unpark(&self, seq: i64) -> Result<bool> {
                let args = [Arg::Int(seq)];
                Ok(self.inner.write(&self.inner.sql.unpark, &args).await? > 0)
            }

            /// [`Self::unpark`] for every parked event (after the cause was fixed: a queue
            /// declared, a stream created); returns how many.
            pub async fn unpark_all(&self) -> Result<u64> {
                self.inner.write_many(&self.inner.sql.unpark_all, &[]).await
            }
        }

        impl OutboxBackend for $name {
            fn claim(
                &self,
                owner: &str,
                lease: Duration,
                limit: u32,
            ) -> impl Future<Output = Result<Vec<ClaimedEvent>>> + Send {
                self.inner.claim(owner, lease, limit)
            }

            async fn mark_sent(&self, seq: i64) -> Result<()> {
                let args = [Arg::Int(seq)];
                self.inner.write(&self.inner.sql.mark_sent, &args).await?;
                Ok(())
            }

            async fn retry_later(
                &self,
                seq: i64,
                delay: Duration,
                error: &str,
                refused: bool,
            ) -> Result<()> {
                let args = [
                    Arg::Int(seq),
                    Arg::Int(ms(delay)),
                    Arg::Text(error),
                    Arg::Int(i64::from(refused)),
                ];
                self.inner.write(&self.inner.sql.retry, &args).await?;
                Ok(())
            }

            async fn park(&self, seq: i64, error: &str) -> Result<()> {
                let args = [Arg::Int(seq), Arg::Text(error)];
                self.inner.write(&self.inner.sql.park, &args).await?;
                Ok(())
            }

            fn counts(&self) -> impl Future<Output = Result<OutboxCounts>> + Send {
                self.inner.counts()
            }

            fn purge_sent(&self, older_than: Duration) -> impl Future<Output = Result<u64>> + Send {
                self.inner.purge_sent(older_than)
            }
        }
    };
}

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use crate::outbox::Wake;
    use crate::store::postgres::Pg;
    use crate::store::sql::ddl::notify_channel;

    impl OutboxDialect for Pg {
        const LOCK: &'static str = " FOR UPDATE SKIP LOCKED";

        fn after_create(table: &str) -> Result<Vec<String>> {
            schema::outbox_notify(table)
        }
    }

    outbox_backend!(
        PgOutbox,
        Pg,
        sqlx::PgPool,
        sqlx::PgConnection,
        "The outbox on PostgreSQL.\n\nAny number of relays may share it: each claims the heads of \
         partitions with `FOR UPDATE SKIP LOCKED` and a lease, and a trigger `NOTIFY`s them when an \
         enqueuing transaction commits (see [`PgOutbox::listener`])."
    );

    impl PgOutbox {
        /// A listener on this outbox's `NOTIFY` channel, for a relay to wake up on.
        pub async fn listener(&self) -> Result<sqlx::postgres::PgListener> {
            let mut listener = sqlx::postgres::PgListener::connect_with(self.pool())
                .await
                .map_err(map_err)?;
            listener
                .listen(&notify_channel(self.table()))
                .await
                .map_err(map_err)?;
            Ok(listener)
        }
    }

    impl Wake for sqlx::postgres::PgListener {
        async fn wait(&mut self, timeout: Duration) {
            match tokio::time::timeout(timeout, self.recv()).await {
                // Woken, or the poll interval passed.
                Ok(Ok(_)) | Err(_) => {}
                Ok(Err(e)) => {
                    // The listener reconnects on its next call; poll meanwhile.
                    tracing::warn!(target: "idem", error = %e, "the outbox listener failed; polling");
                    tokio::time::sleep(timeout).await;
                }
            }
        }
    }
}

#[cfg(feature = "postgres")]
pub use pg::PgOutbox;

#[cfg(feature = "sqlite")]
mod lite {
    use super::*;
    use crate::store::sqlite::Lite;

    impl OutboxDialect for Lite {
        // One writer: the claim's UPDATE is atomic as it stands.
        const LOCK: &'static str = "";
    }

    outbox_backend!(
        SqliteOutbox,
        Lite,
        sqlx::SqlitePool,
        sqlx::SqliteConnection,
        "The outbox on SQLite.\n\nSQLite has one writer at a time, so a claim is atomic as it \
         stands; relays poll. Use the store's writer pool ([`SqliteStore::pool`](crate::SqliteStore::pool))."
    );
}

#[cfg(feature = "sqlite")]
pub use lite::SqliteOutbox;

#[cfg(feature = "mysql")]
mod my {
    use super::*;
    use crate::store::mysql::My;

    impl OutboxDialect for My {
        const LOCK: &'static str = " FOR UPDATE SKIP LOCKED";
        // Neither MySQL nor MariaDB returns rows from an UPDATE; nor may an UPDATE select
        // from its own table in a subquery, or a subquery in `IN` have a LIMIT.
        const UPDATE_RETURNS: bool = false;

        fn enqueue(insert: String) -> Stmt {
            // When the id exists, the update sets nothing (the sequence to itself) and the
            // insert id to 0: the reply says whether a row was inserted.
            let mut stmt = Self::stmt(format!(
                "{insert} ON DUPLICATE KEY UPDATE seq = seq + LAST_INSERT_ID(0)"
            ));
            stmt.returns = crate::store::sql::Returns::InsertId;
            stmt
        }

        fn purge_sent(t: &str, sent: &str, batch: i64) -> Stmt {
            // In the order of the index on `sent_at`, which reads only the events to delete;
            // an order makes the statement deterministic for replication.
            Self::stmt(format!(
                "DELETE FROM {t} WHERE {sent} ORDER BY sent_at, seq LIMIT {batch}"
            ))
        }
    }

    outbox_backend!(
        MySqlOutbox,
        My,
        sqlx::MySqlPool,
        sqlx::MySqlConnection,
        "The outbox on MySQL 8 or MariaDB 10.6 and later.\n\nAny number of relays may share it: \
         each claims the heads of partitions in a transaction of its own, `READ COMMITTED`, \
         with `SELECT … FOR UPDATE SKIP LOCKED`, then leases them; relays poll (use \
         [`Poll`](crate::outbox::Poll)). A deadlock or a lock wait that ran out is \
         [`Error::Unavailable`](crate::Error::Unavailable), and nothing it touched changed: a \
         relay tries again on its next round. The claim, the purge and `unpark_all` run in \
         transactions that read committed rows and lock no gaps, whatever the pool's \
         connections were set to; the store's pool ([`MySqlStore::pool`](crate::MySqlStore::pool)) \
         is set so for everything else too. An enqueue sets the session's `LAST_INSERT_ID()` \
         (to the event's sequence number, or to 0 when its id was known): read your own \
         insert's id before it."
    );
}

#[cfg(feature = "mysql")]
pub use my::MySqlOutbox;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "sqlite")]
    fn table_names_are_checked() {
        assert!(
            OutboxStatements::new::<crate::store::sqlite::Lite>("outbox; DROP TABLE x").is_err()
        );
        assert!(OutboxStatements::new::<crate::store::sqlite::Lite>("idem_outbox").is_ok());
    }
}
