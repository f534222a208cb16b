//! A claim on a record, as an owner holds it: [`Guard`] completes it, releases it, records how far
//! the work got, and releases it when dropped; [`ClaimInfo`] is what a guarded body may know of it.
//!
//! [`begin`](crate::flow::begin) hands out a guard. It is the API `#[idempotent]` expands to, and the
//! one to call by hand when a guarded operation does not fit a function.
//!
//! ```
//! use idem::{begin, Begun, Fingerprint, Key, MemoryStore, Policy, StoredResponse};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let key = Key::parse("0b2c1c6e-1f7b-4f0f-9d3a-8f2f6f0a1111")?;
//! let fp = Fingerprint::of(&("ORD-1", 250))?;
//!
//! match begin(&store, "refund:ORD-1".into(), key.clone(), fp, Policy::DEFAULT).await? {
//!     Begun::Claimed(guard) => {
//!         // Move the money, passing guard.downstream_key("charge") to the gateway.
//!         guard.complete(&StoredResponse::ok(b"{\"refunded\":250}".to_vec())).await?;
//!     }
//!     Begun::Replay(_) => unreachable!("first time"),
//! }
//! // The retry replays the stored bytes and does not move money again.
//! match begin(&store, "refund:ORD-1".into(), key, fp, Policy::DEFAULT).await? {
//!     Begun::Replay(stored) => assert_eq!(stored.body, &b"{\"refunded\":250}"[..]),
//!     Begun::Claimed(_) => unreachable!("already done"),
//! }
//! # Ok::<(), idem::Error>(())
//! # }).unwrap();
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::key::Key;
use crate::lifecycle::resume_delay;
use crate::observe::{self, Outcome};
use crate::record::{ClaimRef, Claimed, Policy, StoredResponse};
use crate::store::{Deferred, DeferredWrite, Store};

/// What a guarded body knows about its claim: `#[idempotent(…, claim = c)]` hands it to the body
/// as `c`, and [`Guard::info`] gives it by hand.
///
/// Clones share what is learnt about the claim while it runs: whether it was lost
/// ([`ClaimInfo::lost`]). Two `ClaimInfo`s are equal when they name the same claim (scope, key,
/// fence and what the store said of it).
#[derive(Debug)]
pub struct ClaimInfo {
    scope: String,
    key: Key,
    fence: u64,
    reclaimed: bool,
    recovery_point: Option<Vec<u8>>,
    attempt: u32,
    /// What the holders of the claim learn about it, shared from the first clone on. A claim
    /// that is never cloned (a guard whose body does not take its claim, outside a consumer)
    /// has nobody to tell, so it allocates nothing and reads no clock: its end is kept in
    /// `end_alone`, and handed to the shared state if a clone comes later.
    state: OnceLock<Arc<ClaimState>>,
    end_alone: AtomicU8,
}

impl Clone for ClaimInfo {
    fn clone(&self) -> Self {
        ClaimInfo {
            scope: self.scope.clone(),
            key: self.key.clone(),
            fence: self.fence,
            reclaimed: self.reclaimed,
            recovery_point: self.recovery_point.clone(),
            attempt: self.attempt,
            state: OnceLock::from(Arc::clone(self.shared())),
            end_alone: AtomicU8::new(End::Running as u8),
        }
    }
}

impl PartialEq for ClaimInfo {
    fn eq(&self, other: &Self) -> bool {
        self.scope == other.scope
            && self.key == other.key
            && self.fence == other.fence
            && self.reclaimed == other.reclaimed
            && self.recovery_point == other.recovery_point
            && self.attempt == other.attempt
    }
}

impl Eq for ClaimInfo {}

/// What the holders of one claim (its guard, the body's [`ClaimInfo`], a consumer renewing its
/// lease) learn about it while it runs.
#[derive(Debug, Default)]
pub(crate) struct ClaimState {
    /// How the claim ended, an [`End`].
    end: AtomicU8,
    /// Whether the record is known to be someone else's now.
    lost: AtomicBool,
    lost_notify: tokio::sync::Notify,
    /// Until when the lease is known to run, by this process's clock: from the claim, or the
    /// last renewal, plus the lease.
    lease_until: Mutex<Option<Instant>>,
    /// Why the effect may have happened, when the body said so ([`ClaimInfo::outcome_unknown`]).
    unknown: Mutex<Option<String>>,
}

/// How a claim ended, as far as its holders know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum End {
    /// The body runs.
    Running = 0,
    /// The body ended; its completion or release is in flight.
    Finishing = 1,
    /// The answer is stored.
    Completed = 2,
    /// Released (an error, a dropped body), or lost to a newer attempt: nothing is stored.
    Released = 3,
    /// The effect happened but its answer could not be stored: the record stays claimed until
    /// its lease runs out, then a later attempt re-claims it.
    Unrecorded = 4,
    /// The outcome is unknown (the effect may have happened): the claim is kept in progress
    /// for a retry of the same request or the completer to resume ([`Guard::suspend`]).
    Suspended = 5,
}

impl ClaimInfo {
    /// The claim a store granted on `(scope, key)`.
    pub(crate) fn new(scope: String, key: Key, claimed: Claimed) -> ClaimInfo {
        ClaimInfo {
            scope,
            key,
            fence: claimed.fence,
            reclaimed: claimed.reclaimed,
            recovery_point: claimed.recovery_point,
            attempt: claimed.attempt,
            state: OnceLock::new(),
            end_alone: AtomicU8::new(End::Running as u8),
        }
    }

    /// The state shared with the clones, created by the first that needs it with what this
    /// claim knows so far (only its end: a claim is marked lost through the shared state, and
    /// its lease is only followed once it is shared).
    fn shared(&self) -> &Arc<ClaimState> {
        self.state.get_or_init(|| {
            Arc::new(ClaimState {
                end: AtomicU8::new(self.end_alone.load(Ordering::Acquire)),
                ..ClaimState::default()
            })
        })
    }

    /// The scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The fence this claim holds.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Whether this claim took over an abandoned one: a previous attempt may have done part of
    /// the work (see [`ClaimInfo::recovery_point`]).
    pub fn is_reclaim(&self) -> bool {
        self.reclaimed
    }

    /// How far a previous attempt of this request got, as it recorded with
    /// [`Guard::checkpoint`].
    pub fn recovery_point(&self) -> Option<&[u8]> {
        self.recovery_point.as_deref()
    }

    /// Which attempt of this request this is: 1 for the first; more when an earlier attempt
    /// began and did not finish (released by an error, a panic or a dropped caller, or abandoned
    /// past its lease), so part of its work may be done. Resume from
    /// [`ClaimInfo::recovery_point`], and repeat outside calls only with
    /// [`ClaimInfo::downstream_key`].
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// A key for a call to the outside world, derived from `(scope, key, step)`: the same for
    /// every attempt of this request, different for each step. Pass it as the gateway's own
    /// idempotency key, so a call that a take-over repeats is deduplicated there.
    pub fn downstream_key(&self, step: &str) -> String {
        downstream_key(&self.scope, self.key.as_str(), step)
    }

    /// Whether this claim is known to be lost: a renewal of its lease, a checkpoint or its
    /// completion found the record taken over by a newer attempt (its lease had run out). Its
    /// body's work will not be recorded; the newer attempt's will.
    pub fn is_lost(&self) -> bool {
        self.state
            .get()
            .is_some_and(|s| s.lost.load(Ordering::Acquire))
    }

    /// Completes when this claim is known to be lost (see [`ClaimInfo::is_lost`]); never, while
    /// it is held. A body that runs long can race its work against it and stop early:
    ///
    /// ```
    /// # async fn work() {}
    /// # async fn f(claim: idem::ClaimInfo) -> Result<(), &'static str> {
    /// tokio::select! {
    ///     () = work() => Ok(()),
    ///     () = claim.lost() => Err("taken over: another attempt does this work now"),
    /// }
    /// # }
    /// ```
    ///
    /// What learns of the loss: the message consumer, which renews the lease of the claims its
    /// handler holds, and [`Guard::renew`], [`Guard::checkpoint`] and [`Guard::complete`].
    /// Under the consumer the delivery of a handler whose claim was lost is not acked: it is
    /// retried, and answered by the newer attempt's record.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let state = Arc::clone(self.shared());
        async move {
            loop {
                let notified = state.lost_notify.notified();
                let mut notified = std::pin::pin!(notified);
                notified.as_mut().enable();
                if state.lost.load(Ordering::Acquire) {
                    return;
                }
                notified.await;
            }
        }
    }

    /// Says that the side effect may have happened although the call is about to fail: a
    /// gateway that timed out, an answer that was lost, a connection that broke after the
    /// request was sent. When the call then ends with an error, its claim is not released (a
    /// retry would run the work as new) but kept in progress, suspended: the same request's
    /// retry resumes it at once (with the recovery point and the next attempt number), a
    /// [`Completer`](crate::completer::Completer) finishes it when nobody retries (if the call
    /// is resumable), and operators see `why`. An error that says nothing happened (a
    /// validation, a declined payment) is returned without this, and releases the claim.
    ///
    /// A call that returns `Ok` stores its answer whatever was said here. The latest `why`
    /// is kept.
    pub fn outcome_unknown(&self, why: impl Into<String>) {
        let state = self.shared();
        *state.unknown.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.into());
    }

    /// Why the effect may have happened, when the body said so with
    /// [`ClaimInfo::outcome_unknown`].
    pub fn unknown_outcome(&self) -> Option<String> {
        let state = self.state.get()?;
        state
            .unknown
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records that the claim was taken over.
    pub(crate) fn mark_lost(&self) {
        let state = self.shared();
        state.lost.store(true, Ordering::Release);
        state.lost_notify.notify_waiters();
    }

    /// How the claim ended, as far as this process knows.
    pub(crate) fn end(&self) -> End {
        let end = self.state.get().map_or(&self.end_alone, |s| &s.end);
        match end.load(Ordering::Acquire) {
            0 => End::Running,
            1 => End::Finishing,
            2 => End::Completed,
            3 => End::Released,
            4 => End::Unrecorded,
            _ => End::Suspended,
        }
    }

    fn set_end(&self, end: End) {
        let state = self.state.get().map_or(&self.end_alone, |s| &s.end);
        state.store(end as u8, Ordering::Release);
    }

    /// The lease was granted or renewed just now, for `lease`. Followed only once the claim is
    /// shared: its one reader is a completion retried while the lease lives, and that patience
    /// is given only to claims a watcher holds a clone of.
    pub(crate) fn renewed(&self, lease: Duration) {
        if let Some(state) = self.state.get() {
            *state.lease_until.lock().unwrap_or_else(|p| p.into_inner()) =
                Instant::now().checked_add(lease);
        }
    }

    /// Until when the lease is known to run, once it was granted through a [`Guard`] to a
    /// shared claim.
    pub(crate) fn lease_until(&self) -> Option<Instant> {
        let state = self.state.get()?;
        *state.lease_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The identity and fence, as presented to the store's fenced writes.
    pub(crate) fn claim_ref(&self) -> ClaimRef<'_> {
        ClaimRef {
            scope: &self.scope,
            key: self.key.as_str(),
            fence: self.fence,
        }
    }

    pub(crate) fn observe(&self, outcome: Outcome) {
        observe::record(outcome, &self.scope, self.key.as_str(), self.fence);
    }
}

/// A claim on a record. Complete it with the response, or release it so a retry can run.
///
/// Dropping a guard that was neither completed nor released (a panic in the body, a cancelled
/// future, a client that hung up) releases the claim at once, in the background, rather than
/// leaving it until the lease runs out.
pub struct Guard<'s, S: Store> {
    store: &'s S,
    claim: ClaimInfo,
    policy: Policy,
    patience: Patience,
    armed: bool,
    /// The call's request is stored with the claim: dropped before it ends, it is suspended
    /// for the completer, not released.
    resumable: bool,
    /// The answer being stored: a guard dropped while the write is in flight hands it to the
    /// store to finish in the background.
    pending: Option<StoredResponse>,
}

impl<S: Store> fmt::Debug for Guard<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("scope", &self.claim.scope)
            .field("key", &self.claim.key)
            .field("fence", &self.claim.fence)
            .field("reclaimed", &self.claim.reclaimed)
            .finish_non_exhaustive()
    }
}

impl<'s, S: Store> Guard<'s, S> {
    pub(crate) fn new(store: &'s S, claim: ClaimInfo, policy: Policy) -> Self {
        claim.renewed(policy.lease);
        Guard {
            store,
            claim,
            policy,
            patience: Patience::Brief,
            armed: true,
            resumable: false,
            pending: None,
        }
    }

    /// Marks a claim whose request is stored with it: a drop before the end suspends it for
    /// the completer rather than releasing it.
    pub(crate) fn resumable(mut self, resumable: bool) -> Self {
        self.resumable = resumable;
        self
    }

    /// How long a completion lost to an unavailable store is retried.
    pub(crate) fn patience(mut self, patience: Patience) -> Self {
        self.patience = patience;
        self
    }

    /// The scope.
    pub fn scope(&self) -> &str {
        self.claim.scope()
    }

    /// The key.
    pub fn key(&self) -> &Key {
        self.claim.key()
    }

    /// The fence this claim holds.
    pub fn fence(&self) -> u64 {
        self.claim.fence()
    }

    /// Whether this claim took over an abandoned one: a previous attempt may have done part of
    /// the work (see [`Guard::recovery_point`]).
    pub fn is_reclaim(&self) -> bool {
        self.claim.is_reclaim()
    }

    /// How far a previous attempt of this request got, as it recorded with
    /// [`Guard::checkpoint`].
    pub fn recovery_point(&self) -> Option<&[u8]> {
        self.claim.recovery_point()
    }

    /// Which attempt of this request this is: see [`ClaimInfo::attempt`].
    pub fn attempt(&self) -> u32 {
        self.claim.attempt()
    }

    /// A key for a call to the outside world: see [`ClaimInfo::downstream_key`].
    pub fn downstream_key(&self, step: &str) -> String {
        self.claim.downstream_key(step)
    }

    /// What the body may know about its claim, owned: see [`ClaimInfo`].
    pub fn info(&self) -> ClaimInfo {
        self.claim.clone()
    }

    /// Whether the body said its effect may have happened ([`ClaimInfo::outcome_unknown`]).
    pub(crate) fn info_unknown(&self) -> bool {
        self.claim.state.get().is_some_and(|s| {
            s.unknown
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some()
        })
    }

    /// Records how far the side effect got (any bytes), and renews the lease.
    pub async fn checkpoint(&mut self, recovery_point: &[u8]) -> Result<()> {
        let result = self
            .store
            .checkpoint(self.claim.claim_ref(), recovery_point, self.policy.lease)
            .await;
        self.renewal(&result);
        result
    }

    /// Renews the lease to the policy's lease from now, leaving the recovery point as it is: for
    /// a body that runs longer than its lease (a message handler that keeps its delivery alive).
    pub async fn renew(&mut self) -> Result<()> {
        let result = self
            .store
            .renew(self.claim.claim_ref(), self.policy.lease)
            .await;
        self.renewal(&result);
        result
    }

    /// What a renewal of the lease (a renewal or a checkpoint) tells about the claim.
    fn renewal(&mut self, result: &Result<()>) {
        match result {
            Ok(()) => self.claim.renewed(self.policy.lease),
            Err(Error::FenceLost { .. }) => {
                // The record is someone else's now: there is nothing left to release.
                self.armed = false;
                self.claim.set_end(End::Released);
                self.claim.mark_lost();
                self.claim.observe(Outcome::FenceLost);
            }
            Err(_) => {}
        }
    }

    /// Stores `response` for replay and ends the claim.
    ///
    /// [`Error::FenceLost`] means a newer attempt took the record over: nothing was written.
    /// A completion lost to an unavailable store is retried: briefly, or, under a message
    /// consumer, while the claim's lease lives (see `retry_complete`). Any other error leaves the
    /// claim in place (not released: the side effect happened, so a retry must not run it
    /// again); it is re-claimed when its lease runs out.
    pub async fn complete(mut self, response: &StoredResponse) -> Result<()> {
        self.finish(response.clone()).await
    }

    /// [`Guard::complete`], borrowing the guard: a caller that holds the guard in its own
    /// future (the macro's flow) awaits this, so the future does not carry the guard twice.
    pub(crate) async fn finish(&mut self, response: StoredResponse) -> Result<()> {
        // The body returned, so its effect happened: a caller dropped while the write is in
        // flight must not release the claim. The answer waits in the guard, whose drop hands it
        // to the store to finish in the background.
        self.claim.set_end(End::Finishing);
        let response = &*self.pending.insert(response);
        let mut result = self.store.complete(self.claim.claim_ref(), response).await;
        if let Err(Error::Unavailable(_)) = result {
            result = retry_complete(
                self.store,
                &self.claim,
                response,
                self.policy.lease,
                self.patience,
            )
            .await;
        }
        self.pending = None;
        self.armed = false;
        match &result {
            Ok(()) => self.claim.set_end(End::Completed),
            Err(Error::FenceLost { .. }) => {
                self.claim.set_end(End::Released);
                self.claim.mark_lost();
            }
            Err(_) => self.claim.set_end(End::Unrecorded),
        }
        self.claim.observe(match &result {
            Ok(()) => Outcome::Completed,
            Err(Error::FenceLost { .. }) => Outcome::FenceLost,
            Err(_) => Outcome::StoreError,
        });
        result
    }

    /// Gives the claim up so that a retry runs the body again (the body failed, and only
    /// successes are worth replaying).
    pub async fn release(mut self) -> Result<()> {
        self.give_up().await
    }

    /// [`Guard::release`], borrowing the guard; see [`Guard::finish`].
    pub(crate) async fn give_up(&mut self) -> Result<()> {
        self.claim.set_end(End::Finishing);
        let result = self.store.release(self.claim.claim_ref()).await;
        self.armed = false;
        self.claim.set_end(End::Released);
        if let Err(Error::FenceLost { .. }) = result {
            self.claim.mark_lost();
        }
        self.claim.observe(match &result {
            Ok(()) => Outcome::Released,
            Err(Error::FenceLost { .. }) => Outcome::FenceLost,
            Err(_) => Outcome::StoreError,
        });
        result
    }

    /// Keeps the claim in progress after an outcome that may have had its effect
    /// ([`Operation::Suspend`](crate::store::Operation::Suspend)): its lease ends now, so the
    /// same request's retry resumes it at once, and a resumable claim becomes due to the
    /// completer after [`resume_delay`] of its attempt. Never a release: only an outcome known
    /// to have done nothing frees the key. A suspension the store cannot write leaves the claim
    /// as it is (in progress until its lease runs out), which is as safe.
    pub async fn suspend(mut self, why: &str) -> Result<()> {
        self.keep_unknown(why).await
    }

    /// [`Guard::suspend`], borrowing the guard; see [`Guard::finish`].
    pub(crate) async fn keep_unknown(&mut self, why: &str) -> Result<()> {
        self.claim.set_end(End::Finishing);
        let result = self
            .store
            .suspend(
                self.claim.claim_ref(),
                why,
                resume_delay(self.claim.attempt),
            )
            .await;
        self.armed = false;
        match &result {
            Ok(()) => {
                self.claim.set_end(End::Suspended);
                self.claim.observe(Outcome::Suspended);
            }
            Err(Error::FenceLost { .. }) => {
                self.claim.set_end(End::Released);
                self.claim.mark_lost();
                self.claim.observe(Outcome::FenceLost);
            }
            Err(e) => {
                self.claim.set_end(End::Suspended);
                self.claim.observe(Outcome::StoreError);
                tracing::warn!(target: "idem", scope = self.claim.scope(), key = %self.claim.key(), fence = self.claim.fence(), error = %e, why, "could not suspend a claim whose outcome is unknown: it stays in progress until its lease runs out, then a retry resumes it");
            }
        }
        result
    }

    /// The end of a call that failed, as what the body said decides: suspended when it said
    /// its effect may have happened ([`ClaimInfo::outcome_unknown`]), else released. Errors of
    /// the store are logged: the caller answers with the body's error either way.
    pub(crate) async fn fail_or_log(&mut self) {
        match self.claim.unknown_outcome() {
            Some(why) => {
                let _ = self.keep_unknown(&why).await;
            }
            None => self.give_up_or_log().await,
        }
    }

    /// [`Guard::give_up`] where the caller answers with the body's error whatever the release
    /// did: a release that failed is logged with its error, since the claim then stays until
    /// its lease runs out and every retry before that is told "in progress".
    pub(crate) async fn give_up_or_log(&mut self) {
        match self.give_up().await {
            // Taken over: the new owner holds the record, and `observe` said so.
            Ok(()) | Err(Error::FenceLost { .. }) => {}
            Err(e) => {
                tracing::warn!(target: "idem", scope = self.claim.scope(), key = %self.claim.key(), fence = self.claim.fence(), error = %e, "could not release a claim after its body failed: retries are told \"in progress\" until its lease runs out");
            }
        }
    }

    /// The completion policy, one for every way of running a guarded call (`#[idempotent]`,
    /// the tower guard, a message consumer's handlers): what becomes of an answer once the body
    /// ran, given the answer `encoded` for storage.
    ///
    /// - Stored: [`Recorded::Stored`], a retry replays it.
    /// - The answer cannot be encoded, or the store failed other than by a lost fence (after
    ///   `retry_complete`): the side effect happened, so the claim is kept until its lease runs
    ///   out rather than released for a second run; logged, and [`Recorded::Unstored`]: the
    ///   caller hands its answer back unstored. The claim ends [`End::Unrecorded`], which is
    ///   how a message consumer knows not to ack the delivery.
    /// - A newer attempt took the record over: [`Recorded::Lost`], with the error the caller
    ///   answers; the newer attempt's answer is the one a retry gets.
    pub(crate) async fn record(&mut self, encoded: Result<StoredResponse>) -> Recorded {
        match self.answer_to_store(encoded) {
            Some(stored) => {
                let result = self.finish(stored).await;
                self.recorded(result)
            }
            None => Recorded::Unstored,
        }
    }

    /// [`Guard::record`]'s first half: what to store of an answer (`None` when it could not be
    /// encoded: logged, and the claim kept). A caller that awaits [`Guard::finish`] in its own
    /// future (the macro's flow) calls the halves itself, so its future carries one state
    /// machine for the completion, not two.
    #[inline]
    pub(crate) fn answer_to_store(
        &mut self,
        encoded: Result<StoredResponse>,
    ) -> Option<StoredResponse> {
        match encoded {
            Ok(stored) => Some(kept(&self.claim, &self.policy, stored)),
            Err(e) => {
                tracing::error!(target: "idem", scope = self.claim.scope(), key = %self.claim.key(), error = %e, "cannot encode the answer for storage: returning it unstored; the claim is kept until its lease runs out");
                self.keep_claimed();
                None
            }
        }
    }

    /// [`Guard::record`]'s second half: the verdict on what [`Guard::finish`] answered.
    #[inline]
    pub(crate) fn recorded(&self, result: Result<()>) -> Recorded {
        match result {
            Ok(()) => Recorded::Stored,
            Err(e @ Error::FenceLost { .. }) => Recorded::Lost(e),
            Err(e) => {
                tracing::error!(target: "idem", scope = self.claim.scope(), key = %self.claim.key(), error = %e, "could not store the answer: returning it unstored; the claim is kept until its lease runs out");
                Recorded::Unstored
            }
        }
    }

    /// Ends this guard without writing: the claim stays until its lease runs out. For when the
    /// side effect happened but its answer cannot be stored, so a retry must not run it again
    /// before the lease says the owner is gone.
    fn keep_claimed(&mut self) {
        self.armed = false;
        self.claim.set_end(End::Unrecorded);
    }
}

/// What a completion stores of `stored`, the answer of `claim`: the answer itself, or, when it
/// is larger than the policy keeps ([`Policy::max_answer`]), the mark that it ran and was not
/// kept (the caller gets it, a retry is told `ANSWER_NOT_KEPT`). Every completion asks it, in
/// separate commits and in a transaction.
#[inline]
pub(crate) fn kept(claim: &ClaimInfo, policy: &Policy, stored: StoredResponse) -> StoredResponse {
    if stored.body.len() <= policy.max_answer {
        return stored;
    }
    not_kept(claim, policy, &stored)
}

/// [`kept`]'s answer for an answer larger than the policy keeps: out of the hot path.
#[cold]
#[inline(never)]
fn not_kept(claim: &ClaimInfo, policy: &Policy, stored: &StoredResponse) -> StoredResponse {
    let (len, max) = (stored.body.len(), policy.max_answer);
    tracing::warn!(target: "idem", scope = claim.scope(), key = %claim.key(), len, max, "the answer is larger than the policy keeps (max_answer): returned to this caller only; the record is completed without it, and a retry is told ANSWER_NOT_KEPT");
    StoredResponse::answer_not_kept(Some(len), max)
}

/// What became of a claimed call's answer: the verdict of the completion policy,
/// `Guard::record`.
#[derive(Debug)]
pub(crate) enum Recorded {
    /// Stored: a retry replays it.
    Stored,
    /// Not stored (it could not be encoded, or the store failed), and the claim kept until its
    /// lease runs out: hand the answer back unstored.
    Unstored,
    /// Taken over by a newer attempt, nothing written: answer with this error
    /// ([`Error::FenceLost`]).
    Lost(Error),
}

/// How long a completion lost to an unavailable store is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Patience {
    /// Three tries within about half a second: a client waits on its connection for the answer,
    /// and gets it unstored rather than after its own timeout.
    Brief,
    /// While the claim's lease lives (at most one lease from the first failure), renewing the
    /// lease before each try: nobody waits on a connection (a message consumer keeps its
    /// delivery alive meanwhile), and an answer left unstored means the work runs again.
    WhileLeased,
}

/// The completion policy: a completion lost to an unavailable store (a dropped connection, a
/// failover) is tried again, with a growing pause, for as long as `patience` says. The side
/// effect has happened; the alternative is a claim that waits out its lease and a second run of
/// the work. Boxed: it is rare, and keeping it out of line keeps the common path's future small.
fn retry_complete<'a, S: Store>(
    store: &'a S,
    claim: &'a ClaimInfo,
    response: &'a StoredResponse,
    lease: Duration,
    patience: Patience,
) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>> {
    Box::pin(async move {
        const BRIEF_MS: [u64; 3] = [20, 100, 400];
        let first_failure = Instant::now();
        tracing::warn!(target: "idem", scope = claim.scope(), key = %claim.key(), ?patience, "could not store the answer: the store is unavailable; trying again");
        let mut result = Err(Error::Unavailable("not attempted".into()));
        let mut pause = Duration::from_millis(20);
        for tries in 0usize.. {
            match patience {
                Patience::Brief => match BRIEF_MS.get(tries) {
                    Some(ms) => pause = Duration::from_millis(*ms),
                    None => break,
                },
                Patience::WhileLeased => {
                    let until = [first_failure.checked_add(lease), claim.lease_until()]
                        .into_iter()
                        .flatten()
                        .min();
                    if let Some(until) = until {
                        let now = Instant::now();
                        if now >= until {
                            break;
                        }
                        pause = pause.min(until - now);
                    }
                }
            }
            tokio::time::sleep(pause).await;
            if patience == Patience::WhileLeased {
                pause = (pause * 2).min(Duration::from_secs(1));
                // Keep the record ours while the store comes back.
                match store.renew(claim.claim_ref(), lease).await {
                    Ok(()) => claim.renewed(lease),
                    Err(e @ Error::FenceLost { .. }) => return Err(e),
                    Err(_) => {}
                }
            }
            result = store.complete(claim.claim_ref(), response).await;
            if !matches!(result, Err(Error::Unavailable(_))) {
                break;
            }
            tracing::debug!(target: "idem", scope = claim.scope(), key = %claim.key(), tries = tries + 1, "could not store the answer yet");
        }
        result
    })
}

impl<S: Store> Drop for Guard<'_, S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Dropped with its answer being stored: the effect happened, finish storing it. Dropped
        // mid-body: a resumable call's work, or one the body said may have had its effect, is
        // kept for a retry or the completer; any other is released at once.
        let write = match self.pending.take() {
            Some(response) => DeferredWrite::Complete(response),
            None => match self.claim.unknown_outcome() {
                Some(note) => self.suspended_on_drop(note),
                None if self.resumable => {
                    self.suspended_on_drop("the call was dropped before it finished".to_owned())
                }
                None => {
                    self.claim.set_end(End::Released);
                    self.claim.observe(Outcome::Released);
                    DeferredWrite::Release
                }
            },
        };
        self.store.defer(Deferred {
            scope: std::mem::take(&mut self.claim.scope),
            key: self.claim.key.as_str().to_owned(),
            fence: self.claim.fence,
            write,
        });
    }
}

impl<S: Store> Guard<'_, S> {
    fn suspended_on_drop(&self, note: String) -> DeferredWrite {
        self.claim.set_end(End::Suspended);
        self.claim.observe(Outcome::Suspended);
        DeferredWrite::Suspend {
            note,
            resume_in: resume_delay(self.claim.attempt),
        }
    }
}

/// The downstream key for `(scope, key, step)`; see [`ClaimInfo::downstream_key`].
pub fn downstream_key(scope: &str, key: &str, step: &str) -> String {
    format!("idem-{}", digest(&[scope, key, step]))
}

/// 32 hex digits naming `parts`: the first 16 bytes of the sha256 over the parts, each preceded
/// by its length (8 bytes, little-endian), so that different splits never share a digest.
pub(crate) fn digest(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for part in parts {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut out = String::with_capacity(32);
    for b in &digest[..16] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> ClaimInfo {
        let claimed = Claimed {
            fence: 7,
            reclaimed: false,
            recovery_point: None,
            attempt: 1,
        };
        ClaimInfo::new("s".into(), Key::parse("k").unwrap(), claimed)
    }

    /// A claim nobody shares allocates nothing, and a clone taken later still learns what
    /// it knew and what it learns after.
    #[test]
    fn a_claim_shares_its_state_from_the_first_clone() {
        let alone = claim();
        alone.set_end(End::Finishing);
        alone.renewed(Duration::from_secs(1));
        assert!(alone.state.get().is_none());
        assert_eq!(alone.lease_until(), None);
        let clone = alone.clone();
        assert_eq!(clone.end(), End::Finishing);
        alone.set_end(End::Completed);
        assert_eq!(clone.end(), End::Completed);
        alone.renewed(Duration::from_secs(1));
        assert!(clone.lease_until().is_some());
        assert!(!clone.is_lost());
        alone.mark_lost();
        assert!(clone.is_lost());
        assert_eq!(clone, alone);
    }

    /// Marking an unshared claim lost shares it, so a later clone knows.
    #[test]
    fn lost_before_any_clone_is_kept() {
        let alone = claim();
        alone.set_end(End::Released);
        alone.mark_lost();
        let clone = alone.clone();
        assert!(clone.is_lost());
        assert_eq!(clone.end(), End::Released);
    }
}
