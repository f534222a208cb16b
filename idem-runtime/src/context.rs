//! The context guarded calls run in: what an integration tells the guarded calls it awaits
//! (`#[idempotent]` functions, [`begin`](crate::flow::begin)) without naming them, and what it
//! learns back from them.
//!
//! This is the one place idem keeps per-task state. A [`Context`] is one value, carried by one
//! task-local and entered with one call, [`Context::scope`]; every part of it is optional:
//!
//! | part | set with | what guarded calls inside do with it | who sets it |
//! |---|---|---|---|
//! | default policy | [`Context::policy`], [`with_default_policy`] | start from it where the attribute sets no `lease`, `retain` or `on_expired_lease` | the message consumer: 7 days' retention |
//! | retry hint | [`Context::retry_hint`], [`with_retry_hint`] | choose the `Retry-After` of their "in progress" answers with it | the message consumer: the remaining lease |
//! | duplicate wait | [`Context::wait`] | let a duplicate of a running call wait that long for its answer, where their policy sets no [`wait`](crate::Policy#structfield.wait) of its own | the axum layer ([`IdempotencyLayer::wait`](crate::axum::IdempotencyLayer::wait)) |
//! | replay watch | [`Context::watch_replays`], [`watch_replays`] | list every answer they replay (and, for an axum `Json` answer, the bytes its value renders to) | the axum layer (to send the stored bytes, marked), the consumer (to ack as replayed) |
//! | claim watch | [`Context::watch_claims`], [`watch_claims`] | list every claim they take (separate commits) and count every attempt | the consumer: to renew the leases of a handler that runs long, and to ack only what was recorded; the completer: to learn how a resumed call ended |
//! | stored request | set by a resumable message consumer only ([`Consumer::resumable`](crate::consumer::Consumer::resumable)) | the calls that store no request of their own (every guarded call but an `#[idempotent(resumable)]` function's) store this one with their claims, the delivered message, so that a completer can run the consumer's handler on it again | the consumer's runner, and the completer running a consumer's handler |
//! | handed claim | set by the completer only | the resumable call of that scope, key and fingerprint (an `#[idempotent(resumable)]` function, [`begin_resumable`](crate::flow::begin_resumable), or the `tower` guard's resumable route re-sent by `idem::tower::resend`) runs under the claim the completer took, instead of beginning its own | the [`Completer`](crate::completer::Completer) |
//!
//! A scope inherits what it does not set: `Context::current().policy(p).scope(fut)` keeps the
//! watches around it. An inner watch of one kind hides the calls inside it from an outer watch
//! of the same kind.
//!
//! # Crossing a spawn
//!
//! A task-local belongs to its task: a future handed to `tokio::spawn` runs with no context at
//! all, whatever scope spawned it. Carry it across with [`spawn`] (or
//! `Context::current().scope(fut)` around the future before it is spawned elsewhere). Guarded
//! calls on a task spawned without it, under a message consumer, lose all four parts:
//!
//! - they start from [`Policy::DEFAULT`]: their records are kept 24 hours, not the consumer's 7
//!   days, so a redelivery after a day runs the work again;
//! - their "in progress" answers take the process's hint, not the remaining lease;
//! - their replays are not seen: the consumer settles the delivery as completed, not replayed,
//!   and the axum layer sends the value rendered again, without `Idempotent-Replayed`;
//! - their claims are not watched: their leases are not renewed (a call that outlives its lease
//!   is taken over by a redelivery and its work runs twice), a completion the store refused is
//!   retried briefly rather than while the lease lives, and a claim lost or an answer left
//!   unstored does not stop the delivery from being acked.
//!
//! `#[idempotent(on_cancel = "finish")]` moves its body onto a task of its own: it carries the
//! context there itself. So does the `tower` guard, which runs each guarded request on a task
//! of its own: a completer's handed claim and claim watch reach the request it re-sends.
//!
//! # Process-wide settings
//!
//! Two settings are the process's, not a task's, and a spawn does not lose them: the retry hint
//! installed with [`set_retry_hint`](crate::flow::set_retry_hint) (what a context without one
//! falls back to) and the store installed with [`set_default_store`](crate::set_default_store)
//! (what `#[idempotent]` without `store = …` uses). Each is set once, at start-up.
//!
//! ```
//! use idem::context::{self, ClaimWatch, Context};
//! use idem::Policy;
//! use std::time::Duration;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let claims = ClaimWatch::new();
//! let week = Policy::DEFAULT.retain(Duration::from_secs(7 * 86_400));
//! Context::current()
//!     .policy(week)
//!     .watch_claims(&claims)
//!     .scope(async {
//!         // Guarded calls here keep their records a week, and their claims are listed.
//!         assert_eq!(context::default_policy(), week);
//!         // A spawned task keeps the context only when it is carried.
//!         let carried = context::spawn(async { context::default_policy() });
//!         let lost = tokio::spawn(async { context::default_policy() });
//!         assert_eq!(carried.await.unwrap(), week);
//!         assert_eq!(lost.await.unwrap(), Policy::DEFAULT);
//!     })
//!     .await;
//! # });
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::task::futures::TaskLocalFuture;

use crate::fingerprint::Fingerprint;
use crate::guard::ClaimInfo;
use crate::record::{Claimed, Policy, StoredRequest, StoredResponse};

/// How the `Retry-After` of an "in progress" answer is chosen: by default how long the running
/// attempt is likely to need, not how long its lease still runs (five minutes by default, for a
/// body that may take 50 ms).
///
/// With [`HintBasis::Observed`] (the default) the hint is the typical duration of the
/// operation's completed calls, observed in this process (`#[idempotent]` functions measure
/// their calls; the typical duration is the median of the recent ones, so a few slow callers do
/// not raise every caller's hint), or `unobserved` before the first one completes; never below
/// `min` and never
/// beyond what is left of the running claim's lease (after that the claim is re-claimable, and a
/// retry then gets the answer or takes over). With [`HintBasis::RemainingLease`] it is what is
/// left of the lease, at least `min`: what a message consumer, whose redelivery costs more than
/// a client's retry, waits for.
///
/// Install one for the process with [`set_retry_hint`](crate::flow::set_retry_hint) at start-up, or for the calls inside a
/// future with [`with_retry_hint`] (the message consumer does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryHint {
    /// The shortest hint. Default one second, `Retry-After`'s resolution.
    pub min: Duration,
    /// The hint for an operation none of whose calls has completed in this process yet (and for
    /// calls guarded by hand with [`begin`](crate::flow::begin), which are not measured). Default one second.
    pub unobserved: Duration,
    /// What the hint is based on.
    pub basis: HintBasis,
}

/// What a [`RetryHint`] is based on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HintBasis {
    /// The operation's observed duration, bounded by the running claim's remaining lease.
    Observed,
    /// The running claim's remaining lease.
    RemainingLease,
}

impl RetryHint {
    /// One second at least, one second when nothing is known yet, from observed durations.
    pub const DEFAULT: RetryHint = RetryHint {
        min: Duration::from_secs(1),
        unobserved: Duration::from_secs(1),
        basis: HintBasis::Observed,
    };

    /// What is left of the running claim's lease, one second at least.
    pub const REMAINING_LEASE: RetryHint = RetryHint {
        basis: HintBasis::RemainingLease,
        ..RetryHint::DEFAULT
    };

    /// The hint for a claim with `lease_left`, for an operation whose calls typically take
    /// `typical`.
    pub fn hint(&self, lease_left: Duration, typical: Option<Duration>) -> Duration {
        match self.basis {
            HintBasis::Observed => typical
                .unwrap_or(self.unobserved)
                .min(lease_left)
                .max(self.min),
            HintBasis::RemainingLease => lease_left.max(self.min),
        }
    }
}

impl Default for RetryHint {
    fn default() -> Self {
        RetryHint::DEFAULT
    }
}

tokio::task_local! {
    /// The context of the guarded calls on this task: see the module documentation.
    static CONTEXT: Context;
}

/// What guarded calls awaited inside [`Context::scope`] take from their caller and report back
/// to it; see the [module](self) documentation.
///
/// Cheap to clone: clones share their watches.
#[derive(Debug, Clone, Default)]
pub struct Context {
    policy: Option<Policy>,
    retry_hint: Option<RetryHint>,
    wait: Option<Duration>,
    replays: Option<ReplayWatch>,
    claims: Option<ClaimWatch>,
    handoff: Option<Handoff>,
    request: Option<StoredRequest>,
}

/// A claim the completer took, waiting for the resumable call it belongs to: the call of that
/// scope, key and fingerprint takes it instead of beginning its own (once).
#[derive(Debug, Clone)]
pub(crate) struct Handoff(Arc<Mutex<Option<Handed>>>);

#[derive(Debug)]
pub(crate) struct Handed {
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) claimed: Claimed,
}

impl Handoff {
    pub(crate) fn new(handed: Handed) -> Handoff {
        Handoff(Arc::new(Mutex::new(Some(handed))))
    }

    /// The claim, if nobody took it: the completer still holds it.
    pub(crate) fn untaken(&self) -> Option<Handed> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl Context {
    /// An empty context: guarded calls inside it behave as outside any.
    pub fn new() -> Context {
        Context::default()
    }

    /// The context of the scope this task runs in, or an empty one. Clone it into a future
    /// that runs elsewhere and enter it there with [`Context::scope`].
    pub fn current() -> Context {
        CONTEXT.try_with(Context::clone).unwrap_or_default()
    }

    /// The lease, retention and expired-lease rule of the `#[idempotent]` calls that set none
    /// of their own.
    pub fn policy(mut self, policy: Policy) -> Context {
        self.policy = Some(policy);
        self
    }

    /// How the "in progress" answers of guarded calls choose their `Retry-After`, instead of
    /// the process's.
    pub fn retry_hint(mut self, hint: RetryHint) -> Context {
        self.retry_hint = Some(hint);
        self
    }

    /// How long a duplicate of a running call waits for its answer, for the guarded calls whose
    /// policy sets no wait of its own ([`Policy::wait`](crate::Policy#structfield.wait)).
    pub fn wait(mut self, wait: Duration) -> Context {
        self.wait = Some(wait);
        self
    }

    /// Lists in `watch` the answers guarded calls replay.
    pub fn watch_replays(mut self, watch: &ReplayWatch) -> Context {
        self.replays = Some(watch.clone());
        self
    }

    /// Lists in `watch` the claims guarded calls take; see [`watch_claims`].
    pub fn watch_claims(mut self, watch: &ClaimWatch) -> Context {
        self.claims = Some(watch.clone());
        self
    }

    /// Hands the completer's claim to the resumable call it belongs to.
    pub(crate) fn handoff(mut self, handoff: &Handoff) -> Context {
        self.handoff = Some(handoff.clone());
        self
    }

    /// Makes the guarded calls inside resumable with `request` (a message consumer's
    /// delivered message), those that store no request of their own.
    pub(crate) fn resumable(mut self, request: StoredRequest) -> Context {
        self.request = Some(request);
        self
    }

    /// Runs `fut` in this context: the guarded calls it awaits on this task (and on tasks it
    /// starts with [`spawn`]) see it.
    pub fn scope<F: Future>(self, fut: F) -> TaskLocalFuture<Context, F> {
        ENTERED.store(true, Ordering::Relaxed);
        CONTEXT.scope(self, fut)
    }
}

/// Whether any context was ever entered in this process ([`Context::scope`], set before the
/// scope's future is first polled). Until then no task has one, and a guarded call does not
/// look: a task-local lookup costs more than this load.
static ENTERED: AtomicBool = AtomicBool::new(false);

/// `f` applied to the context of this task, if it runs in one.
#[inline]
fn with<R>(f: impl FnOnce(&Context) -> R) -> Option<R> {
    if !ENTERED.load(Ordering::Relaxed) {
        return None;
    }
    CONTEXT.try_with(f).ok()
}

/// Spawns `fut` on the runtime with the context of the scope this call runs in: what
/// `tokio::spawn` loses (see the [module](self) documentation). Await the handle before the
/// scope ends: a claim still running when a message consumer settles its delivery is not
/// waited for.
pub fn spawn<F>(fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(Context::current().scope(fut))
}

/// Runs `fut` with `policy` as the lease, retention and expired-lease rule of the
/// `#[idempotent]` calls inside it that do not set their own: what a message consumer does, so
/// that its handlers' records live as long as redeliveries can come.
/// `Context::current().policy(policy).scope(fut)`.
pub fn with_default_policy<F: Future>(policy: Policy, fut: F) -> TaskLocalFuture<Context, F> {
    Context::current().policy(policy).scope(fut)
}

/// Runs `fut` with `hint` choosing the `Retry-After` of the "in progress" answers of the guarded
/// calls inside it, instead of the process's. `Context::current().retry_hint(hint).scope(fut)`.
pub fn with_retry_hint<F: Future>(hint: RetryHint, fut: F) -> TaskLocalFuture<Context, F> {
    Context::current().retry_hint(hint).scope(fut)
}

/// The policy an `#[idempotent]` call starts from: its context's, else [`Policy::DEFAULT`].
/// The attribute's own `lease`, `retain` and `on_expired_lease` apply on top.
#[inline]
pub fn default_policy() -> Policy {
    with(|c| c.policy).flatten().unwrap_or(Policy::DEFAULT)
}

/// The claim the completer handed to the resumable call of `(scope, key)` with `fingerprint`,
/// taken: `None` when this task runs no resumption, the claim is another call's, or it was
/// taken already.
pub(crate) fn take_handoff(scope: &str, key: &str, fingerprint: &Fingerprint) -> Option<Claimed> {
    with(|c| {
        let handoff = c.handoff.as_ref()?;
        let mut slot = handoff.0.lock().unwrap_or_else(|p| p.into_inner());
        let ours = slot
            .as_ref()
            .is_some_and(|h| h.scope == scope && h.key == key && h.fingerprint == *fingerprint);
        ours.then(|| slot.take()).flatten().map(|h| h.claimed)
    })
    .flatten()
}

/// The request this task's context makes its guarded calls store, if it sets one.
pub(crate) fn stored_request() -> Option<StoredRequest> {
    with(|c| c.request.clone()).flatten()
}

/// The retry hint of this task's context, if it sets one.
pub(crate) fn retry_hint() -> Option<RetryHint> {
    with(|c| c.retry_hint).flatten()
}

/// How long a duplicate waits, by this task's context, if it says.
pub(crate) fn wait() -> Option<Duration> {
    with(|c| c.wait).flatten()
}

/// The stored answers that guarded calls replayed; see [`watch_replays`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replays(Vec<StoredResponse>);

impl Replays {
    /// Whether no guarded call replayed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many guarded calls replayed.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The stored answers, in the order they were replayed.
    pub fn iter(&self) -> impl Iterator<Item = &StoredResponse> {
        self.0.iter()
    }

    /// The last stored answer replayed.
    pub fn last(&self) -> Option<&StoredResponse> {
        self.0.last()
    }

    /// The stored answers, owned.
    pub fn into_vec(self) -> Vec<StoredResponse> {
        self.0
    }
}

/// Where the guarded calls of a [`Context`] list the answers they replay, readable while they
/// run. Clones share the same list.
#[derive(Debug, Clone, Default)]
pub struct ReplayWatch(Arc<Mutex<Vec<Replayed>>>);

/// An answer replayed, as stored, and the bytes its decoded value renders to again, when an
/// integration renders it (axum's `Json`).
#[derive(Debug)]
pub(crate) struct Replayed {
    pub(crate) stored: StoredResponse,
    pub(crate) rendered: Option<Vec<u8>>,
}

impl ReplayWatch {
    /// An empty watch.
    pub fn new() -> ReplayWatch {
        ReplayWatch::default()
    }

    /// The answers replayed so far.
    pub fn replays(&self) -> Replays {
        Replays(self.lock().iter().map(|r| r.stored.clone()).collect())
    }

    /// The answers replayed so far, with their renderings, taken out of the watch.
    pub(crate) fn take(&self) -> Vec<Replayed> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Replayed>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs `fut` and reports which guarded calls inside it replayed instead of running.
///
/// The seam through which an integration learns of replays without the core naming it: the
/// HTTP layer wraps each request, a message consumer each delivery. Calls on tasks spawned
/// without the context ([`spawn`]) are not seen, and an inner watch hides its replays from an
/// outer one.
///
/// ```
/// use idem::flow::watch_replays;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let (answer, replays) = watch_replays(async {
///     // Call #[idempotent] functions here.
///     42
/// })
/// .await;
/// assert_eq!(answer, 42);
/// assert!(replays.is_empty());
/// # });
/// ```
pub async fn watch_replays<F: Future>(fut: F) -> (F::Output, Replays) {
    let watch = ReplayWatch::new();
    let out = Context::current().watch_replays(&watch).scope(fut).await;
    let replays = watch.take().into_iter().map(|r| r.stored).collect();
    (out, Replays(replays))
}

/// Whether this task's context watches replays.
pub fn replays_watched() -> bool {
    with(|c| c.replays.is_some()).unwrap_or(false)
}

/// Tells the replay watch of this task's context, if any, that a call replayed `stored`, and,
/// when an integration rendered the decoded value again (axum's `Json`), the bytes it renders
/// to: those join the replay the flow noted just before decoding it. Returns whether a watch
/// took it.
pub(crate) fn note_replay(stored: &StoredResponse, rendered: Option<Vec<u8>>) -> bool {
    with(|c| {
        let Some(w) = &c.replays else {
            return false;
        };
        let mut replays = w.lock();
        match (replays.last_mut(), rendered) {
            (Some(last), Some(rendered)) if last.rendered.is_none() && last.stored == *stored => {
                last.rendered = Some(rendered);
            }
            (_, rendered) => replays.push(Replayed {
                stored: stored.clone(),
                rendered,
            }),
        }
        true
    })
    .unwrap_or(false)
}

/// The claims that guarded calls took, readable while they run: see [`watch_claims`]. Clones
/// share the same list.
#[derive(Debug, Clone, Default)]
pub struct ClaimWatch(Arc<Watched>);

#[derive(Debug, Default)]
struct Watched {
    claims: Mutex<Vec<WatchedClaim>>,
    /// Woken when a claim is added.
    added: tokio::sync::Notify,
    /// The highest attempt number of any claim taken, transactional ones included.
    attempt: AtomicU32,
}

/// A claim seen by a [`ClaimWatch`], with the lease its call runs under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedClaim {
    /// The claim.
    pub claim: ClaimInfo,
    /// The lease of the call's policy: what a renewal extends it to.
    pub lease: Duration,
}

impl ClaimWatch {
    /// An empty watch.
    pub fn new() -> Self {
        ClaimWatch::default()
    }

    /// The claims taken so far, oldest first. A claim stays listed after it ended; a renewal of
    /// an ended claim is refused by the store's fence check and changes nothing.
    pub fn claims(&self) -> Vec<WatchedClaim> {
        self.lock().clone()
    }

    /// Forgets `claim`: it ended, or was taken over.
    pub fn forget(&self, claim: &ClaimInfo) {
        self.lock().retain(|w| w.claim != *claim);
    }

    /// Completes when a claim is added after this was first polled (or enabled).
    pub(crate) fn added(&self) -> tokio::sync::futures::Notified<'_> {
        self.0.added.notified()
    }

    /// The highest attempt number ([`ClaimInfo::attempt`]) of the claims taken so far, in
    /// either mode (a transactional claim is counted here, though not listed), forgotten ones
    /// included; 0 when none was taken. How many times the record saw this request begin: a
    /// count a broker that cannot count redeliveries lacks.
    pub fn attempt(&self) -> u32 {
        self.0.attempt.load(Ordering::Relaxed)
    }

    fn saw_attempt(&self, attempt: u32) {
        self.0.attempt.fetch_max(attempt, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<WatchedClaim>> {
        self.0.claims.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs `fut` and lists in `watch`, while it runs, the claims that guarded calls inside it
/// take: the seam through which a message consumer renews the lease of a handler that runs
/// long ([`Store::renew`](crate::Store::renew)) without the core naming it.
/// `Context::current().watch_claims(watch).scope(fut)`.
///
/// Claims of the separate-commits flow ([`begin`](crate::flow::begin), and `#[idempotent]`
/// without `transaction`) are listed. Their holders expect the watcher to keep them alive, and
/// nobody waits on a connection: a completion the store refuses as unavailable is retried while
/// the claim's lease lives, not briefly. A transactional claim is not listed: its record is not
/// visible outside its transaction until it commits, and a duplicate waits for that commit
/// rather than for a lease; only its attempt number is counted ([`ClaimWatch::attempt`]).
/// Calls on tasks spawned without the context ([`spawn`]) are not seen.
pub fn watch_claims<F: Future>(watch: &ClaimWatch, fut: F) -> TaskLocalFuture<Context, F> {
    Context::current().watch_claims(watch).scope(fut)
}

/// Tells the claim watch of this task's context, if any, that a call holds `claim`: listed for
/// renewal under `lease` when it has one, only counted ([`ClaimWatch::attempt`]) when it is
/// transactional (`None`: a renewal from outside its transaction would wait on the
/// transaction's row lock). Returns whether a watch took it: then a watcher (a message
/// consumer) keeps it alive.
pub(crate) fn note_claim(claim: &ClaimInfo, lease: Option<Duration>) -> bool {
    with(|c| {
        let Some(w) = &c.claims else {
            return false;
        };
        w.saw_attempt(claim.attempt());
        if let Some(lease) = lease {
            w.lock().push(WatchedClaim {
                claim: claim.clone(),
                lease,
            });
            w.0.added.notify_waiters();
        }
        true
    })
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(body: &'static [u8]) -> StoredResponse {
        StoredResponse {
            status: Some(200),
            is_error: false,
            body: body.into(),
        }
    }

    #[tokio::test]
    async fn a_rendering_joins_the_replay_noted_before_it() {
        let watch = ReplayWatch::new();
        let (a, b) = (stored(b"{\"a\":1}"), stored(b"{\"b\":2}"));
        let taken = Context::current()
            .watch_replays(&watch)
            .scope(async {
                assert!(note_replay(&a, None));
                assert!(note_replay(&a, Some(b"{\"a\": 1}".to_vec())));
                // A rendering of another answer than the last noted is a replay of its own.
                assert!(note_replay(&b, Some(b"{\"b\": 2}".to_vec())));
                watch.take()
            })
            .await;
        let seen: Vec<_> = taken
            .iter()
            .map(|r| (&r.stored.body[..], r.rendered.as_deref()))
            .collect();
        assert_eq!(
            seen,
            [
                (&b"{\"a\":1}"[..], Some(&b"{\"a\": 1}"[..])),
                (&b"{\"b\":2}"[..], Some(&b"{\"b\": 2}"[..])),
            ]
        );
        assert!(!note_replay(&a, None), "outside the scope nothing watches");
    }

    #[tokio::test]
    async fn a_scope_keeps_what_it_does_not_set_and_an_inner_watch_hides_from_an_outer() {
        let (outer, inner) = (ReplayWatch::new(), ReplayWatch::new());
        let week = Policy::DEFAULT.retain(Duration::from_secs(7 * 86_400));
        Context::new()
            .policy(week)
            .watch_replays(&outer)
            .scope(async {
                with_retry_hint(RetryHint::REMAINING_LEASE, async {
                    assert_eq!(default_policy(), week);
                    assert_eq!(retry_hint(), Some(RetryHint::REMAINING_LEASE));
                    note_replay(&stored(b"1"), None);
                    Context::current()
                        .watch_replays(&inner)
                        .scope(async { note_replay(&stored(b"2"), None) })
                        .await;
                })
                .await;
                assert_eq!(retry_hint(), None);
            })
            .await;
        assert_eq!(outer.replays().len(), 1);
        assert_eq!(inner.replays().last(), Some(&stored(b"2")));
        assert_eq!(default_policy(), Policy::DEFAULT);
    }
}
