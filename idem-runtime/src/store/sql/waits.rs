//! How a transactional duplicate waits for the transaction that holds its key, on the SQL
//! stores whose database bounds a lock wait (PostgreSQL, MySQL): the builder's two settings,
//! their check, and the waiting room that lets only so many duplicates wait at once.

use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::error::{Error, Result};
use crate::record::{BeginOutcome, BeginRequest};

use super::{SqlKind, SqlStoreBuilder, sealed};

/// How long a transactional duplicate waits by default for the transaction that holds its key
/// ([`SqlStoreBuilder::duplicate_wait`]).
pub const DEFAULT_DUPLICATE_WAIT: Duration = Duration::from_secs(2);

/// The longest [`SqlStoreBuilder::duplicate_wait`] accepted: a minute.
const MAX_DUPLICATE_WAIT: Duration = Duration::from_secs(60);

/// The builder's settings for transactional duplicates.
#[derive(Debug, Clone)]
pub struct DuplicateWaits {
    wait: Duration,
    waiters: Option<usize>,
}

impl Default for DuplicateWaits {
    fn default() -> Self {
        DuplicateWaits {
            wait: DEFAULT_DUPLICATE_WAIT,
            waiters: None,
        }
    }
}

impl<S: SqlKind + sealed::WaitingKind> SqlStoreBuilder<S> {
    /// How long a duplicate of a request running in transactional mode waits for the first
    /// request's transaction (default two seconds, [`DEFAULT_DUPLICATE_WAIT`]; at most a
    /// minute; MySQL counts its lock waits in whole seconds, so there it is rounded up): when
    /// it commits within the bound, the duplicate replays its answer; when it rolls back, the
    /// duplicate claims; when the bound runs out, the duplicate is answered "in progress" (409
    /// with `Retry-After`) and its transaction rolls back, giving its connection back to the
    /// pool. `Duration::ZERO` answers "in progress" at once. A waiting duplicate holds a pool
    /// connection, so only [`waiting_duplicates`](Self::waiting_duplicates) of them wait at
    /// once; the others are answered "in progress" at once.
    pub fn duplicate_wait(mut self, wait: Duration) -> Self {
        S::waits(&mut self.options).wait = wait;
        self
    }

    /// How many transactional duplicates may wait at once
    /// ([`duplicate_wait`](Self::duplicate_wait)); default a quarter of the pool's
    /// connections, at least one. Past it, a duplicate is answered "in progress" at once, so
    /// that retries of one slow request can never take the pool from every other key.
    pub fn waiting_duplicates(mut self, duplicates: usize) -> Self {
        S::waits(&mut self.options).waiters = Some(duplicates);
        self
    }
}

/// Where transactional duplicates wait: the bound, and a place for each of at most so many.
pub(crate) struct WaitingRoom {
    /// How long one waits.
    pub(crate) wait: Duration,
    places: Semaphore,
    limit: usize,
}

impl WaitingRoom {
    /// The room `waits` asks for, beside a pool of `connections`; an error for a bound past
    /// the longest accepted.
    pub(crate) fn new(waits: &DuplicateWaits, connections: u32) -> Result<WaitingRoom> {
        let wait = waits.wait;
        if wait > MAX_DUPLICATE_WAIT {
            return Err(Error::Config(format!(
                "a transactional duplicate waits at most {MAX_DUPLICATE_WAIT:?}, not {wait:?}: past that, answer it \"in progress\" and let the client retry"
            )));
        }
        let limit = waits.waiters.unwrap_or((connections as usize / 4).max(1));
        Ok(WaitingRoom {
            wait,
            places: Semaphore::new(limit),
            limit,
        })
    }

    /// The defaults' room, beside a pool of `connections`.
    pub(crate) fn default_for(connections: u32) -> WaitingRoom {
        WaitingRoom::new(&DuplicateWaits::default(), connections)
            .expect("the default wait is within the bound")
    }

    /// What a duplicate that does not wait, or waited in vain, is answered.
    pub(crate) fn busy(&self) -> BeginOutcome {
        BeginOutcome::InProgress {
            retry_after: self.wait.max(Duration::from_secs(1)),
        }
    }

    /// A place to wait for `req`'s duplicate, held while it waits; `None` when it is to be
    /// answered "in progress" at once: the bound is zero, or as many wait already.
    pub(crate) fn enter(&self, req: &BeginRequest<'_>) -> Option<SemaphorePermit<'_>> {
        if self.wait.is_zero() {
            return None;
        }
        let place = self.places.try_acquire().ok();
        if place.is_none() {
            tracing::debug!(target: "idem", scope = req.scope, key = req.key, waiting = self.limit, "a transactional duplicate is answered in progress at once: as many wait already");
        }
        place
    }
}
