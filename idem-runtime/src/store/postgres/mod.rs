//! The PostgreSQL store: production, shared by any number of service instances.

mod group;
mod notify;

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use sqlx::Row as _;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions, PgRow};

use self::group::{ClaimJob, ClaimReply, CompleteJob, Group};
use crate::error::{Error, Result};
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, StoredResponse};
use crate::store::schema::Database;
use crate::store::sql::{
    self, AddColumn, Arg, Dialect, DuplicateWaits, Engine, GroupCommitStats, Next, SqlKind,
    SqlStoreBuilder, Stmt, Types, WaitingRoom, map_err,
};
use crate::store::{Changes, Operation, Reply, Store, TxStore};

pub use crate::store::sql::waits::DEFAULT_DUPLICATE_WAIT;

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
    const BYTE_ORDER: &'static str = " COLLATE \"C\"";
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

    fn purge(t: &str, expired: &str) -> Vec<Stmt> {
        vec![Stmt::plain(format!(
            "WITH gone AS (DELETE FROM {t} WHERE ctid = ANY(ARRAY( \
                   SELECT ctid FROM {t} WHERE {expired} LIMIT {}) \
                 ) RETURNING 1) \
                 SELECT count(*) AS deleted FROM gone",
            Self::PURGE_BATCH
        ))]
    }

    fn migration_start() -> Option<Stmt> {
        // `IF NOT EXISTS` on what exists already says so in a NOTICE ("column … already exists,
        // skipping"), which sqlx logs: a migration that has nothing to do stays silent, for this
        // transaction only.
        Some(Stmt::plain(format!(
            "SELECT set_config('client_min_messages', 'warning', true), \
                 pg_advisory_xact_lock({MIGRATION_LOCK})"
        )))
    }

    fn add_column(t: &str, _table: &str, column: &str, definition: &str) -> AddColumn {
        AddColumn {
            probe: None,
            alter: Stmt::plain(format!(
                "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {column} {definition}"
            )),
        }
    }

    fn up_to_date(t: &str, indexes: &[String], columns: &[&str]) -> Option<Stmt> {
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
        let has_indexes: String = indexes
            .iter()
            .map(|index| {
                format!(
                    "AND EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
                     WHERE i.indrelid = to_regclass('{t}') AND c.relname = left('{index}', 63)) "
                )
            })
            .collect();
        Some(Stmt::plain(format!(
            "SELECT (CASE WHEN to_regclass('{t}') IS NOT NULL \
                   {has_indexes}AND {has_columns} \
                 THEN 1 ELSE 0 END)::int8 AS present"
        )))
    }

    fn format_note(t: &str, _table: &str) -> Stmt {
        // `t` is a checked, quoted identifier: it can stand in a string literal.
        Stmt::plain(format!(
            "SELECT obj_description(to_regclass('{t}'), 'pg_class') AS note"
        ))
    }

    fn scope_prefix(col: &str) -> String {
        format!("split_part({col}, ':', 1)")
    }

    fn update_state_check(t: &str, table: &str) -> Option<(Stmt, Vec<Stmt>)> {
        // Today's table keeps its states in the domain `<table>_state`, whose check allows each
        // of them (`POSTGRES_RECORDS` creates it before the table). A table created before had
        // them in its own check, named `<table>_state_check` when written inline in the DDL,
        // and perhaps without a state added since: the column moves to the domain (PostgreSQL
        // rewrites the table once, checking each record's state) and the old check goes. `t` is
        // a checked, quoted identifier: it can stand in a string literal.
        let domain = sql::ddl::state_domain(table, '"');
        let check = format!("{}_state_check", sql::base_name(table));
        let probe = format!(
            "SELECT count(*)::int8 AS present FROM pg_attribute \
             WHERE attrelid = to_regclass('{t}') AND attname = 'state' AND NOT attisdropped \
             AND atttypid = to_regtype('{domain}')"
        );
        let convert = format!(
            "ALTER TABLE {t} DROP CONSTRAINT IF EXISTS \"{check}\", \
             ALTER COLUMN state TYPE {domain}"
        );
        Some((Stmt::plain(probe), vec![Stmt::plain(convert)]))
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
    /// How transactional claims meet a duplicate's transaction.
    tx: Arc<TxClaims>,
    /// Where claims this store ends are announced: within the process, and with `NOTIFY`
    /// when built with [`notify`](SqlStoreBuilder::notify).
    changes: Changes,
}

/// Transactional claims: each takes a transaction-scoped advisory lock on its identity in the
/// statement that inserts its record, so that a duplicate finds the key held without waiting on
/// the unique index (which would hold its pool connection for as long as the first transaction
/// runs). A duplicate then waits for the lock within a bound, and only so many at once.
struct TxClaims {
    /// The first claim: the insert, made only when the lock is granted; `fence` when it wrote
    /// one, no row when the lock is another transaction's or the record exists.
    claim: Stmt,
    /// The table's name, part of every lock's key.
    table: String,
    room: WaitingRoom,
}

impl TxClaims {
    fn new(table: &str, room: WaitingRoom) -> TxClaims {
        let in_progress = crate::lifecycle::State::InProgress.as_str();
        let now = Pg::NOW;
        // The lock is the condition of a `SELECT` without `FROM`, evaluated once before the
        // insert. (A `WITH` that also answered whether the lock was granted cost the server
        // 22,000 instructions a call more: `benches/pg_instructions.sh`.)
        let claim = Stmt::plain(format!(
            "INSERT INTO {table} (scope, key, fingerprint, state, fence, lease_until, \
               expires_at, request, resume_at, created_at, updated_at) \
             SELECT $1, $2, $3, '{in_progress}', {}, {}, {}, $6, \
               CASE WHEN $6::bytea IS NULL THEN NULL ELSE {now} END, {now}, {now} \
             WHERE pg_try_advisory_xact_lock($7) \
             ON CONFLICT (scope, key) DO NOTHING RETURNING fence",
            Pg::NOW_MS,
            Pg::after("$4"),
            Pg::after("$5"),
        ));
        TxClaims {
            claim,
            table: table.to_owned(),
            room,
        }
    }

    /// The advisory lock's key for an identity: 64 bits of the sha256 of the table, the scope
    /// and the key, each preceded by its length. Two identities that share it (one chance in
    /// 2^64 per pair) only make one's duplicate wait for the other's transaction.
    fn lock_key(&self, scope: &str, key: &str) -> i64 {
        let mut h = Sha256::new();
        h.update(b"idem transactional claim\0");
        for part in [self.table.as_str(), scope, key] {
            h.update((part.len() as u32).to_be_bytes());
            h.update(part.as_bytes());
        }
        let digest = h.finalize();
        i64::from_be_bytes(digest[..8].try_into().expect("a sha256 has 8 bytes"))
    }
}

pub use self::group::GroupCommit;

/// Builds a [`PgStore`]: table name, whether to create the table, group commit.
pub type PgStoreBuilder = SqlStoreBuilder<PgStore>;

/// What a [`PgStoreBuilder`] sets that other SQL stores do not have: group commit and the
/// transactional duplicates' wait, set through the builder's methods.
#[derive(Debug, Clone)]
pub struct PgOptions {
    group_commit: Option<GroupCommit>,
    waits: DuplicateWaits,
    notify: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            group_commit: Some(GroupCommit::default()),
            waits: DuplicateWaits::default(),
            notify: false,
        }
    }
}

impl sql::sealed::Sealed for PgStore {}

impl SqlKind for PgStore {
    type Options = PgOptions;
}

impl sql::sealed::WaitingKind for PgStore {
    fn waits(options: &mut PgOptions) -> &mut DuplicateWaits {
        &mut options.waits
    }
}

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
        self.options.group_commit = group_commit.into();
        self
    }

    /// A store on an existing pool.
    pub async fn build(self, pool: PgPool) -> Result<PgStore> {
        let room = WaitingRoom::new(&self.options.waits, pool.options().get_max_connections())?;
        let (inner, options) = self.open(pool.clone(), pool).await?;
        let group = match options.group_commit {
            Some(config) => Some(Arc::new(Group::new(inner.clone(), config)?)),
            None => None,
        };
        let tx = Arc::new(TxClaims::new(&inner.sql.table, room));
        let changes = if options.notify {
            notify::changes(&inner.writer, &inner.sql.table).await
        } else {
            Changes::new()
        };
        Ok(PgStore {
            inner,
            group,
            tx,
            changes,
        })
    }

    /// Connects a pool of up to 16 connections to `url` and builds the store on it.
    ///
    /// The pool pings a connection before lending it only when it has been idle for half a
    /// second or more: a connection used more recently is lent as it is, which saves a round
    /// trip per statement on a busy pool. One that the server closed in between (a restart
    /// within that half second) fails the statement it is lent for with
    /// [`Error::Unavailable`](crate::Error::Unavailable), which the caller retries, and is
    /// dropped. A pool of your own, passed to [`build`](Self::build), keeps its own settings;
    /// [`ping_when_idle`](crate::store::ping_when_idle) gives it the same.
    pub async fn connect(self, url: &str) -> Result<PgStore> {
        let pool = sql::ping_when_idle(PgPoolOptions::new())
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

    /// A store on `inner`, with group commit's and transactional duplicates' defaults.
    fn on_engine(inner: Arc<Engine<Pg>>) -> PgStore {
        let group = Group::new(inner.clone(), GroupCommit::default())
            .ok()
            .map(Arc::new);
        let room = WaitingRoom::default_for(inner.writer.options().get_max_connections());
        let tx = Arc::new(TxClaims::new(&inner.sql.table, room));
        PgStore {
            inner,
            group,
            tx,
            changes: Changes::new(),
        }
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

sql::grouped_store!(PgStore, changes);

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
    /// `begin` inside the caller's transaction. A first claim is one statement, as a
    /// hand-written inbox's `INSERT … ON CONFLICT DO NOTHING` is, which also takes the
    /// identity's transaction-scoped advisory lock. When the lock is another transaction's (a
    /// duplicate of a request still running), the duplicate waits for it within
    /// [`SqlStoreBuilder::duplicate_wait`], then decides on the committed record; it never waits
    /// on the unique index, unbounded, holding its connection.
    async fn begin_in_transaction(
        &self,
        conn: &mut PgConnection,
        req: BeginRequest<'_>,
    ) -> Result<BeginOutcome> {
        let lock = self.tx.lock_key(req.scope, req.key);
        let [scope, key, fp, lease, retain, request] = sql::Statements::claim_args(&req);
        let args = [scope, key, fp, lease, retain, request, Arg::Int(lock)];
        if let Some(row) = Pg::fetch(conn, &self.tx.claim, &args).await? {
            let fence: i64 = row.try_get("fence").map_err(map_err)?;
            self.inner.read_first.missed();
            return Ok(BeginOutcome::Claimed(crate::record::Claimed {
                fence: sql::fence_from_db(fence)?,
                reclaimed: false,
                recovery_point: None,
                attempt: 1,
            }));
        }
        // Nothing inserted: the record exists, or another transaction holds the lock. Asking
        // again tells which (this transaction's own lock is granted to it again); a lock
        // released since, by a transaction that ended, is granted too.
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
            .bind(lock)
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?;
        if got {
            // No other transaction is claiming it: decide on the record (or claim the key, if
            // the transaction that held it rolled back).
            return self.inner.claim_on(conn, &req).await;
        }
        self.wait_for_claimer(conn, lock, &req).await
    }

    /// Another transaction holds the identity's lock: wait for it within the bound (one of at
    /// most `waiting_duplicates`), then claim or replay as its end decides; "in progress" when
    /// the bound runs out or too many wait already.
    async fn wait_for_claimer(
        &self,
        conn: &mut PgConnection,
        lock: i64,
        req: &BeginRequest<'_>,
    ) -> Result<BeginOutcome> {
        let busy = self.tx.room.busy();
        let Some(_waiting) = self.tx.room.enter(req) else {
            return Ok(busy);
        };
        // The bound applies to this wait only: the caller's setting comes back after it.
        let previous: String = sqlx::query_scalar(
            // `s` reads `p`, so the setting is read before it is changed.
            "WITH p AS MATERIALIZED (SELECT current_setting('lock_timeout') AS previous), \
             s AS MATERIALIZED (SELECT set_config('lock_timeout', $1, true) FROM p) \
             SELECT previous FROM p, s",
        )
        .bind(format!("{}ms", self.tx.room.wait.as_millis().max(1)))
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
        let waited = sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(lock)
            .execute(&mut *conn)
            .await;
        match waited {
            Ok(_) => {}
            // The bound ran out (the transaction is aborted now; the caller rolls it back).
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
                return Ok(busy);
            }
            Err(e) => return Err(map_err(e)),
        }
        sqlx::query("SELECT set_config('lock_timeout', $1, true)")
            .bind(previous)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        // The first transaction ended: its record is committed (a replay, or one to take
        // over) or gone (rolled back: claim it).
        self.inner.claim_on(conn, req).await
    }
}

sql::engine_store_api!(PgStore, PgPool, sqlx::Postgres, PgConnection);
