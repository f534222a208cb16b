//! Group commit for the PostgreSQL store ([`GroupCommit`]): claims and completions of concurrent
//! requests share one statement, and so one commit.
//!
//! Each kind (claims, completions) has a lane: a task fed by a channel. A caller that finds
//! enough other callers of its kind in flight ([`GroupCommit::min_in_flight`]) sends its request
//! and awaits its own answer; under lighter load a caller runs the single-row statement itself,
//! so a lone request is never batched and never waits. The task takes everything queued, waits at most `max_wait` for callers already on
//! their way (never when none are), and runs the batch as one statement on a connection of the
//! store's pool, at most `batches_in_flight` batches at a time: while they run, the next batch
//! gathers.
//!
//! The batch statement keeps the single-row statement's semantics per record. Anything it does
//! not settle — a take-over (fence + 1), a record a concurrent claim committed after the
//! statement's snapshot, a second request for a key already in the batch, a deadlock — is
//! answered "do it yourself", and that caller runs the single-row path. A failed batch answers
//! every caller with the error, as `Unavailable` when it is transient.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, SqlSafeStr as _, SqlStr};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::Pg;
use crate::error::{Error, Result};
use crate::lifecycle::State;
use crate::record::{ClaimRef, Claimed, StoredResponse};
use crate::store::sql::{
    Columns as _, CurRow, Dialect, Engine, GroupCommitStats, InFlight, InFlightCount, LaneSender,
    fence_to_db, map_err, ms, quote_table,
};

/// Group commit for [`PgStore`](crate::PgStore): concurrent claims share one multi-row claim
/// statement, and concurrent completions one `UPDATE`, so that N requests cost one commit
/// instead of N. Set it with
/// [`PgStoreBuilder::group_commit`](crate::store::SqlStoreBuilder::group_commit); off by
/// default.
///
/// Under light load nothing is batched: a request that finds fewer than
/// [`min_in_flight`](Self::min_in_flight) requests of its kind in flight (itself included) runs
/// the single-row statement as without group commit. A request that finds more joins the next
/// batch; the batch waits at most
/// [`max_wait`](Self::max_wait) for requests already on their way, and holds at most
/// [`max_batch`](Self::max_batch) requests. Transactional guards (`begin_in`, `complete_in`)
/// are never batched, and neither are take-overs, releases and checkpoints.
///
/// ```no_run
/// # async fn f() -> idem::Result<()> {
/// use idem::{GroupCommit, PgStore};
/// use std::time::Duration;
///
/// let store = PgStore::builder()
///     .group_commit(GroupCommit::default().max_wait(Duration::from_micros(200)))
///     .connect("postgres://postgres@127.0.0.1/app")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommit {
    max_wait: Duration,
    max_batch: usize,
    batches_in_flight: usize,
    min_in_flight: usize,
    batch_alone: bool,
}

impl Default for GroupCommit {
    /// `max_wait` 200 µs, `max_batch` 64, two batches in flight per kind, batching from
    /// [`DEFAULT_MIN_IN_FLIGHT`](Self::DEFAULT_MIN_IN_FLIGHT) requests of a kind in flight.
    fn default() -> Self {
        GroupCommit {
            max_wait: Duration::from_micros(200),
            max_batch: 64,
            batches_in_flight: 2,
            min_in_flight: Self::DEFAULT_MIN_IN_FLIGHT,
            batch_alone: false,
        }
    }
}

impl GroupCommit {
    /// How many requests of a kind must be in flight before they are batched, by default:
    /// below it, a batch's wait and its larger statement cost more than the commits they save.
    pub const DEFAULT_MIN_IN_FLIGHT: usize = 12;

    /// How many requests of a kind (claims, completions) must be in flight, this one included,
    /// before a request joins a batch instead of running its own statement (default
    /// [`DEFAULT_MIN_IN_FLIGHT`](Self::DEFAULT_MIN_IN_FLIGHT), at least 2). Under light load every
    /// request runs alone, as without group commit.
    pub fn min_in_flight(mut self, requests: usize) -> Self {
        self.min_in_flight = requests.max(2);
        self
    }

    /// The longest a batch waits for requests already in flight before it runs (default
    /// 200 µs). It never waits when no other request is on its way; zero never waits.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The most requests in one statement (default 64, at least 1).
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }

    /// How many batches of one kind may run at once, each on a connection of its own (default
    /// 2, at least 1). Requests arriving while they run gather into the next batch.
    pub fn batches_in_flight(mut self, batches: usize) -> Self {
        self.batches_in_flight = batches.max(1);
        self
    }

    /// Tests only: send even a lone request through the batch statements, so that sequential
    /// test cases exercise them.
    #[doc(hidden)]
    pub fn batch_alone(mut self, batch_alone: bool) -> Self {
        self.batch_alone = batch_alone;
        self
    }
}

/// The two lanes of one store.
pub(crate) struct Group {
    pub(crate) claims: Lane<ClaimJob>,
    pub(crate) completions: Lane<CompleteJob>,
}

impl Group {
    pub(crate) fn stats(&self) -> GroupCommitStats {
        let (c, k) = (&self.claims.shared, &self.completions.shared);
        GroupCommitStats {
            claim_batches: c.batches.load(Ordering::Relaxed),
            claims_batched: c.batched.load(Ordering::Relaxed),
            completion_batches: k.batches.load(Ordering::Relaxed),
            completions_batched: k.batched.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn new(engine: Arc<Engine<Pg>>, config: GroupCommit) -> Result<Group> {
        let (claim, complete) = statements(&engine.sql.table)?;
        Ok(Group {
            claims: Lane::new(engine.clone(), claim, config),
            completions: Lane::new(engine, complete, config),
        })
    }
}

/// The batch statements: the multi-row claim and the multi-row completion.
fn statements(table: &str) -> Result<(SqlStr, SqlStr)> {
    let t = quote_table(table, Pg::QUALIFIED_TABLES)?;
    let now = Pg::NOW;
    let in_progress = State::InProgress.as_str();
    let completed = State::Completed.as_str();
    let holds = crate::store::sql::holds_work();
    // The request columns are named apart from the table's, so that the table's columns read
    // unqualified exactly as in the single-row statement.
    let claim = format!(
        "WITH req AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::int8[], \
           $5::int8[]) WITH ORDINALITY AS r(r_scope, r_key, r_fingerprint, r_lease, r_retain, i)), \
         cur AS (SELECT req.i, fence, fingerprint, state, response_status, response_error, \
           response_body, (expires_at <= {now} AND NOT {holds}) AS expired, \
           {} AS lease_left_ms, \
           {} AS lease_stamp \
           FROM req JOIN {t} ON scope = req.r_scope AND key = req.r_key), \
         ins AS (INSERT INTO {t} (scope, key, fingerprint, state, fence, lease_until, \
           expires_at, created_at, updated_at) \
           SELECT r_scope, r_key, r_fingerprint, '{in_progress}', {}, {}, {}, {now}, {now} \
           FROM req WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.i = req.i) \
           ORDER BY r_scope, r_key \
           ON CONFLICT (scope, key) DO NOTHING RETURNING scope, key, fence) \
         SELECT req.i, true AS inserted, ins.fence, NULL::bytea AS fingerprint, \
                NULL::text AS state, NULL::int4 AS response_status, false AS response_error, \
                NULL::bytea AS response_body, false AS expired, 0::int8 AS lease_left_ms, \
                0::int8 AS lease_stamp \
           FROM ins JOIN req ON req.r_scope = ins.scope AND req.r_key = ins.key \
         UNION ALL \
         SELECT i, false, fence, fingerprint, state, response_status, response_error, \
                response_body, expired, lease_left_ms, lease_stamp \
           FROM cur",
        Pg::ms_until("lease_until"),
        Pg::stamp("lease_until"),
        Pg::NOW_MS,
        Pg::after("r_lease"),
        Pg::after("r_retain"),
    );
    // As the single-row completion: only the live claim with this fence is completed.
    let complete = format!(
        "UPDATE {t} AS t SET state = '{completed}', response_status = r.r_status, \
           response_error = r.r_error, response_body = r.r_body, recovery_point = NULL, \
           request = NULL, resume_at = NULL, note = NULL, updated_at = {now} \
         FROM unnest($1::text[], $2::text[], $3::int8[], $4::int4[], $5::boolean[], \
           $6::bytea[]) WITH ORDINALITY AS r(r_scope, r_key, r_fence, r_status, r_error, r_body, i) \
         WHERE t.scope = r.r_scope AND t.key = r.r_key AND t.fence = r.r_fence \
           AND t.state = '{in_progress}' \
           AND (t.expires_at > {now} OR t.request IS NOT NULL OR t.note IS NOT NULL) \
         RETURNING r.i"
    );
    Ok((
        AssertSqlSafe(claim).into_sql_str(),
        AssertSqlSafe(complete).into_sql_str(),
    ))
}

/// A job of a lane: a request and where to send its answer.
pub(crate) trait Job: Send + Sized + 'static {
    /// The record it is about: two jobs on one record never share a batch.
    fn record(&self) -> (&str, &str);
    /// Answers "run the single-row path".
    fn single(self);
    /// Answers the error of its batch.
    fn fail(self, e: Error);
    /// Runs `batch` (records all distinct) and answers each job.
    fn run(
        lane: &LaneShared,
        batch: Vec<Self>,
    ) -> impl Future<Output = std::result::Result<(), (Vec<Self>, sqlx::Error)>> + Send;
}

/// What a lane's task shares with its callers.
pub(crate) struct LaneShared {
    engine: Arc<Engine<Pg>>,
    sql: SqlStr,
    config: GroupCommit,
    /// Callers of this kind between entering and being answered.
    in_flight: InFlightCount,
    /// Requests in batches now running.
    running: AtomicUsize,
    /// Batches run, and the requests they held, since the store was built.
    batches: AtomicU64,
    batched: AtomicU64,
}

/// One kind of request, batched.
pub(crate) struct Lane<J> {
    shared: Arc<LaneShared>,
    tx: LaneSender<J>,
}

impl<J: Job> Lane<J> {
    fn new(engine: Arc<Engine<Pg>>, sql: SqlStr, config: GroupCommit) -> Lane<J> {
        Lane {
            shared: Arc::new(LaneShared {
                engine,
                sql,
                config,
                in_flight: InFlightCount::default(),
                running: AtomicUsize::new(0),
                batches: AtomicU64::new(0),
                batched: AtomicU64::new(0),
            }),
            tx: LaneSender::new(),
        }
    }

    /// Counts a caller in. It batches when, with it, at least `min_in_flight` callers of its
    /// kind are in flight.
    pub(crate) fn enter(&self) -> InFlight<'_> {
        let config = &self.shared.config;
        let from = if config.batch_alone {
            1
        } else {
            config.min_in_flight
        };
        self.shared.in_flight.enter(from)
    }

    /// Queues `job`; `None` when there is no runtime to batch on (the caller runs the
    /// single-row path).
    pub(crate) fn send(&self, job: J) -> Option<()> {
        self.tx
            .send(job, |receiver| run_lane(self.shared.clone(), receiver))
    }
}

/// A lane's task: gathers batches and runs them, at most `batches_in_flight` at a time. It ends
/// when the store is dropped (its sender with it).
async fn run_lane<J: Job>(shared: Arc<LaneShared>, mut rx: mpsc::UnboundedReceiver<J>) {
    let permits = Arc::new(Semaphore::new(shared.config.batches_in_flight));
    let max = shared.config.max_batch;
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < max {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // Callers counted in but neither in this batch nor in a running one are on their way
        // (between entering and sending): give them up to `max_wait`, yielding so they can
        // run. No one on the way, no wait.
        let deadline = Instant::now() + shared.config.max_wait;
        while batch.len() < max
            && shared.in_flight.0.load(Ordering::Acquire)
                > batch.len() + shared.running.load(Ordering::Acquire)
            && Instant::now() < deadline
        {
            tokio::task::yield_now().await;
            while batch.len() < max {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
        }
        let n = batch.len();
        shared.running.fetch_add(n, Ordering::AcqRel);
        shared.batches.fetch_add(1, Ordering::Relaxed);
        shared.batched.fetch_add(n as u64, Ordering::Relaxed);
        let shared = shared.clone();
        tokio::spawn(async move {
            run_batch(&shared, batch).await;
            shared.running.fetch_sub(n, Ordering::AcqRel);
            drop(permit);
        });
    }
}

/// Runs one batch: one statement for its distinct records; a second request for a record
/// already in the batch goes the single-row way.
async fn run_batch<J: Job>(shared: &LaneShared, batch: Vec<J>) {
    let mut seen: HashSet<(String, String)> = HashSet::with_capacity(batch.len());
    let mut unique = Vec::with_capacity(batch.len());
    for job in batch {
        let (scope, key) = job.record();
        if seen.insert((scope.to_owned(), key.to_owned())) {
            unique.push(job);
        } else {
            job.single();
        }
    }
    if let Err((jobs, e)) = J::run(shared, unique).await {
        // A deadlock or serialization failure rolled the statement back: each request on its
        // own cannot deadlock. Anything else is each caller's error.
        let retry = matches!(&e, sqlx::Error::Database(db)
            if db.code().is_some_and(|c| c == "40P01" || c == "40001"));
        let text = e.to_string();
        let transient = matches!(map_err(e), Error::Unavailable(_));
        for job in jobs {
            if retry {
                job.single();
            } else if transient {
                job.fail(Error::Unavailable(
                    format!("group commit batch failed: {text}").into(),
                ));
            } else {
                job.fail(Error::Store(
                    format!("group commit batch failed: {text}").into(),
                ));
            }
        }
    }
}

/// What a batched claim answers its caller.
pub(crate) enum ClaimReply {
    /// A first claim.
    Claimed(Claimed),
    /// The record exists: the caller decides on it (and takes it over on the single-row path).
    Found(CurRow),
    /// Run the single-row path.
    Single,
}

/// A claim waiting for its batch.
pub(crate) struct ClaimJob {
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) fingerprint: [u8; 32],
    pub(crate) lease: Duration,
    pub(crate) retain: Duration,
    pub(crate) reply: oneshot::Sender<Result<ClaimReply>>,
}

impl Job for ClaimJob {
    fn record(&self) -> (&str, &str) {
        (&self.scope, &self.key)
    }

    fn single(self) {
        let _ = self.reply.send(Ok(ClaimReply::Single));
    }

    fn fail(self, e: Error) {
        let _ = self.reply.send(Err(e));
    }

    async fn run(
        lane: &LaneShared,
        batch: Vec<Self>,
    ) -> std::result::Result<(), (Vec<Self>, sqlx::Error)> {
        let scopes: Vec<&str> = batch.iter().map(|j| j.scope.as_str()).collect();
        let keys: Vec<&str> = batch.iter().map(|j| j.key.as_str()).collect();
        let fps: Vec<&[u8]> = batch.iter().map(|j| &j.fingerprint[..]).collect();
        let leases: Vec<i64> = batch.iter().map(|j| ms(j.lease)).collect();
        let retains: Vec<i64> = batch.iter().map(|j| ms(j.retain)).collect();
        let query = sqlx::query(lane.sql.clone())
            .bind(scopes)
            .bind(keys)
            .bind(fps)
            .bind(leases)
            .bind(retains);
        let rows = match fetch(lane, query).await {
            Ok(rows) => rows,
            Err(e) => return Err((batch, e)),
        };
        let mut answers: Vec<Option<Result<ClaimReply>>> = batch.iter().map(|_| None).collect();
        for row in &rows {
            let Some((slot, job)) =
                position(row).and_then(|i| Some((answers.get_mut(i)?, batch.get(i)?)))
            else {
                continue;
            };
            *slot = Some(claim_answer(row, job));
        }
        for (job, answer) in batch.into_iter().zip(answers) {
            // No row: a concurrent first claim committed after the statement's snapshot (the
            // insert waited for it, then did nothing). The single-row path sees it.
            let answer = answer.unwrap_or(Ok(ClaimReply::Single));
            let fence = match &answer {
                Ok(ClaimReply::Claimed(c)) => Some(c.fence),
                _ => None,
            };
            if job.reply.send(answer).is_err()
                && let Some(fence) = fence
            {
                // The caller is gone: nobody will run the body, so free the record now rather
                // than when its lease runs out.
                let engine = EngineStore(lane.engine.clone());
                crate::store::spawn_deferred(
                    engine,
                    crate::store::Deferred {
                        scope: job.scope,
                        key: job.key,
                        fence,
                        write: crate::store::DeferredWrite::Release,
                    },
                );
            }
        }
        Ok(())
    }
}

/// The engine as a store, for the writes a batch defers (a claim whose caller went away):
/// every operation but `begin`, which the store answers itself.
struct EngineStore(Arc<Engine<Pg>>);

impl crate::store::Store for EngineStore {
    fn call<'a>(
        &'a self,
        op: crate::store::Operation<'a>,
    ) -> impl Future<Output = Result<crate::store::Reply>> + Send + 'a {
        self.0.call(op)
    }

    fn defer(&self, write: crate::store::Deferred) {
        crate::store::spawn_deferred(EngineStore(self.0.clone()), write)
    }
}

/// Runs a batch's statement on a writer connection.
async fn fetch<'q>(
    lane: &LaneShared,
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> std::result::Result<Vec<PgRow>, sqlx::Error> {
    let mut conn = lane.engine.writer.acquire().await?;
    query.fetch_all(&mut *conn).await
}

/// The job a row of a batch answers: its `i`, the 1-based ordinal of the job's arrays.
fn position(row: &PgRow) -> Option<usize> {
    row.int8("i").ok().and_then(|i| usize::try_from(i - 1).ok())
}

fn claim_answer(row: &PgRow, job: &ClaimJob) -> Result<ClaimReply> {
    if row.boolean("inserted").map_err(map_err)? {
        Ok(ClaimReply::Claimed(Engine::<Pg>::first_claim(row)?))
    } else {
        Ok(ClaimReply::Found(CurRow::read(row, &job.scope, &job.key)?))
    }
}

/// A completion waiting for its batch: `Ok(Some(true))` completed by the batch, `Ok(None)` run
/// the single-row path, which tells a lost fence from a repeat of a completion whose reply was
/// lost. (`Ok(Some(false))`, the fence is lost, is the single-row path's answer, never a
/// batch's.)
pub(crate) struct CompleteJob {
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) fence: u64,
    pub(crate) response: StoredResponse,
    pub(crate) reply: oneshot::Sender<Result<Option<bool>>>,
}

impl CompleteJob {
    pub(crate) fn new(
        claim: ClaimRef<'_>,
        response: &StoredResponse,
    ) -> (CompleteJob, oneshot::Receiver<Result<Option<bool>>>) {
        let (reply, rx) = oneshot::channel();
        (
            CompleteJob {
                scope: claim.scope.to_owned(),
                key: claim.key.to_owned(),
                fence: claim.fence,
                response: response.clone(),
                reply,
            },
            rx,
        )
    }
}

impl Job for CompleteJob {
    fn record(&self) -> (&str, &str) {
        (&self.scope, &self.key)
    }

    fn single(self) {
        let _ = self.reply.send(Ok(None));
    }

    fn fail(self, e: Error) {
        let _ = self.reply.send(Err(e));
    }

    async fn run(
        lane: &LaneShared,
        batch: Vec<Self>,
    ) -> std::result::Result<(), (Vec<Self>, sqlx::Error)> {
        let scopes: Vec<&str> = batch.iter().map(|j| j.scope.as_str()).collect();
        let keys: Vec<&str> = batch.iter().map(|j| j.key.as_str()).collect();
        let fences: Vec<i64> = batch.iter().map(|j| fence_to_db(j.fence)).collect();
        let statuses: Vec<Option<i32>> = batch
            .iter()
            .map(|j| j.response.status.map(i32::from))
            .collect();
        let errors: Vec<bool> = batch.iter().map(|j| j.response.is_error).collect();
        let bodies: Vec<&[u8]> = batch.iter().map(|j| &j.response.body[..]).collect();
        let query = sqlx::query(lane.sql.clone())
            .bind(scopes)
            .bind(keys)
            .bind(fences)
            .bind(statuses)
            .bind(errors)
            .bind(bodies);
        let rows = match fetch(lane, query).await {
            Ok(rows) => rows,
            Err(e) => return Err((batch, e)),
        };
        let mut done = vec![false; batch.len()];
        for row in &rows {
            if let Some(slot) = position(row).and_then(|i| done.get_mut(i)) {
                *slot = true;
            }
        }
        for (job, done) in batch.into_iter().zip(done) {
            // Not completed by the batch: the fence is lost, or this completion is a repeat of
            // one whose reply was lost. The single-row statement tells the two apart.
            let _ = job.reply.send(Ok(done.then_some(true)));
        }
        Ok(())
    }
}
