//! NATS JetStream: pull consumers as [`Delivery`] streams, and a publisher for the outbox relay.
//!
//! - **Key**: the `Nats-Msg-Id` header when present (the id the publisher deduplicates with),
//!   else the stored message's identity, `<stream>:<stream sequence>:<timestamp>`, the
//!   timestamp being when the server stored it (nanoseconds since 1970). A sequence alone
//!   repeats: a stream deleted and created again starts over at 1, and one restored from an
//!   older backup hands out again the sequences stored after that backup (restoring keeps the
//!   stream's creation time, so that cannot tell them apart); the timestamp does not repeat, and
//!   a restored message keeps its own. Never the consumer sequence, which differs per consumer
//!   and per redelivery. A stream whose name makes that longer than a key may be is named by a
//!   digest instead (`stream-<32 hex digits>:<sequence>:<timestamp>`). A dead letter published
//!   again to the subject it came from (a re-drive, see below) is keyed by the key it was
//!   dead-lettered under, its `Idem-Key` header.
//! - **Ack**: a double ack, which returns once the server confirmed it. JetStream can accept an
//!   ack that comes after the ack wait and still redeliver the message: the record, not the ack,
//!   is what stops the second execution, and the redelivery is answered by a replay.
//! - **Delivery limit and age**: the runner's limit
//!   ([`Consumer::max_deliveries`](crate::consumer::Consumer::max_deliveries), by default
//!   [`DEFAULT_MAX_DELIVERIES`](crate::consumer::DEFAULT_MAX_DELIVERIES), 20), and the stream's
//!   `max_age`: the stream deletes a message that old whether or not it was acked, so a
//!   message that keeps failing for now is dead-lettered as soon as a retry would be due after
//!   `max_age` less one ack wait since it was stored (by the consumer's clock), rather than
//!   retried into its deletion. (An ack wait as long as `max_age` leaves no time for a retry:
//!   the first retryable failure is then a dead letter.)
//! - **Retry later**: a `-NAK` with the delay. **Still working**: `+WPI`, every third of the
//!   consumer's ack wait.
//! - **Dead letter**: the message is published through JetStream to the subject you name (a
//!   stream must capture it), with its payload and headers except JetStream's own (`Nats-…`:
//!   expectations such as `Nats-Expected-Stream`, `Nats-Rollup`, `Nats-TTL`, which would make
//!   the dead-letter stream refuse or roll up the copy), and with the reason, the consumer, the
//!   key and its origin in `Idem-…` headers. Its `Nats-Msg-Id` is
//!   `dead-letter:<consumer>:<stream>:<sequence>:<timestamp>`, one per stored message and
//!   consumer, so a repeated dead-lettering of the same message is deduplicated (the server
//!   says `duplicate`, and the first copy stands) while a re-driven copy that fails again is a
//!   new dead letter. Once the server confirmed, the original is terminated (`+TERM`). A dead
//!   letter that cannot be published (no stream captures the subject, the stream refuses it)
//!   leaves the original in place: the runner asks for it again after its backoff, and
//!   dead-letters it then.
//!
//! [`JetStreamSource::deliveries`] refuses, with [`Error::Config`], consumers and streams on
//! which the runner cannot keep its promises:
//!
//! - an ack policy other than explicit (`AckPolicy::All` acks earlier messages still waiting on
//!   a delayed NAK; `None` never redelivers);
//! - a `max_deliver` limit: the server stops redelivering there, so a message whose dead letter
//!   could not be published at the limit would never come back. Leave it unlimited and give the
//!   runner its limit with [`Consumer::max_deliveries`](crate::consumer::Consumer::max_deliveries);
//! - a stream that keeps messages longer than the records are kept (no `max_age`, or a longer
//!   one than [`JetStreamSource::retain`], by default [`MESSAGE_RETAIN`]): a message redelivered
//!   or replayed after its record expired would run again.
//!
//! **Re-driving a dead letter** (once its cause is fixed): [`redrive`] publishes its payload
//! with its headers to the subject in its `Idem-Original-Subject` header and, once the server
//! confirmed, deletes it from the dead-letter stream ([`dead_letters`] lists them; the `idem
//! dead-letters` command does both). Back on its subject, its `Idem-Key` is its key, so consumers that processed the
//! message replay it and the one that gave up runs it; publishing the same dead letter twice is
//! deduplicated by the original stream's duplicate window (its `Nats-Msg-Id` comes with it).
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
//! let consumer = Consumer::new(source.consumer_name(), idem::MemoryStore::new())?
//!     .max_deliveries(5);
//! let handler = consumer.guarded(|msg: Message, _claim| async move {
//!     Ok::<_, HandlerError>(msg.payload.len())
//! });
//! consumer.run(source.deliveries().await?, handler, 32).await;
//! # Ok(()) }
//! ```
//!
//! Re-driving, with the client:
//!
//! ```no_run
//! # async fn f(js: async_nats::jetstream::Context, seq: u64) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use idem::consumer::nats::ORIGINAL_SUBJECT;
//!
//! let dead_letters = js.get_stream("ORDERS_DLQ").await?;
//! let letter = dead_letters.get_raw_message(seq).await?;
//! let subject = letter.headers.get(ORIGINAL_SUBJECT).ok_or("not a dead letter")?.to_string();
//! js.publish_with_headers(subject, letter.headers.clone(), letter.payload.clone())
//!     .await?
//!     .await?;
//! dead_letters.delete_message(seq).await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer};
use async_nats::jetstream::response::Response;
use async_nats::jetstream::{self, AckKind};
use async_nats::{HeaderMap, HeaderValue};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde::Deserialize;

use crate::consumer::{Delivery, MESSAGE_RETAIN, PARTITION_KEY_HEADER};
use crate::error::{BoxError, Error};
use crate::guard::digest;
use crate::key::Key;

/// The header JetStream deduplicates publishes by, and the key of a delivery that carries it.
pub const MSG_ID: &str = "Nats-Msg-Id";
/// Header of a dead letter: why it was given up.
pub const REASON: &str = "Idem-Dead-Letter-Reason";
/// Header of a dead letter: the consumer that gave it up.
pub const CONSUMER: &str = "Idem-Consumer";
/// Header of a dead letter: the message's key. Published again to its original subject (a
/// re-drive), the dead letter is keyed by it.
pub const KEY: &str = "Idem-Key";
/// Header of a dead letter: the subject it was published to.
pub const ORIGINAL_SUBJECT: &str = "Idem-Original-Subject";
/// Header of a dead letter: the stream and stream sequence it came from, `<stream>:<seq>`.
pub const ORIGINAL_SEQUENCE: &str = "Idem-Original-Sequence";

/// Header of a dead letter: how many times the message had been delivered when it was given
/// up.
pub const DELIVERED: &str = "Idem-Delivered";

/// The prefix of JetStream's own headers: none is copied into a dead letter.
const JETSTREAM_HEADERS: &str = "Nats-";

/// A pull consumer, with where its dead letters go.
#[derive(Clone)]
pub struct JetStreamSource {
    context: jetstream::Context,
    consumer: PullConsumer,
    dead_letters: String,
    batch: usize,
    retain: Duration,
}

impl fmt::Debug for JetStreamSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamSource")
            .field("consumer", &self.consumer_name())
            .field("dead_letters", &self.dead_letters)
            .field("batch", &self.batch)
            .field("retain", &self.retain)
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
            retain: MESSAGE_RETAIN,
        }
    }

    /// How many messages one pull asks for (default 32): about the runner's concurrency. A
    /// message pulled but not yet handled gets no "still working", so its ack wait runs while it
    /// waits; a batch much larger than the concurrency turns that wait into redeliveries.
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// How long the handler's records are kept (default [`MESSAGE_RETAIN`], the consumer's
    /// default): the shortest retention of the records the handler relies on, its consumer's
    /// ([`Consumer::retain`](crate::consumer::Consumer::retain)) and that of the
    /// `#[idempotent]` functions it calls with a `retain` of their own.
    /// [`JetStreamSource::deliveries`] refuses a stream that keeps messages longer.
    pub fn retain(mut self, retain: Duration) -> Self {
        self.retain = retain;
        self
    }

    /// The consumer's name (its durable name): put it in the handler's scope.
    pub fn consumer_name(&self) -> &str {
        &self.consumer.cached_info().name
    }

    /// The deliveries, as they are pulled. The stream's errors (a missed heartbeat, a
    /// reconnect) are items of their own, which the runner logs and skips.
    ///
    /// Refused with [`Error::Config`] when the consumer's ack policy is not explicit, when it
    /// has a `max_deliver` limit, or when its stream keeps messages longer than the records are
    /// kept (see the [module](self) documentation); [`Error::Unavailable`] when the server could
    /// not be asked.
    pub async fn deliveries(
        &self,
    ) -> Result<impl Stream<Item = Result<JetStreamDelivery, BoxError>> + use<>, Error> {
        let mut consumer = self.consumer.clone();
        let info = consumer
            .info()
            .await
            .map_err(|e| Error::Unavailable(Box::new(e)))?
            .clone();
        check_consumer(&info.name, &info.config)?;
        let facts = StreamFacts::fetch(&self.context, &info.stream_name).await?;
        facts.check_retention(self.retain)?;
        let keep_alive = (info.config.ack_wait / 3).max(Duration::from_millis(10));
        let shared = Arc::new(Shared {
            max_age: facts.max_age,
            ack_wait: info.config.ack_wait,
            context: self.context.clone(),
            dead_letters: self.dead_letters.clone(),
            consumer: info.name.clone(),
            keep_alive,
        });
        let messages = self
            .consumer
            .stream()
            .max_messages_per_batch(self.batch)
            .heartbeat(Duration::from_secs(15))
            .messages()
            .await
            .map_err(|e| Error::Unavailable(Box::new(e)))?;
        Ok(messages.map(move |m| match m {
            Ok(msg) => JetStreamDelivery::new(msg, shared.clone()),
            Err(e) => Err(Box::new(e) as BoxError),
        }))
    }
}

/// Refuses a consumer whose acknowledgements the runner cannot rely on.
fn check_consumer(name: &str, config: &jetstream::consumer::Config) -> Result<(), Error> {
    if config.ack_policy != AckPolicy::Explicit {
        return Err(Error::Config(format!(
            "the JetStream consumer {name:?} has the ack policy {:?}: the runner needs explicit acks (with `All`, an ack of one message acks earlier ones still waiting to be retried; with `None`, nothing is redelivered)",
            config.ack_policy
        )));
    }
    if config.max_deliver > 0 {
        return Err(Error::Config(format!(
            "the JetStream consumer {name:?} has max_deliver = {}: the server stops redelivering there, so a message whose dead letter could not be published at the limit would never come back. Leave max_deliver unlimited (-1) and give the runner its limit with Consumer::max_deliveries({})",
            config.max_deliver, config.max_deliver
        )));
    }
    Ok(())
}

/// How long the consumer's stream keeps messages.
#[derive(Debug)]
struct StreamFacts {
    stream: String,
    max_age: Duration,
}

/// The part of the server's stream info the adapter reads.
#[derive(Deserialize)]
struct RawStreamInfo {
    config: RawStreamConfig,
}

#[derive(Deserialize)]
struct RawStreamConfig {
    /// Nanoseconds; 0 when messages never expire.
    #[serde(default)]
    max_age: u64,
}

impl StreamFacts {
    async fn fetch(context: &jetstream::Context, stream: &str) -> Result<StreamFacts, Error> {
        let response: Response<RawStreamInfo> = context
            .request(format!("STREAM.INFO.{stream}"), &serde_json::json!({}))
            .await
            .map_err(|e| Error::Unavailable(Box::new(e)))?;
        match response {
            Response::Ok(info) => Ok(StreamFacts {
                stream: stream.to_owned(),
                max_age: Duration::from_nanos(info.config.max_age),
            }),
            Response::Err { error } => Err(Error::Unavailable(
                format!("the info of JetStream stream {stream:?}: {error}").into(),
            )),
        }
    }

    /// Refuses a stream that keeps messages longer than records are kept.
    fn check_retention(&self, retain: Duration) -> Result<(), Error> {
        let stream = &self.stream;
        if self.max_age.is_zero() {
            return Err(Error::Config(format!(
                "the JetStream stream {stream:?} has no max_age and keeps its messages forever, while the handler's records are kept {retain:?}: a message redelivered or replayed after that would run again. Give the stream a max_age of at most {retain:?}, or keep the records longer (JetStreamSource::retain, Consumer::retain)"
            )));
        }
        if self.max_age > retain {
            return Err(Error::Config(format!(
                "the JetStream stream {stream:?} keeps messages {:?} (max_age), longer than the handler's records are kept ({retain:?}): a message redelivered or replayed after that would run again. Give the stream a max_age of at most {retain:?}, or keep the records longer (JetStreamSource::retain, Consumer::retain)",
                self.max_age
            )));
        }
        Ok(())
    }
}

/// What every delivery of one source shares.
struct Shared {
    context: jetstream::Context,
    dead_letters: String,
    consumer: String,
    keep_alive: Duration,
    /// How long the stream keeps a message (zero: for ever).
    max_age: Duration,
    /// How long the server waits for an ack before it redelivers.
    ack_wait: Duration,
}

/// One JetStream message, as the runner handles it.
pub struct JetStreamDelivery {
    msg: jetstream::Message,
    shared: Arc<Shared>,
    key: String,
    /// `<stream>:<sequence>`, as dead letters say where they came from.
    origin: String,
    /// `<stream>:<sequence>:<timestamp>` (or its digest form): this stored message.
    place: String,
    /// When the server stored it, in nanoseconds since 1970.
    stored_at: u64,
    delivered: u32,
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
    /// A delivery of `msg`; an error when it carries no JetStream metadata (then it cannot be
    /// acknowledged either).
    fn new(msg: jetstream::Message, shared: Arc<Shared>) -> Result<Self, BoxError> {
        let (stream, sequence, delivered) = match msg.info() {
            Ok(info) => (
                info.stream.to_owned(),
                info.stream_sequence,
                u32::try_from(info.delivered).unwrap_or(1).max(1),
            ),
            Err(e) => return Err(format!("a JetStream message without metadata: {e}").into()),
        };
        let stored_at = msg.reply.as_deref().and_then(stored_at).ok_or_else(|| {
            format!(
                "a JetStream message without the time it was stored: {:?}",
                msg.reply
            )
        })?;
        let place = place_key(&stream, sequence, stored_at);
        let stored_at = stored_at.parse().unwrap_or(u64::MAX);
        let key = message_key(msg.headers.as_ref(), msg.subject.as_str())
            .unwrap_or_else(|| place.clone());
        Ok(JetStreamDelivery {
            msg,
            shared,
            key,
            origin: format!("{stream}:{sequence}"),
            place,
            stored_at,
            delivered,
        })
    }

    /// The message as the client received it.
    pub fn message(&self) -> &jetstream::Message {
        &self.msg
    }

    /// The headers of this message's dead letter.
    fn dead_letter_headers(&self, reason: &str) -> Result<HeaderMap, BoxError> {
        let mut headers = HeaderMap::new();
        if let Some(original) = &self.msg.headers {
            for (name, values) in original.iter() {
                let name_str: &str = name.as_ref();
                let control = name_str
                    .get(..JETSTREAM_HEADERS.len())
                    .is_some_and(|p| p.eq_ignore_ascii_case(JETSTREAM_HEADERS));
                if !control {
                    for v in values {
                        headers.append(name.clone(), v.clone());
                    }
                }
            }
        }
        headers.insert(REASON, text_value(reason));
        headers.insert(CONSUMER, text_value(&self.shared.consumer));
        headers.insert(KEY, exact_value(KEY, &self.key)?);
        headers.insert(DELIVERED, text_value(&self.delivered.to_string()));
        headers.insert(
            ORIGINAL_SUBJECT,
            exact_value(ORIGINAL_SUBJECT, &self.msg.subject)?,
        );
        headers.insert(
            ORIGINAL_SEQUENCE,
            exact_value(ORIGINAL_SEQUENCE, &self.origin)?,
        );
        let id = dead_letter_id(&self.shared.consumer, &self.place);
        headers.insert(MSG_ID, exact_value(MSG_ID, &id)?);
        Ok(headers)
    }
}

/// The key a message names itself: a re-driven dead letter's original key, else its
/// `Nats-Msg-Id`.
fn message_key(headers: Option<&HeaderMap>, subject: &str) -> Option<String> {
    let headers = headers?;
    let redriven = headers
        .get(ORIGINAL_SUBJECT)
        .is_some_and(|s| s.as_str() == subject);
    if redriven && let Some(original) = headers.get(KEY) {
        return Some(original.as_str().to_owned());
    }
    headers.get(MSG_ID).map(|v| v.as_str().to_owned())
}

/// When the server stored the message, in nanoseconds since 1970, as its ack subject says
/// (`$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`, or
/// with the domain and account hash before the stream): read as text, so the key does not depend
/// on the date type the client is built with.
fn stored_at(reply: &str) -> Option<&str> {
    let tokens: Vec<&str> = reply.strip_prefix("$JS.ACK.")?.split('.').collect();
    let time = match tokens.len() {
        7 => tokens[5],
        n if n >= 9 => tokens[7],
        _ => return None,
    };
    (!time.is_empty() && time.bytes().all(|b| b.is_ascii_digit())).then_some(time)
}

/// `<stream>:<sequence>:<timestamp>`, or `stream-<digest of the stream>:<sequence>:<timestamp>`
/// when the stream's name makes the first no key.
fn place_key(stream: &str, sequence: u64, stored_at: &str) -> String {
    let readable = format!("{stream}:{sequence}:{stored_at}");
    if Key::parse(&readable).is_ok() {
        return readable;
    }
    format!("stream-{}:{sequence}:{stored_at}", digest(&[stream]))
}

/// The `Nats-Msg-Id` of the dead letter `consumer` writes for the stored message at `place`:
/// `dead-letter:<consumer>:<place>`, or its digest form when that is no key.
fn dead_letter_id(consumer: &str, place: &str) -> String {
    let readable = format!("dead-letter:{consumer}:{place}");
    if Key::parse(&readable).is_ok() {
        return readable;
    }
    format!("dead-letter:{}", digest(&[consumer, place]))
}

/// Free text (a reason) as a header value: line breaks and other control characters become
/// spaces, so nothing in it can end the header or start another.
fn text_value(s: &str) -> HeaderValue {
    let clean: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    // Nothing left that a header value refuses.
    clean.parse().unwrap_or_default()
}

/// A value that must be written exactly (a key, a subject): an error, never a changed value,
/// when a header cannot carry it.
fn exact_value(name: &str, s: &str) -> Result<HeaderValue, BoxError> {
    s.parse()
        .map_err(|_| format!("the {name} header cannot carry {s:?}").into())
}

impl Delivery for JetStreamDelivery {
    fn key(&self) -> Result<Key, String> {
        Key::parse(&self.key).map_err(|e| format!("unusable message id {:?}: {e}", self.key))
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

    fn partition_key(&self) -> Option<&str> {
        let headers = self.msg.headers.as_ref()?;
        Some(headers.get(PARTITION_KEY_HEADER)?.as_str())
    }

    fn keep_alive_every(&self) -> Option<Duration> {
        Some(self.shared.keep_alive)
    }

    /// The stream deletes the message `max_age` after it stored it, acked or not: that, less
    /// an ack wait (a redelivery can come that much later), by this machine's clock.
    fn expires_in(&self) -> Option<Duration> {
        if self.shared.max_age.is_zero() {
            return None;
        }
        let stored = std::time::UNIX_EPOCH + Duration::from_nanos(self.stored_at);
        let now = std::time::SystemTime::now();
        let age = now.duration_since(stored).unwrap_or_default();
        Some(
            self.shared
                .max_age
                .saturating_sub(age)
                .saturating_sub(self.shared.ack_wait),
        )
    }

    async fn ack(&self) -> Result<(), BoxError> {
        self.msg.double_ack().await
    }

    async fn retry(&self, delay: Duration) -> Result<(), BoxError> {
        self.msg.ack_with(AckKind::Nak(Some(delay))).await
    }

    async fn dead_letter(&self, reason: &str) -> Result<(), BoxError> {
        let headers = self.dead_letter_headers(reason)?;
        let ack = self
            .shared
            .context
            .publish_with_headers(
                self.shared.dead_letters.clone(),
                headers,
                self.msg.payload.clone(),
            )
            .await?
            .await?;
        if ack.duplicate {
            // This consumer dead-lettered this very message before (its termination did not
            // reach the server): the first copy is the dead letter.
            tracing::info!(target: "idem", consumer = %self.shared.consumer, origin = %self.origin, stream = %ack.stream, sequence = ack.sequence, "the message was dead-lettered before; terminating it");
        }
        self.msg.ack_with(AckKind::Term).await
    }

    async fn keep_alive(&self) -> Result<(), BoxError> {
        self.msg.ack_with(AckKind::Progress).await
    }
}

/// A dead letter in a dead-letter stream, as [`dead_letters`] reads it: its place and what its
/// `Idem-…` headers say (`None` where a header is missing: a message that no runner
/// dead-lettered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its sequence in the dead-letter stream: what [`redrive`] takes.
    pub sequence: u64,
    /// The subject it was published to ([`ORIGINAL_SUBJECT`]).
    pub original_subject: Option<String>,
    /// The stream and sequence it came from ([`ORIGINAL_SEQUENCE`]).
    pub origin: Option<String>,
    /// Its key ([`KEY`]): re-driven, it is processed under this key.
    pub key: Option<String>,
    /// The consumer that gave it up ([`CONSUMER`]).
    pub consumer: Option<String>,
    /// How many times it had been delivered ([`DELIVERED`]).
    pub delivered: Option<u32>,
    /// Why it was given up ([`REASON`]).
    pub reason: Option<String>,
    /// Its payload's size in bytes.
    pub size: usize,
}

impl DeadLetter {
    fn read(message: &jetstream::message::StreamMessage) -> Self {
        let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned());
        DeadLetter {
            sequence: message.sequence,
            original_subject: header(ORIGINAL_SUBJECT),
            origin: header(ORIGINAL_SEQUENCE),
            key: header(KEY),
            consumer: header(CONSUMER),
            delivered: header(DELIVERED).and_then(|d| d.parse().ok()),
            reason: header(REASON),
            size: message.payload.len(),
        }
    }
}

/// An error of the server, or of reaching it, as [`Error::Unavailable`].
fn unavailable(e: impl Into<BoxError>) -> Error {
    Error::Unavailable(e.into())
}

/// Whether a raw-message error says there is no such message.
fn not_found(e: &jetstream::stream::RawMessageError) -> bool {
    use jetstream::stream::RawMessageErrorKind;
    matches!(e.kind(), RawMessageErrorKind::NoMessageFound)
}

/// The dead letters of `stream`, oldest first, at most `limit`, starting at sequence `from`
/// (1: the start). Reading them changes nothing.
pub async fn dead_letters(
    stream: &jetstream::stream::Stream,
    from: u64,
    limit: usize,
) -> Result<Vec<DeadLetter>, Error> {
    let mut letters = Vec::new();
    let mut next = from.max(1);
    while letters.len() < limit {
        match stream.get_first_raw_message_by_subject(">", next).await {
            Ok(message) => {
                next = message.sequence + 1;
                letters.push(DeadLetter::read(&message));
            }
            Err(e) if not_found(&e) => break,
            Err(e) => return Err(unavailable(e)),
        }
    }
    Ok(letters)
}

/// What [`redrive`] did with a dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redriven {
    /// The dead letter, as it was.
    pub letter: DeadLetter,
    /// Where the copy was stored: its stream and sequence.
    pub stream: String,
    /// Its sequence there.
    pub stream_sequence: u64,
    /// Whether the stream took it for a copy of a message it already holds (its `Nats-Msg-Id`
    /// within the stream's duplicate window): a dead letter re-driven twice is stored once.
    pub duplicate: bool,
}

/// Re-drives the dead letter at `sequence` of the dead-letter stream `stream`: publishes its
/// payload and headers through `context` to the subject in its [`ORIGINAL_SUBJECT`] header and,
/// only once the server confirmed that publish, deletes it from the dead-letter stream. Back on
/// its subject it is keyed by its [`KEY`] header, its original key: a consumer that processed
/// the message replays it, and the one that gave up runs it.
///
/// A message without an [`ORIGINAL_SUBJECT`] header (no runner dead-lettered it) is refused with
/// [`Error::Config`], as is a sequence the stream does not hold; a publish
/// that is not confirmed leaves the dead letter where it is ([`Error::Unavailable`]), and a
/// confirmed publish whose deletion fails says so: re-driving it again is deduplicated within
/// the original stream's duplicate window.
pub async fn redrive(
    context: &jetstream::Context,
    stream: &jetstream::stream::Stream,
    sequence: u64,
) -> Result<Redriven, Error> {
    let message = match stream.get_raw_message(sequence).await {
        Ok(message) => message,
        Err(e) if not_found(&e) => {
            return Err(Error::Config(format!(
                "no dead letter at sequence {sequence}"
            )));
        }
        Err(e) => return Err(unavailable(e)),
    };
    let letter = DeadLetter::read(&message);
    let Some(subject) = letter.original_subject.clone() else {
        return Err(Error::Config(format!(
            "the message at sequence {sequence} is no dead letter: it has no {ORIGINAL_SUBJECT} \
             header"
        )));
    };
    let ack = context
        .publish_with_headers(subject, message.headers.clone(), message.payload.clone())
        .await
        .map_err(unavailable)?
        .await
        .map_err(unavailable)?;
    stream.delete_message(sequence).await.map_err(|e| {
        unavailable(format!(
            "re-drove the dead letter at sequence {sequence} (stored as {}:{}) but could not \
             delete it: {e}",
            ack.stream, ack.sequence
        ))
    })?;
    Ok(Redriven {
        letter,
        stream: ack.stream,
        stream_sequence: ack.sequence,
        duplicate: ack.duplicate,
    })
}

/// Publishes outbox events through JetStream: the event's id as `Nats-Msg-Id`, so the stream's
/// duplicate window drops a second publish of the same event, and its partition key as
/// `Idem-Partition-Key` (for [`Consumer::ordered`](crate::consumer::Consumer::ordered)); returns once the server stored
/// (or deduplicated) it. A server out of reach or slow to answer is
/// [`Unreachable`](crate::outbox::Unreachable); a refusal (no stream captures the topic, a payload over the server's limit) counts toward
/// parking the event ([`Relay::park_after`](crate::outbox::Relay::park_after)).
#[cfg(feature = "sql")]
#[derive(Clone)]
pub struct JetStreamPublisher {
    context: jetstream::Context,
}

#[cfg(feature = "sql")]
impl fmt::Debug for JetStreamPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamPublisher").finish_non_exhaustive()
    }
}

#[cfg(feature = "sql")]
impl JetStreamPublisher {
    /// Publishes through `context`; a stream must capture the events' topics.
    pub fn new(context: jetstream::Context) -> Self {
        JetStreamPublisher { context }
    }
}

#[cfg(feature = "sql")]
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
#[cfg(feature = "sql")]
fn whose(e: jetstream::context::PublishError) -> BoxError {
    use jetstream::context::PublishErrorKind;
    match e.kind() {
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::MaxAckPending => Box::new(crate::outbox::Unreachable::new(e)),
        _ => Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "1764602200435496733";

    #[test]
    fn a_place_names_the_stream_the_sequence_and_when_it_was_stored() {
        assert_eq!(place_key("ORDERS", 42, T), format!("ORDERS:42:{T}"));
        // The same sequence stored again (a recreated or restored stream) is another message.
        assert_ne!(
            place_key("ORDERS", 42, T),
            place_key("ORDERS", 42, "1764602200435496734")
        );
    }

    #[test]
    fn the_time_a_message_was_stored_is_read_from_its_ack_subject() {
        assert_eq!(
            stored_at(&format!("$JS.ACK.ORDERS.fulfilment.1.42.7.{T}.0")),
            Some(T)
        );
        assert_eq!(
            stored_at(&format!(
                "$JS.ACK._.ACCHASH.ORDERS.fulfilment.1.42.7.{T}.0.TOKEN"
            )),
            Some(T)
        );
        assert_eq!(
            stored_at(&format!(
                "$JS.ACK.hub.ACCHASH.ORDERS.fulfilment.1.42.7.{T}.0"
            )),
            Some(T)
        );
        assert_eq!(stored_at("$JS.ACK.ORDERS.fulfilment.1.42.7.x.0"), None);
        assert_eq!(stored_at("$JS.ACK.ORDERS.fulfilment.1.42"), None);
        assert_eq!(stored_at("_INBOX.abc"), None);
    }

    #[test]
    fn a_stream_name_that_makes_no_key_is_named_by_a_digest() {
        // Stream names may be up to 255 characters and need not be ASCII.
        for stream in ["S".repeat(255), "commandes-é".to_owned()] {
            let key = place_key(&stream, 7, T);
            assert!(Key::parse(&key).is_ok(), "{key}");
            assert!(
                key.starts_with("stream-") && key.ends_with(&format!(":7:{T}")),
                "{key}"
            );
            let id = dead_letter_id("fulfilment", &key);
            assert!(Key::parse(&id).is_ok(), "{id}");
        }
        let long = place_key(&"S".repeat(255), 7, T);
        assert_ne!(long, place_key(&"S".repeat(254), 7, T));
        let id = dead_letter_id(&"c".repeat(250), &long);
        assert!(
            id.starts_with("dead-letter:") && Key::parse(&id).is_ok(),
            "{id}"
        );
        assert_eq!(
            dead_letter_id("fulfilment", "ORDERS:42:7"),
            "dead-letter:fulfilment:ORDERS:42:7"
        );
    }

    #[test]
    fn a_dead_letter_back_on_its_subject_is_keyed_by_its_original_key() {
        let mut headers = HeaderMap::new();
        headers.insert(MSG_ID, "dead-letter:fulfilment:ORDERS:42:7");
        headers.insert(KEY, "m-1");
        headers.insert(ORIGINAL_SUBJECT, "order.paid");
        assert_eq!(
            message_key(Some(&headers), "order.paid").as_deref(),
            Some("m-1")
        );
        // In the dead-letter stream it is a dead letter: its own id, one per consumer.
        assert_eq!(
            message_key(Some(&headers), "dlq.fulfilment").as_deref(),
            Some("dead-letter:fulfilment:ORDERS:42:7")
        );
        let mut plain = HeaderMap::new();
        plain.insert(MSG_ID, "m-2");
        assert_eq!(
            message_key(Some(&plain), "order.paid").as_deref(),
            Some("m-2")
        );
        assert_eq!(message_key(None, "order.paid"), None);
    }

    #[test]
    fn header_values_are_written_clean_or_refused() {
        assert_eq!(
            text_value("no such order\r\nX-Injected: yes\u{7}").as_str(),
            "no such order  X-Injected: yes "
        );
        assert_eq!(
            text_value("commande introuvable — é").as_str(),
            "commande introuvable — é"
        );
        assert!(exact_value(KEY, "m-1\r\nX: y").is_err());
        assert_eq!(exact_value(KEY, "m-1").unwrap().as_str(), "m-1");
    }
}
