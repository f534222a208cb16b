//! The outbox table of the SQL stores: its statements written once from the stores' `Dialect`,
//! and the two backends, [`PgOutbox`] and [`SqliteOutbox`], that run them.
//!
//! The statements differ between the databases only where the databases do: the clock (from
//! `Dialect`), `FOR UPDATE SKIP LOCKED` (PostgreSQL; SQLite has one writer, so its claim is
//! atomic as it stands), and the `NOTIFY` trigger that wakes PostgreSQL relays. The table, its
//! indexes and the trigger are created from the DDL of [`schema`](crate::store::schema).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sqlx::{AssertSqlSafe, SqlSafeStr as _, SqlStr};

use crate::error::Result;
use crate::outbox::{ClaimedEvent, Event, OutboxBackend, OutboxCounts, PendingEvent};
use crate::store::schema;
use crate::store::sql::{
    AddColumn, Dialect, Migration, Types, base_name, map_err, ms, quote_table,
};

use super::DEFAULT_OUTBOX_TABLE;

/// How many sent events one purge statement deletes.
const PURGE_BATCH: i64 = 10_000;

/// What the outbox's statements need from a database beyond the stores' [`Dialect`].
pub(crate) trait OutboxDialect: Dialect {
    /// What the claim's inner `SELECT` ends with.
    const LOCK: &'static str;
    /// Statements run after the table is created (PostgreSQL's `NOTIFY` trigger).
    fn after_create(table: &str) -> Result<Vec<String>>;
}

/// Every statement of one outbox table.
pub(crate) struct OutboxStatements {
    pub(crate) table: String,
    /// The `NOTIFY` channel of this table (PostgreSQL).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) channel: String,
    pub(crate) migration: Migration,
    pub(crate) enqueue: SqlStr,
    pub(crate) claim: SqlStr,
    pub(crate) mark_sent: SqlStr,
    pub(crate) retry: SqlStr,
    pub(crate) park: SqlStr,
    pub(crate) hold: SqlStr,
    pub(crate) unpark: SqlStr,
    pub(crate) unpark_all: SqlStr,
    pub(crate) pending: SqlStr,
    pub(crate) parked: SqlStr,
    pub(crate) sent: SqlStr,
    pub(crate) counts: SqlStr,
    pub(crate) purge: SqlStr,
}

fn sql(s: String) -> SqlStr {
    AssertSqlSafe(s).into_sql_str()
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
        let channel = crate::store::sql::ddl::notify_channel(table);
        let lock = D::LOCK;
        let parked_index = format!("{base}_parked_idx");
        // The table and its indexes, the parked events' last: it is created once the columns
        // it covers are there.
        let mut create = schema::outbox(D::DATABASE, table)?;
        let finish = create.split_off(create.len() - 1);
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
        Ok(OutboxStatements {
            table: table.to_owned(),
            channel,
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
            },
            enqueue: sql(format!(
                "INSERT INTO {t} (id, topic, partition_key, payload, created_at) \
                 VALUES ($1, $2, $3, $4, {now}) ON CONFLICT (id) DO NOTHING RETURNING seq"
            )),
            // Only the head of each partition (no waiting event before it) whose lease is
            // free: a partition's events are published one at a time, in order, by one relay.
            // A parked event is no head and holds nothing back.
            claim: sql(format!(
                "UPDATE {t} SET lease_until = {}, lease_owner = $1, attempts = attempts + 1 \
                 WHERE seq IN (SELECT o.seq FROM {t} o \
                   WHERE o.sent_at IS NULL AND o.parked_at IS NULL \
                     AND (o.lease_until IS NULL OR o.lease_until <= {now}) \
                     AND NOT EXISTS (SELECT 1 FROM {t} p WHERE p.partition_key = o.partition_key \
                                     AND p.sent_at IS NULL AND p.parked_at IS NULL \
                                     AND p.seq < o.seq) \
                   ORDER BY o.seq LIMIT $3{lock}) \
                 RETURNING {columns}",
                D::after("$2"),
            )),
            mark_sent: sql(format!(
                "UPDATE {t} SET sent_at = {now}, lease_until = NULL, lease_owner = NULL, \
                 last_error = NULL WHERE seq = $1 AND sent_at IS NULL"
            )),
            retry: sql(format!(
                "UPDATE {t} SET lease_until = {}, lease_owner = NULL, last_error = $3, \
                 failures = failures + $4 WHERE seq = $1 AND sent_at IS NULL",
                D::after("$2"),
            )),
            park: sql(format!(
                "UPDATE {t} SET parked_at = {now}, lease_until = NULL, lease_owner = NULL, \
                 last_error = $2, failures = failures + 1 WHERE seq = $1 AND sent_at IS NULL"
            )),
            // An operator's park: only an event still waiting, its refusals left as they are.
            hold: sql(format!(
                "UPDATE {t} SET parked_at = {now}, lease_until = NULL, lease_owner = NULL, \
                 last_error = $2 WHERE seq = $1 AND sent_at IS NULL AND parked_at IS NULL"
            )),
            unpark: sql(format!(
                "UPDATE {t} SET parked_at = NULL, failures = 0, lease_until = NULL, \
                 lease_owner = NULL WHERE seq = $1 AND parked_at IS NOT NULL AND sent_at IS NULL"
            )),
            unpark_all: sql(format!(
                "UPDATE {t} SET parked_at = NULL, failures = 0, lease_until = NULL, \
                 lease_owner = NULL WHERE parked_at IS NOT NULL AND sent_at IS NULL"
            )),
            pending: sql(format!(
                "SELECT {listed} FROM {t} WHERE {waiting} ORDER BY seq LIMIT $1"
            )),
            parked: sql(format!(
                "SELECT {listed} FROM {t} \
                 WHERE parked_at IS NOT NULL AND sent_at IS NULL ORDER BY seq LIMIT $1"
            )),
            sent: sql(format!(
                "SELECT {listed} FROM {t} WHERE sent_at IS NOT NULL ORDER BY seq DESC LIMIT $1"
            )),
            counts: sql(format!(
                "SELECT (SELECT count(*) FROM {t} WHERE {waiting}) AS pending, \
                        (SELECT count(*) FROM {t} WHERE parked_at IS NOT NULL \
                           AND sent_at IS NULL) AS parked, \
                        (SELECT count(*) FROM {t} WHERE sent_at IS NOT NULL) AS sent"
            )),
            purge: sql(format!(
                "DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} \
                 WHERE sent_at IS NOT NULL AND sent_at <= {} LIMIT {PURGE_BATCH})",
                D::after("$1"),
            )),
        })
    }
}

fn read_claimed<R: sqlx::Row>(row: &R) -> std::result::Result<ClaimedEvent, sqlx::Error>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let count = |column: &str| -> std::result::Result<u32, sqlx::Error> {
        Ok(u32::try_from(row.try_get::<i32, _>(column)?).unwrap_or(0))
    };
    Ok(ClaimedEvent {
        seq: row.try_get("seq")?,
        attempts: count("attempts")?,
        failures: count("failures")?,
        event: Event {
            id: row.try_get("id")?,
            topic: row.try_get("topic")?,
            partition_key: row.try_get("partition_key")?,
            payload: Bytes::from(row.try_get::<Vec<u8>, _>("payload")?),
        },
    })
}

/// An outbox's statements, with how one backend runs them: written once for both databases.
macro_rules! outbox_backend {
    ($name:ident, $dialect:ty, $pool:ty, $conn:ty, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone)]
        pub struct $name {
            pool: $pool,
            sql: Arc<OutboxStatements>,
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("table", &self.sql.table)
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
                    pool,
                    sql: Arc::new(OutboxStatements::new::<$dialect>(table)?),
                })
            }

            /// The pool.
            pub fn pool(&self) -> &$pool {
                &self.pool
            }

            /// The table.
            pub fn table(&self) -> &str {
                &self.sql.table
            }

            /// Creates the table, its indexes (and on PostgreSQL its `NOTIFY` trigger) if
            /// missing, and adds the columns a table created by an earlier version lacks; safe
            /// to run from many instances at once, and a table found up to date is not locked.
            pub async fn migrate(&self) -> Result<()> {
                self.sql.migration.run::<$dialect>(&self.pool).await
            }

            /// Enqueues `event` on `conn`: inside the caller's transaction, so that it commits
            /// or rolls back with the state change it announces. An event whose id is already
            /// in the outbox is not enqueued again (`false`): a deterministic id makes a
            /// repeated transaction enqueue nothing new. An event no broker could take (see
            /// [`Event::validate`]) is refused with [`Error::Config`](crate::Error::Config), and
            /// nothing is written.
            pub async fn enqueue(&self, conn: &mut $conn, event: &Event) -> Result<bool> {
                event.validate()?;
                let row = sqlx::query(self.sql.enqueue.clone())
                    .bind(event.id.as_str())
                    .bind(event.topic.as_str())
                    .bind(event.partition_key.as_str())
                    .bind(&event.payload[..])
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(map_err)?;
                Ok(row.is_some())
            }

            /// The oldest events waiting to be published (unsent, not parked), at most
            /// `limit`.
            pub async fn pending(&self, limit: u32) -> Result<Vec<PendingEvent>> {
                self.list(&self.sql.pending, limit).await
            }

            /// The oldest parked events (see [`Relay::park_after`](crate::outbox::Relay::park_after)),
            /// at most `limit`, each with the error that parked it. They stay until an operator
            /// sends them back with [`Self::unpark`] or [`Self::unpark_all`].
            pub async fn parked(&self, limit: u32) -> Result<Vec<PendingEvent>> {
                self.list(&self.sql.parked, limit).await
            }

            /// The most recently sent events not yet purged, newest first, at most `limit`.
            pub async fn sent(&self, limit: u32) -> Result<Vec<PendingEvent>> {
                self.list(&self.sql.sent, limit).await
            }

            /// Parks the waiting event `seq` on an operator's word, with `reason` as its last
            /// error: no relay claims it, and its partition's later events go on without it
            /// (see the module's "Parking"), until [`Self::unpark`] sends it back. Its
            /// refusals are left as they are. `false` when no such event is waiting (sent,
            /// already parked, or not in the outbox). A relay publishing it at that moment
            /// still marks it sent once the broker confirmed it.
            pub async fn hold(&self, seq: i64, reason: &str) -> Result<bool> {
                let done = sqlx::query(self.sql.hold.clone())
                    .bind(seq)
                    .bind(reason)
                    .execute(&self.pool)
                    .await
                    .map_err(map_err)?;
                Ok(done.rows_affected() > 0)
            }

            /// Sends the parked event `seq` back to the relays, its refusals forgotten: it is
            /// published next in its partition (before the partition's events still waiting,
            /// after those sent while it was parked). `false` when no such event is parked.
            pub async fn unpark(&self, seq: i64) -> Result<bool> {
                let done = sqlx::query(self.sql.unpark.clone())
                    .bind(seq)
                    .execute(&self.pool)
                    .await
                    .map_err(map_err)?;
                Ok(done.rows_affected() > 0)
            }

            /// [`Self::unpark`] for every parked event (after the cause was fixed: a queue
            /// declared, a stream created); returns how many.
            pub async fn unpark_all(&self) -> Result<u64> {
                let done = sqlx::query(self.sql.unpark_all.clone())
                    .execute(&self.pool)
                    .await
                    .map_err(map_err)?;
                Ok(done.rows_affected())
            }

            async fn list(&self, statement: &SqlStr, limit: u32) -> Result<Vec<PendingEvent>> {
                use sqlx::Row as _;
                let rows = sqlx::query(statement.clone())
                    .bind(i64::from(limit))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(map_err)?;
                rows.iter()
                    .map(|row| {
                        let claimed = read_claimed(row)?;
                        let age_ms: i64 = row.try_get("age_ms")?;
                        Ok(PendingEvent {
                            age: Duration::from_millis(u64::try_from(age_ms).unwrap_or(0)),
                            seq: claimed.seq,
                            attempts: claimed.attempts,
                            failures: claimed.failures,
                            event: claimed.event,
                            last_error: row.try_get("last_error")?,
                        })
                    })
                    .collect::<std::result::Result<_, sqlx::Error>>()
                    .map_err(map_err)
            }
        }

        impl OutboxBackend for $name {
            async fn claim(
                &self,
                owner: &str,
                lease: Duration,
                limit: u32,
            ) -> Result<Vec<ClaimedEvent>> {
                let rows = sqlx::query(self.sql.claim.clone())
                    .bind(owner)
                    .bind(ms(lease))
                    .bind(i64::from(limit))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(map_err)?;
                let mut events = rows
                    .iter()
                    .map(read_claimed)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(map_err)?;
                events.sort_by_key(|e| e.seq);
                Ok(events)
            }

            async fn mark_sent(&self, seq: i64) -> Result<()> {
                sqlx::query(self.sql.mark_sent.clone())
                    .bind(seq)
                    .execute(&self.pool)
                    .await
                    .map_err(map_err)?;
                Ok(())
            }

            async fn retry_later(
                &self,
                seq: i64,
                delay: Duration,
                error: &str,
                refused: bool,
            ) -> Result<()> {
                sqlx::query(self.sql.retry.clone())
                    .bind(seq)
                    .bind(ms(delay))
                    .bind(error)
                    .bind(i32::from(refused))
                    .execute(&self.pool)
                    .await
                    .map_err(map_err)?;
                Ok(())
            }

            async fn park(&self, seq: i64, error: &str) -> Result<()> {
                sqlx::query(self.sql.park.clone())
                    .bind(seq)
                    .bind(error)
                    .execute(&self.pool)
                    .await
                    .map_err(map_err)?;
                Ok(())
            }

            async fn counts(&self) -> Result<OutboxCounts> {
                use sqlx::Row as _;
                let row = sqlx::query(self.sql.counts.clone())
                    .fetch_one(&self.pool)
                    .await
                    .map_err(map_err)?;
                let get = |c: &str| -> Result<u64> {
                    let n: i64 = row.try_get(c).map_err(map_err)?;
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
                    let done = sqlx::query(self.sql.purge.clone())
                        .bind(-ms(older_than))
                        .execute(&self.pool)
                        .await
                        .map_err(map_err)?
                        .rows_affected();
                    total += done;
                    if done < PURGE_BATCH as u64 {
                        return Ok(total);
                    }
                }
            }
        }
    };
}

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use crate::store::postgres::Pg;

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
            let mut listener = sqlx::postgres::PgListener::connect_with(&self.pool)
                .await
                .map_err(map_err)?;
            listener.listen(&self.sql.channel).await.map_err(map_err)?;
            Ok(listener)
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

        fn after_create(_: &str) -> Result<Vec<String>> {
            Ok(Vec::new())
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked() {
        assert!(
            OutboxStatements::new::<crate::store::sqlite::Lite>("outbox; DROP TABLE x").is_err()
        );
        assert!(OutboxStatements::new::<crate::store::sqlite::Lite>("idem_outbox").is_ok());
    }
}
