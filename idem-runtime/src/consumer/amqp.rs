//! RabbitMQ (AMQP 0.9.1): a queue's deliveries as [`Delivery`] streams, with manual acks.
//!
//! - **Key**: the `message_id` property. A delivery without one is dead-lettered with that reason,
//!   never processed unguarded.
//! - **Ack**: `basic.ack` after the handler committed. An ack, nack or reject that lapin did not
//!   send (`Ok(false)`: the channel closed, and RabbitMQ requeues the delivery) is an error,
//!   which the runner logs and counts in
//!   [`Stats::ack_failures`](crate::consumer::Stats::ack_failures), never as a success.
//! - **Retry later**: the delivery is held (unacked, so no other consumer gets it) for the delay,
//!   then `basic.nack` with requeue. RabbitMQ has no delayed redelivery of its own.
//! - **Dead letter**: the message is published, on the source's channel in confirm mode, with
//!   its body, its properties (its `message_id` above all) and its headers, and with the
//!   reason and where it came from in `Idem-…` headers ([`REASON`], [`ORIGINAL_EXCHANGE`],
//!   [`ORIGINAL_ROUTING_KEY`], [`ORIGINAL_QUEUE`], [`DELIVERED`]), persistent and mandatory, to
//!   the queue `<queue>.dead-letters`, which [`AmqpSource::deliveries`] declares (durable), or
//!   where [`AmqpSource::dead_letter_exchange`] or [`AmqpSource::dead_letter_queue`] say. The
//!   original is acked only once the broker confirmed that a queue took the copy. A copy the
//!   broker did not take (returned unroutable, nacked, no confirmation within
//!   [`DEFAULT_CONFIRM_WAIT`]) is an error: the original is not acked, the runner gives it
//!   back (`basic.nack` with requeue) after its backoff and dead-letters it when it comes back.
//!   Never a `basic.reject`: on a queue without a dead-letter exchange, or one whose exchange
//!   routes nowhere, RabbitMQ would discard the message. A channel that closes between the
//!   confirm and the ack requeues the original, which is then dead-lettered a second time.
//! - **Prefetch**: `basic.qos` with [`DEFAULT_PREFETCH`] (32) unacknowledged deliveries per
//!   consumer, or [`AmqpSource::prefetch`]: about the runner's concurrency. Without it
//!   RabbitMQ pushes the whole queue to one consumer.
//! - **Delivery count**: the `x-delivery-count` header of quorum queues, else the `redelivered`
//!   flag (2 for every redelivery on a classic queue). The runner counts with the record's
//!   attempt number as well, the higher of the two, so a limit set with
//!   [`Consumer::max_deliveries`](crate::consumer::Consumer::max_deliveries) dead-letters a
//!   message that keeps failing on classic and quorum queues alike.
//! - **Re-driving dead letters**: [`dead_letters`] lists a dead-letter queue, and [`redrive`]
//!   publishes its messages back where they were first published (the exchange and routing
//!   key of their `Idem-Original-…` headers, or of the broker's `x-death` header for a message
//!   it dead-lettered itself), with their `message_id`, so a consumer that handled one replays
//!   it; each is removed from the dead-letter queue only once the broker confirmed its
//!   publish.
//! - **Still working**: nothing to say; RabbitMQ holds an unacked delivery for its consumer until
//!   the channel closes (or its `consumer_timeout`).
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use idem::consumer::{amqp::AmqpSource, Consumer, HandlerError, Message};
//!
//! let conn = lapin::Connection::connect("amqp://guest:guest@127.0.0.1:5672/%2f", Default::default()).await?;
//! let channel = conn.create_channel().await?;
//! let source = AmqpSource::new(channel, "order.paid.fulfilment");
//! let consumer = Consumer::new(source.queue(), idem::MemoryStore::new())?.max_deliveries(5);
//! let handler = consumer.guarded(|msg: Message, _claim| async move {
//!     Ok::<_, HandlerError>(msg.payload.len())
//! });
//! consumer.run(source.deliveries("fulfilment-1").await?, handler, 32).await;
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};

use std::sync::Arc;

use crate::consumer::{Delivery, PARTITION_KEY_HEADER};
use crate::error::{BoxError, Error};
use crate::key::Key;

/// How many deliveries a source's consumer holds unacknowledged at once, by default
/// ([`AmqpSource::prefetch`]).
pub const DEFAULT_PREFETCH: u16 = 32;

/// The suffix of the dead-letter queue a source declares for its queue by default:
/// `<queue>.dead-letters`.
pub const DEAD_LETTER_QUEUE_SUFFIX: &str = ".dead-letters";

/// How long a dead letter's publish waits for the broker's confirmation before it counts as not
/// taken (the original is then not acked).
pub const DEFAULT_CONFIRM_WAIT: Duration = Duration::from_secs(10);

/// Header of a dead letter: why it was given up.
pub const REASON: &str = "Idem-Dead-Letter-Reason";
/// Header of a dead letter: the exchange it had been published to.
pub const ORIGINAL_EXCHANGE: &str = "Idem-Original-Exchange";
/// Header of a dead letter: the routing key it had been published with.
pub const ORIGINAL_ROUTING_KEY: &str = "Idem-Original-Routing-Key";
/// Header of a dead letter: the queue it was consumed from.
pub const ORIGINAL_QUEUE: &str = "Idem-Original-Queue";
/// Header of a dead letter: how many times it had been delivered when it was given up.
pub const DELIVERED: &str = "Idem-Delivered";

/// A queue to consume, on a channel.
#[derive(Clone)]
pub struct AmqpSource {
    channel: lapin::Channel,
    queue: String,
    prefetch: u16,
    dead_letters: Option<(String, String)>,
}

impl fmt::Debug for AmqpSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpSource")
            .field("queue", &self.queue)
            .field("prefetch", &self.prefetch)
            .field("dead_letters", &self.dead_letters)
            .finish_non_exhaustive()
    }
}

impl AmqpSource {
    /// Deliveries of `queue` on `channel`, at most [`DEFAULT_PREFETCH`] unacknowledged at once;
    /// dead letters go to `<queue>.dead-letters` (see the [module](self) documentation).
    /// [`AmqpSource::deliveries`] sets the channel's prefetch and puts it in confirm mode.
    pub fn new(channel: lapin::Channel, queue: impl Into<String>) -> Self {
        AmqpSource {
            channel,
            queue: queue.into(),
            prefetch: DEFAULT_PREFETCH,
            dead_letters: None,
        }
    }

    /// How many deliveries the broker hands this source's consumer before it acked any
    /// (`basic.qos`, default [`DEFAULT_PREFETCH`], at least 1): about the runner's concurrency.
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n.max(1);
        self
    }

    /// Dead letters are published to `exchange` with `routing_key` (a queue's configured
    /// dead-letter exchange, say), instead of the queue idem declares. Nothing is declared: a
    /// dead letter the exchange routes to no queue is returned and not acked, so the original
    /// stays; an exchange that does not exist closes the channel (the broker requeues what it
    /// held).
    pub fn dead_letter_exchange(
        mut self,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Self {
        self.dead_letters = Some((exchange.into(), routing_key.into()));
        self
    }

    /// Dead letters are published to the queue `queue` (through the default exchange), which
    /// must exist: idem does not declare it.
    pub fn dead_letter_queue(self, queue: impl Into<String>) -> Self {
        self.dead_letter_exchange("", queue)
    }

    /// The queue's name: a natural consumer name to put in the handler's scope.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Starts consuming with manual acks under `consumer_tag`: sets the prefetch, puts the
    /// channel in confirm mode (for the dead letters) and declares the default dead-letter
    /// queue, durable (a queue of that name declared otherwise is an error).
    pub async fn deliveries(
        &self,
        consumer_tag: &str,
    ) -> Result<impl Stream<Item = Result<AmqpDelivery, BoxError>> + use<>, Error> {
        let unavailable = |e: lapin::Error| Error::Unavailable(Box::new(e));
        // Every name checked before the broker is asked anything.
        let queue = short_string("queue name", &self.queue)?;
        let tag = short_string("consumer tag", consumer_tag)?;
        let (exchange, routing_key) = match &self.dead_letters {
            Some((exchange, routing_key)) => (exchange.clone(), routing_key.clone()),
            None => (
                String::new(),
                format!("{}{DEAD_LETTER_QUEUE_SUFFIX}", self.queue),
            ),
        };
        let dead_letters = Arc::new(DeadLetters {
            channel: self.channel.clone(),
            exchange: short_string("dead-letter exchange name", &exchange)?,
            routing_key: short_string("dead-letter routing key", &routing_key)?,
            queue: self.queue.clone(),
        });
        self.channel
            .basic_qos(
                self.prefetch,
                lapin::options::BasicQosOptions { global: false },
            )
            .await
            .map_err(unavailable)?;
        self.channel
            .confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await
            .map_err(unavailable)?;
        if self.dead_letters.is_none() {
            self.channel
                .queue_declare(
                    dead_letters.routing_key.clone(),
                    lapin::options::QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(unavailable)?;
        }
        let consumer = self
            .channel
            .basic_consume(
                queue,
                tag,
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| Error::Unavailable(Box::new(e)))?;
        Ok(consumer.map(move |d| match d {
            Ok(d) => Ok(AmqpDelivery::new(d, dead_letters.clone())),
            Err(e) => Err(Box::new(e) as BoxError),
        }))
    }
}

/// `s` as an AMQP short string (at most 255 bytes), or an error saying which `what` is too long.
fn short_string(what: &str, s: &str) -> Result<ShortString, Error> {
    ShortString::try_new(s)
        .map_err(|e| Error::Config(format!("the {what} {s:?} is not an AMQP short string: {e}")))
}

/// Where a source's dead letters go, and the channel (in confirm mode) they are published on.
struct DeadLetters {
    channel: lapin::Channel,
    exchange: ShortString,
    routing_key: ShortString,
    queue: String,
}

/// One RabbitMQ delivery, as the runner handles it.
pub struct AmqpDelivery {
    delivery: lapin::message::Delivery,
    delivered: u32,
    dead_letters: Arc<DeadLetters>,
}

impl fmt::Debug for AmqpDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpDelivery")
            .field("routing_key", &self.delivery.routing_key.as_str())
            .field("message_id", self.delivery.properties.message_id())
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

impl AmqpDelivery {
    fn new(delivery: lapin::message::Delivery, dead_letters: Arc<DeadLetters>) -> Self {
        let count = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-delivery-count"))
            .and_then(|v| match v {
                AMQPValue::LongLongInt(n) => u32::try_from(*n).ok(),
                AMQPValue::LongInt(n) => u32::try_from(*n).ok(),
                AMQPValue::LongUInt(n) => Some(*n),
                AMQPValue::ShortInt(n) => u32::try_from(*n).ok(),
                AMQPValue::ShortUInt(n) => Some(u32::from(*n)),
                _ => None,
            });
        let delivered = match count {
            Some(previous) => previous.saturating_add(1),
            None if delivery.redelivered => 2,
            None => 1,
        };
        AmqpDelivery {
            delivery,
            delivered,
            dead_letters,
        }
    }

    /// The properties of this delivery's dead letter: its own, with `reason` and where it came
    /// from in the `Idem-…` headers.
    fn dead_letter_properties(&self, reason: &str) -> lapin::BasicProperties {
        let mut headers = self
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        let text = |s: &str| AMQPValue::LongString(s.into());
        headers.insert(REASON.into(), text(reason));
        headers.insert(
            ORIGINAL_EXCHANGE.into(),
            text(self.delivery.exchange.as_str()),
        );
        headers.insert(
            ORIGINAL_ROUTING_KEY.into(),
            text(self.delivery.routing_key.as_str()),
        );
        headers.insert(ORIGINAL_QUEUE.into(), text(&self.dead_letters.queue));
        headers.insert(DELIVERED.into(), text(&self.delivered.to_string()));
        self.delivery
            .properties
            .clone()
            .with_headers(headers)
            .with_delivery_mode(2)
    }

    /// The delivery as the client received it.
    pub fn delivery(&self) -> &lapin::message::Delivery {
        &self.delivery
    }

    /// What lapin's `Ok(sent)` for `method` means: `false` is an acknowledgement never sent,
    /// because the channel closed (RabbitMQ requeues the delivery) or it was settled already.
    fn sent(&self, method: &str, sent: bool) -> Result<(), BoxError> {
        if sent {
            return Ok(());
        }
        let why = if self.delivery.acker.poisoned() {
            "its channel closed, and the broker requeues it"
        } else {
            "it was settled already"
        };
        Err(format!(
            "{method} of delivery {} was not sent: {why}",
            self.delivery.delivery_tag
        )
        .into())
    }
}

impl Delivery for AmqpDelivery {
    fn key(&self) -> Result<Key, String> {
        match self.delivery.properties.message_id() {
            Some(id) => Key::parse(id.as_str())
                .map_err(|e| format!("unusable message_id {:?}: {e}", id.as_str())),
            None => Err("the delivery has no message_id property".into()),
        }
    }

    fn payload(&self) -> Bytes {
        Bytes::copy_from_slice(&self.delivery.data)
    }

    fn subject(&self) -> &str {
        self.delivery.routing_key.as_str()
    }

    fn delivered(&self) -> u32 {
        self.delivered
    }

    fn partition_key(&self) -> Option<&str> {
        match self
            .delivery
            .properties
            .headers()
            .as_ref()?
            .inner()
            .get(PARTITION_KEY_HEADER)?
        {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        }
    }

    async fn ack(&self) -> Result<(), BoxError> {
        let sent = self.delivery.acker.ack(BasicAckOptions::default()).await?;
        self.sent("basic.ack", sent)
    }

    async fn retry(&self, delay: Duration) -> Result<(), BoxError> {
        tokio::time::sleep(delay).await;
        let sent = self
            .delivery
            .acker
            .nack(BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            })
            .await?;
        self.sent("basic.nack", sent)
    }

    async fn dead_letter(&self, reason: &str) -> Result<(), BoxError> {
        let target = &self.dead_letters;
        let confirmation = async {
            target
                .channel
                .basic_publish(
                    target.exchange.clone(),
                    target.routing_key.clone(),
                    // Mandatory: a copy no queue takes comes back, instead of being dropped.
                    lapin::options::BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    &self.delivery.data,
                    self.dead_letter_properties(reason),
                )
                .await?
                .await
        };
        let not_taken = |why: String| -> BoxError {
            format!(
                "the dead letter of delivery {} (exchange {:?}, routing key {:?}) was not taken: {why}; the original is not acked",
                self.delivery.delivery_tag,
                target.exchange.as_str(),
                target.routing_key.as_str()
            )
            .into()
        };
        match tokio::time::timeout(DEFAULT_CONFIRM_WAIT, confirmation).await {
            Ok(Ok(lapin::Confirmation::Ack(None))) => {}
            Ok(Ok(lapin::Confirmation::Ack(Some(returned)))) => {
                return Err(not_taken(format!(
                    "routed to no queue ({} {})",
                    returned.reply_code, returned.reply_text
                )));
            }
            Ok(Ok(lapin::Confirmation::Nack(_))) => {
                return Err(not_taken("the broker nacked it".into()));
            }
            Ok(Ok(lapin::Confirmation::NotRequested)) => {
                return Err(not_taken("the channel is not in confirm mode".into()));
            }
            Ok(Err(e)) => return Err(not_taken(e.to_string())),
            Err(_) => {
                return Err(not_taken(format!(
                    "no confirmation within {DEFAULT_CONFIRM_WAIT:?}"
                )));
            }
        }
        // Confirmed: a queue holds the copy, and the original may go.
        let sent = self.delivery.acker.ack(BasicAckOptions::default()).await?;
        self.sent("basic.ack", sent)
    }

    async fn keep_alive(&self) -> Result<(), BoxError> {
        Ok(())
    }
}

/// A message of a dead-letter queue, as [`dead_letters`] and [`redrive`] read it: its key and
/// what its `Idem-…` headers (a runner's dead letter) or else the broker's `x-death` header (its
/// latest dead-lettering) say (`None` where neither says: a message published to the queue
/// directly).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its place in the queue when it was read, from 1.
    pub position: usize,
    /// Its `message_id`: its key, which a re-drive keeps.
    pub message_id: Option<String>,
    /// The exchange it was published to.
    pub exchange: Option<String>,
    /// The routing key it was published with.
    pub routing_key: Option<String>,
    /// The queue that dead-lettered it.
    pub queue: Option<String>,
    /// Why it was dead-lettered: a runner's reason ([`REASON`]), or what the broker's
    /// `x-death` says (`rejected`, `expired`, `maxlen`, `delivery_limit`).
    pub reason: Option<String>,
    /// How many times it was dead-lettered from that queue for that reason.
    pub count: Option<u64>,
    /// How many times it had been delivered (`x-delivery-count`, quorum queues).
    pub delivered: Option<u64>,
    /// Its payload's size in bytes.
    pub size: usize,
}

/// The headers the broker writes when it dead-letters or delivers a message: left behind by a
/// re-drive, so the copy starts afresh.
const BROKER_HEADERS: &[&str] = &[
    "x-death",
    "x-first-death-",
    "x-last-death-",
    "x-delivery-count",
    REASON,
    "Idem-Original-",
    DELIVERED,
];

fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

fn number(value: &AMQPValue) -> Option<u64> {
    match value {
        AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongUInt(n) => Some(u64::from(*n)),
        AMQPValue::ShortInt(n) => u64::try_from(*n).ok(),
        AMQPValue::ShortUInt(n) => Some(u64::from(*n)),
        AMQPValue::Timestamp(n) => Some(*n),
        _ => None,
    }
}

impl DeadLetter {
    fn read(position: usize, delivery: &lapin::message::Delivery) -> Self {
        let properties = &delivery.properties;
        let headers = properties.headers().as_ref().map(|h| h.inner());
        // The latest dead-lettering is the first entry of `x-death`.
        let death = headers
            .and_then(|h| h.get("x-death"))
            .and_then(|v| match v {
                AMQPValue::FieldArray(a) => a.as_slice().first(),
                _ => None,
            })
            .and_then(|v| match v {
                AMQPValue::FieldTable(t) => Some(t.inner()),
                _ => None,
            });
        let field = |name: &str| death.and_then(|d| d.get(name));
        // What a runner wrote when it published the dead letter, first: the broker's `x-death`
        // describes only dead letters it moved itself.
        let idem = |name: &str| headers.and_then(|h| h.get(name)).and_then(text);
        DeadLetter {
            position,
            message_id: properties
                .message_id()
                .as_ref()
                .map(|m| m.as_str().to_owned()),
            exchange: idem(ORIGINAL_EXCHANGE).or_else(|| field("exchange").and_then(text)),
            routing_key: idem(ORIGINAL_ROUTING_KEY).or_else(|| {
                field("routing-keys")
                    .and_then(|v| match v {
                        AMQPValue::FieldArray(a) => a.as_slice().first(),
                        _ => None,
                    })
                    .and_then(text)
            }),
            queue: idem(ORIGINAL_QUEUE).or_else(|| field("queue").and_then(text)),
            reason: idem(REASON).or_else(|| field("reason").and_then(text)),
            count: field("count").and_then(number),
            delivered: headers
                .and_then(|h| h.get("x-delivery-count"))
                .and_then(number)
                .or_else(|| idem(DELIVERED).and_then(|d| d.parse().ok())),
            size: delivery.data.len(),
        }
    }
}

fn unavailable(e: impl Into<BoxError>) -> Error {
    Error::Unavailable(e.into())
}

/// Takes up to `limit` messages of `queue` on `channel` without acknowledging them: the
/// caller settles each.
async fn take(
    channel: &lapin::Channel,
    queue: &str,
    limit: usize,
) -> Result<Vec<lapin::message::Delivery>, Error> {
    let name = short_string("queue name", queue)?;
    let mut taken = Vec::new();
    while taken.len() < limit {
        let got = channel
            .basic_get(
                name.clone(),
                lapin::options::BasicGetOptions { no_ack: false },
            )
            .await
            .map_err(unavailable)?;
        match got {
            Some(message) => taken.push(message.delivery),
            None => break,
        }
    }
    Ok(taken)
}

/// Gives `deliveries` back to their queue, in their places.
async fn give_back(deliveries: &[lapin::message::Delivery]) -> Result<(), Error> {
    for delivery in deliveries {
        delivery
            .acker
            .nack(BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            })
            .await
            .map_err(unavailable)?;
    }
    Ok(())
}

/// The first `limit` messages of the dead-letter queue `queue`, read on a channel of
/// `connection` and given back at once (AMQP 0.9.1 cannot look at a queue without taking its
/// messages: each is taken unacknowledged and requeued in its place, so a quorum queue counts
/// it as a delivery).
pub async fn dead_letters(
    connection: &lapin::Connection,
    queue: &str,
    limit: usize,
) -> Result<Vec<DeadLetter>, Error> {
    let channel = connection.create_channel().await.map_err(unavailable)?;
    let taken = take(&channel, queue, limit).await?;
    let letters = taken
        .iter()
        .enumerate()
        .map(|(i, d)| DeadLetter::read(i + 1, d))
        .collect();
    give_back(&taken).await?;
    let _ = channel.close(200, "listed".into()).await;
    Ok(letters)
}

/// Re-drives the dead letters of `queue` that `select` picks (among the first `limit`): each is
/// published, on a channel of `connection` in confirm mode, to the exchange and with the routing
/// key it was first published with (its `Idem-Original-…` headers, else its `x-death` header),
/// with its properties (its `message_id`, its key, above all) and its headers except the
/// broker's (`x-death`, `x-delivery-count`) and the dead letter's (`Idem-Original-…`, …), and is removed from `queue` only once the broker confirmed the publish
/// and a queue took it. Those not picked stay, in their places. Returns the ones re-driven.
///
/// A picked message with neither (none was dead-lettered) is refused with
/// [`Error::Config`] and stays; so does one the broker did not take (no queue bound, a nack),
/// with the error. Every message not yet re-driven stays in the queue.
pub async fn redrive(
    connection: &lapin::Connection,
    queue: &str,
    limit: usize,
    mut select: impl FnMut(&DeadLetter) -> bool,
) -> Result<Vec<DeadLetter>, Error> {
    let channel = connection.create_channel().await.map_err(unavailable)?;
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .map_err(unavailable)?;
    let taken = take(&channel, queue, limit).await?;
    let mut kept = Vec::new();
    let mut redriven = Vec::new();
    let mut failure = None;
    for (i, delivery) in taken.into_iter().enumerate() {
        let letter = DeadLetter::read(i + 1, &delivery);
        if failure.is_some() || !select(&letter) {
            kept.push(delivery);
            continue;
        }
        match publish_back(&channel, &letter, &delivery).await {
            Ok(()) => {
                let acked = delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await
                    .map_err(unavailable)?;
                if !acked {
                    return Err(unavailable(format!(
                        "re-drove dead letter {:?} but could not remove it: its channel closed",
                        letter.message_id
                    )));
                }
                redriven.push(letter);
            }
            Err(e) => {
                failure = Some(e);
                kept.push(delivery);
            }
        }
    }
    give_back(&kept).await?;
    let _ = channel.close(200, "re-driven".into()).await;
    match failure {
        Some(e) => Err(e),
        None => Ok(redriven),
    }
}

/// Publishes `delivery` back where `letter` says it came from; returns once a queue took it.
async fn publish_back(
    channel: &lapin::Channel,
    letter: &DeadLetter,
    delivery: &lapin::message::Delivery,
) -> Result<(), Error> {
    let (Some(exchange), Some(routing_key)) = (&letter.exchange, &letter.routing_key) else {
        return Err(Error::Config(format!(
            "dead letter {} ({:?}) has neither {ORIGINAL_EXCHANGE} headers nor an x-death header: it was not dead-lettered, and where it \
             came from is unknown",
            letter.position, letter.message_id
        )));
    };
    let mut properties = delivery.properties.clone();
    if let Some(headers) = properties.headers() {
        let mut kept = FieldTable::default();
        for (name, value) in headers.inner() {
            let broker = BROKER_HEADERS
                .iter()
                .any(|prefix| name.as_str().starts_with(prefix));
            if !broker {
                kept.insert(name.clone(), value.clone());
            }
        }
        properties = properties.with_headers(kept);
    }
    let confirm = channel
        .basic_publish(
            short_string("exchange name", exchange)?,
            short_string("routing key", routing_key)?,
            lapin::options::BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            &delivery.data,
            properties,
        )
        .await
        .map_err(unavailable)?
        .await
        .map_err(unavailable)?;
    match confirm {
        lapin::Confirmation::Ack(None) => Ok(()),
        lapin::Confirmation::Ack(Some(returned)) => Err(unavailable(format!(
            "the broker could not route dead letter {:?} (exchange {exchange:?}, routing key \
             {routing_key:?}): {} {}",
            letter.message_id, returned.reply_code, returned.reply_text
        ))),
        _ => Err(unavailable(format!(
            "the broker did not take dead letter {:?}",
            letter.message_id
        ))),
    }
}

/// Publishes outbox events to an exchange with publisher confirms: the event's id as the
/// `message_id` property (what [`AmqpDelivery`]'s key is), its topic as the routing key, its
/// partition key in the `Idem-Partition-Key` header (for
/// [`Consumer::ordered`](crate::consumer::Consumer::ordered)), persistent and mandatory; returns
/// once the broker confirmed it.
///
/// - **Confirmed means queued**: a publish succeeds only when the broker acked it and did not
///   return it. A message that no queue takes (no binding matches its routing key) is returned
///   and is an error, as is a nack (a queue over its length limit with `reject-publish`), so
///   the outbox keeps the event.
/// - **Confirm timeout**: a confirmation that does not come within
///   [`AmqpPublisher::confirm_timeout`] (default 10 s) is an error, and the channel is given up
///   for a new one.
/// - **Recovery**: a channel the broker closed (it does so on a publish to an exchange that
///   does not exist) is replaced by a new one on the next publish, and a publisher built with
///   [`AmqpPublisher::connect`] also reconnects a connection that was lost.
/// - **Whose failure**: the broker refusing the event (returned, nacked, a channel error such
///   as an unknown exchange) counts toward parking it ([`Relay::park_after`]); the broker out of
///   reach or slow (a lost connection, a timeout) is [`Unreachable`] and never parks.
///
/// [`Relay::park_after`]: crate::outbox::Relay::park_after
#[cfg(feature = "sql")]
#[derive(Clone)]
pub struct AmqpPublisher {
    link: std::sync::Arc<tokio::sync::Mutex<Link>>,
    exchange: String,
    confirm_timeout: Duration,
}

/// How a publisher reaches the broker: its connection (reopened from `uri` when there is one)
/// and the channel in confirm mode it publishes on, replaced when it closes.
#[cfg(feature = "sql")]
struct Link {
    uri: Option<String>,
    connection: Option<lapin::Connection>,
    channel: Option<lapin::Channel>,
}

#[cfg(feature = "sql")]
impl fmt::Debug for AmqpPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpPublisher")
            .field("exchange", &self.exchange)
            .field("confirm_timeout", &self.confirm_timeout)
            .finish_non_exhaustive()
    }
}

/// The default of [`AmqpPublisher::confirm_timeout`].
#[cfg(feature = "sql")]
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(feature = "sql")]
use crate::outbox::Unreachable;

#[cfg(feature = "sql")]
fn unreachable(e: impl Into<BoxError>) -> Unreachable {
    Unreachable::new(e)
}

#[cfg(feature = "sql")]
impl AmqpPublisher {
    /// Publishes to `exchange` (`""`: the default exchange, routing to the queue named by the
    /// topic) on channels of `connection`: a channel that closes is replaced by a new one. A
    /// connection that is lost is not reopened (every publish is then
    /// [`Unreachable`]): [`AmqpPublisher::connect`] reopens its own.
    pub async fn new(
        connection: lapin::Connection,
        exchange: impl Into<String>,
    ) -> Result<Self, Error> {
        AmqpPublisher::with_link(None, connection, exchange.into()).await
    }

    /// Connects to the broker at `uri` (`amqp://user:password@host:5672/%2f`) and publishes to
    /// `exchange`; a lost connection is reopened, as a closed channel is, on the next publish.
    pub async fn connect(uri: &str, exchange: impl Into<String>) -> Result<Self, Error> {
        let connection = lapin::Connection::connect(uri, lapin::ConnectionProperties::default())
            .await
            .map_err(|e| Error::Unavailable(Box::new(e)))?;
        AmqpPublisher::with_link(Some(uri.to_owned()), connection, exchange.into()).await
    }

    async fn with_link(
        uri: Option<String>,
        connection: lapin::Connection,
        exchange: String,
    ) -> Result<Self, Error> {
        short_string("exchange name", &exchange)?;
        let publisher = AmqpPublisher {
            link: std::sync::Arc::new(tokio::sync::Mutex::new(Link {
                uri,
                connection: Some(connection),
                channel: None,
            })),
            exchange,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
        };
        // Opened now, so that a broker that refuses confirm mode says so at start.
        publisher
            .channel()
            .await
            .map_err(|e| Error::Unavailable(Box::new(e)))?;
        Ok(publisher)
    }

    /// How long a publish waits for the broker's confirmation (default
    /// [`DEFAULT_CONFIRM_TIMEOUT`], 10 s) before it fails as [`Unreachable`] and the
    /// channel is replaced. Keep it well under the relay's lease, so that a relay gives an
    /// event back before another relay may take it.
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// The open channel in confirm mode, or a new one (on a new connection, if the old one is
    /// gone and the publisher knows where to reconnect).
    async fn channel(&self) -> Result<lapin::Channel, Unreachable> {
        let mut link = self.link.lock().await;
        if let Some(channel) = &link.channel
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        link.channel = None;
        tokio::time::timeout(self.confirm_timeout, link.reopen())
            .await
            .map_err(|_| {
                unreachable(format!(
                    "no channel to the broker within {:?}",
                    self.confirm_timeout
                ))
            })?
    }

    /// Gives `channel` up (its confirmation never came): closed in the background, and the
    /// next publish opens another.
    async fn give_up(&self, channel: &lapin::Channel) {
        let mut link = self.link.lock().await;
        if link
            .channel
            .as_ref()
            .is_some_and(|c| c.id() == channel.id())
        {
            link.channel = None;
        }
        let channel = channel.clone();
        tokio::spawn(async move {
            let closing = channel.close(200, "no publisher confirmation in time".into());
            let _ = tokio::time::timeout(Duration::from_secs(5), closing).await;
        });
    }
}

#[cfg(feature = "sql")]
impl Link {
    async fn reopen(&mut self) -> Result<lapin::Channel, Unreachable> {
        let connected = self
            .connection
            .as_ref()
            .is_some_and(|c| c.status().connected());
        if !connected {
            let Some(uri) = &self.uri else {
                return Err(unreachable(
                    "the connection to the broker is closed (a publisher built with `AmqpPublisher::connect` reconnects)",
                ));
            };
            self.connection = Some(
                lapin::Connection::connect(uri, lapin::ConnectionProperties::default())
                    .await
                    .map_err(unreachable)?,
            );
        }
        let Some(connection) = &self.connection else {
            return Err(unreachable("no connection to the broker"));
        };
        let channel = connection.create_channel().await.map_err(unreachable)?;
        channel
            .confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await
            .map_err(unreachable)?;
        self.channel = Some(channel.clone());
        Ok(channel)
    }
}

#[cfg(feature = "sql")]
impl crate::outbox::Publisher for AmqpPublisher {
    async fn publish(&self, event: &crate::outbox::Event) -> Result<(), BoxError> {
        // The id and topic become short strings, whose conversion panics past 255 bytes.
        event.validate()?;
        let mut headers = FieldTable::default();
        headers.insert(
            PARTITION_KEY_HEADER.into(),
            AMQPValue::LongString(event.partition_key.as_str().into()),
        );
        let properties = lapin::BasicProperties::default()
            .with_message_id(short_string("event id", &event.id)?)
            .with_headers(headers)
            .with_delivery_mode(2);
        let (exchange, topic) = (
            short_string("exchange name", &self.exchange)?,
            short_string("topic", &event.topic)?,
        );
        let channel = self.channel().await?;
        let confirmation = async {
            channel
                .basic_publish(
                    exchange,
                    topic,
                    // Mandatory: a message no queue takes comes back, instead of being dropped.
                    lapin::options::BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    &event.payload,
                    properties,
                )
                .await?
                .await
        };
        match tokio::time::timeout(self.confirm_timeout, confirmation).await {
            Ok(Ok(confirm)) => confirmed(&self.exchange, event, confirm),
            Ok(Err(e)) => Err(whose(e)),
            Err(_) => {
                self.give_up(&channel).await;
                Err(Box::new(unreachable(format!(
                    "the broker did not confirm event {} within {:?}",
                    event.id, self.confirm_timeout
                ))))
            }
        }
    }
}

/// A publish's error from lapin, as the relay needs to read it: a channel error is the broker
/// refusing this publish (an unknown exchange, a message over its size limit); anything else
/// (a lost connection, a channel already closed, a connection error) is the broker out of reach.
#[cfg(feature = "sql")]
fn whose(e: lapin::Error) -> BoxError {
    use lapin::protocol::AMQPErrorKind;
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) if matches!(amqp.kind(), AMQPErrorKind::Soft(_)) => {
            Box::new(e)
        }
        _ => Box::new(unreachable(e)),
    }
}

/// What the broker's confirmation of `event` says: only an ack without a returned message means
/// a queue holds it.
#[cfg(feature = "sql")]
fn confirmed(
    exchange: &str,
    event: &crate::outbox::Event,
    confirm: lapin::Confirmation,
) -> Result<(), BoxError> {
    use lapin::Confirmation;
    match confirm {
        Confirmation::Ack(None) => Ok(()),
        // Acked and returned: routed to no queue (a topic no binding matches, a queue not
        // declared yet). The broker dropped it.
        Confirmation::Ack(Some(returned)) => Err(format!(
            "the broker could not route event {} (exchange {exchange:?}, routing key {:?}): {} {}",
            event.id, event.topic, returned.reply_code, returned.reply_text
        )
        .into()),
        Confirmation::Nack(_) => Err(format!(
            "the broker refused event {} (a queue over its length limit, an internal error)",
            event.id
        )
        .into()),
        Confirmation::NotRequested => Err(
            "the channel is not in confirm mode: the broker never said it took the event".into(),
        ),
    }
}
