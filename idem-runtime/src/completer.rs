//! The completer: resumable work whose caller never came back is finished, once.
//!
//! A resumable call (`#[idempotent(…, resumable)]`, [`begin_resumable`] by hand, a route of
//! the `tower` guard built with `GuardLayer::resumable`, or the handler of a consumer built with
//! `Consumer::resumable`) stores its request with its claim. When the caller does not come back
//! for it — its process was
//! killed, or the call ended in an outcome that may have had its effect
//! ([`ClaimInfo::outcome_unknown`]) and nobody retried — a [`Completer`] running next to the
//! service finds the claim once its lease ran out (its resume time passed too: after an
//! unknown outcome it waits [`resume_delay`] of the attempt, doubling each time), takes it
//! over (fence + 1, attempt + 1, the recovery point), and runs the resume function registered
//! for the request's name with the stored request. That function calls the guarded call again
//! with the stored arguments and the service's own state (its database, its gateway client):
//! the call runs under the completer's claim, and its answer is stored like any other, so the
//! client's later retry or lookup gets it. For a resumable route of the `tower` guard, the
//! resume function is `idem::tower::resend(service)`: it sends the stored HTTP request through
//! the guarded service again. For a resumable message consumer, [`Completer::consumer`] registers
//! the consumer's own handler, which runs again on the stored message once its broker stopped
//! delivering it.
//!
//! ```
//! use std::time::Duration;
//! use idem::completer::{Completer, Resumption};
//! use idem::{idempotent, ClaimInfo, MemoryStore};
//!
//! #[derive(Clone)]
//! struct Payments { idem: MemoryStore }
//!
//! impl Payments {
//!     #[idempotent(scope = "refund:<order_no>", key = key, store = self.idem, claim = claim, resumable)]
//!     async fn refund(&self, order_no: String, key: String) -> Result<u64, idem::Error> {
//!         // Call the gateway with claim.downstream_key("refund"): a resumed attempt that
//!         // repeats the call is deduplicated there.
//!         Ok(250)
//!     }
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let payments = Payments { idem: MemoryStore::new() };
//! let running = Completer::new(payments.idem.clone())
//!     // The name is the scope template; the function gets the stored arguments.
//!     .resume("refund:<order_no>", {
//!         let payments = payments.clone();
//!         move |r: Resumption| {
//!             let payments = payments.clone();
//!             async move {
//!                 let order_no: String = r.arg("order_no")?;
//!                 payments.refund(order_no, r.key().to_string()).await
//!             }
//!         }
//!     })
//!     .every(Duration::from_secs(5))
//!     .start()?;
//! # drop(running);
//! # Ok::<(), idem::Error>(())
//! # }).unwrap();
//! ```
//!
//! Guarantees:
//!
//! - **Once.** A claim is taken by one attempt at a time: any number of completers (one per
//!   instance) and client retries may race for it, and the store's claim decides. The resumed
//!   call's downstream keys ([`ClaimInfo::downstream_key`]) are those of every attempt of the
//!   request, so an outside call it repeats is deduplicated there.
//! - **Bounded.** A claim resumed `max_attempts` times (8 by default) without finishing is
//!   parked ([`State::Parked`](crate::lifecycle::State::Parked)) with its last error: never run
//!   again by itself, never purged; a request with its key is answered 409 `REQUEST_PARKED`;
//!   an operator retries it (`idem records retry`, the admin view) or releases it.
//! - **Visible.** Unfinished and parked claims are listed and counted by the store's operator
//!   operations (`idem records list --state unfinished` and `--state parked`, `idem stats`, the
//!   admin view), and the completer reports what it did as metrics
//!   (`idem_completer_resumed_total`, `idem_completer_parked_total`) and the store's counts as
//!   gauges (`idem_unfinished_claims`, `idem_unfinished_oldest_seconds`, `idem_parked_claims`,
//!   read every [`Completer::count_every`]).
//! - **Where it runs.** One per instance, beside the service: completers need no election, since
//!   each takes a due claim with an ordinary claim on the store, which one attempt wins.
//!
//! A resume function that fails before the guarded call claims the record (it could not decode
//! the request, a dependency was down) counts as an attempt: the claim is suspended with its
//! error and tried again later, then parked. A request whose name has no resume function here
//! is left alone (another service sharing the store may finish it), and logged once.
//!
//! [`begin_resumable`]: crate::flow::begin_resumable
//! [`ClaimInfo::outcome_unknown`]: crate::ClaimInfo::outcome_unknown
//! [`ClaimInfo::downstream_key`]: crate::ClaimInfo::downstream_key
//! [`resume_delay`]: crate::lifecycle::resume_delay

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::context::{ClaimWatch, Context, Handed, Handoff};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::guard::{ClaimInfo, End};
use crate::key::{Key, KeyPolicy};
use crate::lifecycle::resume_delay;
use crate::observe;
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, StoredRequest, Unfinished};
use crate::store::Store;

/// How often a completer looks for due claims by default: every five seconds.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(5);

/// How many times by default a claim is resumed before it is parked.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;

/// How often a completer reads the counts of unfinished work into its gauges by default: once
/// a minute ([`Completer::count_every`]).
pub const DEFAULT_COUNT_EVERY: Duration = Duration::from_secs(60);

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A registered resume function: the outcome is the call's error, rendered, if it failed.
pub(crate) type ResumeFn =
    Arc<dyn Fn(Resumption) -> BoxFuture<std::result::Result<(), String>> + Send + Sync>;

/// Finishes resumable claims whose caller never came back; see the [module](self)
/// documentation. Built with by-value setters, started with [`Completer::start`].
pub struct Completer<S> {
    store: S,
    resumers: HashMap<String, ResumeFn>,
    every: Duration,
    max_attempts: u32,
    batch: usize,
    concurrency: usize,
    /// Names of due requests that have no resume function here, logged once each.
    unknown_names: Arc<Mutex<HashSet<String>>>,
    /// The delivery limits of the consumers registered ([`Completer::consumer`]), by name.
    delivery_limits: HashMap<String, u32>,
    /// How often the unfinished-work gauges are read from the store.
    count_every: Duration,
    /// When they were last read, by this process's clock.
    counted: Mutex<Option<tokio::time::Instant>>,
}

impl<S> fmt::Debug for Completer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.resumers.keys().map(String::as_str).collect();
        names.sort_unstable();
        f.debug_struct("Completer")
            .field("resumes", &names)
            .field("every", &self.every)
            .field("max_attempts", &self.max_attempts)
            .field("batch", &self.batch)
            .field("concurrency", &self.concurrency)
            .field("count_every", &self.count_every)
            .finish_non_exhaustive()
    }
}

/// A claim being resumed, as its resume function gets it: the stored request, and who it was.
#[derive(Debug, Clone)]
pub struct Resumption {
    scope: String,
    key: Key,
    fingerprint: Fingerprint,
    request: StoredRequest,
    attempt: u32,
    note: Option<String>,
}

impl Resumption {
    /// The record's scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The record's key: the client's idempotency key, to call the guarded function with.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The record's fingerprint: the request's, as its first call computed it. The resumed
    /// call runs under the completer's claim only if it computes the same.
    ///
    /// ```
    /// use idem::completer::{Completer, Resumption};
    /// use idem::MemoryStore;
    ///
    /// let completer = Completer::new(MemoryStore::new()).resume("refunds", |r: Resumption| async move {
    ///     println!("resuming {} {} ({})", r.scope(), r.key(), r.fingerprint());
    ///     Ok::<(), idem::Error>(())
    /// });
    /// # drop(completer);
    /// ```
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The stored request.
    pub fn request(&self) -> &StoredRequest {
        &self.request
    }

    /// The stored arguments, as the call encoded them.
    pub fn payload(&self) -> &Bytes {
        self.request.payload()
    }

    /// The stored arguments decoded from JSON (what `#[idempotent(resumable)]` stores: an
    /// object of the fingerprinted arguments by name) into `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(self.payload()).map_err(|e| {
            Error::Decode(format!(
                "the stored request of {:?} as {}: {e}",
                self.request.name(),
                std::any::type_name::<T>()
            ))
        })
    }

    /// The stored argument `name` (a fingerprinted argument of an `#[idempotent(resumable)]`
    /// function, or a field path such as `req.cents` when it fingerprints one), decoded into
    /// `T`.
    pub fn arg<T: DeserializeOwned>(&self, name: &str) -> Result<T> {
        let object: serde_json::Map<String, serde_json::Value> = self.json()?;
        let value = object.get(name).ok_or_else(|| {
            Error::Decode(format!(
                "the stored request of {:?} has no argument `{name}` (it has: {})",
                self.request.name(),
                object.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        T::deserialize(value).map_err(|e| {
            Error::Decode(format!(
                "the stored argument `{name}` of {:?} as {}: {e}",
                self.request.name(),
                std::any::type_name::<T>()
            ))
        })
    }

    /// Which attempt held the claim last; the resumed call runs as the next one.
    pub fn last_attempt(&self) -> u32 {
        self.attempt
    }

    /// Why the last attempt did not finish, when it said.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }
}

/// What one round of a completer did ([`Completer::run_once`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Round {
    /// Due claims found.
    pub due: u64,
    /// Resumed calls that stored their answer.
    pub completed: u64,
    /// Resumed calls that ended in an error that says nothing happened: the claim is released.
    pub released: u64,
    /// Resumed calls that ended unknown again (or failed before they claimed): suspended, to
    /// be tried again later.
    pub suspended: u64,
    /// Claims parked: their attempts ran out, or their request could not be read.
    pub parked: u64,
    /// Claims another attempt held or had finished: left to it.
    pub taken: u64,
    /// Claims left alone: no resume function of their name here.
    pub skipped: u64,
}

/// A running completer; dropping it stops the task.
#[derive(Debug)]
pub struct Running {
    handle: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops the task now.
    pub fn stop(self) {}
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

impl<S: Store + Clone> Completer<S> {
    /// A completer for `store`'s resumable claims, with no resume function yet, looking every
    /// five seconds, parking a claim after eight attempts.
    pub fn new(store: S) -> Self {
        Completer {
            store,
            resumers: HashMap::new(),
            every: DEFAULT_EVERY,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            batch: 32,
            concurrency: 4,
            unknown_names: Arc::default(),
            delivery_limits: HashMap::new(),
            count_every: DEFAULT_COUNT_EVERY,
            counted: Mutex::default(),
        }
    }

    /// Registers `f` as the resume function of requests named `name` (for
    /// `#[idempotent(resumable)]`, the function's scope template as written, e.g.
    /// `"refund:<order_no>"`, or the name given with `resumable = "…"`; for a hand-written
    /// call, the name of its [`StoredRequest`]). `f` calls the guarded
    /// call with what the [`Resumption`] holds; the call runs under the completer's claim. Its
    /// error, if it fails, is rendered with `Debug` as the claim's note.
    pub fn resume<F, Fut, T, E>(self, name: &str, f: F) -> Self
    where
        F: Fn(Resumption) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'static,
        E: fmt::Debug,
    {
        let f = Arc::new(f);
        let resume: ResumeFn = Arc::new(move |r| {
            let fut = f(r);
            Box::pin(async move { fut.await.map(drop).map_err(|e| format!("{e:?}")) })
        });
        self.resume_fn(name.to_owned(), resume, None)
    }

    /// Registers `resume` under `name`; for a message consumer, with its delivery limit.
    pub(crate) fn resume_fn(
        mut self,
        name: String,
        resume: ResumeFn,
        delivery_limit: Option<u32>,
    ) -> Self {
        match delivery_limit {
            Some(limit) => self.delivery_limits.insert(name.clone(), limit),
            None => self.delivery_limits.remove(&name),
        };
        self.resumers.insert(name, resume);
        self
    }

    /// How often the store is asked for due claims (default five seconds, at least 10 ms).
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    /// How many times a claim is resumed before it is parked (default 8, at least 1). Counted
    /// by the record's attempt number, so every attempt counts: the client's first, its
    /// retries, and the completer's, in any process.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// How many due claims one round takes (default 32).
    pub fn batch(mut self, claims: usize) -> Self {
        self.batch = claims;
        self
    }

    /// How many resumed calls run at once (default 4).
    pub fn concurrency(mut self, calls: usize) -> Self {
        self.concurrency = calls;
        self
    }

    /// How often a round also reads the store's counts of unfinished and parked work
    /// ([`StoreAdmin::stats`](crate::store::StoreAdmin::stats)) into the gauges
    /// `idem_unfinished_claims`, `idem_unfinished_oldest_seconds` and `idem_parked_claims`
    /// (default once a minute, at least every round). The counts cover every unfinished claim in
    /// the store, resumable or not, as `idem stats` shows them; reading them scans the store's
    /// records (one aggregate query on a SQL store, a scan of every primary on Redis), so they
    /// are not read every round.
    pub fn count_every(mut self, every: Duration) -> Self {
        self.count_every = every;
        self
    }

    fn check(&self) -> Result<()> {
        if self.resumers.is_empty() {
            return Err(Error::Config(
                "a completer needs at least one resume function (Completer::resume)".into(),
            ));
        }
        if self.every < Duration::from_millis(10) {
            return Err(Error::Config(format!(
                "a completer looks at most every 10 ms, not every {:?}",
                self.every
            )));
        }
        if self.max_attempts == 0 || self.batch == 0 || self.concurrency == 0 {
            return Err(Error::Config(
                "a completer's max_attempts, batch and concurrency are at least 1".into(),
            ));
        }
        for name in self.resumers.keys() {
            StoredRequest::new(name.clone(), Bytes::new())?;
        }
        Ok(())
    }

    /// Says, when it starts, which registered consumers' messages it would park at once:
    /// those whose delivery limit spends its attempts before the broker gives up.
    fn warn_spent_attempts(&self) {
        for (name, limit) in &self.delivery_limits {
            if *limit >= self.max_attempts {
                tracing::warn!(target: "idem", consumer = %name, delivery_limit = limit, max_attempts = self.max_attempts, "a message of this consumer reaches the completer after as many attempts as its delivery limit, and the completer parks a claim after max_attempts: it parks such messages at once, for an operator. Give the completer more attempts than the delivery limit for it to finish them (Completer::max_attempts)");
            }
        }
    }

    /// Starts the completer on the current Tokio runtime: a round every
    /// [`Completer::every`], the first one at once. Refused with [`Error::Config`] when it has
    /// no resume function, or a setting is out of range, or outside a Tokio runtime.
    pub fn start(self) -> Result<Running> {
        self.check()?;
        self.warn_spent_attempts();
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Config("a completer is started inside a Tokio runtime".into()))?;
        let every = self.every;
        let handle = rt.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = self.run_once().await {
                    tracing::warn!(target: "idem", error = %e, "a completer round failed; the next round tries again");
                }
            }
        });
        Ok(Running { handle })
    }

    /// One round: the due claims, each parked, resumed or left alone. What [`Completer::start`]
    /// runs every period; call it directly to drive a completer by hand (a job, a test).
    pub async fn run_once(&self) -> Result<Round> {
        self.check()?;
        self.count_unfinished().await;
        let due = self.store.due(self.batch).await?;
        let mut round = Round {
            due: due.len() as u64,
            ..Round::default()
        };
        let mut running = tokio::task::JoinSet::new();
        for unfinished in due {
            while running.len() >= self.concurrency {
                if let Some(done) = running.join_next().await {
                    tally(&mut round, done);
                }
            }
            let job = self.job(unfinished);
            running.spawn(job);
        }
        while let Some(done) = running.join_next().await {
            tally(&mut round, done);
        }
        Ok(round)
    }

    /// What becomes of one due claim, as a future of its own.
    fn job(&self, unfinished: Unfinished) -> impl Future<Output = Outcome> + Send + 'static {
        let store = self.store.clone();
        let request = StoredRequest::decode(&unfinished.request);
        let resume = request
            .as_ref()
            .ok()
            .and_then(|r| self.resumers.get(r.name()).cloned());
        if let (Ok(request), None) = (&request, &resume) {
            self.unknown_name(request.name());
        }
        let max_attempts = self.max_attempts;
        async move {
            let request = match request {
                Ok(request) => request,
                Err(e) => {
                    let note = format!("its stored request cannot be read: {e}");
                    return park(&store, &unfinished, &note).await;
                }
            };
            let Some(resume) = resume else {
                return Outcome::Skipped;
            };
            if unfinished.attempt >= max_attempts {
                let note = format!(
                    "gave up after {} attempts; last: {}",
                    unfinished.attempt,
                    unfinished
                        .note
                        .as_deref()
                        .unwrap_or("the call did not finish")
                );
                return park(&store, &unfinished, &note).await;
            }
            resume_one(&store, unfinished, request, resume).await
        }
    }

    /// Reads the store's counts of unfinished and parked work into the gauges, when
    /// [`Completer::count_every`] has passed since they were last read.
    async fn count_unfinished(&self) {
        {
            let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
            let now = tokio::time::Instant::now();
            if counted.is_some_and(|at| now.duration_since(at) < self.count_every) {
                return;
            }
            *counted = Some(now);
        }
        match crate::store::StoreAdmin::stats(&self.store, Duration::ZERO).await {
            Ok(stats) => observe::unfinished(
                stats.unfinished,
                stats.oldest_unfinished.unwrap_or_default(),
                stats.states.parked,
            ),
            Err(e) => {
                tracing::debug!(target: "idem", error = %e, "could not count unfinished work for the gauges");
            }
        }
    }

    fn unknown_name(&self, name: &str) {
        let mut seen = self.unknown_names.lock().unwrap_or_else(|p| p.into_inner());
        if seen.insert(name.to_owned()) {
            tracing::info!(target: "idem", name, "a due claim's request has no resume function in this completer: left for one that has it (or an operator)");
        }
    }
}

/// How one due claim ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Completed,
    Released,
    Suspended,
    Unrecorded,
    Parked,
    Taken,
    Skipped,
    Failed,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Released => "released",
            Outcome::Suspended => "suspended",
            Outcome::Unrecorded => "unrecorded",
            Outcome::Parked => "parked",
            Outcome::Taken => "taken",
            Outcome::Skipped => "skipped",
            Outcome::Failed => "failed",
        }
    }
}

fn tally(round: &mut Round, done: std::result::Result<Outcome, tokio::task::JoinError>) {
    let outcome = done.unwrap_or(Outcome::Failed);
    match outcome {
        Outcome::Completed => round.completed += 1,
        Outcome::Released => round.released += 1,
        Outcome::Suspended | Outcome::Unrecorded | Outcome::Failed => round.suspended += 1,
        Outcome::Parked => round.parked += 1,
        Outcome::Taken => round.taken += 1,
        Outcome::Skipped => round.skipped += 1,
    }
    match outcome {
        Outcome::Parked => observe::completer_parked(),
        Outcome::Skipped => {}
        other => observe::resumed(other.label()),
    }
}

/// Parks the due claim, as it was found.
async fn park<S: Store>(store: &S, unfinished: &Unfinished, note: &str) -> Outcome {
    let claim = ClaimRef {
        scope: &unfinished.scope,
        key: &unfinished.key,
        fence: unfinished.fence,
    };
    match store.park(claim, note).await {
        Ok(()) => {
            tracing::error!(target: "idem", scope = unfinished.scope, key = unfinished.key, note, "parked unfinished work: it waits for an operator (retry or release it)");
            Outcome::Parked
        }
        // Taken over meanwhile (a retry resumed it): its new owner decides.
        Err(Error::FenceLost { .. }) => Outcome::Taken,
        Err(e) => {
            tracing::warn!(target: "idem", scope = unfinished.scope, key = unfinished.key, error = %e, "could not park unfinished work; the next round tries again");
            Outcome::Failed
        }
    }
}

/// Takes the due claim over and runs its resume function under it.
async fn resume_one<S: Store>(
    store: &S,
    unfinished: Unfinished,
    request: StoredRequest,
    resume: ResumeFn,
) -> Outcome {
    let Ok(key) = Key::parse_with(&unfinished.key, KeyPolicy::DEFAULT) else {
        let note = "its key is not a valid idempotency key";
        return park(store, &unfinished, note).await;
    };
    let policy = request.policy();
    let req = BeginRequest::new(
        &unfinished.scope,
        &unfinished.key,
        &unfinished.fingerprint,
        &policy,
    );
    let claimed = match store.begin(req).await {
        Ok(BeginOutcome::Claimed(c)) => c,
        // A retry holds it, or finished it, or it was parked or released meanwhile.
        Ok(_) => return Outcome::Taken,
        Err(e) => {
            tracing::warn!(target: "idem", scope = unfinished.scope, key = unfinished.key, error = %e, "could not take over a due claim; the next round tries again");
            return Outcome::Failed;
        }
    };
    let claim = ClaimInfo::new(unfinished.scope.clone(), key.clone(), claimed.clone());
    claim.observe(crate::observe::Outcome::Reclaimed);
    let handoff = Handoff::new(Handed {
        scope: unfinished.scope.clone(),
        key: unfinished.key.clone(),
        fingerprint: unfinished.fingerprint,
        claimed,
    });
    let watch = ClaimWatch::new();
    let resumption = Resumption {
        scope: unfinished.scope.clone(),
        key,
        fingerprint: unfinished.fingerprint,
        request,
        attempt: unfinished.attempt,
        note: unfinished.note.clone(),
    };
    let ran = Context::current()
        .policy(policy)
        .watch_claims(&watch)
        .handoff(&handoff)
        .scope(resume(resumption))
        .await;
    let Some(_) = handoff.untaken() else {
        return ended(&watch, &claim, ran);
    };
    // The resume function returned without running the call under the claim (it failed
    // before it, or called it with other arguments): the completer still holds the claim, and
    // counts the attempt.
    let note = match ran {
        Err(e) => format!("the resume function failed before it ran the call: {e}"),
        Ok(()) => "the resume function did not run the guarded call of this record (another scope, key or request?)".to_owned(),
    };
    match store
        .suspend(claim.claim_ref(), &note, resume_delay(claim.attempt()))
        .await
    {
        Ok(()) => Outcome::Suspended,
        Err(_) => Outcome::Failed,
    }
}

/// How the resumed call's claim ended, as its guard left it.
fn ended(watch: &ClaimWatch, claim: &ClaimInfo, ran: std::result::Result<(), String>) -> Outcome {
    let held = watch
        .claims()
        .into_iter()
        .find(|w| w.claim.fence() == claim.fence() && w.claim.scope() == claim.scope());
    let Some(held) = held else {
        return Outcome::Failed;
    };
    let outcome = match held.claim.end() {
        _ if held.claim.is_lost() => Outcome::Taken,
        End::Completed => Outcome::Completed,
        End::Released => Outcome::Released,
        End::Suspended => Outcome::Suspended,
        End::Unrecorded => Outcome::Unrecorded,
        End::Running | End::Finishing => Outcome::Failed,
    };
    if let Err(e) = ran
        && outcome != Outcome::Completed
    {
        tracing::info!(target: "idem", scope = claim.scope(), key = %claim.key(), outcome = outcome.label(), error = %e, "a resumed call failed");
    }
    outcome
}
