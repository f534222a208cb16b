//! The decision every store makes when `begin` finds an existing record, in one place.
//!
//! Stores differ in how they read and write atomically; what a record's state means does not.

use std::time::Duration;

use crate::record::{ExpiredLease, Policy};

/// What a store saw in an existing record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub(crate) state: SeenState,
    /// Its fingerprint equals the request's.
    pub(crate) same_fingerprint: bool,
    /// Its retention has ended (the identity is free again).
    pub(crate) expired: bool,
    /// Milliseconds left on its lease (zero or less: the lease ran out).
    pub(crate) lease_left_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeenState {
    InProgress,
    Completed,
    Released,
}

impl SeenState {
    pub(crate) fn parse(s: &str) -> SeenState {
        match s {
            "in_progress" => SeenState::InProgress,
            "completed" => SeenState::Completed,
            _ => SeenState::Released,
        }
    }
}

/// What to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Take the record (fence + 1). `reclaim`: over a live owner's abandoned claim.
    /// `keep_recovery_point`: the previous attempt was this same request and did not finish.
    Claim {
        reclaim: bool,
        keep_recovery_point: bool,
    },
    Replay,
    InProgress(Duration),
    KeyReused,
}

pub(crate) fn decide(seen: Seen, policy: &Policy) -> Decision {
    if seen.expired || seen.state == SeenState::Released {
        return Decision::Claim {
            reclaim: false,
            keep_recovery_point: !seen.expired && seen.same_fingerprint,
        };
    }
    if !seen.same_fingerprint {
        return Decision::KeyReused;
    }
    match seen.state {
        SeenState::Completed => Decision::Replay,
        SeenState::InProgress if seen.lease_left_ms > 0 => {
            Decision::InProgress(Duration::from_millis(seen.lease_left_ms as u64))
        }
        SeenState::InProgress if policy.expired_lease == ExpiredLease::FailClosed => {
            Decision::InProgress(policy.lease)
        }
        SeenState::InProgress | SeenState::Released => Decision::Claim {
            reclaim: true,
            keep_recovery_point: true,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(state: SeenState, same: bool, expired: bool, left: i64) -> Seen {
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
        use SeenState as S;
        let p = Policy::DEFAULT;
        let closed = Policy::DEFAULT.expired_lease(ExpiredLease::FailClosed);
        let claim = |reclaim, keep_recovery_point| D::Claim {
            reclaim,
            keep_recovery_point,
        };
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
    }
}
