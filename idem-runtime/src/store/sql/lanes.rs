//! What the stores that batch writes share: the count of writes in flight that decides whether
//! a write joins a batch, a lane's channel (its task started on first use), and the counts of
//! what was batched.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

/// How much group commit batched, since the store was built:
/// [`PgStore::group_commit_stats`](crate::PgStore::group_commit_stats) and
/// `SqliteStore::group_commit_stats`. A batch is one statement on PostgreSQL and one
/// transaction on SQLite, where one batch may hold claims and completions both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCommitStats {
    /// Batches that held claims.
    pub claim_batches: u64,
    /// Claims that went through a batch.
    pub claims_batched: u64,
    /// Batches that held completions.
    pub completion_batches: u64,
    /// Completions that went through a batch.
    pub completions_batched: u64,
}

/// Writes of one kind in flight: counted from entering until answered (or dropped). A lane
/// that waits for callers on their way reads the count itself.
#[derive(Debug, Default)]
pub(crate) struct InFlightCount(pub(crate) AtomicUsize);

/// A write in flight, counted until it is answered (or dropped).
pub(crate) struct InFlight<'a> {
    count: &'a InFlightCount,
    /// Fewer writes than the threshold were in flight with it: run the single-row path.
    pub(crate) alone: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl InFlightCount {
    /// Counts a write in; it is `alone` when, with it, fewer than `min_in_flight` are in
    /// flight.
    pub(crate) fn enter(&self, min_in_flight: usize) -> InFlight<'_> {
        let before = self.0.fetch_add(1, Ordering::AcqRel);
        InFlight {
            count: self,
            alone: before + 1 < min_in_flight,
        }
    }
}

/// The sending side of a lane: its task is started on first use, on the caller's runtime, and
/// again if that runtime shut down (its task with it).
pub(crate) struct LaneSender<J>(Mutex<Option<mpsc::UnboundedSender<J>>>);

impl<J: Send + 'static> LaneSender<J> {
    pub(crate) fn new() -> LaneSender<J> {
        LaneSender(Mutex::new(None))
    }

    /// Queues `job`, starting the lane's task with `start` when none runs; `None` when there is
    /// no runtime to run it on (the caller runs the single-row path).
    pub(crate) fn send<F>(
        &self,
        job: J,
        start: impl FnOnce(mpsc::UnboundedReceiver<J>) -> F,
    ) -> Option<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut tx = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let job = match tx.as_ref() {
            Some(sender) => match sender.send(job) {
                Ok(()) => return Some(()),
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let (sender, receiver) = mpsc::unbounded_channel();
        rt.spawn(start(receiver));
        let sent = sender.send(job).is_ok();
        *tx = Some(sender);
        sent.then_some(())
    }
}
