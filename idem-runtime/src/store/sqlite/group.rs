//! Group commit for the SQLite store: the first claims and completions of concurrent requests
//! share one transaction on the single writer, and so one commit and one turn of the writer
//! connection, instead of one each.
//!
//! A request that finds another write of the store in flight sends its statement to the lane, a
//! task fed by a channel, and awaits its own answer; a lone request runs its statement itself, so
//! that under light load nothing changes. The lane takes everything queued, runs it on the writer
//! (in one `BEGIN IMMEDIATE` … `COMMIT` when there is more than one), and answers each request
//! once the commit is done; while it runs, the next batch gathers.
//!
//! Each request runs exactly the statement it would run alone, so its meaning per record is the
//! single-row path's. What a batch does not settle, it answers "do it yourself", and that caller
//! runs the single-row path: a claim whose key exists (a replay, a duplicate, a take-over), and
//! every request of a batch in which a statement or the commit failed (the transaction rolls
//! back, so none of them was written).

use std::sync::{Arc, Mutex};

use sqlx::SqliteConnection;
use tokio::sync::{mpsc, oneshot};

use super::Lite;
use crate::error::{Error, Result};
use crate::record::{BeginRequest, ClaimRef, Claimed, StoredResponse};
use crate::store::sql::{
    Dialect as _, Engine, GroupCommitStats, InFlight, InFlightCount, LaneSender, Statements,
};
use crate::{Fingerprint, Policy};

/// The most requests one transaction holds.
const MAX_BATCH: usize = 64;

/// A request sent to the lane, and where its answer goes: `None` for "do it yourself".
enum Job {
    Claim {
        scope: String,
        key: String,
        fingerprint: Fingerprint,
        policy: Policy,
        reply: oneshot::Sender<Option<Result<Claimed>>>,
    },
    Complete {
        scope: String,
        key: String,
        fence: u64,
        response: StoredResponse,
        reply: oneshot::Sender<Option<Result<()>>>,
    },
}

impl Job {
    /// Answers "run the single-row path".
    fn single(self) {
        match self {
            Job::Claim { reply, .. } => drop(reply.send(None)),
            Job::Complete { reply, .. } => drop(reply.send(None)),
        }
    }
}

/// What one job's statement did, before the commit.
enum Done {
    Claimed(Result<Claimed>),
    /// The key exists: its caller decides on the record itself.
    Exists,
    Completed(Result<()>),
}

/// The writes of one store, batched.
pub(crate) struct Group {
    engine: Arc<Engine<Lite>>,
    /// Writes of this store between entering and being answered.
    in_flight: InFlightCount,
    /// How many writes must be in flight, this one included, before one joins a batch.
    min_in_flight: usize,
    /// What transactions of more than one write held.
    stats: Mutex<GroupCommitStats>,
    tx: LaneSender<Job>,
}

impl Group {
    pub(crate) fn new(engine: Arc<Engine<Lite>>, min_in_flight: usize) -> Group {
        Group {
            engine,
            in_flight: InFlightCount::default(),
            min_in_flight: min_in_flight.max(1),
            stats: Mutex::new(GroupCommitStats::default()),
            tx: LaneSender::new(),
        }
    }

    /// What transactions of more than one write held, so far.
    pub(crate) fn stats(&self) -> GroupCommitStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a write in; it batches when, with it, `min_in_flight` writes are in flight.
    pub(crate) fn enter(&self) -> InFlight<'_> {
        self.in_flight.enter(self.min_in_flight)
    }

    /// Queues `job`; `None` when there is no runtime to run the lane on.
    fn send(self: &Arc<Self>, job: Job) -> Option<()> {
        self.tx
            .send(job, |receiver| run_lane(Arc::downgrade(self), receiver))
    }

    /// A first claim through the lane: `None` when the caller runs the single-row path.
    pub(crate) async fn claim(self: &Arc<Self>, req: &BeginRequest<'_>) -> Option<Result<Claimed>> {
        let (reply, answer) = oneshot::channel();
        let job = Job::Claim {
            scope: req.scope.to_owned(),
            key: req.key.to_owned(),
            fingerprint: *req.fingerprint,
            policy: *req.policy,
            reply,
        };
        self.send(job)?;
        // A lane that ended without answering (its runtime shut down) wrote nothing it did
        // not answer: its transaction rolled back.
        answer.await.ok().flatten()
    }

    /// A completion through the lane: `None` when the caller runs the single-row path.
    pub(crate) async fn complete(
        self: &Arc<Self>,
        claim: ClaimRef<'_>,
        response: &StoredResponse,
    ) -> Option<Result<()>> {
        let (reply, answer) = oneshot::channel();
        let job = Job::Complete {
            scope: claim.scope.to_owned(),
            key: claim.key.to_owned(),
            fence: claim.fence,
            response: response.clone(),
            reply,
        };
        self.send(job)?;
        answer.await.ok().flatten()
    }

    /// Counts a committed transaction of more than one write.
    fn count(&self, batch: &[Job]) {
        let claims = batch
            .iter()
            .filter(|job| matches!(job, Job::Claim { .. }))
            .count() as u64;
        let completions = batch.len() as u64 - claims;
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.claim_batches += u64::from(claims > 0);
        stats.claims_batched += claims;
        stats.completion_batches += u64::from(completions > 0);
        stats.completions_batched += completions;
    }
}

/// The lane: takes what is queued and runs it, one batch at a time (the writer is one
/// connection). It ends when the store is dropped.
async fn run_lane(group: std::sync::Weak<Group>, mut rx: mpsc::UnboundedReceiver<Job>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let Some(group) = group.upgrade() else {
            batch.into_iter().for_each(Job::single);
            return;
        };
        run_batch(&group, batch).await;
    }
}

/// Runs `batch` on the writer, in one transaction when it holds more than one request, and
/// answers each request once it is committed.
async fn run_batch(group: &Group, batch: Vec<Job>) {
    let engine = &group.engine;
    let done = match batch.len() {
        1 => match engine.write_conn().await {
            Ok(mut conn) => run_jobs(engine, &mut conn, &batch).await,
            Err(_) => None,
        },
        _ => match engine.begin_transaction().await {
            // Dropped without its commit, the transaction rolls back.
            Ok(mut tx) => match run_jobs(engine, &mut tx, &batch).await {
                Some(done) if tx.commit().await.is_ok() => {
                    group.count(&batch);
                    Some(done)
                }
                _ => None,
            },
            Err(_) => None,
        },
    };
    let Some(done) = done else {
        // Nothing of the batch was written: each caller runs its own statement.
        batch.into_iter().for_each(Job::single);
        return;
    };
    for (job, done) in batch.into_iter().zip(done) {
        match (job, done) {
            (Job::Claim { reply, .. }, Done::Claimed(claimed)) => drop(reply.send(Some(claimed))),
            (Job::Complete { reply, .. }, Done::Completed(r)) => drop(reply.send(Some(r))),
            (job, _) => job.single(),
        }
    }
}

/// Each job's statement on `conn`, in order; `None` when one failed.
async fn run_jobs(
    engine: &Engine<Lite>,
    conn: &mut SqliteConnection,
    batch: &[Job],
) -> Option<Vec<Done>> {
    let mut done = Vec::with_capacity(batch.len());
    for job in batch {
        done.push(match job {
            Job::Claim {
                scope,
                key,
                fingerprint,
                policy,
                ..
            } => {
                let req = BeginRequest::new(scope, key, fingerprint, policy);
                let args = Statements::claim_args(&req);
                match Lite::fetch(conn, &engine.sql.insert, &args).await.ok()? {
                    Some(row) => {
                        engine.read_first.missed();
                        Done::Claimed(Engine::<Lite>::first_claim(&row))
                    }
                    None => Done::Exists,
                }
            }
            Job::Complete {
                scope,
                key,
                fence,
                response,
                ..
            } => {
                let claim = ClaimRef {
                    scope,
                    key,
                    fence: *fence,
                };
                match engine.complete_on(conn, claim, response).await {
                    Ok(()) => Done::Completed(Ok(())),
                    // The statement ran and matched nothing: the claim's answer, not a failure.
                    Err(lost @ Error::FenceLost { .. }) => Done::Completed(Err(lost)),
                    Err(_) => return None,
                }
            }
        });
    }
    Some(done)
}
