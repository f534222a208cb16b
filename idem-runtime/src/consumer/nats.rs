//! NATS JetStream: pull consumers as [`Delivery`] streams, and a publisher for the outbox relay.
//!
//! - **Key**: the `Nats-Msg-Id` header when present (the id the publisher deduplicates with),
//!   else `<stream>:<stream sequence>` (never the consumer sequence, which differs per consumer
//!   and per redelivery).
//! - **Ack**: a double ack, which returns once the server confirmed it. JetStream can accept an
//!   ack that comes after the ack wait and still redeliver the message: the record, not the ack,
//!   is what stops the second execution, and the redelivery is answered by a replay.
//! - **Retry later**: a `-NAK` with the delay. **Still working**: `+WPI`, every third of the
//!   consumer's ack wait. **Delivery limit**: the consumer's `max_deliver`, with the delivery
//!   count from the message's metadata.
//! - **Dead letter**: the message is published through JetStream to the subject you name (a
//!   stream must capture it), with the reason and its origin in headers and a `Nats-Msg-Id` of
//!   `dead-letter:<consumer>:<key>` so a repeated dead-lettering is deduplicated; once the server
//!   confirmed, the original is terminated (`+TERM`).
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use idem::consumer::{nats::JetStreamSource, Consumer, HandlerError, Message};
//!
//! let client = async_nats::connect("127.0.0.1:4222").await?;
//! let js = async_nats::jetstream::new(client);
//! let stream = js.get_stream("ORDERS").await?;
//! let pull: async_nats::jetstream::consumer::PullConsumer =
//!     stream.get_consumer("fulfilment").await?;
//! let source = JetStreamSource::new(js, pull, "ORDERS_DLQ.fulfilment");
//! let consumer = Consumer::new(source.consumer_name(), idem::MemoryStore::new())?;
//! let handler = consumer.guarded(|msg: Message, _claim| async move {
//!     Ok::<_, HandlerError>(msg.payload.len())
//! });
//! consumer.run(source.deliveries().await?, handler, 32).await;
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self, AckKind};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use crate::consumer::{Delivery, PARTITION_KEY_HEADER};
use crate::error::{BoxError, Error};
use crate::key::Key;

/// The header JetStream deduplicates publishes by, and the key of a delivery that carries it.
pub const MSG_ID: &str = "Nats-Msg-Id";
/// Header of a dead letter: why it was given up.
pub const REASON: &str = "Idem-Dead-Letter-Reason";
/// Header of a dead letter: the consumer that gave it up.
pub const CONSUMER: &str = "Idem-Consumer";
/// Header of a dead letter: the message's key.
pub const KEY: &str = "Idem-Key";
/// Header of a dead letter: the subject it was published to.
pub const ORIGINAL_SUBJECT: &str = "Idem-Original-Subject";
/// Header of a dead letter: the stream and stream sequence it came from, `<stream>:<seq>`.
pub const ORIGINAL_SEQUENCE: &str = "Idem-Original-Sequence";

/// A pull consumer, with where its dead letters go.
#[derive(Clone)]
pub struct JetStreamSource {
    context: jetstream::Context,
    consumer: PullConsumer,
    dead_letters: String,
    batch: usize,
}

impl fmt::Debug for JetStreamSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamSource")
            .field("consumer", &self.consumer_name())
            .field("dead_letters", &self.dead_letters)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl JetStreamSource {
    /// Deliveries of `consumer`; dead letters are published through `context` to
    /// `dead_letter_subject`, which a stream must capture.
    pub fn new(
        context: jetstream::Context,
        consumer: PullConsumer,
        dead_letter_subject: impl Into<String>,
    ) -> Self {
        JetStreamSource {
            context,
            consumer,
            dead_letters: dead_letter_subject.into(),
            batch: 32,
        }
    }

    /// How many messages one pull asks for (default 32): about the runner's concurrency. A
    /// message pulled but not yet handled gets no "still working", so its ack wait runs while it
    /// waits; a batch much larger than the concurrency turns that wait into redeliveries.
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// The consumer's name (its durable name): put it in the handler's scope.
    pub fn consumer_name(&self) -> &str {
        &self.consumer.cached_info().name
    }

    /// The deliveries, as they are pulled. The stream's errors (a missed heartbeat, a
    /// reconnect) are items of their own, which the runner logs and skips.
    pub async fn deliveries(
        &self,
    ) -> Result<impl Stream<Item = Result<JetStreamDelivery, BoxError>> + use<>, Error> {
        let config = &self.consumer.cached_info().config;
        let max_deliver = u32::try_from(config.max_deliver).ok().filter(|m| *m > 0);
        let keep_alive = (config.ack_wait / 3).max(Duration::from_millis(10));
        let context = self.context.clone();
        let dead_letters = self.dead_letters.clone();
        let consumer = self.consumer_name().to_owned();
        let messages = self
            .consumer
            .stream()
            .max_messages_per_batch(self.batch)
            .heartbeat(Duration::from_secs(15))
            .messages()
            .await
            .map_err(|e| Error::Unavailable(Box::new(e)))?;
        Ok(messages.map(move |m| match m {
            Ok(msg) => Ok(JetStreamDelivery::new(
                msg,
                context.clone(),
                dead_letters.clone(),
                consumer.clone(),
                max_deliver,
                keep_alive,
            )),
            Err(e) => Err(Box::new(e) as BoxError),
        }))
    }
}

/// One JetStream message, as the runner handles it.
pub struct JetStreamDelivery {
    msg: jetstream::Message,
    context: jetstream::Context,
    dead_letters: String,
    consumer: String,
    key: Result<String, String>,
    origin: String,
    delivered: u32,
    max_deliver: Option<u32>,
    keep_alive: Duration,
}

impl fmt::Debug for JetStreamDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamDelivery")
            .field("subject", &self.msg.subject)
            .field("key", &self.key)
            .field("origin", &self.origin)
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

impl JetStreamDelivery {
    fn new(
        msg: jetstream::Message,
        context: jetstream::Context,
        dead_letters: String,
        consumer: String,
        max_deliver: Option<u32>,
        keep_alive: Duration,
    ) -> Self {
        let (origin, delivered) = match msg.info() {
            Ok(info) => (
                format!("{}:{}", info.stream, info.stream_sequence),
                u32::try_from(info.delivered).unwrap_or(1).max(1),
            ),
            Err(_) => (String::new(), 1),
        };
        let header = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(MSG_ID))
            .map(|v| v.as_str().to_owned());
        let key = match header {
            Some(id) => Ok(id),
            None if !origin.is_empty() => Ok(origin.clone()),
            None => {
                Err("the message has neither a Nats-Msg-Id header nor JetStream metadata".into())
            }
        };
        JetStreamDelivery {
            msg,
            context,
            dead_letters,
            consumer,
            key,
            origin,
            delivered,
            max_deliver,
            keep_alive,
        }
    }

    /// The message as the client received it.
    pub fn message(&self) -> &jetstream::Message {
        &self.msg
    }
}

/// A header value without line breaks or other control characters.
fn header_value(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

impl Delivery for JetStreamDelivery {
    fn key(&self) -> Result<Key, String> {
        match &self.key {
            Ok(raw) => Key::parse(raw).map_err(|e| format!("unusable message id {raw:?}: {e}")),
            Err(why) => Err(why.clone()),
        }
    }

    fn payload(&self) -> Bytes {
        self.msg.payload.clone()
    }

    fn subject(&self) -> &str {
        self.msg.subject.as_str()
    }

    fn delivered(&self) -> u32 {
        self.delivered
    }

    fn max_deliveries(&self) -> Option<u32> {
        self.max_deliver
    }

    fn partition_key(&self) -> Option<&str> {
        let headers = self.msg.headers.as_ref()?;
        Some(headers.get(PARTITION_KEY_HEADER)?.as_str())
    }

    fn keep_alive_every(&self) -> Option<Duration> {
        Some(self.keep_alive)
    }

    async fn ack(&self) -> Result<(), BoxError> {
        self.msg.double_ack().await
    }

    async fn retry(&self, delay: Duration) -> Result<(), BoxError> {
        self.msg.ack_with(AckKind::Nak(Some(delay))).await
    }

    async fn dead_letter(&self, reason: &str) -> Result<(), BoxError> {
        let key = match &self.key {
            Ok(k) => k.clone(),
            Err(_) => self.origin.clone(),
        };
        let mut headers = HeaderMap::new();
        if let Some(original) = &self.msg.headers {
            for (name, values) in original.iter() {
                if !AsRef::<str>::as_ref(name).eq_ignore_ascii_case(MSG_ID) {
                    for v in values {
                        headers.append(name.clone(), v.clone());
                    }
                }
            }
        }
        headers.insert(REASON, header_value(reason).as_str());
        headers.insert(CONSUMER, header_value(&self.consumer).as_str());
        headers.insert(KEY, header_value(&key).as_str());
        headers.insert(ORIGINAL_SUBJECT, self.msg.subject.as_str());
        headers.insert(ORIGINAL_SEQUENCE, self.origin.as_str());
        headers.insert(
            MSG_ID,
            header_value(&format!("dead-letter:{}:{key}", self.consumer)).as_str(),
        );
        self.context
            .publish_with_headers(self.dead_letters.clone(), headers, self.msg.payload.clone())
            .await?
            .await?;
        self.msg.ack_with(AckKind::Term).await
    }

    async fn keep_alive(&self) -> Result<(), BoxError> {
        self.msg.ack_with(AckKind::Progress).await
    }
}

/// Publishes outbox events through JetStream: the event's id as `Nats-Msg-Id`, so the stream's
/// duplicate window drops a second publish of the same event, and its partition key as
/// `Idem-Partition-Key` (for [`Consumer::ordered`](crate::consumer::Consumer::ordered)); returns once the server stored
/// (or deduplicated) it. A server out of reach or slow to answer is
/// [`Unreachable`](crate::outbox::Unreachable); a refusal (no stream captures the topic, a payload over the server's limit) counts toward
/// parking the event ([`Relay::park_after`](crate::outbox::Relay::park_after)).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Clone)]
pub struct JetStreamPublisher {
    context: jetstream::Context,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl fmt::Debug for JetStreamPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamPublisher").finish_non_exhaustive()
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl JetStreamPublisher {
    /// Publishes through `context`; a stream must capture the events' topics.
    pub fn new(context: jetstream::Context) -> Self {
        JetStreamPublisher { context }
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl crate::outbox::Publisher for JetStreamPublisher {
    async fn publish(&self, event: &crate::outbox::Event) -> Result<(), BoxError> {
        // A header value with a line break would panic inside the client: refuse it first.
        event.validate()?;
        let mut headers = HeaderMap::new();
        headers.insert(MSG_ID, event.id.as_str());
        headers.insert(PARTITION_KEY_HEADER, event.partition_key.as_str());
        self.context
            .publish_with_headers(event.topic.clone(), headers, event.payload.clone())
            .await
            .map_err(whose)?
            .await
            .map_err(whose)?;
        Ok(())
    }
}

/// A publish's error, as the relay needs to read it: the server out of reach or slow is
/// [`Unreachable`](crate::outbox::Unreachable); anything else (no stream captures the subject, a payload over the
/// server's limit, a stream that refused the message) is this event refused.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn whose(e: jetstream::context::PublishError) -> BoxError {
    use jetstream::context::PublishErrorKind;
    match e.kind() {
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::MaxAckPending => Box::new(crate::outbox::Unreachable::new(e)),
        _ => Box::new(e),
    }
}
