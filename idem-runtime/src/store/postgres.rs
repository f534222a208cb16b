//! The PostgreSQL store: production, shared by any number of service instances.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, SqlSafeStr as _, SqlStr};

use crate::error::{Error, Result};
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, StoredResponse};
use crate::store::group::{ClaimJob, ClaimReply, CompleteJob, Group};
use crate::store::schema::Database;
use crate::store::sql::{
    self, AddColumn, Arg, Dialect, Engine, Next, SqlStoreBuilder, Types, map_err,
};
use crate::store::{Operation, Reply, Store, TxStore};

/// All idem migrations, in every schema, take this advisory lock: concurrent `CREATE TABLE IF
/// NOT EXISTS` statements can otherwise fail on PostgreSQL's catalog indexes.
const MIGRATION_LOCK: i64 = 0x1de3_0001;

/// PostgreSQL's side of the SQL stores: the database's `now()` and `timestamptz` columns, a
/// first claim in one statement, purges by physical row address.
pub(crate) struct Pg;

impl Dialect for Pg {
    type Db = sqlx::Postgres;
    type Row = PgRow;

    const NOW: &'static str = "now()";
    const NOW_MS: &'static str = "(EXTRACT(EPOCH FROM now()) * 1000)::int8";
    // A purge holds row locks only on what it deletes; live traffic is not queued behind it.
    const PURGE_BATCH: i64 = 10_000;
    const DATABASE: Database = Database::Postgres;
    const TYPES: Types = Types {
        int4: "integer",
        timestamp: "timestamptz",
        bytes: "bytea",
        text: "text",
    };
    const FALSE: &'static str = "false";
    const QUALIFIED_TABLES: bool = true;
    const BEGIN: Option<&'static str> = None;

    fn after(param: &str) -> String {
        format!("now() + {param}::int8 * interval '1 millisecond'")
    }

    fn ms_until(col: &str) -> String {
        format!("(EXTRACT(EPOCH FROM ({col} - now())) * 1000)::int8")
    }

    fn stamp(col: &str) -> String {
        // Microseconds: exactly what `timestamptz` stores.
        format!("(EXTRACT(EPOCH FROM {col}) * 1000000)::int8")
    }

    fn purge(t: &str, expired: &str) -> Vec<SqlStr> {
        vec![
            AssertSqlSafe(format!(
                "WITH gone AS (DELETE FROM {t} WHERE ctid = ANY(ARRAY( \
                   SELECT ctid FROM {t} WHERE {expired} LIMIT {}) \
                 ) RETURNING 1) \
                 SELECT count(*) AS deleted FROM gone",
                Self::PURGE_BATCH
            ))
            .into_sql_str(),
        ]
    }

    fn migration_start() -> Option<SqlStr> {
        // `IF NOT EXISTS` on what exists already says so in a NOTICE ("column … already exists,
        // skipping"), which sqlx logs: a migration that has nothing to do stays silent, for this
        // transaction only.
        Some(
            AssertSqlSafe(format!(
                "SELECT set_config('client_min_messages', 'warning', true), \
                 pg_advisory_xact_lock({MIGRATION_LOCK})"
            ))
            .into_sql_str(),
        )
    }

    fn add_column(t: &str, _table: &str, column: &str, definition: &str) -> AddColumn {
        AddColumn {
            probe: None,
            alter: AssertSqlSafe(format!(
                "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {column} {definition}"
            ))
            .into_sql_str(),
        }
    }

    fn up_to_date(t: &str, index: &str, columns: &[&str]) -> Option<SqlStr> {
        // `t` is a checked, quoted identifier and the names are identifiers: they can stand
        // in string literals. PostgreSQL cuts identifiers to 63 bytes.
        let has_columns = if columns.is_empty() {
            "true".to_owned()
        } else {
            let names: Vec<String> = columns.iter().map(|c| format!("'{c}'")).collect();
            format!(
                "(SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass('{t}') \
                   AND attnum > 0 AND NOT attisdropped AND attname IN ({})) = {}",
                names.join(", "),
                columns.len()
            )
        };
        Some(
            AssertSqlSafe(format!(
                "SELECT (CASE WHEN to_regclass('{t}') IS NOT NULL \
                   AND EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
                     WHERE i.indrelid = to_regclass('{t}') AND c.relname = left('{index}', 63)) \
                   AND {has_columns} \
                 THEN 1 ELSE 0 END)::int8 AS present"
            ))
            .into_sql_str(),
        )
    }

    fn scope_prefix(col: &str) -> String {
        format!("split_part({col}, ':', 1)")
    }

    fn allow_states(t: &str, table: &str, states: &str) -> (SqlStr, Vec<SqlStr>) {
        // The check written inline in the DDL is named `<table>_state_check`; `t` is a checked,
        // quoted identifier, and the names identifiers, so they can stand in string literals.
        let check = format!("{}_state_check", sql::base_name(table));
        let probe = format!(
            "SELECT count(*)::int8 AS present FROM pg_constraint \
             WHERE conrelid = to_regclass('{t}') AND contype = 'c' \
             AND pg_get_constraintdef(oid) LIKE '%parked%'"
        );
        let widen = format!(
            "ALTER TABLE {t} DROP CONSTRAINT IF EXISTS \"{check}\", \
             ADD CONSTRAINT \"{check}\" CHECK (state IN ({states}))"
        );
        (
            AssertSqlSafe(probe).into_sql_str(),
            vec![AssertSqlSafe(widen).into_sql_str()],
        )
    }

    sql::run_statements!(sqlx::Postgres, PgConnection, PgRow);
}

/// A store on PostgreSQL.
///
/// Leases and retention are read against the database's `now()`, so instances with skewed
/// clocks agree. `begin` inserts first, as a hand-written guard does: a new key is one
/// `INSERT … ON CONFLICT DO NOTHING`, an existing one that insert (which writes nothing) and a
/// `SELECT`. While recent claims keep finding their record (retries), it reads first instead,
/// so that a replay is one `SELECT`; in transactional mode that read comes before the
/// transaction opens, and a new key costs exactly what a hand-written inbox pays. Taking over
/// an abandoned, expired or released record is an `UPDATE` that applies only if the record is
/// still as read.
/// `complete`, `release` and `checkpoint` are one `UPDATE … WHERE fence = $n` each; completion
/// changes no indexed column, so it is a HOT update on a table with room on its pages.
///
/// Under load, group commit (on by default, [`group_commit`](SqlStoreBuilder::group_commit))
/// lets concurrent claims share one multi-row claim statement and concurrent completions one
/// multi-row `UPDATE` (see [`GroupCommit`]).
///
/// Expired records are deleted in the background, once a minute by default, in batches of
/// 10,000 that lock only the rows they delete; see [Retention](SqlStoreBuilder#retention) for
/// the interval and the opt-out. Several instances on one table may all purge: a record is
/// deleted once.
///
/// ```no_run
/// # async fn f() -> idem::Result<()> {
/// let store = idem::PgStore::connect("postgres://postgres@127.0.0.1/app").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgStore {
    // One pointer: the macro clones the store on every call.
    inner: Arc<Engine<Pg>>,
    /// Group commit's lanes, when it is on.
    group: Option<Arc<Group>>,
}

pub use crate::store::group::{GroupCommit, GroupCommitStats};

/// Builds a [`PgStore`]: table name, whether to create the table, group commit.
pub type PgStoreBuilder = SqlStoreBuilder<PgStore>;

impl SqlStoreBuilder<PgStore> {
    /// Group commit (default: on, `GroupCommit::default()`; `group_commit(None)` turns it
    /// off): under load, concurrent claims share one multi-row claim statement, and concurrent
    /// completions one multi-row `UPDATE`, each answering every caller its own outcome — one
    /// commit for the batch instead of one per request. Below
    /// [`GroupCommit::min_in_flight`] requests of a kind in flight nobody batches, so a request
    /// alone is never batched and never waits; a batch waits at most
    /// [`GroupCommit::max_wait`] for requests already in flight. Transactional guards are never
    /// batched. `BENCHMARKS.md` ("Group commit on by default") has the measurements behind the
    /// default: level with off at 1 and 8 tasks, 1.45× at 32 and 3× at 128.
    pub fn group_commit(mut self, group_commit: impl Into<Option<GroupCommit>>) -> Self {
        self.group_commit = group_commit.into();
        self
    }

    /// A store on an existing pool.
    pub async fn build(self, pool: PgPool) -> Result<PgStore> {
        let group_commit = self.group_commit;
        let inner = self.open(pool.clone(), pool).await?;
        let group = match group_commit {
            Some(config) => Some(Arc::new(Group::new(inner.clone(), config)?)),
            None => None,
        };
        Ok(PgStore { inner, group })
    }

    /// Connects a pool to `url` and builds the store on it.
    pub async fn connect(self, url: &str) -> Result<PgStore> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(url)
            .await
            .map_err(map_err)?;
        self.build(pool).await
    }
}

impl PgStore {
    /// How much group commit batched since the store was built; `None` without group commit.
    pub fn group_commit_stats(&self) -> Option<GroupCommitStats> {
        self.group.as_ref().map(|g| g.stats())
    }

    /// Connects to `url` and creates the table if missing.
    pub async fn connect(url: &str) -> Result<PgStore> {
        PgStore::builder().connect(url).await
    }

    /// A store on `inner`, with group commit's defaults.
    fn on_engine(inner: Arc<Engine<Pg>>) -> PgStore {
        let group = Group::new(inner.clone(), GroupCommit::default())
            .ok()
            .map(Arc::new);
        PgStore { inner, group }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.writer
    }
}

impl PgStore {
    /// `begin` in a batch: the outcome, or `None` for the single-row path (alone, a take-over,
    /// a record that changed under the batch, no runtime to batch on).
    async fn begin_batched(
        &self,
        group: &Group,
        req: &BeginRequest<'_>,
    ) -> Result<Option<BeginOutcome>> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let job = ClaimJob {
            scope: req.scope.to_owned(),
            key: req.key.to_owned(),
            fingerprint: *req.fingerprint.as_bytes(),
            lease: req.policy.lease,
            retain: req.policy.retain,
            reply,
        };
        if group.claims.send(job).is_none() {
            return Ok(None);
        }
        // A closed answer: the lane's task is gone (its runtime shut down). The single-row path
        // sees whatever the batch did, if it ran.
        let Ok(reply) = rx.await else { return Ok(None) };
        Ok(match reply? {
            ClaimReply::Claimed(claimed) => Some(BeginOutcome::Claimed(claimed)),
            ClaimReply::Found(cur) => match sql::next(req, &cur)? {
                Next::Answer(outcome) => Some(outcome),
                // Take-overs (fence + 1) stay on the single-row path.
                Next::TakeOver { .. } => None,
            },
            ClaimReply::Single => None,
        })
    }

    /// `complete` in a batch: the answer, or `None` for the single-row path.
    async fn complete_batched(
        &self,
        group: &Group,
        claim: ClaimRef<'_>,
        response: &StoredResponse,
    ) -> Result<Option<()>> {
        let (job, rx) = CompleteJob::new(claim, response);
        if group.completions.send(job).is_none() {
            return Ok(None);
        }
        let Ok(reply) = rx.await else { return Ok(None) };
        match reply? {
            Some(true) => Ok(Some(())),
            Some(false) => Err(Error::FenceLost { fence: claim.fence }),
            None => Ok(None),
        }
    }
}

impl Store for PgStore {
    async fn call(&self, op: Operation<'_>) -> Result<Reply> {
        match op {
            Operation::Begin(req) => self.begin_grouped(req).await.map(Reply::Begun),
            Operation::Complete { claim, response } => self
                .complete_grouped(claim, response)
                .await
                .map(|()| Reply::Done),
            op => self.inner.call(op).await,
        }
    }

    fn defer(&self, write: super::Deferred) {
        super::spawn_deferred(self.clone(), write)
    }
}

impl PgStore {
    /// `begin`, batched with others in flight when group commit is on.
    async fn begin_grouped(&self, req: BeginRequest<'_>) -> Result<BeginOutcome> {
        // Counted in flight until answered, so that others know to batch with it.
        let entered = self
            .group
            .as_deref()
            .map(|group| (group, group.claims.enter()));
        // A resumable claim stores its request: the single-row statement writes it.
        if let Some((group, entered)) = &entered
            && !entered.alone
            && req.request.is_none()
            && let Some(outcome) = self.begin_batched(group, &req).await?
        {
            return Ok(outcome);
        }
        self.inner.begin(None, &req).await
    }

    /// `complete`, batched with others in flight when group commit is on.
    async fn complete_grouped(&self, claim: ClaimRef<'_>, response: &StoredResponse) -> Result<()> {
        let entered = self
            .group
            .as_deref()
            .map(|group| (group, group.completions.enter()));
        if let Some((group, entered)) = &entered
            && !entered.alone
            && let Some(done) = self.complete_batched(group, claim, response).await?
        {
            return Ok(done);
        }
        self.inner.complete(claim, response).await
    }
}

impl PgStore {
    /// `begin` inside the caller's transaction.
    /// Inside a transaction the plain insert goes first: a first claim costs what a
    /// hand-written inbox's `INSERT … ON CONFLICT DO NOTHING` does, and a duplicate waits on
    /// the unique index, then reads the committed record.
    async fn begin_in_transaction(
        &self,
        conn: &mut PgConnection,
        req: BeginRequest<'_>,
    ) -> Result<BeginOutcome> {
        self.inner.claim_on(conn, &req).await
    }
}

sql::engine_store_api!(PgStore, PgPool, sqlx::Postgres, PgConnection);
