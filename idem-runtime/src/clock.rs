//! Time as the in-process stores see it, with a seam for tests.
//!
//! SQL stores never use this: their leases and retention are read against the database's own
//! clock, so service instances with skewed clocks still agree.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A clock that moves only when told to: lease and retention expiry in tests without sleeping.
///
/// Clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use idem::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let before = clock.now_ms();
/// clock.advance(Duration::from_secs(301));
/// assert_eq!(clock.now_ms() - before, 301_000);
/// ```
#[derive(Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock that starts at the current system time.
    pub fn new() -> Self {
        ManualClock {
            now: Arc::new(AtomicI64::new(SystemClock.now_ms())),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(duration_ms(by), Ordering::SeqCst);
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now_ms", &self.now.load(Ordering::SeqCst))
            .finish()
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// A duration in whole milliseconds, saturating.
pub(crate) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
