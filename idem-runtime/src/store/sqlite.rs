//! The SQLite store: the embedded default, on a file or in memory.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};

use crate::error::{Error, Result};
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, StoredResponse};
use crate::store::schema::Database;
use crate::store::sql::{
    self, AddColumn, Arg, Dialect, Engine, FenceFrom, GroupCommitStats, SqlKind, SqlStoreBuilder,
    Stmt, Types, map_err,
};
use crate::store::{Operation, Reply, Store, TxStore};

/// The store's clock: milliseconds since the Unix epoch, read by SQLite itself.
const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// SQLite's side of the SQL stores: its own clock in integer milliseconds, a claim inserted
/// first and read only when the key exists, purges through `changes()`.
pub(crate) struct Lite;

impl Dialect for Lite {
    type Db = sqlx::Sqlite;
    type Row = SqliteRow;

    const NOW: &'static str = NOW;
    const NOW_MS: &'static str = NOW;
    // One batch holds the single writer: about 1,000 deletions keep a live claim's wait short.
    const PURGE_BATCH: i64 = 1_000;
    const DATABASE: Database = Database::Sqlite;
    const TYPES: Types = Types {
        int4: "INTEGER",
        timestamp: "INTEGER",
        bytes: "BLOB",
        text: "TEXT",
    };
    const FALSE: &'static str = "0";
    // Text is compared byte by byte unless a column says otherwise (BINARY).
    const BYTE_ORDER: &'static str = "";
    const QUALIFIED_TABLES: bool = false;
    // A transaction that writes takes the write lock up front: two that started reading could
    // otherwise deadlock upgrading their locks.
    const BEGIN: Option<&'static str> = Some("BEGIN IMMEDIATE");

    fn returning(update: String, _t: &str, columns: &str, fence: FenceFrom) -> Stmt {
        match (columns, fence) {
            // A fenced write answers only whether it matched: `changes()` says so
            // (`write_fenced`). `RETURNING` would cost SQLite a temporary table each time, to
            // hold the rows it returns.
            ("fence", FenceFrom::Arg(_)) => Stmt::plain(update),
            _ => Stmt::plain(format!("{update} RETURNING {columns}")),
        }
    }

    fn write_fenced<'a>(
        conn: &'a mut SqliteConnection,
        sql: &'a Stmt,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<bool>> + Send + 'a {
        let matched = Self::execute(conn, sql, args);
        async move { Ok(matched.await? > 0) }
    }

    fn after(param: &str) -> String {
        format!("{NOW} + {param}")
    }

    fn ms_until(col: &str) -> String {
        format!("{col} - {NOW}")
    }

    fn stamp(col: &str) -> String {
        col.to_owned()
    }

    fn purge(t: &str, expired: &str) -> Vec<Stmt> {
        vec![
            Stmt::plain(format!(
                "DELETE FROM {t} WHERE (scope, key) IN ( \
                   SELECT scope, key FROM {t} WHERE {expired} LIMIT {})",
                Self::PURGE_BATCH
            )),
            Stmt::plain("SELECT changes() AS deleted"),
        ]
    }

    fn migration_start() -> Option<Stmt> {
        // `BEGIN IMMEDIATE` already serialises migrations, across processes too.
        None
    }

    fn add_column(t: &str, table: &str, column: &str, definition: &str) -> AddColumn {
        // `table` is a checked identifier, so it can stand in a string literal.
        AddColumn {
            probe: Some(Stmt::plain(format!(
                "SELECT count(*) AS present FROM pragma_table_info('{table}') \
                     WHERE name = '{column}'"
            ))),
            alter: Stmt::plain(format!("ALTER TABLE {t} ADD COLUMN {column} {definition}")),
        }
    }

    fn scope_prefix(col: &str) -> String {
        format!(
            "CASE WHEN instr({col}, ':') > 0 THEN substr({col}, 1, instr({col}, ':') - 1) ELSE {col} END"
        )
    }

    fn format_note(_t: &str, table: &str) -> Stmt {
        // SQLite keeps a table's definition as it was written, comments included. `table` is a
        // checked identifier: it can stand in a string literal.
        Stmt::plain(format!(
            "SELECT sql AS note FROM sqlite_master WHERE type = 'table' AND name = '{table}' COLLATE NOCASE"
        ))
    }

    fn update_state_check(t: &str, table: &str) -> Option<(Stmt, Vec<Stmt>)> {
        // SQLite cannot alter a check: a table created before `parked` was a state, or before
        // the check was written as comparisons (see `SQLITE_RECORDS`), is rebuilt with today's
        // DDL, its rows copied, in the migration's transaction. `table` is a checked
        // identifier, so it can stand in a string literal.
        let probe = format!(
            "SELECT count(*) AS present FROM sqlite_master \
             WHERE type = 'table' AND name = '{table}' AND sql LIKE '%OR state = ''parked''%'"
        );
        let new = format!("{table}__idem_rebuild");
        let mut widen = Vec::new();
        if let Ok(ddl) = crate::store::schema::records(Database::Sqlite, &new) {
            let columns = "scope, key, fingerprint, state, fence, lease_until, expires_at, \
                recovery_point, attempt, response_status, response_error, response_body, \
                request, resume_at, note, created_at, updated_at";
            widen.push(ddl[0].clone());
            widen.push(format!(
                "INSERT INTO \"{new}\" ({columns}) SELECT {columns} FROM {t}"
            ));
            widen.push(format!("DROP TABLE {t}"));
            widen.push(format!("ALTER TABLE \"{new}\" RENAME TO {t}"));
            // The indexes went with the old table.
            widen.extend(ddl.into_iter().skip(1).map(|s| s.replace(&new, table)));
        }
        Some((
            Stmt::plain(probe),
            widen.into_iter().map(Stmt::plain).collect(),
        ))
    }

    sql::run_statements!(sqlx::Sqlite, SqliteConnection, SqliteRow);
}

/// Whether `url` names an in-memory database (`sqlite::memory:`, `sqlite://:memory:`,
/// `…?mode=memory`), which exists only in its connection.
fn is_in_memory(url: &str) -> bool {
    let rest = url
        .strip_prefix("sqlite:")
        .unwrap_or(url)
        .trim_start_matches('/');
    rest.starts_with(":memory:") || url.contains("mode=memory")
}

/// A store on SQLite, through sqlx with SQLite bundled: no server, no setup.
///
/// [`SqliteStore::connect`] opens (and creates) the database file in WAL mode with a busy
/// timeout and creates the table. Several processes may share one file: claims are decided by
/// SQLite's unique index and conditional updates, never by reading first.
///
/// `begin` inserts first, on the writer, as a hand-written guard does: a new key is one
/// `INSERT … ON CONFLICT DO NOTHING`, an existing one that insert (which does nothing) and a
/// `SELECT` on the same connection. While recent claims keep finding their record (retries),
/// it reads first on the readers instead, so that replays never wait for the writer; in
/// transactional mode that read comes before the transaction opens.
/// [`read_first`](SqlStoreBuilder::read_first) fixes either order.
///
/// Expired records are deleted in the background, once a minute by default, in batches of
/// 1,000 between which live claims take the writer; see [Retention](SqlStoreBuilder#retention)
/// for the interval and the opt-out.
///
/// ```no_run
/// # async fn f() -> idem::Result<()> {
/// let store = idem::SqliteStore::connect("sqlite://idem.db").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    // Two pointers: the macro clones the store on every call. The engine's writer is one
    // connection when idem opened the database: SQLite has one writer at a time, and waiting
    // for it in this queue beats sleeping in SQLite's busy handler. Its readers are WAL
    // readers, which never wait for the writer.
    inner: Arc<Engine<Lite>>,
    /// Group commit's lane, when it is on.
    group: Option<Arc<group::Group>>,
}

mod group;

/// Builds a [`SqliteStore`]: table name, whether to create the table, group commit.
pub type SqliteStoreBuilder = SqlStoreBuilder<SqliteStore>;

/// What a [`SqliteStoreBuilder`] sets that other SQL stores do not have: group commit, set
/// through the builder's methods.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// Writes in flight from which they share a transaction; `None`: group commit off.
    group_from: Option<usize>,
}

/// Writes in flight, this one included, from which they share a transaction when group commit
/// is on: any two.
const GROUP_FROM: usize = 2;

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            group_from: Some(GROUP_FROM),
        }
    }
}

impl sql::sealed::Sealed for SqliteStore {}

impl SqlKind for SqliteStore {
    type Options = SqliteOptions;
}

impl SqlStoreBuilder<SqliteStore> {
    /// Group commit (on by default): while another write of the store is in flight, a first
    /// claim or a completion joins the writes queued for the writer, which run in one
    /// transaction and one commit instead of one each. Each runs the statement it would run
    /// alone, and its caller is answered once the transaction committed; a lone request runs
    /// its statement itself, as with group commit off. Claims of resumable calls, take-overs,
    /// releases, checkpoints and transactional guards are never batched.
    ///
    /// SQLite has one writer at a time, so concurrent writes queue for it anyway: batched, 8
    /// concurrent requests of the benchmark in `BENCHMARKS.md` ran 1.14–1.25× as many guarded
    /// calls per second as without, 32 concurrent requests 1.4–1.7×; 2 about as many.
    pub fn group_commit(mut self, on: bool) -> Self {
        self.options.group_from = on.then_some(GROUP_FROM);
        self
    }

    /// Tests only: with group commit on, send even a lone write through the lane, so that
    /// sequential test cases exercise it.
    #[doc(hidden)]
    pub fn group_commit_alone(mut self) -> Self {
        self.options.group_from = Some(1);
        self
    }

    /// A store on an existing pool, for reads and writes.
    pub async fn build(self, pool: SqlitePool) -> Result<SqliteStore> {
        self.build_split(pool.clone(), pool).await
    }

    /// A store that writes through `writer` (ideally a pool of one connection, used for the
    /// application's own writes too) and reads through `reader`.
    pub async fn build_split(self, writer: SqlitePool, reader: SqlitePool) -> Result<SqliteStore> {
        let (inner, options) = self.open(writer, reader).await?;
        Ok(SqliteStore::with_options(inner, &options))
    }

    /// Opens the database at `url` (`sqlite://path/to/file.db`, `sqlite::memory:`) with
    /// [`SqliteStore::connect_options`]: one writer connection and up to eight readers (one
    /// connection for an in-memory database, which lives in its connection). The pools do not
    /// ping a connection before each use (`test_before_acquire(false)`): SQLite has no server
    /// to lose, and each ping is a hand-off to the connection's thread and back, about half as
    /// long as a one-row insert. A pool of your own for [`build`](Self::build) gains the same.
    pub async fn connect(self, url: &str) -> Result<SqliteStore> {
        let options = SqliteStore::connect_options(url)?;
        if is_in_memory(url) {
            // The database lives as long as its one connection: never let the pool close it.
            let one = SqlitePoolOptions::new()
                .test_before_acquire(false)
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .connect_with(options)
                .await
                .map_err(map_err)?;
            return self.build(one).await;
        }
        // No ping before each use: a SQLite connection is a file this process holds open, with
        // no server that could have dropped it, and the ping is a round trip to the connection's
        // worker thread before every statement, about half as long as a one-row insert.
        let pool = |max: u32| {
            SqlitePoolOptions::new()
                .test_before_acquire(false)
                .max_connections(max)
                .connect_with(options.clone())
        };
        let writer = pool(1).await.map_err(map_err)?;
        let reader = pool(8).await.map_err(map_err)?;
        self.build_split(writer, reader).await
    }
}

impl SqliteStore {
    /// A store on `inner`, with the builder's defaults.
    fn on_engine(inner: Arc<Engine<Lite>>) -> SqliteStore {
        SqliteStore::with_options(inner, &SqliteOptions::default())
    }

    fn with_options(inner: Arc<Engine<Lite>>, options: &SqliteOptions) -> SqliteStore {
        let group = options
            .group_from
            .map(|from| Arc::new(group::Group::new(inner.clone(), from)));
        SqliteStore { inner, group }
    }

    /// With group commit on, what the transactions of more than one write held since the store
    /// was built; `None` with group commit off.
    pub fn group_commit_stats(&self) -> Option<GroupCommitStats> {
        self.group.as_ref().map(|g| g.stats())
    }

    /// Opens (creating if missing) the database at `url` and creates the table.
    pub async fn connect(url: &str) -> Result<SqliteStore> {
        SqliteStore::builder().connect(url).await
    }

    /// A private in-memory database, for tests.
    pub async fn in_memory() -> Result<SqliteStore> {
        SqliteStore::connect("sqlite::memory:").await
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
        &self.inner.writer
    }

    /// The pool that reads. With [`SqliteStore::connect`], several connections that never wait
    /// for the writer; with [`SqliteStoreBuilder::build`], the same pool as
    /// [`SqliteStore::pool`]. Read through it while a transaction holds the writer.
    pub fn reader_pool(&self) -> &SqlitePool {
        &self.inner.reader
    }
}

impl SqliteStore {
    /// `begin` inside the caller's transaction.
    async fn begin_in_transaction(
        &self,
        conn: &mut SqliteConnection,
        req: BeginRequest<'_>,
    ) -> Result<BeginOutcome> {
        self.inner.begin(Some(conn), &req).await
    }
}

sql::grouped_store!(SqliteStore, inner.changes);

impl SqliteStore {
    /// `begin`, batched with other writes in flight when group commit is on. A claim that
    /// reads first (on the readers), or stores its request, runs the single-row path.
    async fn begin_grouped(&self, req: BeginRequest<'_>) -> Result<BeginOutcome> {
        // Counted in flight until answered, so that others know to batch with it.
        let entered = self.group.as_ref().map(|group| (group, group.enter()));
        if let Some((group, entered)) = &entered
            && !entered.alone
            && req.request.is_none()
            && !self.inner.read_first.now()
            && let Some(claimed) = group.claim(&req).await
        {
            return claimed.map(BeginOutcome::Claimed);
        }
        self.inner.begin(None, &req).await
    }

    /// `complete`, batched with other writes in flight when group commit is on.
    async fn complete_grouped(&self, claim: ClaimRef<'_>, response: &StoredResponse) -> Result<()> {
        let entered = self.group.as_ref().map(|group| (group, group.enter()));
        if let Some((group, entered)) = &entered
            && !entered.alone
            && let Some(done) = group.complete(claim, response).await
        {
            return done;
        }
        self.inner.complete(claim, response).await
    }
}

sql::engine_store_api!(SqliteStore, SqlitePool, sqlx::Sqlite, SqliteConnection);

#[cfg(test)]
mod tests {
    use super::{Lite, is_in_memory};

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

    /// The pools `connect` opens lend connections without pinging them first: on a file and in
    /// memory, the writer and the readers alike.
    #[tokio::test]
    async fn connect_opens_pools_that_do_not_ping() {
        let dir = tempfile::tempdir().unwrap();
        let file = format!("sqlite://{}", dir.path().join("records.db").display());
        for url in [file.as_str(), "sqlite::memory:"] {
            let store = crate::store::sqlite::SqliteStore::connect(url)
                .await
                .unwrap();
            for pool in [store.pool(), store.reader_pool()] {
                assert!(!pool.options().get_test_before_acquire(), "{url}");
            }
        }
    }

    /// Every statement behind an operator's page reads a bounded part of an index: a search,
    /// or a walk in an index's order that stops at its limit; never a scan of the table, nor a
    /// sort of everything it matched.
    #[tokio::test]
    async fn operators_reads_walk_indexes_on_sqlite() {
        use std::time::Duration;

        use crate::lifecycle::State;
        use crate::store::RecordQuery;
        use crate::store::sql::{
            Arg, Columns as _, Dialect as _, Statements, Stmt, ddl, prefix_end,
        };

        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        let statements = Statements::new::<Lite>(ddl::RECORDS_TABLE).unwrap();
        statements.migration.run::<Lite>(&pool).await.unwrap();
        let mut plans: Vec<(String, Stmt, Vec<Arg<'_>>)> = Vec::new();
        let queries = [
            RecordQuery::new(),
            RecordQuery::new()
                .state(State::InProgress)
                .older_than(Duration::from_secs(60)),
            RecordQuery::new().scope_prefix("refund:"),
            RecordQuery::new()
                .scope_prefix("refund:")
                .state(State::InProgress)
                .older_than(Duration::from_secs(60)),
            RecordQuery::new().scope_prefix("\u{10FFFF}"),
            RecordQuery::new().holding_work(true),
            RecordQuery::new()
                .state(State::Parked)
                .scope_prefix("refund:"),
        ];
        let ends: Vec<Option<String>> = queries
            .iter()
            .map(|q| q.scope_prefix.as_deref().and_then(prefix_end))
            .collect();
        for (query, end) in queries.iter().zip(&ends) {
            let list = statements.admin.list::<Lite>(query, end.as_deref());
            let range = list.args[..list.range_args].to_vec();
            plans.push((format!("{query:?}"), list.rows, list.args));
            plans.push((format!("examined {query:?}"), list.examined, range));
        }
        plans.push((
            "stats".into(),
            statements.admin.stats.clone(),
            vec![Arg::Int(10)],
        ));
        plans.push((
            "stats_bounded".into(),
            statements.admin.stats_bounded.clone(),
            vec![Arg::Int(10), Arg::Int(3_600_000)],
        ));
        let mut conn = pool.acquire().await.unwrap();
        for (what, statement, args) in &plans {
            let explain = Stmt::plain(format!("EXPLAIN QUERY PLAN {}", statement.sql.as_str()));
            let rows = Lite::fetch_all(&mut conn, &explain, args).await.unwrap();
            let plan: Vec<(i64, i64, String)> = rows
                .iter()
                .map(|r| {
                    (
                        r.int8("id").unwrap(),
                        r.int8("parent").unwrap(),
                        r.text("detail").unwrap(),
                    )
                })
                .collect();
            let on_table: Vec<&(i64, i64, String)> = plan
                .iter()
                .filter(|(_, _, d)| d.contains("idem_records"))
                .collect();
            assert!(!on_table.is_empty(), "{what}: {plan:?}");
            for (_, parent, step) in on_table {
                assert!(
                    step.starts_with("SEARCH idem_records USING")
                        || step.starts_with("SCAN idem_records USING INDEX")
                        || step.starts_with("SCAN idem_records USING COVERING INDEX"),
                    "{what}: the table is scanned: {plan:?}"
                );
                assert!(
                    !plan
                        .iter()
                        .any(|(_, p, d)| p == parent && d.starts_with("USE TEMP B-TREE")),
                    "{what}: what the table matched is sorted whole: {plan:?}"
                );
            }
        }
        // The listing of unfinished work reads its own index.
        let query = RecordQuery::new().holding_work(true);
        let work = statements.admin.list::<Lite>(&query, None);
        let explain = Stmt::plain(format!("EXPLAIN QUERY PLAN {}", work.rows.sql.as_str()));
        let rows = Lite::fetch_all(&mut conn, &explain, &work.args)
            .await
            .unwrap();
        assert!(
            rows.iter()
                .any(|r| r.text("detail").unwrap().contains("idem_records_work_idx")),
            "the index of unfinished work"
        );
    }
}
