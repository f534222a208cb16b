//! The SQLite store: the embedded default, on a file or in memory.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Row, SqlStr};

use crate::error::{Error, Result};
use crate::lifecycle::{Decision, decide};
use crate::record::{
    BeginOutcome, BeginRequest, ClaimRef, Claimed, Record, RecordState, StoredResponse,
};
use crate::store::sql::{
    self, CurRow, DEFAULT_TABLE, contention, fence_from_db, fence_to_db, map_err, ms,
};
use crate::store::{Store, TxStore};

/// Whether `url` names an in-memory database (`sqlite::memory:`, `sqlite://:memory:`,
/// `…?mode=memory`), which exists only in its connection.
fn is_in_memory(url: &str) -> bool {
    let rest = url
        .strip_prefix("sqlite:")
        .unwrap_or(url)
        .trim_start_matches('/');
    rest.starts_with(":memory:") || url.contains("mode=memory")
}

/// The store's clock: milliseconds since the Unix epoch, read by SQLite itself.
const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// A store on SQLite, through sqlx with SQLite bundled: no server, no setup.
///
/// [`SqliteStore::connect`] opens (and creates) the database file in WAL mode with a busy
/// timeout and creates the table. Several processes may share one file: claims are decided by
/// SQLite's unique index and conditional updates, never by reading first.
///
/// `begin` reads the record first, so a replay never takes SQLite's write lock; a first claim
/// is then one `INSERT … ON CONFLICT DO NOTHING`.
///
/// ```no_run
/// # async fn f() -> idem_runtime::Result<()> {
/// let store = idem_runtime::SqliteStore::connect("sqlite://idem.db").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    // One pointer: the macro clones the store on every call.
    inner: Arc<Shared>,
}

struct Shared {
    /// Writes and transactions. One connection when idem opened the database: SQLite has one
    /// writer at a time, and waiting for it in this queue beats sleeping in SQLite's busy
    /// handler.
    pool: SqlitePool,
    /// Reads: `begin`'s lookup, `lookup`. WAL readers never wait for the writer.
    reader: SqlitePool,
    sql: Statements,
}

/// Where `begin` runs: on the store's pools, or on the caller's transaction.
enum Via<'a> {
    Pools,
    Conn(&'a mut SqliteConnection),
}

type SqliteQuery<'q> =
    sqlx::query::Query<'q, sqlx::Sqlite, <sqlx::Sqlite as sqlx::Database>::Arguments>;

struct Statements {
    table: String,
    select: SqlStr,
    insert: SqlStr,
    reclaim: SqlStr,
    complete: SqlStr,
    release: SqlStr,
    checkpoint: SqlStr,
    lookup: SqlStr,
    purge: SqlStr,
    create: [SqlStr; 2],
}

fn sql(s: String) -> SqlStr {
    AssertSqlSafe(s).into_sql_str()
}

use sqlx::SqlSafeStr as _;

impl Statements {
    fn new(table: &str) -> Result<Statements> {
        if !sql::is_identifier(table) {
            return Err(Error::Config(format!(
                "table name {table:?} is not an identifier: use letters, digits and `_` (not first), at most 63 bytes"
            )));
        }
        let t = sql::quote_table(table)?;
        Ok(Statements {
            table: table.to_owned(),
            select: sql(format!(
                "SELECT fence, fingerprint, state, response_status, response_error, \
                 response_body, expires_at <= {NOW} AS expired, lease_until - {NOW} AS lease_left_ms \
                 FROM {t} WHERE scope = $1 AND key = $2"
            )),
            insert: sql(format!(
                "INSERT INTO {t} (scope, key, fingerprint, state, fence, lease_until, expires_at, \
                 created_at, updated_at) \
                 VALUES ($1, $2, $3, 'in_progress', {NOW}, {NOW} + $4, {NOW} + $5, {NOW}, {NOW}) \
                 ON CONFLICT (scope, key) DO NOTHING RETURNING fence"
            )),
            // The conditions are checked again against the row as it is now: between the read and
            // this write another attempt may have completed, released or re-claimed it.
            reclaim: sql(format!(
                "UPDATE {t} SET fence = fence + 1, state = 'in_progress', fingerprint = $3, \
                 lease_until = {NOW} + $4, expires_at = {NOW} + $5, \
                 recovery_point = CASE WHEN state <> 'completed' AND expires_at > {NOW} \
                   AND fingerprint = $3 THEN recovery_point END, \
                 response_status = NULL, response_error = 0, response_body = NULL, \
                 updated_at = {NOW} \
                 WHERE scope = $1 AND key = $2 AND fence = $6 AND (expires_at <= {NOW} \
                   OR state = 'released' \
                   OR (state = 'in_progress' AND lease_until <= {NOW} AND fingerprint = $3 AND $7)) \
                 RETURNING fence, recovery_point"
            )),
            complete: sql(format!(
                "UPDATE {t} SET state = 'completed', response_status = $4, response_error = $5, \
                 response_body = $6, recovery_point = NULL, updated_at = {NOW} \
                 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 'in_progress' \
                 AND expires_at > {NOW}"
            )),
            release: sql(format!(
                "UPDATE {t} SET state = 'released', updated_at = {NOW} \
                 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 'in_progress'"
            )),
            checkpoint: sql(format!(
                "UPDATE {t} SET recovery_point = $4, lease_until = {NOW} + $5, updated_at = {NOW} \
                 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 'in_progress' \
                 AND expires_at > {NOW}"
            )),
            lookup: sql(format!(
                "SELECT fingerprint, state, fence, response_status, response_error, response_body, \
                 lease_until - {NOW} AS lease_left_ms \
                 FROM {t} WHERE scope = $1 AND key = $2 AND state <> 'released' \
                 AND expires_at > {NOW}"
            )),
            purge: sql(format!("DELETE FROM {t} WHERE expires_at <= {NOW}")),
            create: [
                sql(format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                     scope TEXT NOT NULL, \
                     key TEXT NOT NULL, \
                     fingerprint BLOB NOT NULL, \
                     state TEXT NOT NULL CHECK (state IN ('in_progress', 'completed', 'released')), \
                     fence INTEGER NOT NULL, \
                     lease_until INTEGER NOT NULL, \
                     expires_at INTEGER NOT NULL, \
                     recovery_point BLOB, \
                     response_status INTEGER, \
                     response_error INTEGER NOT NULL DEFAULT 0, \
                     response_body BLOB, \
                     created_at INTEGER NOT NULL, \
                     updated_at INTEGER NOT NULL, \
                     PRIMARY KEY (scope, key)) WITHOUT ROWID"
                )),
                sql(format!(
                    "CREATE INDEX IF NOT EXISTS \"{table}_expires_at_idx\" ON {t} (expires_at)"
                )),
            ],
        })
    }
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("table", &self.inner.sql.table)
            .finish_non_exhaustive()
    }
}

/// Builds a [`SqliteStore`]: table name, whether to create the table.
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    table: String,
    create_table: bool,
}

impl SqliteStoreBuilder {
    /// The table holding the records (default `idem_records`): an identifier, checked.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Whether to create the table and its index if missing (default: yes).
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// A store on an existing pool.
    pub async fn build(self, pool: SqlitePool) -> Result<SqliteStore> {
        self.build_split(pool.clone(), pool).await
    }

    /// A store that writes through `writer` (ideally a pool of one connection, used for the
    /// application's own writes too) and reads through `reader`.
    pub async fn build_split(self, writer: SqlitePool, reader: SqlitePool) -> Result<SqliteStore> {
        let store = SqliteStore {
            inner: Arc::new(Shared {
                pool: writer,
                reader,
                sql: Statements::new(&self.table)?,
            }),
        };
        if self.create_table {
            store.migrate().await?;
        }
        Ok(store)
    }

    /// Opens the database at `url` (`sqlite://path/to/file.db`, `sqlite::memory:`) with
    /// [`SqliteStore::connect_options`]: one writer connection and up to eight readers (one
    /// connection for an in-memory database, which lives in its connection).
    pub async fn connect(self, url: &str) -> Result<SqliteStore> {
        let options = SqliteStore::connect_options(url)?;
        if is_in_memory(url) {
            // The database lives as long as its one connection: never let the pool close it.
            let one = SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .connect_with(options)
                .await
                .map_err(map_err)?;
            return self.build(one).await;
        }
        let pool = |max: u32| {
            SqlitePoolOptions::new()
                .max_connections(max)
                .connect_with(options.clone())
        };
        let writer = pool(1).await.map_err(map_err)?;
        let reader = pool(8).await.map_err(map_err)?;
        self.build_split(writer, reader).await
    }
}

impl SqliteStore {
    /// A builder with the default table name, creating the table.
    pub fn builder() -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            table: DEFAULT_TABLE.to_owned(),
            create_table: true,
        }
    }

    /// Opens (creating if missing) the database at `url` and creates the table.
    pub async fn connect(url: &str) -> Result<SqliteStore> {
        SqliteStore::builder().connect(url).await
    }

    /// A private in-memory database, for tests.
    pub async fn in_memory() -> Result<SqliteStore> {
        SqliteStore::connect("sqlite::memory:").await
    }

    /// A store on `pool`, with the default table. The table is not created: call
    /// [`SqliteStore::migrate`], or use the builder.
    pub fn new(pool: SqlitePool) -> SqliteStore {
        SqliteStore {
            inner: Arc::new(Shared {
                reader: pool.clone(),
                pool,
                sql: Statements::new(DEFAULT_TABLE).expect("the default table name is valid"),
            }),
        }
    }

    /// The options idem opens SQLite with: create if missing, WAL journal, `synchronous =
    /// NORMAL` (durable across process crashes; a power loss may drop the last commits), a
    /// 10-second busy timeout for writers in other connections and processes. Use them for a
    /// pool shared with the application's own tables.
    pub fn connect_options(url: &str) -> Result<SqliteConnectOptions> {
        Ok(SqliteConnectOptions::from_str(url)
            .map_err(|e| Error::Config(format!("invalid SQLite URL {url:?}: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10)))
    }

    /// The pool that writes (and runs transactions): use it for the application's own writes,
    /// so they queue with idem's instead of contending for SQLite's lock.
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    /// The pool that reads. With [`SqliteStore::connect`], several connections that never wait
    /// for the writer; with [`SqliteStoreBuilder::build`], the same pool as
    /// [`SqliteStore::pool`]. Read through it while a transaction holds the writer.
    pub fn reader_pool(&self) -> &SqlitePool {
        &self.inner.reader
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.inner.sql.table
    }

    /// Creates the table and its index if missing. Safe to run concurrently from several
    /// processes.
    pub async fn migrate(&self) -> Result<()> {
        let mut tx = self
            .inner
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_err)?;
        for stmt in &self.inner.sql.create {
            sqlx::query(stmt.clone())
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)
    }

    async fn fetch(
        &self,
        via: &mut Via<'_>,
        read: bool,
        q: SqliteQuery<'_>,
    ) -> Result<Option<SqliteRow>> {
        match via {
            Via::Pools if read => q.fetch_optional(&self.inner.reader).await,
            Via::Pools => q.fetch_optional(&self.inner.pool).await,
            Via::Conn(c) => q.fetch_optional(&mut **c).await,
        }
        .map_err(map_err)
    }

    /// Outside a transaction the read goes first, on the readers: a replay never queues for
    /// SQLite's single writer. Inside one (which holds the write lock already, `BEGIN
    /// IMMEDIATE`), the insert goes first: a first claim is then one statement.
    async fn begin_on(&self, mut via: Via<'_>, req: BeginRequest<'_>) -> Result<BeginOutcome> {
        let insert_first = matches!(via, Via::Conn(_));
        for attempt in 0..8 {
            let row = if insert_first && attempt == 0 {
                None
            } else {
                let q = sqlx::query(self.inner.sql.select.clone())
                    .bind(req.scope)
                    .bind(req.key);
                self.fetch(&mut via, true, q).await?
            };
            let Some(row) = row else {
                let q = sqlx::query(self.inner.sql.insert.clone())
                    .bind(req.scope)
                    .bind(req.key)
                    .bind(&req.fingerprint.as_bytes()[..])
                    .bind(ms(req.policy.lease))
                    .bind(ms(req.policy.retain));
                match self.fetch(&mut via, false, q).await? {
                    Some(row) => {
                        return Ok(BeginOutcome::Claimed(Claimed {
                            fence: fence_from_db(row.try_get(0).map_err(map_err)?)?,
                            reclaimed: false,
                            recovery_point: None,
                        }));
                    }
                    // It exists (inserted by another connection since our read): read it.
                    None => continue,
                }
            };
            let cur = cur_row(&row)?;
            match decide(cur.seen(req.fingerprint), req.policy) {
                Decision::Claim { reclaim, .. } => {
                    let q = sqlx::query(self.inner.sql.reclaim.clone())
                        .bind(req.scope)
                        .bind(req.key)
                        .bind(&req.fingerprint.as_bytes()[..])
                        .bind(ms(req.policy.lease))
                        .bind(ms(req.policy.retain))
                        .bind(cur.fence)
                        .bind(req.policy.expired_lease == crate::record::ExpiredLease::Reclaim);
                    if let Some(row) = self.fetch(&mut via, false, q).await? {
                        return Ok(BeginOutcome::Claimed(Claimed {
                            fence: fence_from_db(row.try_get(0).map_err(map_err)?)?,
                            reclaimed: reclaim,
                            recovery_point: row.try_get(1).map_err(map_err)?,
                        }));
                    }
                }
                Decision::Replay => return Ok(BeginOutcome::Replay(cur.into_response())),
                Decision::InProgress(retry_after) => {
                    return Ok(BeginOutcome::InProgress { retry_after });
                }
                Decision::KeyReused => return Ok(BeginOutcome::KeyReused),
            }
        }
        Err(contention(req.scope, req.key))
    }

    async fn complete_on(
        &self,
        conn: &mut SqliteConnection,
        claim: ClaimRef<'_>,
        response: &StoredResponse,
    ) -> Result<()> {
        let done = sqlx::query(self.inner.sql.complete.clone())
            .bind(claim.scope)
            .bind(claim.key)
            .bind(fence_to_db(claim.fence))
            .bind(response.status.map(i32::from))
            .bind(response.is_error)
            .bind(&response.body[..])
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        owned(done.rows_affected(), claim)
    }

    async fn fenced(&self, stmt: &SqlStr, claim: ClaimRef<'_>) -> Result<()> {
        let done = sqlx::query(stmt.clone())
            .bind(claim.scope)
            .bind(claim.key)
            .bind(fence_to_db(claim.fence))
            .execute(&self.inner.pool)
            .await
            .map_err(map_err)?;
        owned(done.rows_affected(), claim)
    }
}

fn owned(rows: u64, claim: ClaimRef<'_>) -> Result<()> {
    if rows == 1 {
        Ok(())
    } else {
        Err(Error::FenceLost { fence: claim.fence })
    }
}

fn cur_row(row: &SqliteRow) -> Result<CurRow> {
    let get = || -> Result<CurRow, sqlx::Error> {
        Ok(CurRow {
            fence: row.try_get("fence")?,
            fingerprint: row.try_get("fingerprint")?,
            state: row.try_get("state")?,
            response_status: row.try_get("response_status")?,
            response_error: row.try_get("response_error")?,
            response_body: row.try_get("response_body")?,
            expired: row.try_get("expired")?,
            lease_left_ms: row.try_get("lease_left_ms")?,
        })
    };
    get().map_err(map_err)
}

impl Store for SqliteStore {
    async fn begin(&self, req: BeginRequest<'_>) -> Result<BeginOutcome> {
        self.begin_on(Via::Pools, req).await
    }

    async fn complete(&self, claim: ClaimRef<'_>, response: &StoredResponse) -> Result<()> {
        let mut conn = self.inner.pool.acquire().await.map_err(map_err)?;
        self.complete_on(&mut conn, claim, response).await
    }

    async fn release(&self, claim: ClaimRef<'_>) -> Result<()> {
        self.fenced(&self.inner.sql.release, claim).await
    }

    async fn checkpoint(
        &self,
        claim: ClaimRef<'_>,
        recovery_point: &[u8],
        lease: Duration,
    ) -> Result<()> {
        let done = sqlx::query(self.inner.sql.checkpoint.clone())
            .bind(claim.scope)
            .bind(claim.key)
            .bind(fence_to_db(claim.fence))
            .bind(recovery_point)
            .bind(ms(lease))
            .execute(&self.inner.pool)
            .await
            .map_err(map_err)?;
        owned(done.rows_affected(), claim)
    }

    async fn lookup(&self, scope: &str, key: &str) -> Result<Option<Record>> {
        let row = sqlx::query(self.inner.sql.lookup.clone())
            .bind(scope)
            .bind(key)
            .fetch_optional(&self.inner.reader)
            .await
            .map_err(map_err)?;
        row.map(|row| {
            let get = || -> Result<Record, sqlx::Error> {
                let fp: Vec<u8> = row.try_get("fingerprint")?;
                let state: String = row.try_get("state")?;
                let completed = state == "completed";
                let left: i64 = row.try_get("lease_left_ms")?;
                Ok(Record {
                    fingerprint: crate::fingerprint::Fingerprint::from_slice(&fp)
                        .unwrap_or(crate::fingerprint::Fingerprint::from_bytes([0; 32])),
                    state: if completed {
                        RecordState::Completed
                    } else {
                        RecordState::InProgress
                    },
                    fence: row.try_get::<i64, _>("fence")?.max(0) as u64,
                    response: completed.then(|| {
                        sql::stored_response(
                            row.try_get("response_status").ok().flatten(),
                            row.try_get("response_error").unwrap_or(false),
                            row.try_get("response_body").ok().flatten(),
                        )
                    }),
                    lease_remaining: (!completed)
                        .then(|| Duration::from_millis(left.max(0) as u64)),
                })
            };
            get().map_err(map_err)
        })
        .transpose()
    }

    async fn purge_expired(&self) -> Result<u64> {
        let done = sqlx::query(self.inner.sql.purge.clone())
            .execute(&self.inner.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    fn release_in_background(&self, scope: String, key: String, fence: u64) {
        let store = self.clone();
        let (s, k) = (scope.clone(), key.clone());
        sql::spawn_release(&s, &k, async move {
            store
                .release(ClaimRef {
                    scope: &scope,
                    key: &key,
                    fence,
                })
                .await
        });
    }
}

impl TxStore for SqliteStore {
    type Database = sqlx::Sqlite;

    async fn begin_transaction(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        self.inner
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_err)
    }

    async fn begin_in(
        &self,
        conn: &mut SqliteConnection,
        req: BeginRequest<'_>,
    ) -> Result<BeginOutcome> {
        self.begin_on(Via::Conn(conn), req).await
    }

    async fn complete_in(
        &self,
        conn: &mut SqliteConnection,
        claim: ClaimRef<'_>,
        response: &StoredResponse,
    ) -> Result<()> {
        self.complete_on(conn, claim, response).await
    }
}

#[cfg(test)]
mod tests {
    use super::is_in_memory;

    #[test]
    fn in_memory_urls() {
        for url in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://?mode=memory",
            "sqlite://x.db?mode=memory",
        ] {
            assert!(is_in_memory(url), "{url}");
        }
        for url in [
            "sqlite://memory.db",
            "sqlite://data/memory/idem.db",
            "sqlite://idem.db",
        ] {
            assert!(!is_in_memory(url), "{url}");
        }
    }
}
