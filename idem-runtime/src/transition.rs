//! State transitions, optimistic versioned updates and create-once inserts: the runtime side of
//! `#[state_transition]`, `state_machine!`, `#[versioned_update]` and `#[create_once]`.
//!
//! The macros generate the SQL (with table and column names checked as identifiers at compile
//! time, every value bound as a parameter) and call into this module to classify what happened.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::error::Error;

/// What a guarded state transition did.
///
/// `R` is the row type of `returning = …` (or `()`), `S` the state type: the declared state
/// machine's enum, or `String`.
///
/// Only [`Applied`](Transition::Applied) says that *this call* moved the row. Before an
/// irreversible effect (moving money, shipping), act on `Applied` alone, or on
/// [`AlreadyApplied`](Transition::AlreadyApplied) only when the transition declares an `owner`
/// and so tells this request's earlier attempt from another request:
///
/// ```
/// # use idem::Transition;
/// # fn call_gateway() {}
/// # fn conflict(_: &str) {}
/// # fn f(outcome: Transition<(), String>) {
/// match outcome {
///     // This call won the order, or (with `owner`) an earlier attempt of this same request did.
///     Transition::Applied(_) | Transition::AlreadyApplied(_) => call_gateway(),
///     // Another request won it: never a second refund.
///     Transition::AppliedByAnother(_) => conflict("a refund of this order is in progress"),
///     Transition::Illegal { current } => conflict(&current),
///     Transition::GuardMismatch(_) | Transition::NotFound => conflict("not refundable"),
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "only `Applied` means this call moved the row: handle the duplicate, another owner, a mismatch, an illegal state and a missing row"]
pub enum Transition<R = (), S = String> {
    /// This call moved the row: it was in a `from` state and every guard matched; it is now in
    /// `to` (and its `owner` column holds this call's owner). One round trip.
    Applied(R),
    /// The row was already in `to` before this call: an earlier call applied the transition.
    ///
    /// With `owner = …`, that earlier call had this call's owner: a retry of the same request
    /// (a resumed attempt, a redelivered callback), which may safely carry on where it left
    /// off. Without `owner`, the earlier call may have been *any* request: an idempotent
    /// success for a duplicate (a payment callback delivered twice), but never a licence to
    /// perform an irreversible effect. When the call's guard columns differ from the row's (a
    /// second callback with another amount), it is still this outcome, and a warning is
    /// logged.
    AlreadyApplied(R),
    /// The row was already in `to`, and its `owner` column names another owner: a different
    /// request applied the transition. Only with `owner = …`. The loser of a race: it must not
    /// do what the winner does.
    AppliedByAnother(R),
    /// The row is in a `from` state but a guard column differs (the paid amount is not the
    /// order's amount). Never a success: it is logged at warn and must be alerted on.
    GuardMismatch(R),
    /// The row is in a state the transition does not start from.
    Illegal {
        /// Its state.
        current: S,
    },
    /// No row has this key.
    NotFound,
}

impl<R, S> Transition<R, S> {
    /// Whether this call moved the row. An earlier call's transition
    /// ([`AlreadyApplied`](Transition::AlreadyApplied)) is not.
    pub fn is_applied(&self) -> bool {
        matches!(self, Transition::Applied(_))
    }

    /// The row, when this call moved it; otherwise the outcome, to say why not.
    pub fn applied(self) -> Result<R, Self> {
        match self {
            Transition::Applied(r) => Ok(r),
            other => Err(other),
        }
    }

    /// The row, when the outcome carries one.
    pub fn row(&self) -> Option<&R> {
        match self {
            Transition::Applied(r)
            | Transition::AlreadyApplied(r)
            | Transition::AppliedByAnother(r)
            | Transition::GuardMismatch(r) => Some(r),
            _ => None,
        }
    }

    /// A short name of the outcome, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Transition::Applied(_) => "applied",
            Transition::AlreadyApplied(_) => "already_applied",
            Transition::AppliedByAnother(_) => "applied_by_another",
            Transition::GuardMismatch(_) => "guard_mismatch",
            Transition::Illegal { .. } => "illegal",
            Transition::NotFound => "not_found",
        }
    }
}

/// A state machine declared with `state_machine!`: its states, their column texts, its edges.
pub trait StateMachine: Copy + Eq + fmt::Debug + Send + Sync + 'static {
    /// The enum's name.
    const NAME: &'static str;
    /// Every state.
    const STATES: &'static [Self];
    /// Every allowed edge, `(from, to)`.
    const EDGES: &'static [(Self, Self)];

    /// The state's column text.
    fn as_str(&self) -> &'static str;

    /// The state whose column text is `text`.
    fn from_text(text: &str) -> Option<Self> {
        Self::STATES.iter().copied().find(|s| s.as_str() == text)
    }

    /// Whether the machine allows `self → to`.
    fn can_become(&self, to: Self) -> bool {
        Self::EDGES.iter().any(|&(a, b)| a == *self && b == to)
    }

    /// The states reachable from `self` in one step.
    fn next_states(&self) -> impl Iterator<Item = Self> {
        let from = *self;
        Self::EDGES
            .iter()
            .filter(move |(a, _)| *a == from)
            .map(|&(_, b)| b)
    }
}

/// A state as read from the state column: the machine's enum, or the text itself.
pub trait StateValue: Sized {
    /// Parses the column's text.
    fn from_column(text: String) -> Result<Self, Error>;
}

impl StateValue for String {
    fn from_column(text: String) -> Result<Self, Error> {
        Ok(text)
    }
}

impl<M: StateMachine> StateValue for M {
    fn from_column(text: String) -> Result<Self, Error> {
        M::from_text(&text).ok_or_else(|| {
            Error::Decode(format!(
                "the state column holds {text:?}, which is not a state of {}",
                M::NAME
            ))
        })
    }
}

/// How a transition that did not apply is classified, from the row's current state.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    AlreadyApplied,
    GuardMismatch,
    Illegal,
    /// In a `from` state with no guard to differ: it moved back between the two statements.
    Retry,
}

#[doc(hidden)]
pub fn classify_miss(current: &str, from: &[&str], to: &str, guarded: bool) -> Miss {
    if current == to {
        Miss::AlreadyApplied
    } else if from.contains(&current) {
        if guarded {
            Miss::GuardMismatch
        } else {
            Miss::Retry
        }
    } else {
        Miss::Illegal
    }
}

/// Logs a guard mismatch: it is never swallowed.
#[doc(hidden)]
pub fn warn_guard_mismatch(
    table: &str,
    key: &dyn fmt::Debug,
    from: &[&str],
    to: &str,
    guards: &[&str],
) {
    tracing::warn!(
        target: "idem::transition",
        table,
        key = ?key,
        from = ?from,
        to,
        guards = ?guards,
        "state transition refused: the row is in a `from` state but a guard column differs"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_transitions_total", "outcome" => "guard_mismatch").increment(1);
}

/// Logs a row already in `to` whose guard columns differ from this call's: reported as
/// `AlreadyApplied` (the state machine is where it should be), but a second callback with another
/// amount is worth a look.
#[doc(hidden)]
pub fn warn_guard_differs_after(table: &str, key: &dyn fmt::Debug, to: &str, guards: &[&str]) {
    tracing::warn!(
        target: "idem::transition",
        table,
        key = ?key,
        to,
        guards = ?guards,
        "state transition already applied, but this call's guard columns differ from the row's"
    );
}

/// What an optimistic versioned update did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a stale update changed nothing: re-read and retry, or report the conflict"]
pub enum Versioned {
    /// Applied; the row now has this version.
    Updated {
        /// The new version.
        version: i64,
    },
    /// The row's version is no longer the one read: someone else updated it first.
    Stale {
        /// The version the row has now.
        current_version: i64,
    },
    /// No row has this key.
    NotFound,
}

/// What a create-once insert did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created<R> {
    /// This call inserted the row.
    Inserted(R),
    /// A row with this unique business number existed: here it is, as first written.
    Existing(R),
}

impl<R> Created<R> {
    /// The row, however it came.
    pub fn into_row(self) -> R {
        match self {
            Created::Inserted(r) | Created::Existing(r) => r,
        }
    }

    /// The row.
    pub fn row(&self) -> &R {
        match self {
            Created::Inserted(r) | Created::Existing(r) => r,
        }
    }

    /// Whether this call inserted it.
    pub fn is_inserted(&self) -> bool {
        matches!(self, Created::Inserted(_))
    }
}

/// A bounded retry with exponential backoff and full jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// How many attempts in all (at least one).
    pub attempts: u32,
    /// The first backoff's upper bound.
    pub base: Duration,
    /// The largest backoff's upper bound.
    pub max: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            attempts: 10,
            base: Duration::from_millis(5),
            max: Duration::from_millis(500),
        }
    }
}

impl Retry {
    /// The backoff before attempt `n + 1` (after `n` failures): uniform in
    /// `[0, min(max, base · 2ⁿ⁻¹)]`.
    pub fn backoff(&self, failures: u32, rng: &mut Jitter) -> Duration {
        let cap = self
            .base
            .saturating_mul(1u32 << failures.saturating_sub(1).min(20))
            .min(self.max);
        let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(if nanos == 0 {
            0
        } else {
            rng.next() % (nanos + 1)
        })
    }
}

/// A small xorshift generator for backoff jitter; not for anything that needs randomness.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from the clock and the address of a local, so concurrent callers spread out.
    pub fn new() -> Self {
        let local = 0u8;
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Jitter((t ^ (&local as *const u8 as u64).rotate_left(32)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

impl Default for Jitter {
    fn default() -> Self {
        Jitter::new()
    }
}

/// Re-reads and re-applies an optimistic update until it is not stale, at most
/// `retry.attempts` times, sleeping a jittered backoff between attempts.
///
/// `attempt` reads the current row (and its version), computes the new values and runs the
/// versioned update. The result is the last attempt's: [`Versioned::Updated`],
/// [`Versioned::NotFound`], or [`Versioned::Stale`] when every attempt lost a race.
///
/// ```no_run
/// # async fn f(pool: sqlx::SqlitePool) -> idem::Result<()> {
/// use idem::transition::{retry_versioned, Retry, Versioned};
/// let outcome = retry_versioned(Retry::default(), || async {
///     let (balance, version): (i64, i64) =
///         sqlx::query_as("SELECT balance, version FROM accounts WHERE id = 1")
///             .fetch_one(&pool).await.map_err(|e| idem::Error::Store(e.into()))?;
///     // … then the #[versioned_update] function with balance + 10 and `version`.
///     # let _ = (balance, version);
///     Ok(Versioned::Updated { version: version + 1 })
/// }).await?;
/// # Ok(()) }
/// ```
pub async fn retry_versioned<F, Fut>(retry: Retry, mut attempt: F) -> Result<Versioned, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Versioned, Error>>,
{
    let mut rng = Jitter::new();
    let attempts = retry.attempts.max(1);
    let mut failures = 0;
    loop {
        let outcome = attempt().await?;
        match outcome {
            Versioned::Stale { .. } if failures + 1 < attempts => {
                failures += 1;
                tokio::time::sleep(retry.backoff(failures, &mut rng)).await;
            }
            other => return Ok(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misses() {
        let from = ["PENDING"];
        assert_eq!(
            classify_miss("PAID", &from, "PAID", true),
            Miss::AlreadyApplied
        );
        assert_eq!(
            classify_miss("PENDING", &from, "PAID", true),
            Miss::GuardMismatch
        );
        assert_eq!(classify_miss("PENDING", &from, "PAID", false), Miss::Retry);
        assert_eq!(classify_miss("SHIPPED", &from, "PAID", true), Miss::Illegal);
    }

    #[test]
    fn backoff_is_bounded_and_grows() {
        let r = Retry {
            attempts: 5,
            base: Duration::from_millis(10),
            max: Duration::from_millis(40),
        };
        let mut j = Jitter::new();
        for failures in 1..10 {
            let cap = Duration::from_millis((10u64 << (failures - 1)).min(40));
            for _ in 0..100 {
                assert!(r.backoff(failures, &mut j) <= cap);
            }
        }
        let spread: std::collections::HashSet<_> = (0..50).map(|_| r.backoff(3, &mut j)).collect();
        assert!(spread.len() > 10, "jitter spreads attempts out");
    }

    #[tokio::test]
    async fn retry_stops_at_success_or_bound() {
        let mut calls = 0;
        let out = retry_versioned(
            Retry {
                attempts: 3,
                base: Duration::from_millis(1),
                max: Duration::from_millis(2),
            },
            || {
                calls += 1;
                async { Ok(Versioned::Stale { current_version: 9 }) }
            },
        )
        .await
        .unwrap();
        assert_eq!(out, Versioned::Stale { current_version: 9 });
        assert_eq!(calls, 3);
    }
}
