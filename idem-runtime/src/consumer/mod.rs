//! Message consumption: the guard that makes an HTTP handler idempotent dedupes at-least-once
//! deliveries too. The message id is the key, the consumer's name is in the scope, and a
//! redelivery after a crash, or a message published twice, has its effect once.
//!
//! The seam is broker-neutral: a [`Delivery`] offers its key, payload and delivery count, and
//! the four things a consumer can say to its broker (ack, retry later, give up, still working).
//! One runner, [`Consumer`], drives a handler on each delivery and turns every outcome into the
//! acknowledgement it calls for:
//!
//! | what happened | [`Settlement`] | the broker is told |
//! |---|---|---|
//! | the handler completed | `Completed` | ack, after the record (and in transactional mode the handler's SQL) committed |
//! | a replay of a completed delivery | `Replayed` | ack; the handler's effect does not run again |
//! | another consumer holds a live claim | `InProgress(d)` | retry after `d`, the claim's remaining lease |
//! | a retryable error (the claim was released) | `Retry(d)` | retry after an exponential backoff |
//! | the handler returned `Ok`, but a claim it took was lost to a newer attempt, or an answer could not be stored | `Retry(d)` | retry after the backoff, never ack: the redelivery is answered by the record |
//! | a final error, the same id with another payload, no usable id, or the delivery limit reached (the broker's count or the record's, the higher) | `DeadLetter(reason)` | dead-letter with the reason, logged |
//! | … and the broker did not take the dead letter | `Retry(d)` | retry after the backoff, dead-lettered when it comes back |
//! | a retryable error whose retry would come after the broker deletes the message ([`Delivery::expires_in`]: a JetStream stream's `max_age`) | `DeadLetter(reason)` | dead-letter now, rather than retry it into its deletion |
//! | a guarded call's outcome is unknown (its claim is kept) | `Retry(d)`, `DeadLetter(reason)` at the limit | retry after the backoff, for the redelivery to resume the claim; never acked, never dead-lettered at once. A [resumable](Consumer::resumable) consumer's claim is finished by a completer once the broker stops delivering |
//! | the message's unfinished work is parked (its attempts ran out), or a resumable consumer's message is too large to store | `DeadLetter(reason)` | dead-letter with the reason |
//!
//! In ordered mode ([`Consumer::ordered`]) deliveries that share a partition key are handled one
//! at a time, in order, and a retry is held by the runner instead of given back to the broker.
//! Without [`Consumer::max_deliveries`], the delivery limit is [`DEFAULT_MAX_DELIVERIES`] (20).
//!
//! While a handler runs, the runner tells the broker it is still working and renews the lease of
//! every claim the handler holds ([`Store::renew`]), so a long handler is neither redelivered
//! elsewhere nor taken over: every third of the consumer's lease (at most 10 s, and as often as
//! the broker needs), and every third of a shorter lease a claim of the handler has (an
//! `#[idempotent(lease = …)]` function it calls). A renewal that finds a claim taken over (its
//! lease ran out: a stalled process, a store out of reach) tells the handler through
//! [`ClaimInfo::lost`], and the delivery is not acked; every failed renewal is logged. A
//! completion the store refused as unavailable is retried while the claim's lease lives
//! (renewing it), rather than briefly as for a client waiting on a connection; if it still
//! cannot be stored, the delivery is not acked, and its redelivery re-claims the record once the
//! lease ran out. At the delivery limit, a message another consumer is still working on is
//! waited for here (kept alive) rather than dead-lettered.
//!
//! All of this reaches the guarded calls a handler makes through the [`Context`] the runner
//! runs it in (the consumer's policy, its retry hint, its replay and claim watches). A handler
//! that moves work onto a task of its own spawns it with [`context::spawn`](crate::context::spawn)
//! and awaits it; the [`context`](crate::context) module says what a plain `tokio::spawn` loses.
//!
//! Handlers are `#[idempotent]` functions (key = the message's key, scope naming the consumer)
//! or closures guarded by the runner itself ([`Consumer::guarded`]):
//!
//! ```
//! use idem::consumer::{Consumer, HandlerError, Message};
//! use idem::{idempotent, MemoryStore};
//!
//! #[idempotent(scope = "ship:<msg.consumer>", key = msg.key, store = store)]
//! async fn on_paid(store: &MemoryStore, msg: Message) -> Result<u64, HandlerError> {
//!     let order: serde_json::Value = msg.json()?;  // a payload that is not JSON is final
//!     // Create the shipment here: this runs once per message id.
//!     Ok(order["amountCents"].as_u64().unwrap_or(0))
//! }
//!
//! # async fn run(deliveries: impl futures_util::Stream<Item = Result<idem::consumer::testing::TestDelivery, std::convert::Infallible>>) -> idem::Result<()> {
//! let store = MemoryStore::new();
//! let consumer = Consumer::new("fulfilment", store.clone())?;
//! // `deliveries` comes from an adapter: `consumer::nats`, `consumer::amqp`.
//! consumer
//!     .run(deliveries, move |msg| {
//!         let store = store.clone();
//!         async move { on_paid(&store, msg).await }
//!     }, 16)
//!     .await;
//! # Ok(()) }
//! ```
//!
//! Adapters: NATS JetStream ([`nats`], feature `nats`) and RabbitMQ ([`amqp`], feature `amqp`).
//! Records of consumers are kept [`MESSAGE_RETAIN`] (7 days) by default: a redelivery, or a
//! replay of a stream, can come much later than an HTTP retry.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::{Serialize, Serializer};

use crate::context::{ClaimWatch, Context, ReplayWatch};
use crate::error::{BoxError, Error};
use crate::fingerprint::Fingerprint;
use crate::flow::{self, Prepared, RetryHint, WithClaim};
use crate::guard::{ClaimInfo, End};
use crate::key::Key;
use crate::record::{Policy, RequestCap, StoredRequest};
use crate::replay::marker;
use crate::scope::ScopeBuilder;
use crate::store::Store;

#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
pub mod amqp;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
mod ordered;
mod resume;
pub mod testing;

pub use ordered::ORDERED_IN_HAND_PER_SLOT;

/// The header in which the outbox's publishers send an event's partition key, and from which
/// the runner's ordered mode ([`Consumer::ordered`]) reads it: `Idem-Partition-Key`.
pub const PARTITION_KEY_HEADER: &str = "Idem-Partition-Key";

pub use crate::record::MESSAGE_RETAIN;

/// How often a delivery is kept alive, and its claims renewed, when neither the lease nor the
/// broker asks for more often.
const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(10);

/// After how many deliveries a message that keeps failing is dead-lettered, unless
/// [`Consumer::max_deliveries`] says otherwise (or the broker has a limit of its own): 20, about
/// 15 minutes of retries with the default [`Backoff`].
pub const DEFAULT_MAX_DELIVERIES: u32 = 20;

/// How many times, at the delivery limit, a message another consumer is working on is looked at
/// again before it is given up. Each wait is the claim's remaining lease or the keep-alive
/// interval, whichever is shorter.
const MAX_WAITS: u32 = 64;

/// One delivery, as a handler sees it.
///
/// It fingerprints as its payload alone (its [`Serialize`] writes the payload's bytes), so an
/// `#[idempotent]` handler taking a `Message` treats a redelivery as the same request and the
/// same id with another payload as key reuse, whatever the delivery count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The idempotency key: the broker's message id.
    pub key: Key,
    /// The body.
    pub payload: Bytes,
    /// The consumer's name (the durable consumer, the queue's consumer): put it in the scope, so
    /// that two services each process the message once.
    pub consumer: String,
    /// Where it was published (a NATS subject, an AMQP routing key).
    pub subject: String,
    /// Which delivery this is, from 1, as far as the broker says (a hint: a classic RabbitMQ
    /// queue cannot tell; the runner's delivery limit also counts the record's attempts).
    pub delivered: u32,
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.payload)
    }
}

impl Message {
    /// The payload decoded from JSON. A payload that is not this JSON can never be processed:
    /// the error is final, and the message is dead-lettered at once.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, HandlerError> {
        serde_json::from_slice(&self.payload).map_err(|e| {
            HandlerError::permanent(format!("the payload is not the expected JSON: {e}"))
        })
    }
}

/// A message as a broker delivered it: what the runner needs to read from it and to say to the
/// broker about it. Adapters implement it; the runner calls exactly one of `ack`, `retry` and
/// `dead_letter` per delivery, and `keep_alive` any number of times before.
pub trait Delivery: Send + Sync {
    /// The idempotency key, or why the delivery has none usable (it is then dead-lettered with
    /// that reason, never processed unguarded).
    fn key(&self) -> Result<Key, String>;
    /// The body.
    fn payload(&self) -> Bytes;
    /// Where it was published.
    fn subject(&self) -> &str;
    /// Which delivery this is, from 1 (a hint where the broker cannot tell).
    fn delivered(&self) -> u32;
    /// How many deliveries the broker makes before it stops redelivering, if it has a limit.
    fn max_deliveries(&self) -> Option<u32> {
        None
    }
    /// The partition the message belongs to (its [`PARTITION_KEY_HEADER`]), if it has one:
    /// in ordered mode, deliveries of one partition are handled one at a time, in order.
    fn partition_key(&self) -> Option<&str> {
        None
    }
    /// How often the broker needs to hear "still working" to hold the delivery back from others
    /// (a JetStream consumer's ack wait, divided), if it needs to.
    fn keep_alive_every(&self) -> Option<Duration> {
        None
    }
    /// How much longer the broker keeps the message whatever is said to it (a JetStream
    /// stream's `max_age`), less what a redelivery takes to come back, if it deletes messages
    /// by age: a retry due after that would find the message gone, so the runner dead-letters
    /// it instead of asking for the retry.
    fn expires_in(&self) -> Option<Duration> {
        None
    }
    /// Done: the broker may forget the message. Returns once the broker confirmed, where it can.
    fn ack(&self) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// Not now: deliver it again after `delay` (to this or another consumer).
    fn retry(&self, delay: Duration) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// Never: move it aside with `reason`, and do not deliver it again.
    fn dead_letter(&self, reason: &str) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// Still working: do not deliver it to anyone else yet.
    fn keep_alive(&self) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// What a handler's error tells the runner: whether it is idem's own (in progress, key reused,
/// store unavailable) and whether retrying can help.
pub trait ConsumerError: fmt::Display {
    /// idem's error, when this is one.
    fn as_idem(&self) -> Option<&Error>;
    /// Whether retrying cannot help: the message is dead-lettered at once.
    fn is_final(&self) -> bool;
}

impl ConsumerError for Error {
    fn as_idem(&self) -> Option<&Error> {
        Some(self)
    }
    fn is_final(&self) -> bool {
        false
    }
}

/// A handler's error: idem's, one worth retrying, or one that retrying cannot fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// idem's own: in progress elsewhere, key reused, the store unavailable, …
    #[error(transparent)]
    Idem(#[from] Error),
    /// Worth retrying (a dependency is down): the claim is released and the message retried
    /// with backoff.
    #[error("{0}")]
    Transient(String),
    /// Retrying cannot help (the payload is invalid, the order does not exist): the message is
    /// dead-lettered with this reason.
    #[error("{0}")]
    Permanent(String),
}

impl HandlerError {
    /// An error worth retrying.
    pub fn transient(e: impl fmt::Display) -> Self {
        HandlerError::Transient(e.to_string())
    }

    /// An error retrying cannot fix.
    pub fn permanent(e: impl fmt::Display) -> Self {
        HandlerError::Permanent(e.to_string())
    }
}

impl ConsumerError for HandlerError {
    fn as_idem(&self) -> Option<&Error> {
        match self {
            HandlerError::Idem(e) => Some(e),
            _ => None,
        }
    }
    fn is_final(&self) -> bool {
        matches!(self, HandlerError::Permanent(_))
    }
}

/// How a delivery was settled with its broker.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settlement {
    /// The handler ran and committed: acked.
    Completed,
    /// A delivery of a message already processed: the stored answer replayed, acked.
    Replayed,
    /// Another consumer holds a live claim on it: retried after its remaining lease.
    InProgress(Duration),
    /// A retryable error: the claim was released, retried after the backoff.
    Retry(Duration),
    /// Given up, with the reason: dead-lettered.
    DeadLetter(String),
}

impl Settlement {
    /// Its name in metrics and logs: `completed`, `replayed`, `in_progress`, `retried`,
    /// `dead_lettered`.
    pub fn label(&self) -> &'static str {
        match self {
            Settlement::Completed => "completed",
            Settlement::Replayed => "replayed",
            Settlement::InProgress(_) => "in_progress",
            Settlement::Retry(_) => "retried",
            Settlement::DeadLetter(_) => "dead_lettered",
        }
    }

    /// Whether the broker was told to forget the message because it was processed.
    pub fn is_ack(&self) -> bool {
        matches!(self, Settlement::Completed | Settlement::Replayed)
    }
}

/// When `s` asks for the message again: the delay.
fn retry_delay(s: &Settlement) -> Option<Duration> {
    match s {
        Settlement::InProgress(delay) | Settlement::Retry(delay) => Some(*delay),
        _ => None,
    }
}

/// Exponential backoff for retryable errors: `initial × 2^(delivery − 1)`, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first delivery.
    pub initial: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The delay after delivery `delivered` (from 1) failed.
    pub fn delay(&self, delivered: u32) -> Duration {
        let doublings = delivered.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// How a handler's call ended, as [`next_step`] reads it.
#[derive(Debug)]
enum Ran<'a> {
    /// `Ok`; `replayed` when a guarded call replayed instead of running.
    Done { replayed: bool },
    Failed {
        idem: Option<&'a Error>,
        is_final: bool,
        reason: String,
    },
}

/// What the runner does next.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Settle(Settlement),
    /// At the delivery limit with the message in progress elsewhere: wait, then run again.
    Wait(Duration),
}

/// The one mapping from a handler's outcome to an acknowledgement.
fn next_step(ran: Ran<'_>, delivered: u32, max: Option<u32>, backoff: &Backoff) -> Step {
    let last = max.is_some_and(|max| delivered >= max);
    let (idem, is_final, reason) = match ran {
        Ran::Done { replayed: false } => return Step::Settle(Settlement::Completed),
        Ran::Done { replayed: true } => return Step::Settle(Settlement::Replayed),
        Ran::Failed {
            idem,
            is_final,
            reason,
        } => (idem, is_final, reason),
    };
    let dead = |reason: String| Step::Settle(Settlement::DeadLetter(reason));
    match idem {
        Some(Error::InProgress { retry_after }) if last => return Step::Wait(*retry_after),
        Some(Error::InProgress { retry_after }) => {
            return Step::Settle(Settlement::InProgress(*retry_after));
        }
        Some(Error::KeyReused) => {
            return dead("the message id was already processed with a different payload".into());
        }
        Some(
            e @ (Error::InvalidKey(_)
            | Error::InvalidScope { .. }
            | Error::Decode(_)
            | Error::RequestTooLarge { .. }),
        ) => {
            return dead(e.to_string());
        }
        // Its unfinished work waits for an operator: no delivery can run it before they act.
        Some(Error::Parked) => {
            return dead(
                "its unfinished work is parked for an operator (idem records retry, or release)"
                    .into(),
            );
        }
        // Unavailable, fence lost, an answer that could not be stored, a broken store: the
        // claim is released or runs out, and a later delivery can succeed.
        Some(_) => {}
        None if is_final => return dead(reason),
        None => {}
    }
    if last {
        let max = max.unwrap_or(delivered);
        return dead(format!(
            "delivery limit reached ({delivered} of {max}); last error: {reason}"
        ));
    }
    Step::Settle(Settlement::Retry(backoff.delay(delivered)))
}

/// A retry due after the broker deletes the message (`expires_in`, [`Delivery::expires_in`])
/// would lose it: dead-letter it now instead.
fn before_expiry(step: Step, expires_in: Option<Duration>, last_error: &str) -> Step {
    match (&step, expires_in) {
        (Step::Settle(Settlement::Retry(delay)), Some(left)) if left <= *delay => {
            Step::Settle(Settlement::DeadLetter(format!(
                "the broker deletes the message in {left:?} (its stream's max_age), before a retry in {delay:?} could run it; last error: {last_error}"
            )))
        }
        _ => step,
    }
}

/// Which attempt at a message this delivery is, for its delivery limit and backoff: the
/// broker's count, or the record's own when that is higher. The record counts every claim of
/// the message that continued an unfinished one (a release after an error, a take-over after a
/// crash: [`ClaimInfo::attempt`]), whichever broker delivered it; a classic RabbitMQ queue
/// reports every redelivery as the second.
fn attempts(delivered: u32, watch: &ClaimWatch) -> u32 {
    delivered.max(watch.attempt())
}

/// Counts of how deliveries were settled, since the consumer was built. A settlement is counted
/// under its kind only once the broker took it; one it did not take is an `ack_failures`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Handlers that ran and committed, acked.
    pub completed: u64,
    /// Deliveries of processed messages, replayed and acked.
    pub replayed: u64,
    /// Retried because another consumer held a live claim (in ordered mode: held by the
    /// runner and run again).
    pub in_progress: u64,
    /// Retried after a retryable error (in ordered mode: held by the runner and run again).
    pub retried: u64,
    /// Dead-lettered.
    pub dead_lettered: u64,
    /// Settlements (acks, retries, dead letters) the broker did not take: the call failed, or
    /// was never sent because the channel had closed. Logged, and counted nowhere else: the
    /// broker redelivers the message, and its record answers the redelivery.
    pub ack_failures: u64,
    /// Lease renewals of running handlers' claims.
    pub renewals: u64,
}

impl Stats {
    /// Deliveries acked: completed and replayed.
    pub fn acked(&self) -> u64 {
        self.completed + self.replayed
    }
}

#[derive(Debug, Default)]
struct Counters {
    completed: AtomicU64,
    replayed: AtomicU64,
    in_progress: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    ack_failures: AtomicU64,
    renewals: AtomicU64,
}

impl Counters {
    fn settled(&self, s: &Settlement) {
        crate::observe::settled(s.label());
        let c = match s {
            Settlement::Completed => &self.completed,
            Settlement::Replayed => &self.replayed,
            Settlement::InProgress(_) => &self.in_progress,
            Settlement::Retry(_) => &self.retried,
            Settlement::DeadLetter(_) => &self.dead_lettered,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            completed: get(&self.completed),
            replayed: get(&self.replayed),
            in_progress: get(&self.in_progress),
            retried: get(&self.retried),
            dead_lettered: get(&self.dead_lettered),
            ack_failures: get(&self.ack_failures),
            renewals: get(&self.renewals),
        }
    }
}

/// A handler the runner can drive: a closure `Fn(Message) -> impl Future<Output = Result<T, E>>`
/// (typically calling an `#[idempotent]` function), or [`Consumer::guarded`]. The parameter `M`
/// only tells the two apart.
pub trait Handler<M>: Send + Sync {
    /// The handler's error.
    type Error: ConsumerError;
    /// Handles one message.
    fn call(&self, msg: Message) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

impl<F, Fut, T, E> Handler<(T, E)> for F
where
    F: Fn(Message) -> Fut + Send + Sync,
    Fut: Future<Output = Result<T, E>> + Send,
    E: ConsumerError,
{
    type Error = E;
    fn call(&self, msg: Message) -> impl Future<Output = Result<(), E>> + Send {
        let fut = self(msg);
        async move { fut.await.map(|_| ()) }
    }
}

/// A closure guarded by the runner itself: see [`Consumer::guarded`]. Cloned (when its
/// closure can be) to hand the same handler to the runner and to a completer
/// ([`Completer::consumer`](crate::completer::Completer::consumer)).
#[derive(Clone)]
pub struct Guarded<S, F> {
    store: S,
    scope: String,
    policy: Policy,
    f: F,
}

impl<S, F> fmt::Debug for Guarded<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("scope", &self.scope)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// Tells [`Guarded`]'s [`Handler`] implementation apart from a closure's.
#[derive(Debug)]
pub enum GuardedHandler {}

impl<S, F, Fut, T, E> Handler<(GuardedHandler, T, E)> for Guarded<S, F>
where
    S: Store,
    F: Fn(Message, ClaimInfo) -> Fut + Send + Sync,
    Fut: Future<Output = Result<T, E>> + Send,
    T: Serialize + DeserializeOwned + Send,
    E: ConsumerError + From<Error> + Send,
{
    type Error = E;
    fn call(&self, msg: Message) -> impl Future<Output = Result<(), E>> + Send {
        let prepared = Prepared::new(
            Ok(msg.key.clone()),
            Ok(self.scope.clone()),
            Fingerprint::of(&msg),
            self.policy,
        );
        let f = &self.f;
        async move {
            flow::run::<S, Result<T, E>, marker::Serde, _>(
                &self.store,
                prepared,
                flow::ErrorOps::releasing(),
                WithClaim(move |claim| f(msg, claim)),
            )
            .await
            .map(|_| ())
        }
    }
}

/// The runner: drives a handler on each delivery and settles it with its broker.
///
/// Cheap to clone (clones share their [`Stats`]). Built with [`Consumer::new`] and by-value
/// setters.
#[derive(Clone)]
pub struct Consumer<S> {
    name: String,
    scope: String,
    store: S,
    policy: Policy,
    max_deliveries: Option<u32>,
    backoff: Backoff,
    keep_alive: Option<Duration>,
    ordered: bool,
    /// Whether each message is stored with its handler's claims ([`Consumer::resumable`]).
    resumable: bool,
    max_request: RequestCap,
    counters: Arc<Counters>,
}

impl<S> fmt::Debug for Consumer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("name", &self.name)
            .field("policy", &self.policy)
            .field("max_deliveries", &self.max_deliveries)
            .field("backoff", &self.backoff)
            .field("ordered", &self.ordered)
            .field("resumable", &self.resumable)
            .field("max_request", &self.max_request)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Consumer<S> {
    /// A consumer named `name` (the durable consumer's name, say) whose claims live in `store`.
    ///
    /// Its policy: the default lease, retention [`MESSAGE_RETAIN`] (7 days). Claims that
    /// `#[idempotent]` handlers take must be in the same store for their leases to be renewed.
    pub fn new(name: impl Into<String>, store: S) -> Result<Self, Error> {
        let name = name.into();
        let mut scope = ScopeBuilder::new();
        scope.literal("consumer:").value(&name);
        Ok(Consumer {
            scope: scope.finish()?,
            name,
            store,
            policy: Policy::DEFAULT.retain(MESSAGE_RETAIN),
            max_deliveries: Some(DEFAULT_MAX_DELIVERIES),
            backoff: Backoff::default(),
            keep_alive: None,
            ordered: false,
            resumable: false,
            max_request: RequestCap::DEFAULT,
            counters: Arc::default(),
        })
    }

    /// The lease of claims taken by [`Consumer::guarded`] (default five minutes), renewed while
    /// the handler runs.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.policy = self.policy.lease(lease);
        self
    }

    /// How long records of [`Consumer::guarded`] are kept (default 7 days).
    pub fn retain(mut self, retain: Duration) -> Self {
        self.policy = self.policy.retain(retain);
        self
    }

    /// The whole policy of [`Consumer::guarded`].
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// After how many deliveries a message that keeps failing is dead-lettered, when the broker
    /// does not say (default [`DEFAULT_MAX_DELIVERIES`], 20; `u32::MAX` for as good as none,
    /// which a broker that deletes messages by age still bounds: see
    /// [`Delivery::expires_in`]). JetStream consumers must leave their own `max_deliver` unlimited (the
    /// server would stop redelivering a message whose dead letter failed at the limit): this is
    /// their limit.
    ///
    /// Deliveries are counted by the broker, or by the record when its count is higher: every
    /// claim of the message that continues an unfinished one (after an error released it, or
    /// a crash abandoned it) is one more attempt, whatever the broker reports (a classic
    /// RabbitMQ queue says 2 for every redelivery). The record remembers: a dead letter sent
    /// back to the queue within the record's retention is on its last attempt already, and is
    /// dead-lettered again at its first failure.
    pub fn max_deliveries(mut self, max: u32) -> Self {
        self.max_deliveries = Some(max.max(1));
        self
    }

    /// The backoff after retryable errors (default 1 s doubling to 60 s).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How often a running handler's delivery is kept alive and its claims renewed (default: a
    /// third of the lease, at most 10 s, and as often as the broker needs). While the handler
    /// holds a claim with a shorter lease (an `#[idempotent(lease = …)]` function it calls), a
    /// third of that lease.
    pub fn keep_alive(mut self, every: Duration) -> Self {
        self.keep_alive = Some(every.max(Duration::from_millis(10)));
        self
    }

    /// Ordered mode: deliveries with the same partition key ([`PARTITION_KEY_HEADER`], set by
    /// the outbox's publishers) are handled one at a time, in the order this runner received
    /// them; deliveries of other partitions, and those without the header, run concurrently.
    ///
    /// What "in order" means, precisely:
    ///
    /// - **A retry holds its partition.** A delivery to be retried (a retryable error, another
    ///   consumer's live claim) is not given back to the broker, which would let the
    ///   partition's next delivery overtake it: the runner keeps it (alive, with the broker's
    ///   "still working") for the delay and runs it again, counting each run as a delivery for
    ///   the limit. The partition's later deliveries wait behind it.
    /// - **A dead letter releases it.** A delivery dead-lettered (a final error, the delivery
    ///   limit) is gone from the stream: the partition's next delivery runs, and the consumer
    ///   sees a gap, as it does for an outbox event that was parked.
    /// - **Per runner.** The order is the order in which this runner received the deliveries.
    ///   Deliveries of one partition that reach two runners (two processes on one queue or one
    ///   durable consumer) are handled by each on its own: give a partition one runner
    ///   (RabbitMQ's single active consumer, one process per JetStream durable consumer, or
    ///   subjects split by partition). After a crash the broker redelivers what was not acked
    ///   (JetStream once the ack wait runs out, RabbitMQ to the queue), and the records answer
    ///   what was done already.
    ///
    /// A delivery waiting for its turn is kept alive, and holds none of the `concurrency` slots
    /// of [`Consumer::run`]: they bound the handlers running, and a retry held in place gives
    /// its slot back while it waits, so a partition stuck behind a failing head (dead-lettered
    /// at the delivery limit) never stops the others. At most
    /// [`ORDERED_IN_HAND_PER_SLOT`] × `concurrency` deliveries are in hand at once, waiting or
    /// running; the broker's own bound comes first (RabbitMQ's prefetch,
    /// [`AmqpSource::prefetch`](amqp::AmqpSource::prefetch); JetStream's `max_ack_pending`).
    pub fn ordered(mut self, ordered: bool) -> Self {
        self.ordered = ordered;
        self
    }

    /// Makes the consumer resumable: each message is stored with the claims its handler takes
    /// (its subject and payload, within [`Consumer::max_request`]; its key and the consumer's
    /// name are the record's), so that a [`Completer`](crate::completer::Completer) given the
    /// handler ([`Completer::consumer`](crate::completer::Completer::consumer)) finishes a
    /// message whose outcome is unknown once its broker stops delivering it.
    ///
    /// Without it, a handler whose guarded call ends in an unknown outcome
    /// ([`ClaimInfo::outcome_unknown`]) keeps its claim for the message's redelivery to resume.
    /// That holds while the broker delivers it again; once it stops (the delivery limit
    /// dead-letters the message, a JetStream stream's `max_age` comes near, a RabbitMQ queue
    /// dead-letters it), nothing would finish the claim. With it:
    ///
    /// - every guarded call the handler makes stores the message with its claim (an
    ///   `#[idempotent]` function it calls, [`Consumer::guarded`]'s claim, a hand-written
    ///   [`begin`](crate::flow::begin); an `#[idempotent(resumable)]` function stores its own
    ///   arguments instead), carried by the [`Context`] the runner runs the handler in;
    /// - the broker is told what it is told without it: the message is retried while deliveries
    ///   remain, and dead-lettered with its reason when they run out. The dead letter still
    ///   carries the message;
    /// - a completer finds the kept claim once its resume delay has passed and runs the handler
    ///   again with the stored message, under its claim, as the next attempt with the same
    ///   downstream key. Its answer is stored: a later delivery of the message (a redelivery
    ///   still on its way, the dead letter re-driven under its key) is a replay, acked without
    ///   running the handler. A message whose attempts ran out is parked for an operator, and
    ///   a delivery of it is dead-lettered at once, saying so;
    /// - a message larger than [`Consumer::max_request`] is not run: it is dead-lettered at
    ///   once with [`Error::RequestTooLarge`]'s reason.
    ///
    /// The stored message stays in the store, in clear, until its claim is finished.
    pub fn resumable(mut self) -> Self {
        self.resumable = true;
        self
    }

    /// The most bytes a resumable consumer's stored message (its subject and payload) may
    /// take: [`RequestCap::DEFAULT`] (64 KiB) unless set, at most [`RequestCap::MAX`] (1 MiB);
    /// a cap out of range is refused at start-up, by [`RequestCap::new`]. Without
    /// [`Consumer::resumable`] nothing is stored, and it has no effect.
    pub fn max_request(mut self, cap: RequestCap) -> Self {
        self.max_request = cap;
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The scope of [`Consumer::guarded`]'s records: `consumer:<name>`.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// How deliveries were settled so far.
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    /// A handler guarded by the runner: `f(message, claim)` runs once per message id (scope
    /// `consumer:<name>`, the consumer's policy, the payload as fingerprint), in separate-commit
    /// mode; its `Ok` is stored and replayed to later deliveries, its `Err` releases the claim.
    /// For a transactional handler, write an `#[idempotent(…, transaction = tx)]` function.
    pub fn guarded<F>(&self, f: F) -> Guarded<S, F>
    where
        S: Clone,
    {
        Guarded {
            store: self.store.clone(),
            scope: self.scope.clone(),
            policy: self.policy,
            f,
        }
    }

    /// Handles one delivery: runs `handler` on it, keeping it alive and its claims renewed while
    /// it runs, then settles it with the broker. Returns how.
    pub async fn handle<D: Delivery, M, H: Handler<M>>(
        &self,
        delivery: &D,
        handler: &H,
    ) -> Settlement {
        self.handle_in(delivery, handler, None).await
    }

    /// [`Consumer::handle`], each run of the handler taking one of `slots` (ordered mode's
    /// concurrency) for as long as it runs: not while it waits for a retry.
    async fn handle_in<D: Delivery, M, H: Handler<M>>(
        &self,
        delivery: &D,
        handler: &H,
        slots: Option<&tokio::sync::Semaphore>,
    ) -> Settlement {
        let key = match delivery.key() {
            Ok(key) => key,
            Err(why) => {
                return self
                    .settle(delivery, None, Settlement::DeadLetter(why))
                    .await;
            }
        };
        let mut msg = Message {
            key,
            payload: delivery.payload(),
            consumer: self.name.clone(),
            subject: delivery.subject().to_owned(),
            delivered: delivery.delivered().max(1),
        };
        let stored = match self.stored(&msg) {
            Ok(stored) => stored,
            Err(e) => {
                let reason = format!("a resumable consumer stores every message it runs: {e}");
                return self
                    .settle(delivery, Some(&msg.key), Settlement::DeadLetter(reason))
                    .await;
            }
        };
        let max = delivery.max_deliveries().or(self.max_deliveries);
        let every = self.keep_alive_every(delivery);
        let mut waits = 0;
        loop {
            let watch = ClaimWatch::new();
            let replays = ReplayWatch::new();
            // The handler's context: a live claim elsewhere is retried when its lease runs out
            // (a redelivery costs more than a client's retry); `#[idempotent]` functions it
            // calls start from the consumer's policy, so their records live as long as
            // redeliveries can come; their replays and claims are watched. The handler's future
            // is boxed: the seams around it would otherwise move it, whole, through several
            // frames of the stack.
            let mut context = Context::current()
                .policy(self.policy)
                .retry_hint(RetryHint::REMAINING_LEASE)
                .watch_replays(&replays)
                .watch_claims(&watch);
            if let Some(stored) = &stored {
                context = context.resumable(stored.clone());
            }
            let call = context.scope(Box::pin(handler.call(msg.clone())));
            let slot = match slots {
                Some(slots) => {
                    let free = slots.acquire();
                    (self
                        .while_alive(delivery, &ClaimWatch::new(), every, free)
                        .await)
                        .ok()
                }
                None => None,
            };
            let result = self.while_alive(delivery, &watch, every, call).await;
            drop(slot);
            // An `Ok` is acked only if every claim the handler took was recorded.
            let unrecorded = result.as_ref().ok().and_then(|()| unrecorded(&watch));
            let ran = match (&result, &unrecorded) {
                (Ok(()), Some(e)) => {
                    tracing::warn!(target: "idem", consumer = %self.name, key = %msg.key, error = %e, "the handler succeeded but its work was not recorded: not acking it");
                    Ran::Failed {
                        idem: Some(e),
                        is_final: false,
                        reason: e.to_string(),
                    }
                }
                (Ok(()), None) => Ran::Done {
                    replayed: !replays.replays().is_empty(),
                },
                // A guarded call whose outcome is unknown kept its claim: the message is retried
                // (never dead-lettered as final at once), so that its redelivery resumes it.
                (Err(e), _) => Ran::Failed {
                    idem: e.as_idem(),
                    is_final: e.is_final() && !suspended(&watch),
                    reason: e.to_string(),
                },
            };
            let last_error = match &ran {
                Ran::Failed { reason, .. } => reason.clone(),
                Ran::Done { .. } => String::new(),
            };
            let step = next_step(ran, attempts(msg.delivered, &watch), max, &self.backoff);
            match before_expiry(step, delivery.expires_in(), &last_error) {
                Step::Settle(s) if self.ordered && retry_delay(&s).is_some() => {
                    self.hold(delivery, &msg.key, every, &s).await;
                    msg.delivered = msg.delivered.saturating_add(1);
                }
                Step::Settle(s) => return self.settle(delivery, Some(&msg.key), s).await,
                Step::Wait(delay) if waits < MAX_WAITS => {
                    waits += 1;
                    tracing::info!(target: "idem", consumer = %self.name, key = %msg.key, ?delay, "last delivery of a message another consumer is processing: waiting for it");
                    self.while_alive(
                        delivery,
                        &ClaimWatch::new(),
                        every,
                        tokio::time::sleep(delay.min(every)),
                    )
                    .await;
                }
                Step::Wait(_) => {
                    let reason = "delivery limit reached while another consumer kept the message in progress".to_owned();
                    return self
                        .settle(delivery, Some(&msg.key), Settlement::DeadLetter(reason))
                        .await;
                }
            }
        }
    }

    /// The message as a resumable consumer stores it with its handler's claims, or `None`
    /// when the consumer is not resumable; refused when it is too large to store.
    fn stored(&self, msg: &Message) -> Result<Option<StoredRequest>, Error> {
        if !self.resumable {
            return Ok(None);
        }
        resume::stored(&self.scope, msg, self.max_request).map(Some)
    }

    /// Runs `handler` on every delivery of `deliveries`, `concurrency` at a time, until the
    /// stream ends. Errors of the stream itself (a missed heartbeat) are logged and skipped.
    pub async fn run<D, E, St, M, H>(&self, deliveries: St, handler: H, concurrency: usize)
    where
        D: Delivery,
        E: fmt::Display,
        St: Stream<Item = Result<D, E>>,
        H: Handler<M>,
    {
        self.run_until(deliveries, handler, concurrency, std::future::pending())
            .await
    }

    /// [`Consumer::run`] until `shutdown` completes: then no new delivery is taken, and the
    /// ones being handled are finished and settled.
    pub async fn run_until<D, E, St, M, H>(
        &self,
        deliveries: St,
        handler: H,
        concurrency: usize,
        shutdown: impl Future<Output = ()>,
    ) where
        D: Delivery,
        E: fmt::Display,
        St: Stream<Item = Result<D, E>>,
        H: Handler<M>,
    {
        let handler = &handler;
        if self.ordered {
            return self
                .run_ordered(deliveries, handler, concurrency, shutdown)
                .await;
        }
        deliveries
            .take_until(shutdown)
            .for_each_concurrent(concurrency.max(1), |delivery| async move {
                match delivery {
                    Ok(d) => {
                        self.handle(&d, handler).await;
                    }
                    Err(e) => {
                        tracing::warn!(target: "idem", consumer = %self.name, error = %e, "the broker's stream reported an error");
                    }
                }
            })
            .await
    }

    fn keep_alive_every<D: Delivery>(&self, delivery: &D) -> Duration {
        let from_lease = (self.policy.lease / 3).min(DEFAULT_KEEP_ALIVE);
        let mut every = self.keep_alive.unwrap_or(from_lease);
        if let Some(broker) = delivery.keep_alive_every() {
            every = every.min(broker);
        }
        every.max(Duration::from_millis(10))
    }

    /// Awaits `fut`, keeping `delivery` alive and renewing the claims in `watch`: every `every`,
    /// and more often while a claim in `watch` has a shorter lease ([`renew_every`]).
    async fn while_alive<D: Delivery, F: Future>(
        &self,
        delivery: &D,
        watch: &ClaimWatch,
        every: Duration,
        fut: F,
    ) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        let mut next = tokio::time::Instant::now() + every;
        loop {
            // Listening before reading the claims: one taken meanwhile is not missed.
            let added = watch.added();
            let mut added = std::pin::pin!(added);
            added.as_mut().enable();
            next = next.min(tokio::time::Instant::now() + renew_every(every, watch));
            tokio::select! {
                biased;
                out = &mut fut => return out,
                () = tokio::time::sleep_until(next) => {
                    self.keep_alive_now(delivery, watch).await;
                    next = tokio::time::Instant::now() + renew_every(every, watch);
                }
                () = &mut added => {}
            }
        }
    }

    /// Says "still working" to the broker and renews the lease of every claim the handler
    /// holds. A claim found taken over is marked lost (its body learns it through
    /// [`ClaimInfo::lost`], and the delivery is not acked); every other failure is logged.
    async fn keep_alive_now<D: Delivery>(&self, delivery: &D, watch: &ClaimWatch) {
        if let Err(e) = delivery.keep_alive().await {
            tracing::warn!(target: "idem", consumer = %self.name, error = %e, "could not keep a delivery alive");
        }
        for w in watch.claims() {
            if !held(&w.claim) {
                continue;
            }
            match self.store.renew(w.claim.claim_ref(), w.lease).await {
                Ok(()) => {
                    w.claim.renewed(w.lease);
                    self.counters.renewals.fetch_add(1, Ordering::Relaxed);
                }
                Err(Error::FenceLost { .. }) if w.claim.end() == End::Running => {
                    w.claim.mark_lost();
                    tracing::warn!(target: "idem", consumer = %self.name, scope = w.claim.scope(), key = %w.claim.key(), fence = w.claim.fence(), "a running handler's claim was taken over (its lease ran out): the handler is told, and its delivery will not be acked");
                }
                // It ended while the renewal was on its way: nothing left to renew.
                Err(Error::FenceLost { .. }) => {}
                Err(e) => {
                    tracing::warn!(target: "idem", consumer = %self.name, scope = w.claim.scope(), key = %w.claim.key(), error = %e, "could not renew a running handler's lease");
                }
            }
        }
    }

    async fn settle<D: Delivery>(
        &self,
        delivery: &D,
        key: Option<&Key>,
        s: Settlement,
    ) -> Settlement {
        let key = key.map(Key::as_str).unwrap_or("");
        let result = match &s {
            Settlement::Completed | Settlement::Replayed => delivery.ack().await,
            Settlement::InProgress(delay) | Settlement::Retry(delay) => {
                delivery.retry(*delay).await
            }
            Settlement::DeadLetter(reason) => {
                return self.dead_letter(delivery, key, reason.clone()).await;
            }
        };
        match result {
            Ok(()) => {
                tracing::debug!(target: "idem", consumer = %self.name, key, settlement = ?s, "settled a delivery");
                self.counters.settled(&s);
            }
            // Not a success of any kind: the broker still holds the message as delivered.
            Err(e) => {
                self.counters.ack_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(target: "idem", consumer = %self.name, key, error = %e, settlement = ?s, "the broker did not take the settlement; it redelivers the message, and the record answers the redelivery");
            }
        }
        s
    }
}

/// Whether a claim is still held by its body or its completion, and not known lost: one to
/// renew.
fn held(claim: &ClaimInfo) -> bool {
    matches!(claim.end(), End::Running | End::Finishing) && !claim.is_lost()
}

/// How often the claims in `watch` need renewing: `every`, or a third of the shortest lease of a
/// claim still held, whichever is sooner (at least every 10 ms).
fn renew_every(every: Duration, watch: &ClaimWatch) -> Duration {
    watch
        .claims()
        .iter()
        .filter(|w| held(&w.claim))
        .map(|w| w.lease / 3)
        .fold(every, Duration::min)
        .max(Duration::from_millis(10))
}

/// Whether a guarded call of the handler ended with its outcome unknown, its claim kept
/// ([`Guard::suspend`](crate::Guard::suspend)).
fn suspended(watch: &ClaimWatch) -> bool {
    watch
        .claims()
        .iter()
        .any(|w| w.claim.end() == End::Suspended)
}

/// Why the handler's work is not recorded, when it is not, as the completion policy
/// (`Guard::record`) left its claims: one was lost to a newer attempt, its answer could not
/// be stored, or its outcome is unknown (the handler went on after a guarded call said its
/// effect may have happened). Its delivery is then retried, never acked: the redelivery is
/// answered by the newer attempt's record, resumes the kept claim, or re-claims the record once
/// its lease ran out.
fn unrecorded(watch: &ClaimWatch) -> Option<Error> {
    watch.claims().into_iter().find_map(|w| {
        let end = w.claim.end();
        if end == End::Suspended {
            return Some(Error::Unavailable(
                format!(
                    "the outcome of a guarded call on {:?} is unknown: its claim is kept for the redelivery to resume",
                    w.claim.key().as_str()
                )
                .into(),
            ));
        }
        if w.claim.is_lost() && end != End::Completed {
            Some(Error::FenceLost {
                fence: w.claim.fence(),
            })
        } else if end == End::Unrecorded {
            Some(Error::Unavailable(
                format!(
                    "the answer of a guarded call on {:?} was not stored: its record stays claimed until its lease runs out",
                    w.claim.key().as_str()
                )
                .into(),
            ))
        } else {
            None
        }
    })
}

impl<S: Store> Consumer<S> {
    /// Dead-letters `delivery`. A dead letter the broker did not take (no queue or stream
    /// receives it, the broker refused it) leaves the message with the broker: it is asked for
    /// again after the backoff, and dead-lettered then, never dropped.
    async fn dead_letter<D: Delivery>(
        &self,
        delivery: &D,
        key: &str,
        reason: String,
    ) -> Settlement {
        tracing::error!(target: "idem", consumer = %self.name, key, subject = delivery.subject(), reason = %reason, "dead-lettering a message");
        let Err(e) = delivery.dead_letter(&reason).await else {
            tracing::debug!(target: "idem", consumer = %self.name, key, "settled a delivery: dead-lettered");
            let s = Settlement::DeadLetter(reason);
            self.counters.settled(&s);
            return s;
        };
        self.counters.ack_failures.fetch_add(1, Ordering::Relaxed);
        let delay = self.backoff.delay(delivery.delivered().max(1));
        tracing::error!(target: "idem", consumer = %self.name, key, error = %e, ?delay, "the dead letter was not taken; the message stays with the broker and is dead-lettered when it comes back");
        let s = Settlement::Retry(delay);
        self.counters.settled(&s);
        if let Err(e) = delivery.retry(delay).await {
            self.counters.ack_failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(target: "idem", consumer = %self.name, key, error = %e, "the broker did not confirm the retry; it redelivers after its own timeout");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(1),
    };

    fn failed(idem: Option<&Error>, is_final: bool) -> Ran<'_> {
        Ran::Failed {
            idem,
            is_final,
            reason: "boom".into(),
        }
    }

    fn dead(step: Step) -> String {
        match step {
            Step::Settle(Settlement::DeadLetter(r)) => r,
            other => panic!("expected a dead letter, got {other:?}"),
        }
    }

    #[test]
    fn every_outcome_maps_to_its_acknowledgement() {
        let settle = Step::Settle;
        assert_eq!(
            next_step(Ran::Done { replayed: false }, 1, None, &B),
            settle(Settlement::Completed)
        );
        assert_eq!(
            next_step(Ran::Done { replayed: true }, 9, Some(3), &B),
            settle(Settlement::Replayed)
        );
        let busy = Error::InProgress {
            retry_after: Duration::from_secs(7),
        };
        assert_eq!(
            next_step(failed(Some(&busy), false), 1, Some(5), &B),
            settle(Settlement::InProgress(Duration::from_secs(7)))
        );
        assert_eq!(
            next_step(failed(Some(&busy), false), 5, Some(5), &B),
            Step::Wait(Duration::from_secs(7))
        );
        assert!(
            dead(next_step(
                failed(Some(&Error::KeyReused), false),
                1,
                None,
                &B
            ))
            .contains("different payload")
        );
        let bad_key = Error::InvalidKey(crate::error::KeyError::Empty);
        assert!(
            dead(next_step(failed(Some(&bad_key), false), 1, None, &B))
                .contains("invalid idempotency key")
        );
        assert!(
            dead(next_step(
                failed(Some(&Error::Parked), false),
                1,
                Some(5),
                &B
            ))
            .contains("parked for an operator")
        );
        let too_large = Error::RequestTooLarge {
            len: 70_000,
            max: 65_536,
        };
        assert!(
            dead(next_step(failed(Some(&too_large), false), 1, Some(5), &B))
                .contains("70000 bytes")
        );
        assert_eq!(dead(next_step(failed(None, true), 1, Some(5), &B)), "boom");
        assert_eq!(
            next_step(failed(None, false), 1, Some(5), &B),
            settle(Settlement::Retry(Duration::from_millis(100)))
        );
        assert_eq!(
            next_step(failed(None, false), 3, None, &B),
            settle(Settlement::Retry(Duration::from_millis(400)))
        );
        let down = Error::Unavailable("db down".into());
        assert_eq!(
            next_step(failed(Some(&down), false), 2, Some(5), &B),
            settle(Settlement::Retry(Duration::from_millis(200)))
        );
        let limit = dead(next_step(failed(None, false), 5, Some(5), &B));
        assert!(
            limit.contains("delivery limit reached (5 of 5)") && limit.ends_with("boom"),
            "{limit}"
        );
        assert!(
            dead(next_step(failed(Some(&down), false), 6, Some(5), &B)).contains("delivery limit")
        );
    }

    #[test]
    fn a_retry_due_after_the_broker_deletes_the_message_is_a_dead_letter_now() {
        let retry = || Step::Settle(Settlement::Retry(Duration::from_secs(2)));
        let left = |s| Some(Duration::from_secs(s));
        assert_eq!(before_expiry(retry(), None, "down"), retry());
        assert_eq!(before_expiry(retry(), left(3), "down"), retry());
        let r = dead(before_expiry(retry(), left(2), "down"));
        assert!(
            r.contains("max_age") && r.ends_with("last error: down"),
            "{r}"
        );
        assert!(dead(before_expiry(retry(), left(0), "down")).contains("max_age"));
        // Only a retry: another consumer's live claim, a completion, a dead letter stand.
        for other in [
            Step::Settle(Settlement::InProgress(Duration::from_secs(9))),
            Step::Settle(Settlement::Completed),
            Step::Wait(Duration::from_secs(9)),
        ] {
            assert_eq!(before_expiry(other.clone(), left(0), "down"), other);
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_maximum() {
        assert_eq!(B.delay(0), Duration::from_millis(100));
        assert_eq!(B.delay(1), Duration::from_millis(100));
        assert_eq!(B.delay(2), Duration::from_millis(200));
        assert_eq!(B.delay(4), Duration::from_millis(800));
        assert_eq!(B.delay(5), Duration::from_secs(1));
        assert_eq!(B.delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn a_message_fingerprints_as_its_payload() {
        let msg = |delivered, subject: &str, payload: &'static [u8]| Message {
            key: Key::parse("m-1").unwrap(),
            payload: Bytes::from_static(payload),
            consumer: "c".into(),
            subject: subject.into(),
            delivered,
        };
        let a = Fingerprint::of(&msg(1, "a", b"{\"n\":1}")).unwrap();
        assert_eq!(a, Fingerprint::of(&msg(4, "b", b"{\"n\":1}")).unwrap());
        assert_ne!(a, Fingerprint::of(&msg(1, "a", b"{\"n\":2}")).unwrap());
    }

    #[test]
    fn the_default_retention_is_seven_days() {
        let c = Consumer::new("c", crate::MemoryStore::new()).unwrap();
        assert_eq!(c.policy.retain, Duration::from_secs(604_800));
        assert_eq!(c.policy.lease, crate::record::DEFAULT_LEASE);
        assert_eq!(c.max_deliveries, Some(DEFAULT_MAX_DELIVERIES));
        assert_eq!(c.scope(), "consumer:c");
        let c = c.retain(Duration::from_secs(60));
        assert_eq!(c.policy.retain, Duration::from_secs(60));
    }
}
