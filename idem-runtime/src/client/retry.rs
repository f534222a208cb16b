//! How long a call keeps trying, and how long it waits between tries: exponential backoff with
//! full jitter, bounded in attempts and in time, and `Retry-After` as the server gives it.

use std::time::{Duration, SystemTime};

use http::HeaderValue;

/// How a call retries: how many requests it may make, for how long, and how long it backs off
/// between them when the server gave no `Retry-After`.
///
/// The `n`-th backoff (from 0) is drawn uniformly from zero to
/// `min(max_delay, first_delay × 2ⁿ)` ("full jitter"), so that clients that failed together do
/// not come back together. A `Retry-After` on 409, 429 or 503 replaces the backoff: the call
/// waits as long as the server asked, unless that would take it past `max_elapsed`, when it
/// stops and says when to come back instead.
///
/// Set on [`Idempotency::retry`](super::Idempotency::retry) for every call, or on one call as
/// a request extension (`.with_extension(Retry::DEFAULT.max_attempts(3))`).
///
/// ```
/// use std::time::Duration;
/// use idem::client::Retry;
///
/// let retry = Retry::DEFAULT
///     .first_delay(Duration::from_millis(100))
///     .max_delay(Duration::from_secs(2))
///     .max_attempts(6)
///     .max_elapsed(Duration::from_secs(20));
/// assert_eq!(retry.ceiling(0), Duration::from_millis(100));
/// assert_eq!(retry.ceiling(3), Duration::from_millis(800));
/// assert_eq!(retry.ceiling(10), Duration::from_secs(2));
/// assert!(retry.delay(3) <= Duration::from_millis(800));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    first_delay: Duration,
    max_delay: Duration,
    max_attempts: u32,
    max_elapsed: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry::DEFAULT
    }
}

impl Retry {
    /// Backoff from 200 ms up to 10 s a step; at most 10 requests (sends and lookups) in at most
    /// 60 s.
    pub const DEFAULT: Retry = Retry {
        first_delay: Duration::from_millis(200),
        max_delay: Duration::from_secs(10),
        max_attempts: 10,
        max_elapsed: Duration::from_secs(60),
    };

    /// The ceiling of the first backoff.
    pub fn first_delay(mut self, delay: Duration) -> Self {
        self.first_delay = delay;
        self
    }

    /// The highest ceiling of any backoff.
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// How many requests a call may make in all, sends and lookups together; at least one.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// How long a call may take in all, its waits and its requests: no request outlives it (its
    /// timeout is cut to what is left) and no wait ends past it.
    pub fn max_elapsed(mut self, elapsed: Duration) -> Self {
        self.max_elapsed = elapsed;
        self
    }

    /// The request budget, [`Retry::max_attempts`].
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The time budget, [`Retry::max_elapsed`].
    pub fn elapsed(&self) -> Duration {
        self.max_elapsed
    }

    /// The ceiling of the `n`-th backoff (from 0): `min(max_delay, first_delay × 2ⁿ)`.
    pub fn ceiling(&self, n: u32) -> Duration {
        let factor = 2u32.checked_pow(n).unwrap_or(u32::MAX);
        self.first_delay
            .checked_mul(factor)
            .map_or(self.max_delay, |d| d.min(self.max_delay))
    }

    /// The `n`-th backoff: a duration drawn uniformly from zero to [`Retry::ceiling`]`(n)`.
    pub fn delay(&self, n: u32) -> Duration {
        // Without a random source (it never fails on a supported system) the ceiling itself:
        // a wait without jitter is still a wait.
        let unit = getrandom::u64().map_or(1.0, |r| (r >> 11) as f64 / (1u64 << 53) as f64);
        self.ceiling(n).mul_f64(unit)
    }
}

/// What a `Retry-After` header asks for, read at `now`: a number of seconds, or an HTTP-date
/// (any of the three forms HTTP allows) from which the time until then is taken, zero for a
/// date already past. `None` when the value is neither.
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use idem::client::reqwest::header::HeaderValue;
/// use idem::client::retry_after;
///
/// let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
/// assert_eq!(retry_after(&HeaderValue::from_static("3"), now), Some(Duration::from_secs(3)));
/// let date = HeaderValue::from_static("Sun, 06 Nov 1994 08:49:42 GMT");
/// assert_eq!(retry_after(&date, now), Some(Duration::from_secs(5)));
/// assert_eq!(retry_after(&HeaderValue::from_static("soon"), now), None);
/// ```
pub fn retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // Digits too many for a u64 are still "later than anyone waits".
        return Some(Duration::from_secs(text.parse().unwrap_or(u64::MAX)));
    }
    let date = httpdate::parse_http_date(text).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}
