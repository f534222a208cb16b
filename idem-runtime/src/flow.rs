//! The record lifecycle as a guarded call lives it: begin, then replay, or run the body and
//! complete or release — in two modes.
//!
//! This is the core every integration drives: `#[idempotent]` expands to `run` (separate
//! commits) or to the transactional flow; [`begin`] is the same start by hand; an HTTP layer or a
//! message consumer sets the [`Context`](crate::context::Context) its guarded calls run in, and
//! learns through it of replays ([`watch_replays`]) and of the claims a call holds, to renew
//! their leases while it runs long ([`watch_claims`]). Each rule lives once:
//!
//! - what a store's [`BeginOutcome`] means to the caller, and what is observed: `started`;
//! - how a separate-commits call starts (begin, claim, the claim watch, the guard): `start`,
//!   behind both [`begin`] and `run`;
//! - what a claim is: [`ClaimInfo`], built in one place from the store's [`Claimed`];
//! - how a claim ends (complete, release, dropped), and what becomes of an answer after the body
//!   ran (the completion policy, `Guard::record`): [`Guard`];
//! - which errors are stored and which release: `run` and `tx_finish`, with `ErrorOps`;
//! - what `begin` decides about an existing record: `lifecycle::decide`, inside each store.
//!
//! ```text
//!             ┌─ Replay ─────────────────────────────► stored answer (body not run)
//! begin ──────┼─ InProgress / KeyReused / error ─────► error
//!             └─ Claimed ─► body ─┬─ Ok ─► complete ─► answer
//!                                 ├─ Err (final) ─► complete with the error ─► error
//!                                 ├─ Err ─► release ─► error
//!                                 └─ panic / dropped ─► release in the background
//! ```
//!
//! A call whose policy (or context) sets a [`wait`](crate::Policy#structfield.wait) does not
//! take "in progress" at once: it asks again until the running call's answer is there (a
//! replay), its claim is released (a claim of its own), or the wait runs out.
//!
//! In transactional mode the claim, the body's SQL and the completion share one database
//! transaction: `Err`, panic and drop roll all of it back.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::context;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::guard::{ClaimInfo, Guard, Patience, Recorded};
use crate::key::Key;
use crate::observe::{self, Outcome};
use crate::record::{
    BeginOutcome, BeginRequest, Claimed, Policy, RequestCap, StoredRequest, StoredResponse,
};
use crate::replay::Replay;
use crate::store::Store;

pub use crate::context::{
    ClaimWatch, HintBasis, ReplayWatch, Replays, RetryHint, WatchedClaim, default_policy,
    replays_watched, watch_claims, watch_replays, with_default_policy, with_retry_hint,
};

static RETRY_HINT: OnceLock<RetryHint> = OnceLock::new();

/// Installs how "in progress" answers choose their `Retry-After`; see [`RetryHint`]. Call it
/// once at start-up; a second call is refused with [`Error::Config`].
pub fn set_retry_hint(hint: RetryHint) -> Result<()> {
    RETRY_HINT
        .set(hint)
        .map_err(|_| Error::Config("a retry hint is already installed".into()))
}

/// The [`RetryHint`] in force: the one of the [`Context`](crate::context::Context) this call
/// runs in, else the one installed with [`set_retry_hint`], else the default.
pub fn retry_hint() -> RetryHint {
    context::retry_hint().unwrap_or_else(|| RETRY_HINT.get().copied().unwrap_or_default())
}

/// How many recent completions an operation's typical duration is the median of.
const SAMPLES: usize = 32;

/// How long one guarded operation's calls take, observed in this process: what its "in
/// progress" answers tell a client to wait. `#[idempotent]` keeps one per function, in a
/// `static`.
///
/// The typical duration is the median of the last 32 sampled completions, whoever made them: a
/// few callers whose requests are slow (a huge body, a slow downstream for one account) move it
/// only once they are most of the recent calls, so no one caller can drag every other caller's
/// `Retry-After` up to the lease. A shift of most calls moves it within 16 samples.
#[doc(hidden)]
#[derive(Debug)]
pub struct Timing {
    /// The last completions' durations in microseconds, plus one (zero: an empty slot), written
    /// round the ring.
    samples: [AtomicU64; SAMPLES],
    /// How many completions were observed: the next slot, modulo the ring's size.
    observed: AtomicU64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing::new()
    }
}

impl Timing {
    /// Nothing observed yet.
    pub const fn new() -> Timing {
        Timing {
            samples: [const { AtomicU64::new(0) }; SAMPLES],
            observed: AtomicU64::new(0),
        }
    }

    /// When a call starts: the instant to measure it from, for the first call and one call in
    /// eight after that on each thread. Sampling keeps the clock reads off most calls; the
    /// median moves a little slower, which a hint does not mind.
    pub(crate) fn start(&self) -> Option<Instant> {
        thread_local!(static CALLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
        let sampled = CALLS.with(|c| {
            let n = c.get().wrapping_add(1);
            c.set(n);
            n % 8 == 0
        });
        (sampled || self.observed.load(Ordering::Relaxed) == 0).then(Instant::now)
    }

    /// A call that took `d` completed.
    pub fn observe(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX - 1);
        let slot = self.observed.fetch_add(1, Ordering::Relaxed) % SAMPLES as u64;
        // Racing writers each take a slot of their own; a reader may see a slot one write late,
        // which a hint does not mind.
        self.samples[slot as usize].store(us.saturating_add(1), Ordering::Relaxed);
    }

    /// The typical duration of a completed call (the median of the recent ones), once one
    /// completed.
    pub fn typical(&self) -> Option<Duration> {
        let mut seen = [0u64; SAMPLES];
        let mut n = 0;
        for slot in &self.samples {
            match slot.load(Ordering::Relaxed) {
                0 => {}
                us => {
                    seen[n] = us - 1;
                    n += 1;
                }
            }
        }
        if n == 0 {
            return None;
        }
        // The lower median: of an even count, the shorter of the middle two.
        let (_, median, _) = seen[..n].select_nth_unstable((n - 1) / 2);
        Some(Duration::from_micros(*median))
    }
}

/// What a begun call goes on with, once the store's answer has been observed.
pub(crate) enum Started {
    /// Run the body under this claim.
    Claimed(Claimed),
    /// Return this stored answer; the body does not run.
    Replay(StoredResponse),
}

/// The one mapping from a store's answer to what the caller gets: a claim, a replay, or the
/// error it is (in progress, with its [`RetryHint`]; key reused; the store's own), each recorded
/// as an outcome.
pub(crate) fn started(
    scope: &str,
    key: &Key,
    outcome: Result<BeginOutcome>,
    timing: Option<&Timing>,
) -> Result<Started> {
    let (what, fence, next) = match outcome {
        Ok(BeginOutcome::Claimed(c)) => {
            let what = if c.reclaimed {
                Outcome::Reclaimed
            } else {
                Outcome::Claimed
            };
            (what, c.fence, Ok(Started::Claimed(c)))
        }
        Ok(BeginOutcome::Replay(stored)) => (Outcome::Replayed, 0, Ok(Started::Replay(stored))),
        Ok(BeginOutcome::InProgress { retry_after }) => (
            Outcome::InProgress,
            0,
            Err(Error::InProgress {
                retry_after: retry_hint().hint(retry_after, timing.and_then(Timing::typical)),
            }),
        ),
        Ok(BeginOutcome::KeyReused) => (Outcome::KeyReused, 0, Err(Error::KeyReused)),
        Ok(BeginOutcome::Parked) => (Outcome::Parked, 0, Err(Error::Parked)),
        Err(e) => (Outcome::StoreError, 0, Err(e)),
    };
    observe::record(what, scope, key.as_str(), fence);
    next
}

/// What [`begin`] hands back when the request may proceed or is already done.
pub enum Begun<'s, S: Store> {
    /// First run (or a take-over of an abandoned one): run the side effect, then complete.
    Claimed(Guard<'s, S>),
    /// Already done: return these bytes and do nothing else.
    Replay(StoredResponse),
}

impl<S: Store> fmt::Debug for Begun<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Begun::Claimed(g) => f.debug_tuple("Claimed").field(g).finish(),
            Begun::Replay(r) => f.debug_tuple("Replay").field(r).finish(),
        }
    }
}

/// Begins a guarded operation on `(scope, key)`.
///
/// A live claim by someone else is [`Error::InProgress`]; a completed or live record with
/// another fingerprint is [`Error::KeyReused`].
pub async fn begin<S: Store>(
    store: &S,
    scope: String,
    key: Key,
    fingerprint: Fingerprint,
    policy: Policy,
) -> Result<Begun<'_, S>> {
    start(store, scope, key, &fingerprint, policy, None, None).await
}

/// [`begin`] for a resumable operation: `request` is stored with the claim, so that a
/// [`Completer`](crate::completer::Completer) with a resume function named
/// [`StoredRequest::name`] finishes the work if the caller never comes back (its process died,
/// or the work ended in an unknown outcome, [`Guard::suspend`], that nobody retried). A guard
/// of a resumable claim dropped before it ends suspends the claim rather than releasing it.
pub async fn begin_resumable<'s, S: Store>(
    store: &'s S,
    scope: String,
    key: Key,
    fingerprint: Fingerprint,
    policy: Policy,
    request: &StoredRequest,
) -> Result<Begun<'s, S>> {
    let request = request.encode();
    start(
        store,
        scope,
        key,
        &fingerprint,
        policy,
        None,
        Some(&request),
    )
    .await
}

/// The one start of a separate-commits call, by hand or generated: begins on the store, maps
/// the answer (`started`), and for a claim builds it, tells the context's claim watch, and
/// guards it, its completion as patient as the watch says (a watched claim is kept alive by its
/// watcher; an unwatched one has a caller waiting on a connection).
async fn start<'s, S: Store>(
    store: &'s S,
    scope: String,
    key: Key,
    fingerprint: &Fingerprint,
    policy: Policy,
    timing: Option<&Timing>,
    stored: Option<&[u8]>,
) -> Result<Begun<'s, S>> {
    // A call that stores no request of its own stores its context's (a resumable consumer's
    // message), with its own lease and retention.
    let from_context = match stored {
        Some(_) => None,
        None => context::stored_request().map(|r| r.with_policy(&policy).encode()),
    };
    let stored = stored.or(from_context.as_deref());
    // A resumable call that a completer resumes runs under the claim the completer took.
    let handed = stored.and_then(|_| context::take_handoff(&scope, key.as_str(), fingerprint));
    let begun = match handed {
        Some(claimed) => Started::Claimed(claimed),
        None => {
            let mut req = request(&scope, &key, fingerprint, &policy);
            req.request = stored;
            let outcome = begin_waiting(store, req, &policy).await;
            started(&scope, &key, outcome, timing)?
        }
    };
    Ok(match begun {
        Started::Claimed(c) => {
            let claim = ClaimInfo::new(scope, key, c);
            let patience = if context::note_claim(&claim, Some(policy.lease)) {
                Patience::WhileLeased
            } else {
                Patience::Brief
            };
            Begun::Claimed(
                Guard::new(store, claim, policy)
                    .patience(patience)
                    .resumable(stored.is_some()),
            )
        }
        Started::Replay(stored) => Begun::Replay(stored),
    })
}

/// The first pause of a waiting duplicate between two asks, and the longest.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(250);

/// Begins on the store; while the answer is "in progress" and the call's wait (its policy's,
/// else its context's) has time left, asks again: when the store announces that the running
/// claim ended ([`Store::changes`]), else after a pause that doubles from 5 ms to 250 ms, cut
/// to the time left. Nothing is held between two asks: each is one `begin`, which replays the
/// running call's answer once it completed, or claims the key once it was released. A call
/// that finds no running claim pays for none of it.
async fn begin_waiting<S: Store>(
    store: &S,
    req: BeginRequest<'_>,
    policy: &Policy,
) -> Result<BeginOutcome> {
    let outcome = store.begin(req).await;
    if !matches!(outcome, Ok(BeginOutcome::InProgress { .. })) {
        return outcome;
    }
    let wait = if policy.wait.is_zero() {
        context::wait().unwrap_or(Duration::ZERO).min(policy.lease)
    } else {
        policy.wait
    };
    if wait.is_zero() {
        return outcome;
    }
    let deadline = tokio::time::Instant::now() + wait;
    // Listening before the next ask: an end between that ask and the pause is heard.
    let mut listening = store.changes().map(|c| c.listen(req.scope, req.key));
    let mut pause = if listening.is_some() {
        Duration::ZERO
    } else {
        FIRST_PAUSE
    };
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return outcome;
        }
        let nap = tokio::time::sleep(pause.min(left));
        match listening.as_mut() {
            Some(listening) => {
                tokio::select! {
                    () = listening.changed() => {}
                    () = nap => {}
                }
            }
            None => nap.await,
        }
        let next = store.begin(req).await;
        if !matches!(next, Ok(BeginOutcome::InProgress { .. })) {
            return next;
        }
        pause = (pause * 2).clamp(FIRST_PAUSE, LONGEST_PAUSE);
    }
}

fn request<'a>(
    scope: &'a str,
    key: &'a Key,
    fingerprint: &'a Fingerprint,
    policy: &'a Policy,
) -> BeginRequest<'a> {
    BeginRequest::new(scope, key.as_str(), fingerprint, policy)
}

/// The return type of a guarded function: a `Result`, possibly behind an alias.
#[diagnostic::on_unimplemented(
    message = "an #[idempotent] function must return `Result<T, E>`, not `{Self}`",
    label = "not a `Result`",
    note = "the body's `Ok` value is stored and replayed; its `Err` releases the claim so a retry can run"
)]
#[doc(hidden)]
pub trait IdemResult: Sized {
    /// The `Ok` type: what is stored and replayed.
    type Ok;
    /// The `Err` type.
    type Err;
    /// `Self`, named through the trait: a return type that is not a `Result` then becomes an
    /// error type after its one error, and nothing downstream reports it again.
    type Checked;
    /// `Ok(v)`.
    fn from_ok(v: Self::Ok) -> Self;
    /// `Err(e)`.
    fn from_err(e: Self::Err) -> Self;
    /// The `Result` itself.
    fn into_result(self) -> std::result::Result<Self::Ok, Self::Err>;
}

impl<T, E> IdemResult for std::result::Result<T, E> {
    type Ok = T;
    type Err = E;
    type Checked = Self;
    fn from_ok(v: T) -> Self {
        Ok(v)
    }
    fn from_err(e: E) -> Self {
        Err(e)
    }
    fn into_result(self) -> Self {
        self
    }
}

#[doc(hidden)]
/// How idem's errors become the function's error type, and which of its errors are final.
///
/// `M` is the replay marker of the function's `Ok` type ([`Replay`]`<M>`): inferred, or fixed
/// by [`ErrorOps::replayed_as`] so that an unmet bound names the type inside the answer.
pub struct ErrorOps<E, M> {
    pub(crate) from_idem: fn(Error) -> E,
    pub(crate) finals: Option<FinalOps<E>>,
    pub(crate) replay: PhantomData<fn() -> M>,
}

/// How a function that stores final errors tells, stores and rebuilds them.
pub(crate) struct FinalOps<E> {
    pub(crate) is_final: fn(&E) -> bool,
    pub(crate) encode: fn(&E) -> Result<StoredResponse>,
    pub(crate) decode: fn(StoredResponse) -> Result<E>,
}

impl<E, M> fmt::Debug for ErrorOps<E, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ErrorOps")
            .field("stores_final_errors", &self.finals.is_some())
            .finish()
    }
}

impl<E: From<Error>, M> ErrorOps<E, M> {
    /// Errors release the claim; idem's own failures become `E` through its `From<Error>`.
    pub fn releasing() -> Self {
        ErrorOps {
            from_idem: E::from,
            finals: None,
            replay: PhantomData,
        }
    }
}

impl<E, M> ErrorOps<E, M> {
    /// Fixes the replay marker to `shape`'s: with one candidate left, the compiler reports
    /// what that implementation lacks (the `T` inside `Json<T>`), not the whole `Ok` type.
    pub fn replayed_as(self, _shape: crate::replay::Shape<M>) -> Self {
        self
    }

    fn fail<R: IdemResult<Err = E>>(&self, e: Error) -> R {
        R::from_err((self.from_idem)(e))
    }

    /// The stored form of `e`, when it is a final error this function stores.
    fn stored_final(&self, e: &E) -> Option<Result<StoredResponse>> {
        let finals = self.finals.as_ref().filter(|f| (f.is_final)(e))?;
        Some((finals.encode)(e))
    }
}

#[doc(hidden)]
/// The identity and fingerprint of a call, or why it has none: computed before the body.
#[derive(Debug)]
pub struct Prepared {
    parts: Result<Parts>,
    policy: Policy,
    timing: Option<&'static Timing>,
    /// The encoded request of a resumable call.
    request: Option<Vec<u8>>,
}

#[derive(Debug)]
struct Parts {
    scope: String,
    key: Key,
    fingerprint: Fingerprint,
}

/// A prepared call with its parts: what a flow starts from.
struct Call {
    scope: String,
    key: Key,
    fingerprint: Fingerprint,
    policy: Policy,
    timing: Option<&'static Timing>,
    request: Option<Vec<u8>>,
}

impl Prepared {
    /// The call's parts. A bad key is the client's error and is reported before anything about
    /// the scope.
    #[inline]
    pub fn new(
        key: Result<Key>,
        scope: Result<String>,
        fingerprint: Result<Fingerprint>,
        policy: Policy,
    ) -> Prepared {
        let parts = key.and_then(|key| {
            Ok(Parts {
                scope: scope?,
                key,
                fingerprint: fingerprint?,
            })
        });
        Prepared {
            parts,
            policy,
            timing: None,
            request: None,
        }
    }

    /// Makes the call resumable: its request, for the resume function `name`, is stored with
    /// its claim ([`StoredRequest`]); `payload` is the call's arguments, encoded, or why they
    /// could not be. A request larger than `max_request` bytes ([`RequestCap`]) is refused
    /// before anything is claimed.
    pub fn resumable(
        mut self,
        name: &str,
        payload: Result<Vec<u8>>,
        max_request: usize,
    ) -> Prepared {
        let stored = RequestCap::new(max_request)
            .and_then(|cap| payload.and_then(|payload| StoredRequest::within(name, payload, cap)));
        match stored {
            Ok(stored) => self.request = Some(stored.with_policy(&self.policy).encode()),
            Err(e) => {
                if self.parts.is_ok() {
                    self.parts = Err(e);
                }
            }
        }
        self
    }

    /// The call's parts, its policy and its timing, or why it has none.
    #[inline]
    fn split(self) -> Result<Call> {
        let Parts {
            scope,
            key,
            fingerprint,
        } = self.parts?;
        Ok(Call {
            scope,
            key,
            fingerprint,
            policy: self.policy,
            timing: self.timing,
            request: self.request,
        })
    }

    /// Measures the call's duration into `timing`, and uses it for "in progress" hints.
    #[inline]
    pub fn timed(mut self, timing: &'static Timing) -> Prepared {
        self.timing = Some(timing);
        self
    }
}

#[doc(hidden)]
/// The body of a guarded function: a future, or a closure that takes the claim's
/// [`ClaimInfo`] (`claim = …`).
pub trait Body<R> {
    /// The body's future.
    type Fut: Future<Output = R>;
    /// Starts the body; `claim` is called only by bodies that take their claim.
    fn start(self, claim: impl FnOnce() -> ClaimInfo) -> Self::Fut;
}

#[doc(hidden)]
/// A body that does not look at its claim.
#[derive(Debug)]
pub struct Plain<F>(pub F);

impl<R, F: Future<Output = R>> Body<R> for Plain<F> {
    type Fut = F;
    fn start(self, _claim: impl FnOnce() -> ClaimInfo) -> F {
        self.0
    }
}

#[doc(hidden)]
/// A body that is handed its claim.
#[derive(Debug)]
pub struct WithClaim<C>(pub C);

impl<R, C, F> Body<R> for WithClaim<C>
where
    C: FnOnce(ClaimInfo) -> F,
    F: Future<Output = R>,
{
    type Fut = F;
    fn start(self, claim: impl FnOnce() -> ClaimInfo) -> F {
        (self.0)(claim())
    }
}

#[doc(hidden)]
/// The separate-commits flow: claim (committed), body, complete or release.
///
/// One flat async fn that awaits the store and the guard directly, so the future every caller
/// moves around holds one guard and one response.
pub async fn run<S, R, M, B>(
    store: &S,
    prepared: Prepared,
    errors: ErrorOps<R::Err, M>,
    body: B,
) -> R
where
    S: Store,
    R: IdemResult,
    R::Ok: Replay<M>,
    B: Body<R>,
{
    let Call {
        scope,
        key,
        fingerprint,
        policy,
        timing,
        request,
    } = match prepared.split() {
        Ok(call) => call,
        Err(e) => return errors.fail(e),
    };
    let begun = start(
        store,
        scope,
        key,
        &fingerprint,
        policy,
        timing,
        request.as_deref(),
    )
    .await;
    let mut guard = match begun {
        Ok(Begun::Claimed(guard)) => guard,
        Ok(Begun::Replay(stored)) => return replay::<R, M>(stored, &errors),
        Err(e) => return errors.fail(e),
    };
    let began = timing.and_then(Timing::start);
    let observe = |recorded: &Recorded| {
        if let (Some(timing), Some(began), Recorded::Stored) = (timing, began, recorded) {
            timing.observe(began.elapsed());
        }
    };
    match body.start(|| guard.info()).await.into_result() {
        // The completion policy decides what becomes of the answer and of the claim.
        Ok(v) => {
            // `Guard::record`, its halves around the completion awaited here.
            let recorded = match guard.answer_to_store(v.encode()) {
                Some(stored) => {
                    let result = guard.finish(stored).await;
                    guard.recorded(result)
                }
                None => Recorded::Unstored,
            };
            observe(&recorded);
            match recorded {
                Recorded::Stored | Recorded::Unstored => R::from_ok(v),
                Recorded::Lost(e) => errors.fail(e),
            }
        }
        Err(e) => {
            match errors.stored_final(&e) {
                // An error after an effect that may have happened is never final: the work is
                // kept for a retry or the completer to finish.
                _ if guard.info_unknown() => guard.fail_or_log().await,
                // The answer is this error whether or not it was stored.
                Some(Ok(stored)) => observe(&guard.record(Ok(stored)).await),
                Some(Err(enc)) => {
                    tracing::error!(target: "idem", error = %enc, "cannot store a final error; releasing the claim instead");
                    guard.give_up_or_log().await;
                }
                // Only successes (and final errors) are worth replaying: free the key for a
                // real retry, unless the body said its effect may have happened.
                None => guard.fail_or_log().await,
            }
            R::from_err(e)
        }
    }
}

/// The separate-commits flow on a task of its own, for `on_cancel = "finish"`: the claim, the
/// body and the completion run to their end even when the caller's future is dropped (a client
/// that hung up), so a retry gets "in progress" and then the stored answer, never a second run
/// of a body cut halfway. The caller awaits the task; a panic in the body is the caller's panic.
pub async fn run_detached<S, R, M, B>(
    store: S,
    prepared: Prepared,
    errors: ErrorOps<R::Err, M>,
    body: B,
) -> R
where
    S: Store,
    R: IdemResult + Send + 'static,
    R::Ok: Replay<M> + Send,
    R::Err: Send + 'static,
    M: 'static,
    B: DetachedBody<R>,
{
    // The body's task runs in the caller's context: a consumer's policy and watches follow it.
    let task = context::spawn(async move { run(&store, prepared, errors, body).await });
    match task.await {
        Ok(out) => out,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // The runtime is shutting down: the caller goes with it.
            Err(e) => panic!("the guarded body's task was cancelled: {e}"),
        },
    }
}

/// A body that can run on a task of its own: it owns what it uses (`'static`) and can move
/// between threads (`Send`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "the body of an `#[idempotent(on_cancel = \"finish\")]` function must be `Send` and own what it uses",
    label = "runs on a task of its own",
    note = "`on_cancel = \"finish\"` moves the body onto a task of its own so that a dropped caller does not cut it halfway: values it holds across an `.await` must be `Send` (an `Arc` rather than an `Rc`, a `tokio::sync::Mutex` guard rather than a `std` one), and it cannot borrow from the caller"
)]
pub trait DetachedBody<R>: Body<R, Fut: Send> + Send + 'static {}

impl<R, B> DetachedBody<R> for B
where
    B: Body<R> + Send + 'static,
    B::Fut: Send,
{
}

/// A stored response, as the function's return value: its `Ok`, or a stored final error.
fn replay<R, M>(stored: StoredResponse, errors: &ErrorOps<R::Err, M>) -> R
where
    R: IdemResult,
    R::Ok: Replay<M>,
{
    if let Some(not_kept) = stored.not_kept() {
        return errors.fail(not_kept);
    }
    context::note_replay(&stored, None);
    if stored.is_error {
        return match &errors.finals {
            Some(finals) => match (finals.decode)(stored) {
                Ok(e) => R::from_err(e),
                Err(e) => errors.fail(e),
            },
            None => errors.fail(Error::Decode(
                "the stored response is a final error, but this function does not store final errors (on_error = \"store_final\")".into(),
            )),
        };
    }
    match R::Ok::decode(stored) {
        Ok(v) => R::from_ok(v),
        Err(e) => errors.fail(e),
    }
}

/// The transactional flow of `#[idempotent(…, transaction = tx)]`: claim, body and completion in
/// one database transaction.
///
/// The macro calls [`tx_start`], runs the body inline on the transaction it opened (no closure,
/// so nothing higher-ranked stands between the body and the caller's `Send` checks), then
/// [`tx_finish`], which is the one call that needs the return type's bounds.
#[cfg(feature = "sql")]
mod transactional {
    use super::*;
    use crate::store::TxStore;
    use crate::store::sql::map_err;

    type Tx<S> = sqlx::Transaction<'static, <S as TxStore>::Database>;

    #[doc(hidden)]
    /// What [`tx_start`] found: a claim inside an open transaction, or the end of the story (a
    /// replay, or a refusal).
    pub struct TxStart<T> {
        state: std::result::Result<TxClaim<T>, Result<StoredResponse>>,
    }

    impl<T> fmt::Debug for TxStart<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match &self.state {
                Ok(c) => f.debug_tuple("Claimed").field(c).finish(),
                Err(done) => f.debug_tuple("Done").field(done).finish(),
            }
        }
    }

    impl<T> TxStart<T> {
        /// The transaction to run the body in, when the claim was taken.
        pub fn transaction(&mut self) -> Option<&mut T> {
            self.state.as_mut().ok().map(|c| &mut c.tx)
        }

        /// The transaction and what the body may know about its claim, when the claim was
        /// taken.
        pub fn claimed(&mut self) -> Option<(&mut T, ClaimInfo)> {
            self.state
                .as_mut()
                .ok()
                .map(|c| (&mut c.tx, c.claim.clone()))
        }
    }

    #[doc(hidden)]
    /// A claim held inside the open transaction `T`.
    pub struct TxClaim<T> {
        tx: T,
        claim: ClaimInfo,
        fingerprint: Fingerprint,
        policy: Policy,
        timing: Option<(&'static Timing, Instant)>,
        /// The encoded request of a resumable call.
        request: Option<Vec<u8>>,
    }

    impl<T> fmt::Debug for TxClaim<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("TxClaim")
                .field("claim", &self.claim)
                .finish_non_exhaustive()
        }
    }

    #[doc(hidden)]
    /// Opens the transaction and claims inside it; a replay or a refusal ends it at once.
    pub async fn tx_start<S: TxStore>(store: &S, prepared: Prepared) -> TxStart<Tx<S>> {
        TxStart {
            state: match start(store, prepared).await {
                Ok(Ok(claim)) => Ok(claim),
                Ok(Err(stored)) => Err(Ok(stored)),
                Err(e) => Err(Err(e)),
            },
        }
    }

    async fn start<S: TxStore>(
        store: &S,
        prepared: Prepared,
    ) -> Result<std::result::Result<TxClaim<Tx<S>>, StoredResponse>> {
        let Call {
            scope,
            key,
            fingerprint,
            policy,
            timing,
            request: stored,
        } = prepared.split()?;
        let mut req = request(&scope, &key, &fingerprint, &policy);
        req.request = stored.as_deref();
        // A replay is answered before a transaction opens where the store can read first; a
        // first claim goes straight to the transaction.
        let (tx, outcome) = match store.answer_first(req).await {
            Ok(None) => {
                let mut tx = store.begin_transaction().await?;
                let outcome = store.begin_in(&mut tx, req).await;
                (Some(tx), outcome)
            }
            Ok(Some(answer)) => (None, Ok(answer)),
            Err(e) => (None, Err(e)),
        };
        // Past this point a transaction that is dropped (a replay, a refusal, an error) wrote
        // nothing: its rollback is queued on the connection rather than waited for.
        match started(&scope, &key, outcome, timing)? {
            Started::Claimed(c) => {
                let Some(tx) = tx else {
                    return Err(Error::Store(
                        "the store answered a claim without a transaction".into(),
                    ));
                };
                let claim = ClaimInfo::new(scope, key, c);
                context::note_claim(&claim, None);
                Ok(Ok(TxClaim {
                    tx,
                    claim,
                    fingerprint,
                    policy,
                    timing: timing.and_then(|t| Some((t, t.start()?))),
                    request: stored,
                }))
            }
            Started::Replay(stored) => Ok(Err(stored)),
        }
    }

    #[doc(hidden)]
    /// The function's return value. For a claim, with the body's `out`: completes and commits
    /// on `Ok`; on `Err` rolls back, then, if the identity is still free, records a final error
    /// on its own (when the function stores final errors) or leaves the record released, one
    /// attempt on. Otherwise the replay, or the refusal.
    pub async fn tx_finish<S, R, M>(
        store: &S,
        start: TxStart<Tx<S>>,
        errors: ErrorOps<R::Err, M>,
        out: Option<R>,
    ) -> R
    where
        S: TxStore,
        R: IdemResult,
        R::Ok: Replay<M>,
    {
        let (claim, out) = match (start.state, out) {
            (Ok(claim), Some(out)) => (claim, out),
            (Err(Ok(stored)), _) => return replay::<R, M>(stored, &errors),
            (Err(Err(e)), _) => return errors.fail(e),
            (Ok(claim), None) => {
                // Unreachable from generated code: a claim always runs the body.
                rollback(claim.tx, &claim.claim).await;
                return errors.fail(Error::Config("the guarded body did not run".into()));
            }
        };
        match out.into_result() {
            Ok(v) => commit::<S, R, M>(store, claim, v, &errors).await,
            Err(e) => {
                let TxClaim {
                    tx,
                    claim,
                    fingerprint,
                    policy,
                    request: stored_request,
                    ..
                } = claim;
                rollback(tx, &claim).await;
                // The rollback took the claim with it. Outside the transaction, the record is
                // left as the error means for the next attempt: suspended when the body said an
                // effect outside the database may have happened (for a retry or the completer
                // to finish); a final error stored, to be replayed; any other error released,
                // as in separate commits, so the next claim knows it is one more attempt
                // (`ClaimInfo::attempt`: what a consumer's delivery limit counts when its
                // broker cannot). Unless the identity was taken meanwhile.
                let unknown = claim.unknown_outcome();
                let stored = errors.stored_final(&e).and_then(Result::ok);
                if let Ok(Begun::Claimed(mut guard)) = super::start(
                    store,
                    claim.scope().to_owned(),
                    claim.key().clone(),
                    &fingerprint,
                    policy,
                    None,
                    stored_request.as_deref(),
                )
                .await
                {
                    match (unknown, stored) {
                        (Some(why), _) => {
                            let _ = guard.suspend(&why).await;
                        }
                        (None, Some(stored)) => {
                            if let Err(not_stored) = guard.complete(&stored).await {
                                tracing::warn!(target: "idem", scope = claim.scope(), key = %claim.key(), error = %not_stored, "could not store a final error after its transaction rolled back: a retry runs the body again");
                            }
                        }
                        (None, None) => guard.give_up_or_log().await,
                    }
                }
                R::from_err(e)
            }
        }
    }

    async fn commit<S, R, M>(
        store: &S,
        mut claim: TxClaim<Tx<S>>,
        v: R::Ok,
        errors: &ErrorOps<R::Err, M>,
    ) -> R
    where
        S: TxStore,
        R: IdemResult,
        R::Ok: Replay<M>,
    {
        let stored = match v.encode() {
            // Too large to keep: the caller gets it, the record says it ran, as in separate
            // commits.
            Ok(s) => crate::guard::kept(&claim.claim, &claim.policy, s),
            Err(e) => return errors.fail(e),
        };
        if let Err(e) = store
            .complete_in(&mut claim.tx, claim.claim.claim_ref(), &stored)
            .await
        {
            return errors.fail(e);
        }
        match claim.tx.commit().await {
            Ok(()) => {
                claim.claim.observe(Outcome::Completed);
                if let Some((timing, began)) = claim.timing {
                    timing.observe(began.elapsed());
                }
                R::from_ok(v)
            }
            // Nothing was committed (or, if the connection dropped during COMMIT, everything
            // was): either way a retry with the same key gets the right answer.
            Err(e) => errors.fail(map_err(e)),
        }
    }

    async fn rollback<DB: sqlx::Database>(tx: sqlx::Transaction<'static, DB>, claim: &ClaimInfo) {
        // Errors are moot: a connection that is gone has rolled the transaction back too.
        let _ = tx.rollback().await;
        claim.observe(Outcome::Released);
    }
}

#[cfg(feature = "sql")]
pub use transactional::{TxClaim, TxStart, tx_finish, tx_start};

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE_LEFT: Duration = Duration::from_secs(300);

    fn hint(timing: &Timing) -> Duration {
        RetryHint::DEFAULT.hint(LEASE_LEFT, timing.typical())
    }

    #[test]
    fn a_few_slow_calls_do_not_move_the_hint_most_calls_do() {
        let timing = Timing::new();
        assert_eq!(timing.typical(), None);
        assert_eq!(
            hint(&timing),
            Duration::from_secs(1),
            "nothing observed yet"
        );
        for _ in 0..SAMPLES {
            timing.observe(Duration::from_secs(2));
        }
        assert_eq!(hint(&timing), Duration::from_secs(2));

        // One caller's requests take the whole lease, several times in a row.
        for _ in 0..5 {
            timing.observe(Duration::from_secs(290));
        }
        assert_eq!(
            hint(&timing),
            Duration::from_secs(2),
            "a few slow calls do not drag the hint"
        );
        // Even as many as just under half of the recent calls.
        for _ in 5..SAMPLES / 2 {
            timing.observe(Duration::from_secs(290));
        }
        assert_eq!(hint(&timing), Duration::from_secs(2));

        // Most calls slow down: the hint follows.
        for _ in 0..SAMPLES / 2 + 1 {
            timing.observe(Duration::from_secs(9));
        }
        assert_eq!(hint(&timing), Duration::from_secs(9));
        for _ in 0..SAMPLES {
            timing.observe(Duration::from_millis(1_500));
        }
        assert_eq!(hint(&timing), Duration::from_millis(1_500), "and back");
    }

    #[test]
    fn the_median_of_few_observations() {
        let timing = Timing::new();
        timing.observe(Duration::from_millis(40));
        assert_eq!(timing.typical(), Some(Duration::from_millis(40)));
        timing.observe(Duration::from_secs(100));
        assert_eq!(
            timing.typical(),
            Some(Duration::from_millis(40)),
            "the shorter of two"
        );
        timing.observe(Duration::from_millis(60));
        assert_eq!(timing.typical(), Some(Duration::from_millis(60)));
    }
}
