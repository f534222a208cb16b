//! The idempotency record, the policy that governs it, and what [`Store::begin`] can answer.
//!
//! [`Store::begin`]: crate::store::Store::begin

use std::time::Duration;

use bytes::Bytes;

use crate::fingerprint::Fingerprint;

/// The default lease: how long a claimed request may run before it is presumed abandoned.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(5 * 60);

/// How long a request's record is kept by default ([`Policy::DEFAULT`]): 24 hours, how long a
/// completed record is replayed before its identity is free again. Clients retry within
/// minutes; a day covers a retry after an outage.
pub const REQUEST_RETAIN: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a message consumer's records are kept by default: 7 days, as long as a broker may
/// redeliver or a relay re-publish (a JetStream stream's `max_age` must not be longer).
pub const MESSAGE_RETAIN: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// What `begin` does with an `in_progress` record whose lease has run out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ExpiredLease {
    /// Presume the owner crashed: re-claim the record with a higher fence and hand the recovery
    /// point to the new owner. Safe when the side effect carries the guard's downstream key, so
    /// that the outside world dedupes a repeated call.
    #[default]
    Reclaim,
    /// Keep answering "in progress" until the record expires or an operator resolves it: for
    /// side effects that cannot be deduplicated downstream.
    FailClosed,
}

/// Durations and policies for one guarded operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How long a claim is live before it is presumed abandoned. Default five minutes.
    pub lease: Duration,
    /// How long a record is kept (and replayed), counted from its claim. Default 24 hours.
    pub retain: Duration,
    /// What to do with an abandoned claim.
    pub expired_lease: ExpiredLease,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::DEFAULT
    }
}

impl Policy {
    /// Five-minute lease, 24-hour retention, re-claim abandoned claims.
    pub const DEFAULT: Policy = Policy {
        lease: DEFAULT_LEASE,
        retain: REQUEST_RETAIN,
        expired_lease: ExpiredLease::Reclaim,
    };

    /// Sets the lease.
    pub const fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets the retention.
    pub const fn retain(mut self, retain: Duration) -> Self {
        self.retain = retain;
        self
    }

    /// Sets what happens to abandoned claims.
    pub const fn expired_lease(mut self, policy: ExpiredLease) -> Self {
        self.expired_lease = policy;
        self
    }
}

/// The bytes first returned for a request, exactly as they will be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The transport status (the HTTP status), when the response type has one.
    pub status: Option<u16>,
    /// Whether this is a stored final error rather than a success.
    pub is_error: bool,
    /// The encoded response. Shared, not copied, when a store or a cache hands it out again.
    pub body: Bytes,
}

impl StoredResponse {
    /// A successful response without a transport status.
    pub fn ok(body: impl Into<Bytes>) -> Self {
        StoredResponse {
            status: None,
            is_error: false,
            body: body.into(),
        }
    }
}

/// The state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// Claimed; the body is running (or its owner crashed and the lease will tell).
    InProgress,
    /// Done; the response is stored and replayed.
    Completed,
}

/// A record as [`Store::lookup`](crate::store::Store::lookup) returns it, for clients
/// recovering from a timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The fingerprint of the request that claimed it.
    pub fingerprint: Fingerprint,
    /// In progress or completed.
    pub state: RecordState,
    /// The current fence.
    pub fence: u64,
    /// The stored response, once completed.
    pub response: Option<StoredResponse>,
    /// For an in-progress record: how long its lease still runs (zero once it ran out).
    pub lease_remaining: Option<Duration>,
}

/// What a store found when asked to begin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginOutcome {
    /// The caller owns the record now and must run the body, then complete or release.
    Claimed(Claimed),
    /// The request already completed: here are its stored bytes.
    Replay(StoredResponse),
    /// Another attempt holds a live claim.
    InProgress {
        /// How long until its lease ends.
        retry_after: Duration,
    },
    /// The identity is taken by a request with another fingerprint.
    KeyReused,
}

/// A successful claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The fence every later write must present. A record's first claim takes the store's clock
    /// in milliseconds; every take-over or claim after a release adds one. A record purged and
    /// claimed afresh therefore starts above every fence of its previous life.
    pub fence: u64,
    /// Whether an abandoned claim was taken over (the lease of a previous owner ran out).
    pub reclaimed: bool,
    /// How far a previous attempt of the same request got, if it said so with `checkpoint`.
    pub recovery_point: Option<Vec<u8>>,
    /// Which attempt of this request the claim is: 1 for the first; one more for each claim of
    /// the same request after an earlier attempt began and did not finish (released by an error,
    /// a panic or a dropped caller, or abandoned past its lease). A claim after the record's
    /// retention ended, or for another request, starts again at 1.
    pub attempt: u32,
}

/// The identity and fence of a claim, as presented to `complete`, `release` and `checkpoint`.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRef<'a> {
    /// The scope.
    pub scope: &'a str,
    /// The key.
    pub key: &'a str,
    /// The fence handed out by `begin`.
    pub fence: u64,
}

/// What `begin` is asked.
#[derive(Debug, Clone, Copy)]
pub struct BeginRequest<'a> {
    /// The scope, rendered.
    pub scope: &'a str,
    /// The validated key.
    pub key: &'a str,
    /// The request's fingerprint.
    pub fingerprint: &'a Fingerprint,
    /// Lease, retention, expired-lease policy.
    pub policy: &'a Policy,
}
