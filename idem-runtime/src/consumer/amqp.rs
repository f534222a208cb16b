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
//! - **Dead letter**: `basic.reject` without requeue, into the queue's dead-letter exchange
//!   (declare the queue with `x-dead-letter-exchange`); the runner logs the reason.
//! - **Delivery count**: the `x-delivery-count` header of quorum queues, else the `redelivered`
//!   flag (2 for every redelivery on a classic queue). The runner counts with the record's
//!   attempt number as well, the higher of the two, so a limit set with
//!   [`Consumer::max_deliveries`](crate::consumer::Consumer::max_deliveries) dead-letters a
//!   message that keeps failing on classic and quorum queues alike.
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
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};

use crate::consumer::{Delivery, PARTITION_KEY_HEADER};
use crate::error::{BoxError, Error};
use crate::key::Key;

/// A queue to consume, on a channel.
#[derive(Clone)]
pub struct AmqpSource {
    channel: lapin::Channel,
    queue: String,
}

impl fmt::Debug for AmqpSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpSource")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl AmqpSource {
    /// Deliveries of `queue` on `channel` (set its prefetch with `basic_qos` to bound how many
    /// are held at once).
    pub fn new(channel: lapin::Channel, queue: impl Into<String>) -> Self {
        AmqpSource {
            channel,
            queue: queue.into(),
        }
    }

    /// The queue's name: a natural consumer name to put in the handler's scope.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Starts consuming with manual acks under `consumer_tag`.
    pub async fn deliveries(
        &self,
        consumer_tag: &str,
    ) -> Result<impl Stream<Item = Result<AmqpDelivery, BoxError>> + use<>, Error> {
        let consumer = self
            .channel
            .basic_consume(
                short_string("queue name", &self.queue)?,
                short_string("consumer tag", consumer_tag)?,
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| Error::Unavailable(Box::new(e)))?;
        Ok(consumer.map(|d| match d {
            Ok(d) => Ok(AmqpDelivery::new(d)),
            Err(e) => Err(Box::new(e) as BoxError),
        }))
    }
}

/// `s` as an AMQP short string (at most 255 bytes), or an error saying which `what` is too long.
fn short_string(what: &str, s: &str) -> Result<ShortString, Error> {
    ShortString::try_new(s)
        .map_err(|e| Error::Config(format!("the {what} {s:?} is not an AMQP short string: {e}")))
}

/// One RabbitMQ delivery, as the runner handles it.
pub struct AmqpDelivery {
    delivery: lapin::message::Delivery,
    delivered: u32,
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
    fn new(delivery: lapin::message::Delivery) -> Self {
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
        }
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

    async fn dead_letter(&self, _reason: &str) -> Result<(), BoxError> {
        // The reason is logged by the runner; the dead-letter exchange records `rejected` in
        // the message's `x-death` header.
        let sent = self
            .delivery
            .acker
            .reject(BasicRejectOptions { requeue: false })
            .await?;
        self.sent("basic.reject", sent)
    }

    async fn keep_alive(&self) -> Result<(), BoxError> {
        Ok(())
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
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Clone)]
pub struct AmqpPublisher {
    link: std::sync::Arc<tokio::sync::Mutex<Link>>,
    exchange: String,
    confirm_timeout: Duration,
}

/// How a publisher reaches the broker: its connection (reopened from `uri` when there is one)
/// and the channel in confirm mode it publishes on, replaced when it closes.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
struct Link {
    uri: Option<String>,
    connection: Option<lapin::Connection>,
    channel: Option<lapin::Channel>,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl fmt::Debug for AmqpPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpPublisher")
            .field("exchange", &self.exchange)
            .field("confirm_timeout", &self.confirm_timeout)
            .finish_non_exhaustive()
    }
}

/// The default of [`AmqpPublisher::confirm_timeout`].
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::outbox::Unreachable;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn unreachable(e: impl Into<BoxError>) -> Unreachable {
    Unreachable::new(e)
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
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

#[cfg(any(feature = "sqlite", feature = "postgres"))]
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

#[cfg(any(feature = "sqlite", feature = "postgres"))]
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
#[cfg(any(feature = "sqlite", feature = "postgres"))]
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
#[cfg(any(feature = "sqlite", feature = "postgres"))]
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
