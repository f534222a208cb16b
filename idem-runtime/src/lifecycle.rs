//! The rules of a record's life, in one place: its states, and what `begin` decides when it finds
//! an existing record.
//!
//! Stores differ in how they read and write atomically; what a record's state means, and what a
//! new request may do with it, does not. Every store reads what it holds into a [`Seen`], asks
//! [`decide`], and applies the [`Decision`] with its own atomic primitive, conditional on the
//! record being exactly as seen. A store written outside idem does the same, and proves it with
//! the test kit (`testkit`, feature `testkit`).
//!
//! ```
//! use std::time::Duration;
//! use idem::lifecycle::{decide, Decision, Seen, State};
//! use idem::Policy;
//!
//! // A record in progress for the same request, its lease run out: take it over.
//! let seen = Seen { state: State::InProgress, same_fingerprint: true, expired: false, lease_left_ms: -5 };
//! assert_eq!(decide(seen, &Policy::DEFAULT), Decision::Claim { reclaim: true, continues: true });
//! // Completed: replay it.
//! let done = Seen { state: State::Completed, ..seen };
//! assert_eq!(decide(done, &Policy::DEFAULT), Decision::Replay);
//! ```

use std::time::Duration;

use crate::error::Error;
use crate::record::{ExpiredLease, Policy};

/// The state of a record as stores keep it. [`crate::RecordState`] is the public view of the
/// two states a caller can observe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Claimed; the body is running, or its owner crashed and the lease will tell.
    InProgress,
    /// Done; the response is stored and replayed.
    Completed,
    /// Given up by its owner: free for the next claim, but kept so that fences keep growing.
    Released,
    /// Unfinished work whose retries were given up (the completer's attempts ran out): never
    /// run again by itself and never purged; an operator retries or releases it.
    Parked,
}

impl State {
    /// The text stores write.
    pub const fn as_str(self) -> &'static str {
        match self {
            State::InProgress => "in_progress",
            State::Completed => "completed",
            State::Released => "released",
            State::Parked => "parked",
        }
    }

    /// The state written as `text`. Anything else is not a record idem wrote: an error, never a
    /// state that lets a body run.
    pub fn parse(text: &str) -> Result<State, Error> {
        match text {
            "in_progress" => Ok(State::InProgress),
            "completed" => Ok(State::Completed),
            "released" => Ok(State::Released),
            "parked" => Ok(State::Parked),
            other => Err(Error::Store(
                format!("the record holds an unknown state {other:?}").into(),
            )),
        }
    }
}

/// What a store saw in an existing record.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// Its state.
    pub state: State,
    /// Its fingerprint equals the request's.
    pub same_fingerprint: bool,
    /// Its retention has ended (the identity is free again). Never true of a record that holds
    /// unfinished work ([`unfinished`]): such a record is not purged and keeps its identity
    /// until it is finished, or an operator releases it.
    pub expired: bool,
    /// Milliseconds left on its lease (zero or less: the lease ran out).
    pub lease_left_ms: i64,
}

/// What to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take the record: fence + 1, state in progress, a new lease and retention.
    Claim {
        /// Over an owner's abandoned claim (its lease ran out).
        reclaim: bool,
        /// The claim continues an earlier attempt of this same request that did not finish:
        /// the new owner gets its recovery point and the next attempt number. Otherwise the
        /// recovery point is cleared and the attempt number starts again at 1.
        continues: bool,
    },
    /// Replay the stored answer.
    Replay,
    /// Another attempt holds a live claim: answer "in progress", with how long its lease runs.
    InProgress(Duration),
    /// The identity belongs to another request.
    KeyReused,
    /// The request's unfinished work is parked for an operator: the body does not run.
    Parked,
}

/// What `begin` answers for a request that found the record `seen`.
pub fn decide(seen: Seen, policy: &Policy) -> Decision {
    if seen.state == State::Parked {
        return if seen.same_fingerprint {
            Decision::Parked
        } else {
            Decision::KeyReused
        };
    }
    if seen.expired || seen.state == State::Released {
        return Decision::Claim {
            reclaim: false,
            continues: !seen.expired && seen.same_fingerprint,
        };
    }
    if !seen.same_fingerprint {
        return Decision::KeyReused;
    }
    match seen.state {
        State::Completed => Decision::Replay,
        State::InProgress if seen.lease_left_ms > 0 => {
            Decision::InProgress(Duration::from_millis(seen.lease_left_ms as u64))
        }
        State::InProgress if policy.expired_lease == ExpiredLease::FailClosed => {
            Decision::InProgress(policy.lease)
        }
        State::InProgress | State::Released | State::Parked => Decision::Claim {
            reclaim: true,
            continues: true,
        },
    }
}

/// The attempt number of a claim: one more than the record's when the claim continues an
/// unfinished attempt of the same request, else 1.
pub fn next_attempt(continues: bool, previous: u32) -> u32 {
    if continues {
        previous.saturating_add(1)
    } else {
        1
    }
}

/// Whether a record holds unfinished work: parked, or in progress for a resumable request
/// (`resumable`: its request is stored) or after an outcome that may have had its effect
/// (`unknown`: a suspended claim, [`Operation::Suspend`](crate::store::Operation::Suspend)).
/// Such a record never expires: the purge keeps it and `begin` never treats its identity as
/// free, so work that may have happened is finished (by a retry, the completer or an
/// operator), never forgotten. Stores state the same condition in their own terms.
pub fn unfinished(state: State, resumable: bool, unknown: bool) -> bool {
    state == State::Parked || (state == State::InProgress && (resumable || unknown))
}

/// How long after an unknown outcome at `attempt` the completer resumes the claim: one second
/// after the first, doubling with each attempt, at most five minutes. A retry by the client
/// does not wait for it.
pub fn resume_delay(attempt: u32) -> Duration {
    const FIRST_MS: u64 = 1_000;
    const MAX_MS: u64 = 5 * 60 * 1_000;
    let doublings = attempt.saturating_sub(1).min(20);
    Duration::from_millis((FIRST_MS << doublings).min(MAX_MS))
}

/// Whether a fenced write (complete, release, checkpoint) by the owner of `fence` applies to a
/// record in `state` with `record_fence` whose retention has or has not ended. Stores that cannot
/// call this inside their atomic primitive (SQL) state the same condition in their statements.
pub fn owns(fence: u64, record_fence: u64, state: State, expired: bool) -> bool {
    fence == record_fence && state == State::InProgress && !expired
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(state: State, same: bool, expired: bool, left: i64) -> Seen {
        Seen {
            state,
            same_fingerprint: same,
            expired,
            lease_left_ms: left,
        }
    }

    #[test]
    fn table() {
        use Decision as D;
        use State as S;
        let p = Policy::DEFAULT;
        let closed = Policy::DEFAULT.expired_lease(ExpiredLease::FailClosed);
        let claim = |reclaim, continues| D::Claim { reclaim, continues };
        assert_eq!(decide(seen(S::Completed, true, false, 0), &p), D::Replay);
        assert_eq!(
            decide(seen(S::Completed, false, false, 0), &p),
            D::KeyReused
        );
        assert_eq!(
            decide(seen(S::InProgress, false, false, 10), &p),
            D::KeyReused
        );
        assert_eq!(
            decide(seen(S::InProgress, true, false, 1500), &p),
            D::InProgress(Duration::from_millis(1500))
        );
        assert_eq!(
            decide(seen(S::InProgress, true, false, 0), &p),
            claim(true, true)
        );
        assert_eq!(
            decide(seen(S::InProgress, true, false, -5), &closed),
            D::InProgress(closed.lease)
        );
        assert_eq!(
            decide(seen(S::Completed, false, true, 0), &p),
            claim(false, false)
        );
        assert_eq!(
            decide(seen(S::Released, false, false, 0), &p),
            claim(false, false)
        );
        assert_eq!(
            decide(seen(S::Released, true, false, 0), &p),
            claim(false, true)
        );
        assert_eq!(
            decide(seen(S::InProgress, true, true, 100), &p),
            claim(false, false)
        );
        // Parked: never run again by itself, whatever its lease or retention says.
        for (expired, left) in [(false, 0), (true, -5), (false, 1500)] {
            assert_eq!(decide(seen(S::Parked, true, expired, left), &p), D::Parked);
            assert_eq!(
                decide(seen(S::Parked, true, expired, left), &closed),
                D::Parked
            );
            assert_eq!(
                decide(seen(S::Parked, false, expired, left), &p),
                D::KeyReused
            );
        }
    }

    #[test]
    fn unfinished_work_is_parked_or_in_progress_resumable_or_unknown() {
        assert!(unfinished(State::Parked, false, false));
        assert!(unfinished(State::InProgress, true, false));
        assert!(unfinished(State::InProgress, false, true));
        assert!(!unfinished(State::InProgress, false, false));
        for done in [State::Completed, State::Released] {
            assert!(!unfinished(done, true, true));
        }
    }

    #[test]
    fn resume_delays_double_from_a_second_up_to_five_minutes() {
        let secs: Vec<u64> = (0..12).map(|a| resume_delay(a).as_secs()).collect();
        assert_eq!(secs, [1, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(resume_delay(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn states_round_trip_and_unknown_text_is_an_error() {
        for s in [
            State::InProgress,
            State::Completed,
            State::Released,
            State::Parked,
        ] {
            assert_eq!(State::parse(s.as_str()).unwrap(), s);
        }
        for bad in ["", "IN_PROGRESS", "done", "released "] {
            assert!(matches!(State::parse(bad), Err(Error::Store(_))), "{bad:?}");
        }
    }

    #[test]
    fn only_a_live_claim_with_its_fence_owns_the_record() {
        assert!(owns(7, 7, State::InProgress, false));
        assert!(!owns(6, 7, State::InProgress, false));
        assert!(!owns(7, 7, State::Completed, false));
        assert!(!owns(7, 7, State::Released, false));
        assert!(!owns(7, 7, State::InProgress, true));
    }
}
