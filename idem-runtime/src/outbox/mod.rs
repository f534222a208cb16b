//! A transactional outbox: events enqueued in the same database transaction as the state change
//! they announce, and a relay that publishes them, in order per partition, marking each sent only
//! after the broker confirmed it.
//!
//! ```text
//!  handler's transaction                         relay (any number of instances)
//!  ───────────────────────────                   ─────────────────────────────────────────────
//!  UPDATE orders SET status = 'PAID' …           claim partition heads (lease; SKIP LOCKED)
//!  outbox.enqueue(tx, Event::for_claim(…))  ──►  publish (message id = event id), confirmed
//!  COMMIT  (NOTIFY on PostgreSQL)                mark sent           (crash here: published again,
//!                                                                     deduplicated by the id)
//! ```
//!
//! - **Ids are deterministic**: [`Event::for_claim`] derives the id from the guarded call's scope,
//!   key and a step name, so a retried request enqueues the same id (and the outbox keeps one), and
//!   the broker's message id (`Nats-Msg-Id`, AMQP `message_id`) is the same on every publish.
//! - **Checked before it is kept**: an id, topic or partition key that a broker could not take
//!   (a line break in a header, a routing key over 255 bytes) is refused by `enqueue` and by
//!   every publisher with an error ([`Event::validate`]), never a panic inside a client.
//! - **Order per partition**: the relay publishes a partition's events one at a time, lowest
//!   sequence first, and the next only once the previous is sent. Sequences follow the order in
//!   which enqueuing transactions reach the outbox; transactions that enqueue for one partition
//!   and lock the same row (the order being changed) commit in that order.
//! - **At least once, deduplicated**: a relay killed between the broker's confirmation and mark
//!   sent publishes again after its lease; JetStream's duplicate window drops the copy, and a
//!   guarded consumer replays it anyway.
//! - **Several relays**: PostgreSQL and MySQL claim with `FOR UPDATE SKIP LOCKED` and a lease
//!   (MySQL in a transaction that locks the partition heads, then leases them); SQLite has one
//!   writer, so its claim is atomic. PostgreSQL relays wake on `LISTEN/NOTIFY`; polling is the
//!   safety net (and SQLite's and MySQL's only way).
//! - **Contention**: a deadlock or a lock wait that ran out is
//!   [`Error::Unavailable`]: an enqueue's rolled the caller's
//!   transaction back (retry it whole), a claim's changed nothing (the relay tries again on its
//!   next round), and marking an event sent, which is safe to repeat, is tried again at once.
//! - **Retention**: sent events are purged after [`Relay::retain_sent`] (default 7 days).
//!
//! # Parking
//!
//! An event the broker keeps refusing (no queue or stream for its topic, a payload over the
//! broker's limit) would otherwise hold back its partition forever. After
//! [`Relay::park_after`] refusals (default 20, about six minutes) the relay parks it: logged
//! as an error, counted in `idem_outbox_parked_total` (feature `metrics`), kept in the outbox
//! with the error, and no longer published. A broker out of reach is not a refusal: events wait
//! for it however long it takes. An event that no broker can take ([`Event::validate`]) is
//! parked at once.
//!
//! **What parking means for order**: the partition's later events go on without it, so a
//! consumer can see `order.refunded` of a partition whose `order.paid` is parked. That is the
//! price of not stopping the partition; the parked event is the alert. Sent back with `unpark`
//! (or `unpark_all`, once the cause is fixed), it is published next in its partition: before
//! the partition's events still waiting, after the ones sent while it was parked.
//!
//! Backends: [`PgOutbox`] (feature `postgres`), [`SqliteOutbox`] (feature `sqlite`) and
//! [`MySqlOutbox`] (feature `mysql`), in `outbox/sql.rs`. Publishers: `JetStreamPublisher`
//! (feature `nats`) and `AmqpPublisher` (feature `amqp`), or any [`Publisher`].

use std::fmt;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;

use crate::error::{BoxError, Error, Result};
use crate::guard::{ClaimInfo, downstream_key};
use crate::key::Key;

// The databases an outbox runs on.
mod sql;

/// The default table of the outbox.
pub const DEFAULT_OUTBOX_TABLE: &str = "idem_outbox";
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use sql::MySqlOutbox;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use sql::PgOutbox;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sql::SqliteOutbox;

/// The longest topic and partition key an event may have, in bytes: an AMQP routing key is a
/// short string of at most 255 bytes, and a partition key travels in a header.
pub const MAX_NAME_LEN: usize = 255;

/// An event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its id, published as the broker's message id: deterministic, so every publish of it is
    /// deduplicated as one.
    pub id: String,
    /// Where to publish it: a NATS subject, an AMQP routing key.
    pub topic: String,
    /// Events with the same partition key are published in order, one at a time.
    pub partition_key: String,
    /// The body.
    pub payload: Bytes,
}

impl Event {
    /// An event with an id of your own.
    pub fn new(
        id: impl Into<String>,
        topic: impl Into<String>,
        partition_key: impl Into<String>,
        payload: impl Into<Bytes>,
    ) -> Self {
        Event {
            id: id.into(),
            topic: topic.into(),
            partition_key: partition_key.into(),
            payload: payload.into(),
        }
    }

    /// Checks that the event can be published by every publisher, as the outbox and the
    /// publishers do before they take it: an error ([`Error::Config`]) that names what is wrong,
    /// never a panic inside a broker's client.
    ///
    /// - the id is what a consumer takes as its idempotency key: 1–255 bytes of visible ASCII
    ///   (the default [`KeyPolicy`](crate::KeyPolicy)), so no line break can reach a header;
    /// - the topic is 1–255 bytes without whitespace or control characters (a NATS subject, an
    ///   AMQP routing key);
    /// - the partition key is at most 255 bytes without control characters (it travels in the
    ///   `Idem-Partition-Key` header).
    pub fn validate(&self) -> Result<()> {
        let refuse = |what: String| {
            Err(Error::Config(format!(
                "outbox event {:?} cannot be published: {what}",
                self.id
            )))
        };
        if let Err(e) = Key::parse(&self.id) {
            return refuse(format!("its id is not a valid idempotency key ({e})"));
        }
        if self.topic.is_empty() || self.topic.len() > MAX_NAME_LEN {
            return refuse(format!(
                "its topic is {} bytes long, not 1 to {MAX_NAME_LEN}",
                self.topic.len()
            ));
        }
        if self
            .topic
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return refuse(format!(
                "its topic {:?} holds whitespace or a control character",
                self.topic
            ));
        }
        if self.partition_key.len() > MAX_NAME_LEN {
            return refuse(format!(
                "its partition key is {} bytes long, more than {MAX_NAME_LEN}",
                self.partition_key.len()
            ));
        }
        if self.partition_key.chars().any(char::is_control) {
            return refuse(format!(
                "its partition key {:?} holds a control character",
                self.partition_key
            ));
        }
        Ok(())
    }

    /// An event of a guarded call: its id is derived from the call's scope, key and `step`, the
    /// same for every attempt of the request and different for each step.
    pub fn for_claim(
        claim: &ClaimInfo,
        step: &str,
        topic: impl Into<String>,
        partition_key: impl Into<String>,
        payload: impl Into<Bytes>,
    ) -> Self {
        Event::new(
            event_id(claim.scope(), claim.key().as_str(), step),
            topic,
            partition_key,
            payload,
        )
    }
}

/// The id of the event of `step` in the guarded call on `(scope, key)`.
pub fn event_id(scope: &str, key: &str, step: &str) -> String {
    downstream_key(scope, key, &format!("event:{step}"))
}

/// An event claimed by a relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedEvent {
    /// Its place in the outbox.
    pub seq: i64,
    /// How many times a relay claimed it, this time included.
    pub attempts: u32,
    /// How many of its publishes the broker refused (failures of a broker out of reach are not
    /// counted): what [`Relay::park_after`] compares.
    pub failures: u32,
    /// The event.
    pub event: Event,
}

/// An event in the outbox as operators list it: waiting to be published, parked, or sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingEvent {
    /// Its place in the outbox.
    pub seq: i64,
    /// How many times a relay claimed it.
    pub attempts: u32,
    /// How many of its publishes the broker refused (see [`ClaimedEvent::failures`]).
    pub failures: u32,
    /// The event.
    pub event: Event,
    /// Why its last publish failed (for a parked event: why it was parked), if it did.
    pub last_error: Option<String>,
    /// How long ago it was enqueued, by the database's clock.
    pub age: Duration,
}

/// How many events an outbox holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxCounts {
    /// Waiting to be published: not sent, not parked.
    pub pending: u64,
    /// Parked: given up on by a relay until an operator sends them back.
    pub parked: u64,
    /// Sent, not yet purged.
    pub sent: u64,
}

/// Where a relay takes events from: an outbox table.
pub trait OutboxBackend: Send + Sync {
    /// Claims up to `limit` events for `owner` for `lease`: only the first event of each
    /// partition still waiting (unsent, not parked), and only if no other relay holds it.
    fn claim(
        &self,
        owner: &str,
        lease: Duration,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<ClaimedEvent>>> + Send;
    /// Marks the event sent: call only after the broker confirmed it.
    fn mark_sent(&self, seq: i64) -> impl Future<Output = Result<()>> + Send;
    /// Gives the event back, to be claimed again after `delay`, with the `error` of its
    /// publish; `refused` counts it as one more of the event's failures (the broker said no),
    /// otherwise the broker was out of reach.
    fn retry_later(
        &self,
        seq: i64,
        delay: Duration,
        error: &str,
        refused: bool,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Parks the event with the `error` that made the relay give up: no relay claims it, and
    /// it no longer holds back its partition, until an operator sends it back.
    fn park(&self, seq: i64, error: &str) -> impl Future<Output = Result<()>> + Send;
    /// How many events are pending, parked and sent.
    fn counts(&self) -> impl Future<Output = Result<OutboxCounts>> + Send;
    /// Deletes events sent longer ago than `older_than`; returns how many.
    fn purge_sent(&self, older_than: Duration) -> impl Future<Output = Result<u64>> + Send;
}

/// Publishes an event and returns once the broker confirmed it (stored it, or deduplicated it).
///
/// An error tells the relay whose failure it was: [`Unreachable`] (boxed) when the broker could
/// not be reached or did not answer in time, which the relay retries for as long as it takes;
/// any other error is the broker refusing this event (no queue or stream for its topic, a
/// payload over its limit), which counts toward parking it ([`Relay::park_after`]).
pub trait Publisher: Send + Sync {
    /// Publishes `event` with `event.id` as the broker's message id.
    fn publish(&self, event: &Event) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// A publisher's error saying the broker was out of reach or did not answer in time, not that
/// it refused the event: the relay retries it without counting it toward parking.
#[derive(Debug, thiserror::Error)]
#[error("the broker is out of reach: {0}")]
pub struct Unreachable(#[source] pub BoxError);

impl Unreachable {
    /// `e`, as a broker out of reach.
    pub fn new(e: impl Into<BoxError>) -> Self {
        Unreachable(e.into())
    }

    /// Whether `e` is one.
    pub fn is(e: &BoxError) -> bool {
        e.downcast_ref::<Unreachable>().is_some()
    }
}

/// The default of [`Relay::park_after`].
pub const DEFAULT_PARK_AFTER: u32 = 20;

/// How often a relay tries to mark a published event sent while the database says to try
/// again: about a third of a second in all.
const MARK_SENT_ATTEMPTS: u32 = 5;

/// A relay: claims pending events, publishes them, marks them sent.
pub struct Relay<O, P> {
    outbox: O,
    publisher: P,
    owner: String,
    batch: u32,
    lease: Duration,
    poll: Duration,
    retain_sent: Duration,
    backoff_max: Duration,
    park_after: u32,
}

impl<O, P> fmt::Debug for Relay<O, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("owner", &self.owner)
            .field("batch", &self.batch)
            .field("lease", &self.lease)
            .field("poll", &self.poll)
            .field("park_after", &self.park_after)
            .finish_non_exhaustive()
    }
}

impl<O: OutboxBackend, P: Publisher> Relay<O, P> {
    /// A relay from `outbox` to `publisher`: batches of 64, a 30-second lease, polling every
    /// second (PostgreSQL relays are woken sooner by `NOTIFY`), sent events kept 7 days, an
    /// event parked after [`DEFAULT_PARK_AFTER`] refusals.
    pub fn new(outbox: O, publisher: P) -> Self {
        Relay {
            outbox,
            publisher,
            owner: format!(
                "relay-{}-{:x}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            ),
            batch: 64,
            lease: Duration::from_secs(30),
            poll: Duration::from_secs(1),
            retain_sent: crate::record::MESSAGE_RETAIN,
            backoff_max: Duration::from_secs(30),
            park_after: DEFAULT_PARK_AFTER,
        }
    }

    /// How many events one round claims (default 64): at most one per partition.
    pub fn batch(mut self, n: u32) -> Self {
        self.batch = n.max(1);
        self
    }

    /// How long a claim keeps other relays off an event (default 30 s): longer than a publish
    /// takes. A relay that dies holding events leaves them to others after this.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often to look for work without a wake-up (default 1 s).
    pub fn poll(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// How long sent events are kept before [`Relay::run_until`] purges them (default 7 days).
    pub fn retain_sent(mut self, retain: Duration) -> Self {
        self.retain_sent = retain;
        self
    }

    /// After how many refused publishes an event is parked (default
    /// [`DEFAULT_PARK_AFTER`], 20: with the backoff doubling from 0.2 s to 30 s, about six
    /// minutes of refusals). A parked event is logged as an error and counted (the counter
    /// `idem_outbox_parked_total`, feature `metrics`); it stays in the outbox, visible to
    /// operators, until sent back (`parked`, `unpark` and `unpark_all` on the outbox), and its
    /// partition's later events are published without it: see the module's "Parking".
    ///
    /// Only refusals count: a broker out of reach (a publisher's [`Unreachable`]) never parks
    /// anything. An event no broker can take ([`Event::validate`]) is parked at once.
    pub fn park_after(mut self, refusals: u32) -> Self {
        self.park_after = refusals.max(1);
        self
    }

    /// The relay's name in the outbox's `lease_owner` column.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The outbox.
    pub fn outbox(&self) -> &O {
        &self.outbox
    }

    /// One round: claims a batch, publishes its events concurrently (one per partition), marks
    /// each sent once confirmed and gives the others back with a backoff. Returns how many
    /// were sent.
    pub async fn run_once(&self) -> Result<usize> {
        let claimed = self
            .outbox
            .claim(&self.owner, self.lease, self.batch)
            .await?;
        let results = join_all(claimed.iter().map(|c| self.publish_one(c))).await;
        Ok(results.into_iter().filter(|sent| *sent).count())
    }

    async fn publish_one(&self, claimed: &ClaimedEvent) -> bool {
        if let Err(e) = claimed.event.validate() {
            // No broker takes it, however often it is tried.
            self.park(claimed, &e.to_string()).await;
            return false;
        }
        match self.publisher.publish(&claimed.event).await {
            Ok(()) => match self.mark_sent(claimed).await {
                Ok(()) => {
                    crate::observe::outbox_published();
                    true
                }
                Err(e) => {
                    // Published but not marked: it is published again after the lease, and the
                    // broker's dedupe (or the consumer's guard) absorbs the copy.
                    tracing::warn!(target: "idem", id = %claimed.event.id, error = %e, "published an event but could not mark it sent");
                    false
                }
            },
            Err(e) => {
                let refused = !Unreachable::is(&e);
                crate::observe::outbox_publish_failed(refused);
                let failures = claimed.failures + u32::from(refused);
                if refused && failures >= self.park_after {
                    self.park(claimed, &e.to_string()).await;
                    return false;
                }
                let delay = Duration::from_millis(100)
                    .saturating_mul(1 << claimed.attempts.min(16))
                    .min(self.backoff_max);
                tracing::warn!(target: "idem", id = %claimed.event.id, topic = %claimed.event.topic, attempts = claimed.attempts, refused = failures, park_after = self.park_after, ?delay, error = %e, "publishing an event failed; retrying");
                if let Err(e) = self
                    .outbox
                    .retry_later(claimed.seq, delay, &e.to_string(), refused)
                    .await
                {
                    tracing::warn!(target: "idem", id = %claimed.event.id, error = %e, "could not give an event back; it is claimed again after its lease");
                }
                false
            }
        }
    }

    /// Marks a published event sent, trying again while the database says to (a deadlock, a
    /// lock wait that ran out, a connection lost): it is safe to repeat, and an event left
    /// unmarked is published again after its lease.
    async fn mark_sent(&self, claimed: &ClaimedEvent) -> Result<()> {
        let mut delay = Duration::from_millis(20);
        for _ in 1..MARK_SENT_ATTEMPTS {
            match self.outbox.mark_sent(claimed.seq).await {
                Err(e @ Error::Unavailable(_)) => {
                    tracing::debug!(target: "idem", id = %claimed.event.id, error = %e, ?delay, "marking an event sent failed; trying again");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                done => return done,
            }
        }
        self.outbox.mark_sent(claimed.seq).await
    }

    async fn park(&self, claimed: &ClaimedEvent, reason: &str) {
        let event = &claimed.event;
        match self.outbox.park(claimed.seq, reason).await {
            Ok(()) => {
                tracing::error!(target: "idem", seq = claimed.seq, id = %event.id, topic = %event.topic, partition_key = %event.partition_key, attempts = claimed.attempts, error = %reason, "parked an outbox event that cannot be published: its partition's later events go on without it; list parked events and send them back with `unpark` once the cause is fixed");
                crate::observe::outbox_parked();
            }
            Err(e) => {
                tracing::warn!(target: "idem", id = %event.id, error = %e, "could not park an outbox event; it is claimed again after its lease");
            }
        }
    }

    /// Runs rounds until `shutdown` completes: at once while there is work, otherwise on a
    /// wake-up from `wake` (PostgreSQL's `NOTIFY`: see [`Wake`]) or after the poll interval.
    /// Purges sent events past their retention about once a minute, and (feature `metrics`)
    /// sets the gauges `idem_outbox_pending` and `idem_outbox_parked` at the start and about
    /// once a minute.
    pub async fn run_until<W: Wake>(&self, mut wake: W, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut last_purge = tokio::time::Instant::now();
        let mut last_count: Option<tokio::time::Instant> = None;
        loop {
            let busy = match self.run_once().await {
                Ok(sent) => sent > 0,
                Err(e) => {
                    tracing::warn!(target: "idem", error = %e, "the outbox could not be read; retrying");
                    false
                }
            };
            if last_purge.elapsed() > Duration::from_secs(60) {
                last_purge = tokio::time::Instant::now();
                if let Err(e) = self.outbox.purge_sent(self.retain_sent).await {
                    tracing::warn!(target: "idem", error = %e, "purging sent events failed");
                }
            }
            // The backlog, for dashboards: at the start, then once a minute (counting sent
            // events scans their index).
            if last_count.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                last_count = Some(tokio::time::Instant::now());
                match self.outbox.counts().await {
                    Ok(counts) => crate::observe::outbox_backlog(counts.pending, counts.parked),
                    Err(e) => {
                        tracing::warn!(target: "idem", error = %e, "counting the outbox's events failed")
                    }
                }
            }
            if busy {
                // More may be waiting behind what was just sent; look again, unless asked to
                // stop.
                if futures_util::FutureExt::now_or_never(shutdown.as_mut()).is_some() {
                    return;
                }
                continue;
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = wake.wait(self.poll) => {}
            }
        }
    }
}

/// What a relay waits on between rounds: a wake-up, or the poll interval, whichever comes first.
pub trait Wake: Send {
    /// Returns on a wake-up or after `timeout`.
    fn wait(&mut self, timeout: Duration) -> impl Future<Output = ()> + Send;
}

/// No wake-ups: poll.
#[derive(Debug, Clone, Copy, Default)]
pub struct Poll;

impl Wake for Poll {
    async fn wait(&mut self, timeout: Duration) {
        tokio::time::sleep(timeout).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_are_deterministic_per_scope_key_and_step() {
        let a = event_id("order:1", "k", "paid");
        assert_eq!(a, event_id("order:1", "k", "paid"));
        assert_ne!(a, event_id("order:1", "k", "refunded"));
        assert_ne!(a, event_id("order:2", "k", "paid"));
        assert_ne!(a, downstream_key("order:1", "k", "paid"));
        assert!(a.starts_with("idem-") && a.len() == 37, "{a}");
    }

    #[test]
    fn events_that_no_broker_can_take_are_refused_by_name() {
        let ok = Event::new("evt-1", "order.paid", "ORD-1", "{}");
        assert!(ok.validate().is_ok());
        assert!(
            Event::new("evt-1", "order.paid", "", "{}")
                .validate()
                .is_ok()
        );
        let long = "x".repeat(MAX_NAME_LEN + 1);
        for (bad, expected) in [
            (
                Event::new("a\r\nb", "t", "p", ""),
                "its id is not a valid idempotency key",
            ),
            (
                Event::new("", "t", "p", ""),
                "its id is not a valid idempotency key",
            ),
            (
                Event::new("é", "t", "p", ""),
                "its id is not a valid idempotency key",
            ),
            (
                Event::new(long.as_str(), "t", "p", ""),
                "its id is not a valid idempotency key",
            ),
            (Event::new("e", "", "p", ""), "its topic is 0 bytes long"),
            (
                Event::new("e", long.as_str(), "p", ""),
                "its topic is 256 bytes long",
            ),
            (
                Event::new("e", "order paid", "p", ""),
                "whitespace or a control character",
            ),
            (
                Event::new("e", "order\npaid", "p", ""),
                "whitespace or a control character",
            ),
            (
                Event::new("e", "t", long.as_str(), ""),
                "its partition key is 256 bytes long",
            ),
            (
                Event::new("e", "t", "ORD\r\n1", ""),
                "its partition key \"ORD\\r\\n1\" holds a control",
            ),
        ] {
            match bad.validate() {
                Err(Error::Config(msg)) => assert!(msg.contains(expected), "{msg}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
