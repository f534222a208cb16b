//! Purging expired records in the background.
//!
//! The SQL stores purge by themselves: each store started by its builder (or `new`) runs one
//! purge task, shared by all its clones, once a minute unless told otherwise
//! (`SqlStoreBuilder::purge_every`, `SqlStoreBuilder::background_purge`), and the task ends when
//! the last handle of the store is dropped. The memory store purges as it is used, and Redis
//! lets records expire by their time to live. [`spawn_sweeper`] runs the same loop for any
//! other store.

use std::future::Future;
use std::time::Duration;

use crate::error::Result;
use crate::store::Store;

/// How often a store that purges in the background deletes its expired records, unless told
/// otherwise: once a minute.
#[cfg(feature = "sql")]
pub(crate) const DEFAULT_PURGE_EVERY: Duration = Duration::from_secs(60);

/// A running sweeper. Dropping it stops the task.
#[derive(Debug)]
pub struct Sweeper {
    handle: tokio::task::JoinHandle<()>,
}

impl Sweeper {
    /// Stops the task now.
    pub fn stop(self) {}
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Spawns a task on the current Tokio runtime that calls [`Store::purge_expired`] every
/// `every` (the first time one interval after the start). Errors are logged and the next round
/// tries again. The task holds a clone of `store` until the [`Sweeper`] is dropped.
///
/// The SQL stores need none: they purge in the background by themselves.
///
/// # Panics
///
/// Panics when called outside a Tokio runtime, like `tokio::spawn`.
pub fn spawn_sweeper<S: Store + Clone>(store: S, every: Duration) -> Sweeper {
    let name = std::any::type_name::<S>();
    spawn_purges(
        &tokio::runtime::Handle::current(),
        name.to_owned(),
        None,
        every,
        move || {
            let store = store.clone();
            Some(async move { store.purge_expired().await })
        },
    )
}

/// The purge loop, the one of every background purge: every `every` (the first time one
/// interval after the start), `next` hands out the round to run, or `None` when there is
/// nothing left to purge (the store is gone), which ends the task. A round that fails is logged
/// with `store` and the next one tries again. What a round deletes is counted under `store`
/// and, for a SQL store, its `database`.
pub(crate) fn spawn_purges<F, Fut>(
    rt: &tokio::runtime::Handle,
    store: String,
    database: Option<&'static str>,
    every: Duration,
    mut next: F,
) -> Sweeper
where
    F: FnMut() -> Option<Fut> + Send + 'static,
    Fut: Future<Output = Result<u64>> + Send,
{
    // A zero period would make `interval` panic; a millisecond is as often as makes sense.
    let every = every.max(Duration::from_millis(1));
    let handle = rt.spawn(async move {
        let start = tokio::time::Instant::now() + every;
        let mut tick = tokio::time::interval_at(start, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(round) = next() else { return };
            match round.await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::debug!(target: "idem", store = %store, purged = n, "purged expired records");
                    crate::observe::purged(&store, database, n);
                }
                Err(e) => tracing::warn!(
                    target: "idem",
                    store = %store,
                    error = %e,
                    "purging expired records failed; the next round tries again"
                ),
            }
        }
    });
    Sweeper { handle }
}
