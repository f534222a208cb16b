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

/// The largest answer a guarded call stores by default ([`Policy::max_answer`]): 1 MiB.
pub const DEFAULT_MAX_ANSWER: usize = 1 << 20;

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
    /// The largest answer stored for replay, in encoded bytes. Default 1 MiB
    /// ([`DEFAULT_MAX_ANSWER`]). A larger answer is returned to its caller, and its record is
    /// completed without it: a retry is told [`Error::AnswerNotKept`](crate::Error::AnswerNotKept)
    /// (409 `ANSWER_NOT_KEPT`) and never runs the call again.
    pub max_answer: usize,
    /// How long a duplicate of a running call waits for its answer before it is told "in
    /// progress" (409 `IN_PROGRESS`). Default zero: told at once. Within the bound the duplicate
    /// asks the store again, backing off from 5 ms to 250 ms between asks, and holds no
    /// connection in between; when the running call completes, the duplicate replays its answer,
    /// and when it releases its claim, the duplicate claims the key and runs. Separate-commits
    /// calls only: a transactional duplicate already waits on the record's row lock.
    pub wait: Duration,
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
        max_answer: DEFAULT_MAX_ANSWER,
        wait: Duration::ZERO,
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

    /// Sets the largest answer stored for replay, in encoded bytes (at least 1).
    pub const fn max_answer(mut self, bytes: usize) -> Self {
        self.max_answer = bytes;
        self
    }

    /// Sets how long a duplicate of a running call waits for its answer (see
    /// [`Policy::wait`](Policy#structfield.wait)); zero, the default, answers "in progress" at
    /// once.
    pub const fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The longest lease or retention a policy may have: 2^45 ms, about 1,100 years, which
    /// every store writes exactly.
    pub const MAX: Duration = Duration::from_millis(1 << 45);

    /// Whether the policy keeps its promise: a lease of at least a millisecond, a retention at
    /// least as long as the lease (else a record would expire while its body runs, and a retry
    /// would claim it anew and run the body alongside), both at most [`Policy::MAX`]. Every
    /// claim checks its policy in [`Store::begin`](crate::Store::begin), however the policy
    /// was built (`GuardLayer::policy`, `Consumer::lease`, by hand): refused with
    /// [`Error::Config`](crate::Error::Config), which says what to change, before the store is
    /// asked. `#[idempotent]` checks its own at compile time.
    pub fn check(&self) -> crate::Result<()> {
        let refuse = |what: String| Err(crate::Error::Config(what));
        if self.lease < Duration::from_millis(1) {
            return refuse(format!(
                "a policy's lease is at least 1ms, not {:?}: a claim with no lease is abandoned as soon as it is taken",
                self.lease
            ));
        }
        if self.lease > Self::MAX || self.retain > Self::MAX {
            return refuse(format!(
                "a policy's lease and retention are at most 2^45 ms, not {:?} and {:?}",
                self.lease, self.retain
            ));
        }
        if self.wait > self.lease {
            return refuse(format!(
                "a policy's wait ({:?}) is at most its lease ({:?}): a duplicate that waits longer than the running call may hold its claim waits for a call that is presumed dead; shorten the wait",
                self.wait, self.lease
            ));
        }
        if self.max_answer == 0 {
            return refuse(
                "a policy's max_answer is at least one byte: with none, no answer could ever be replayed".into(),
            );
        }
        if self.retain < self.lease {
            return refuse(format!(
                "a policy's retention ({:?}) must be at least its lease ({:?}): the record would expire while its body runs, and a retry would run the body again alongside it; raise the retention or shorten the lease",
                self.retain, self.lease
            ));
        }
        Ok(())
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
    /// What a record holds in place of an answer too large to keep.
    const NOT_KEPT: &'static str = "\0idem: answer not kept ";

    /// A successful response without a transport status.
    pub fn ok(body: impl Into<Bytes>) -> Self {
        StoredResponse {
            status: None,
            is_error: false,
            body: body.into(),
        }
    }

    /// What a completed record stores in place of an answer it does not keep: one of `len`
    /// bytes, larger than the policy's `max` ([`Policy::max_answer`]), or a stream (`None`, passed
    /// through as it came). The call ran, its answer is not kept, and a retry is told so
    /// ([`StoredResponse::not_kept`]).
    pub fn answer_not_kept(len: Option<usize>, max: usize) -> StoredResponse {
        let len = len.map_or_else(|| "stream".to_owned(), |n| n.to_string());
        StoredResponse {
            status: None,
            is_error: true,
            body: format!("{}{len} {max}", Self::NOT_KEPT).into(),
        }
    }

    /// When this record stands for an answer too large to keep
    /// ([`StoredResponse::answer_not_kept`]), the error its replay is:
    /// [`Error::AnswerNotKept`](crate::Error::AnswerNotKept).
    pub fn not_kept(&self) -> Option<crate::Error> {
        if !self.is_error || self.status.is_some() {
            return None;
        }
        let rest = self.body.strip_prefix(Self::NOT_KEPT.as_bytes())?;
        let (len, max) = std::str::from_utf8(rest).ok()?.split_once(' ')?;
        let len = match len {
            "stream" => None,
            n => Some(n.parse().ok()?),
        };
        Some(crate::Error::AnswerNotKept {
            len,
            max: max.parse().ok()?,
        })
    }
}

/// The state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// Claimed; the body is running (or its owner crashed and the lease will tell, or its
    /// outcome is unknown and a retry or the completer resumes it).
    InProgress,
    /// Done; the response is stored and replayed.
    Completed,
    /// An earlier attempt did not finish and its retries were given up: it waits for an
    /// operator, who retries or releases it. Never run again by itself.
    Parked,
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
    /// An earlier attempt of this request did not finish, and the completer gave its retries
    /// up: it waits for an operator. The body does not run.
    Parked,
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
    /// The request of a resumable call, encoded ([`StoredRequest::encode`]): stored with the
    /// claim, so that a [`Completer`](crate::completer::Completer) can finish the call when its
    /// caller never comes back. `None` for a call that is not resumable; a take-over by such a
    /// call keeps the request the record holds.
    pub request: Option<&'a [u8]>,
}

impl<'a> BeginRequest<'a> {
    /// A request to begin `(scope, key)` for a call with `fingerprint` under `policy`, not
    /// resumable.
    pub fn new(
        scope: &'a str,
        key: &'a str,
        fingerprint: &'a Fingerprint,
        policy: &'a Policy,
    ) -> BeginRequest<'a> {
        BeginRequest {
            scope,
            key,
            fingerprint,
            policy,
            request: None,
        }
    }

    /// The same request, resumable: `request` is stored with the claim.
    pub fn resumable(mut self, request: &'a [u8]) -> BeginRequest<'a> {
        self.request = Some(request);
        self
    }
}

/// How many bytes a resumable call's request may take when it is stored with its claim: the
/// payload of its [`StoredRequest`]. A request larger than its cap is refused before anything is
/// claimed ([`crate::Error::RequestTooLarge`], HTTP 413 `REQUEST_TOO_LARGE_TO_RESUME`; a
/// resumable consumer dead-letters the message with that reason): a completer reads every stored
/// request it finishes, and the store keeps it with the record until the call completes.
///
/// 64 KiB unless set ([`RequestCap::DEFAULT`]), at most 1 MiB ([`RequestCap::MAX`]). Set per
/// resumable call where it is made resumable: `#[idempotent(resumable, max_request = "256KiB")]`
/// (checked when it compiles), [`GuardLayer::max_request`](crate::tower::GuardLayer::max_request)
/// for a resumable route of the `tower` guard, [`Consumer::max_request`](crate::consumer::Consumer::max_request)
/// for a resumable consumer. A cap out of range is refused where it is made, at start-up, by
/// [`RequestCap::new`]: a cap is never clamped in silence.
///
/// ```
/// use idem::RequestCap;
///
/// let cap = RequestCap::new(256 * 1024)?;
/// assert_eq!(cap.bytes(), 262_144);
/// assert!(RequestCap::new(0).is_err());
/// assert!(RequestCap::new(2 * 1024 * 1024).is_err(), "past RequestCap::MAX");
/// # Ok::<(), idem::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestCap(usize);

impl RequestCap {
    /// The cap of a resumable call that sets none: 64 KiB.
    pub const DEFAULT: RequestCap = RequestCap(64 * 1024);

    /// The largest cap: 1 MiB. A store keeps a resumable record's request in its row (in
    /// Redis, in the record's one value, read and written whole by every operation on it).
    pub const MAX: RequestCap = RequestCap(1024 * 1024);

    /// A cap of `bytes`: refused with [`crate::Error::Config`] when it is 0 or larger than
    /// [`RequestCap::MAX`].
    pub fn new(bytes: usize) -> crate::Result<RequestCap> {
        if bytes == 0 || bytes > Self::MAX.0 {
            return Err(crate::Error::Config(format!(
                "a resumable request's size cap is 1 byte to {} bytes (1 MiB), not {bytes}",
                Self::MAX.0
            )));
        }
        Ok(RequestCap(bytes))
    }

    /// The cap in bytes.
    pub fn bytes(self) -> usize {
        self.0
    }

    /// `Err(RequestTooLarge)` when `len` bytes are past the cap.
    pub(crate) fn admit(self, len: usize) -> crate::Result<()> {
        if len > self.0 {
            return Err(crate::Error::RequestTooLarge { len, max: self.0 });
        }
        Ok(())
    }
}

impl Default for RequestCap {
    fn default() -> Self {
        RequestCap::DEFAULT
    }
}

/// The request of a resumable call, as it is stored with its claim: the name of the resume
/// function that finishes it (registered with a [`Completer`](crate::completer::Completer)), and
/// the call's arguments, encoded by the caller (`#[idempotent(resumable)]`: the fingerprinted
/// arguments as a JSON object; the `tower` guard: the HTTP request).
///
/// Stored with the call's lease and retention (what the completer's claim takes) as
/// `idemreq1 <lease ms> <retain ms> <name>\n<payload>`; decoding is strict, so a value that is
/// not exactly one is an error, never a request to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRequest {
    name: String,
    /// The lease and retention of the call, which the completer's claim takes.
    lease: Duration,
    retain: Duration,
    payload: Bytes,
}

impl StoredRequest {
    /// The largest payload a resumable call stores unless its cap says otherwise: 64 KiB,
    /// [`RequestCap::DEFAULT`]. A larger request is refused before it is claimed
    /// ([`crate::Error::RequestTooLarge`], HTTP 413).
    pub const MAX_PAYLOAD: usize = RequestCap::DEFAULT.0;

    /// The longest name: 200 bytes.
    pub const MAX_NAME: usize = 200;

    const MAGIC: &'static [u8] = b"idemreq1 ";

    /// A stored request for the resume function `name` (1 to 200 bytes of printable ASCII,
    /// spaces included: a scope template such as `refund:<order_no>` is a good name), holding
    /// `payload` (at most [`StoredRequest::MAX_PAYLOAD`] bytes, the default cap).
    pub fn new(name: impl Into<String>, payload: impl Into<Bytes>) -> crate::Result<StoredRequest> {
        StoredRequest::within(name, payload, RequestCap::DEFAULT)
    }

    /// [`StoredRequest::new`] with a payload of at most `cap` bytes.
    pub fn within(
        name: impl Into<String>,
        payload: impl Into<Bytes>,
        cap: RequestCap,
    ) -> crate::Result<StoredRequest> {
        let (name, payload) = (name.into(), payload.into());
        if name.is_empty()
            || name.len() > Self::MAX_NAME
            || !name.bytes().all(|b| (0x20..=0x7e).contains(&b))
        {
            return Err(crate::Error::Config(format!(
                "a resume name is 1 to {} bytes of printable ASCII, not {name:?}",
                Self::MAX_NAME
            )));
        }
        cap.admit(payload.len())?;
        Ok(StoredRequest {
            name,
            lease: Policy::DEFAULT.lease,
            retain: Policy::DEFAULT.retain,
            payload,
        })
    }

    /// The same request, to be claimed with `policy`'s lease and retention when it is resumed.
    pub fn with_policy(mut self, policy: &Policy) -> StoredRequest {
        self.lease = policy.lease;
        self.retain = policy.retain;
        self
    }

    /// The policy a resumed claim takes: the call's lease and retention, re-claiming an
    /// abandoned claim.
    pub fn policy(&self) -> Policy {
        Policy::DEFAULT.lease(self.lease).retain(self.retain)
    }

    /// The resume function's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The call's arguments, as its caller encoded them.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The bytes a store keeps.
    pub fn encode(&self) -> Vec<u8> {
        let head = format!("{} {} ", self.lease.as_millis(), self.retain.as_millis());
        let mut out = Vec::with_capacity(
            Self::MAGIC.len() + head.len() + self.name.len() + 1 + self.payload.len(),
        );
        out.extend_from_slice(Self::MAGIC);
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(&self.payload);
        out
    }

    /// The stored request in `bytes`, read exactly.
    pub fn decode(bytes: &[u8]) -> crate::Result<StoredRequest> {
        let bad = |why: &str| crate::Error::Decode(format!("a stored request {why}"));
        let rest = bytes
            .strip_prefix(Self::MAGIC)
            .ok_or_else(|| bad("that does not start with `idemreq1 `"))?;
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| bad("without the end of its name"))?;
        let head = std::str::from_utf8(&rest[..end]).map_err(|_| bad("whose name is not text"))?;
        let mut parts = head.splitn(3, ' ');
        let mut ms = || -> crate::Result<Duration> {
            let text = parts.next().unwrap_or("");
            if text.is_empty() || text.len() > 15 || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(
                    "whose lease or retention is not a number of milliseconds",
                ));
            }
            Ok(Duration::from_millis(text.parse().unwrap_or(0)))
        };
        let (lease, retain) = (ms()?, ms()?);
        let name = parts.next().unwrap_or("");
        let payload = Bytes::copy_from_slice(&rest[end + 1..]);
        // Stored under whatever cap its call had: any up to the largest.
        let mut stored = StoredRequest::within(name, payload, RequestCap::MAX)
            .map_err(|e| bad(&format!("that is not valid: {e}")))?;
        if lease.is_zero() || retain < lease {
            return Err(bad("whose lease is zero or longer than its retention"));
        }
        (stored.lease, stored.retain) = (lease, retain);
        Ok(stored)
    }
}

/// A resumable claim whose work is due to be finished, as [`Operation::Due`] lists it: in
/// progress, its request stored, its lease run out (its owner died, or its outcome was unknown)
/// and its resume time passed.
///
/// [`Operation::Due`]: crate::store::Operation::Due
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unfinished {
    /// The rendered scope.
    pub scope: String,
    /// The key.
    pub key: String,
    /// The fence of its last claim: [`Operation::Park`](crate::store::Operation::Park) is
    /// conditional on it.
    pub fence: u64,
    /// Which attempt held it last.
    pub attempt: u32,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// The stored request, encoded ([`StoredRequest::decode`]).
    pub request: Vec<u8>,
    /// Why its last attempt did not finish, when it said ([`Operation::Suspend`]).
    ///
    /// [`Operation::Suspend`]: crate::store::Operation::Suspend
    pub note: Option<String>,
    /// How long ago it became due, by the store's clock.
    pub overdue: Duration,
}

impl Unfinished {
    /// A due claim, as a store read it.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        scope: String,
        key: String,
        fence: u64,
        attempt: u32,
        fingerprint: Fingerprint,
        request: Vec<u8>,
        note: Option<String>,
        overdue: Duration,
    ) -> Unfinished {
        Unfinished {
            scope,
            key,
            fence,
            attempt,
            fingerprint,
            request,
            note,
            overdue,
        }
    }
}
