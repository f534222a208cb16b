//! A background task that purges expired records.

use std::time::Duration;

use crate::store::Store;

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

/// Spawns a task on the current Tokio runtime that calls
/// [`Store::purge_expired`] every `every`. Errors are logged and the next round tries again.
///
/// # Panics
///
/// Panics when called outside a Tokio runtime, like `tokio::spawn`.
pub fn spawn_sweeper<S: Store + Clone>(store: S, every: Duration) -> Sweeper {
    let handle = tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match store.purge_expired().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(target: "idem", purged = n, "purged expired records"),
                Err(e) => {
                    tracing::warn!(target: "idem", error = %e, "purging expired records failed")
                }
            }
        }
    });
    Sweeper { handle }
}
