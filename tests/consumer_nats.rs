//! The JetStream adapter against a real NATS server: the scenarios every broker passes
//! (`nats::…`, from `common/consumer_scenarios.rs`: a message published three times and
//! redelivered after a crash has one effect, a poison message is dead-lettered after one attempt
//! while the rest flow), and JetStream's own: an ack after the ack wait, with the redelivery it
//! could not stop, still runs the handler once; consumers and streams that could lose or repeat
//! messages are refused; dead letters are clean and can be re-driven.
//!
//! Each test works in streams of its own (a unique prefix), deleted at the end. Without
//! `NATS_URL` at build time the tests are listed as ignored.

mod common;
#[path = "common/consumer_scenarios.rs"]
mod scenarios;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer::AckPolicy;
use async_nats::jetstream::consumer::{PullConsumer, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream;
use bytes::Bytes;
use futures_util::StreamExt;
use idem::consumer::nats::{JetStreamDelivery, JetStreamSource, KEY, ORIGINAL_SUBJECT, REASON};
use idem::consumer::{Backoff, Consumer, Delivery, Handler, HandlerError, Message};
use idem::{BoxError, Key, MemoryStore};

use common::{JsStreams, until};
use scenarios::{
    Broker, CONSUMER, DeadLetter, Deliveries,
    a_poison_message_is_dead_lettered_after_one_attempt_while_the_rest_flow,
    published_three_times_and_redelivered_after_a_crash_has_one_effect, running,
};

/// JetStream under the shared scenarios: an `orders` stream that keeps every copy of a message
/// (a duplicate window of 100 ms), a `dlq` stream for the dead letters, and the durable
/// consumer.
struct Nats {
    streams: JsStreams,
    stream: stream::Stream,
    root: String,
    dlq: stream::Stream,
    source: JetStreamSource,
}

impl Broker for Nats {
    type Delivery = JetStreamDelivery;
    type Subscription = ();
    const KEEPS_REASONS: bool = true;

    async fn open(ack_wait: Duration) -> Nats {
        let streams = JsStreams::new(&common::nats_url()).await;
        let (stream, root) = streams.stream("orders", Duration::from_millis(100)).await;
        let (dlq, dlq_root) = streams.stream("dlq", Duration::from_secs(60)).await;
        let pull = pull_consumer(&stream, CONSUMER, ack_wait, -1).await;
        let dead_letters = format!("{dlq_root}.{CONSUMER}");
        let source = JetStreamSource::new(streams.js.clone(), pull, dead_letters);
        Nats {
            streams,
            stream,
            root,
            dlq,
            source,
        }
    }

    async fn publish(&self, id: &str, payload: &str) {
        publish(
            &self.streams.js,
            &format!("{}.paid", self.root),
            id,
            payload,
        )
        .await;
    }

    async fn publish_copies(&self, id: &str, payload: &str, copies: usize) {
        // Each past the duplicate window, so the stream stores every copy.
        for _ in 0..copies {
            self.publish(id, payload).await;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(
            holds(&self.stream, copies as u64, Duration::from_secs(5)).await,
            "every copy stored"
        );
    }

    async fn subscribe(&self, _tag: &str) -> ((), Deliveries<JetStreamDelivery>) {
        ((), self.source.deliveries().await.unwrap().boxed())
    }

    /// The durable consumer redelivers what a subscription left unacknowledged once the ack
    /// wait runs out.
    async fn crash(&self, (): ()) {}

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        let inspect: PullConsumer = self
            .dlq
            .get_or_create_consumer(
                "inspect",
                pull::Config {
                    durable_name: Some("inspect".into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let mut batch = inspect.fetch().max_messages(100).messages().await.unwrap();
        let mut taken = Vec::new();
        while let Some(letter) = batch.next().await {
            let letter = letter.unwrap();
            let headers = letter.headers.clone().unwrap_or_default();
            let header = |name| headers.get(name).map(|v| v.as_str().to_owned());
            taken.push(DeadLetter {
                key: header(KEY),
                payload: letter.payload.to_vec(),
                reason: header(REASON),
            });
            letter.ack().await.unwrap();
        }
        taken
    }

    async fn close(self) {}
}

mod nats {
    crate::backend_tests!(
        #[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
        super::Nats:
        published_three_times_and_redelivered_after_a_crash_has_one_effect(flavor = "multi_thread", worker_threads = 2),
        a_poison_message_is_dead_lettered_after_one_attempt_while_the_rest_flow(flavor = "multi_thread", worker_threads = 2),
    );
}

async fn pull_consumer(
    stream: &async_nats::jetstream::stream::Stream,
    name: &str,
    ack_wait: Duration,
    max_deliver: i64,
) -> PullConsumer {
    stream
        .create_consumer(pull::Config {
            durable_name: Some(name.to_owned()),
            ack_wait,
            max_deliver,
            ..Default::default()
        })
        .await
        .expect("create the consumer")
}

async fn publish(js: &async_nats::jetstream::Context, subject: &str, id: &str, payload: &str) {
    js.send_publish(
        subject.to_owned(),
        PublishMessage::build()
            .payload(Bytes::copy_from_slice(payload.as_bytes()))
            .message_id(id),
    )
    .await
    .expect("publish")
    .await
    .expect("the server confirmed");
}

/// Publishes `payload` to `subject` with `headers`, and waits for the server to store it.
async fn publish_with(
    js: &async_nats::jetstream::Context,
    subject: &str,
    headers: &[(&str, &str)],
    payload: &str,
) {
    let mut map = async_nats::HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, *value);
    }
    js.publish_with_headers(
        subject.to_owned(),
        map,
        Bytes::copy_from_slice(payload.as_bytes()),
    )
    .await
    .expect("publish")
    .await
    .expect("the server confirmed");
}

/// Waits until `stream` holds `n` messages, at most `limit`.
async fn holds(stream: &async_nats::jetstream::stream::Stream, n: u64, limit: Duration) -> bool {
    let mut stream = stream.clone();
    let end = tokio::time::Instant::now() + limit;
    loop {
        let messages = stream.info().await.expect("stream info").state.messages;
        if messages == n {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The consumer's pending and unacknowledged messages: `(0, 0)` once every message was settled.
async fn outstanding(stream: &async_nats::jetstream::stream::Stream, name: &str) -> (u64, usize) {
    let mut pull: PullConsumer = stream.get_consumer(name).await.unwrap();
    let info = pull.info().await.unwrap();
    (info.num_pending, info.num_ack_pending)
}

/// A backoff short enough for tests.
fn quick(consumer: Consumer<MemoryStore>) -> Consumer<MemoryStore> {
    consumer.backoff(Backoff {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(200),
    })
}

/// A delivery whose consumer stalls: it never says "still working", so the broker's ack wait
/// runs out while the handler works.
struct Stalled<D>(D);

impl<D: Delivery> Delivery for Stalled<D> {
    fn key(&self) -> Result<Key, String> {
        self.0.key()
    }
    fn payload(&self) -> Bytes {
        self.0.payload()
    }
    fn subject(&self) -> &str {
        self.0.subject()
    }
    fn delivered(&self) -> u32 {
        self.0.delivered()
    }
    fn max_deliveries(&self) -> Option<u32> {
        self.0.max_deliveries()
    }
    async fn ack(&self) -> Result<(), BoxError> {
        self.0.ack().await
    }
    async fn retry(&self, delay: Duration) -> Result<(), BoxError> {
        self.0.retry(delay).await
    }
    async fn dead_letter(&self, reason: &str) -> Result<(), BoxError> {
        self.0.dead_letter(reason).await
    }
    async fn keep_alive(&self) -> Result<(), BoxError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn an_ack_after_the_ack_wait_does_not_stop_the_redelivery_the_record_does() {
    use futures_util::StreamExt;
    let streams = JsStreams::new(&common::nats_url()).await;
    let (stream, root) = streams.stream("events", Duration::from_secs(60)).await;
    publish(&streams.js, &format!("{root}.paid"), "evt-1", "{}").await;
    let pull = pull_consumer(&stream, "slow", Duration::from_secs(1), -1).await;
    let source = JetStreamSource::new(streams.js.clone(), pull, format!("{root}.dlq"));

    let runs = Arc::new(AtomicUsize::new(0));
    let delivered = Arc::new(std::sync::Mutex::new(Vec::new()));
    let consumer = Consumer::new(source.consumer_name(), MemoryStore::new())
        .unwrap()
        .lease(Duration::from_secs(30));
    let r = runs.clone();
    let handler = consumer.guarded(move |_msg: Message, _claim| {
        let first = r.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                // Longer than two ack waits, without a word to the broker.
                tokio::time::sleep(Duration::from_millis(2500)).await;
            }
            Ok::<_, HandlerError>("shipped".to_owned())
        }
    });
    let d = delivered.clone();
    let deliveries = source.deliveries().await.unwrap().map(move |m| {
        m.map(|m| {
            d.lock().unwrap().push(m.delivered());
            Stalled(m)
        })
    });
    let c = consumer.clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn(async move {
        c.run_until(deliveries, handler, 1, async {
            let _ = stop_rx.await;
        })
        .await
    });
    assert!(
        until(Duration::from_secs(20), || consumer.stats().completed == 1
            && consumer.stats().replayed >= 1)
        .await,
        "{:?} {:?}",
        consumer.stats(),
        delivered.lock().unwrap()
    );
    let _ = stop_tx.send(());
    runner.await.unwrap();
    // The broker redelivered while the first delivery ran, and took its late ack: the
    // redelivery reached the handler's guard, which replayed instead of running it again.
    assert!(
        delivered.lock().unwrap().iter().any(|n| *n >= 2),
        "{:?}",
        delivered.lock().unwrap()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let mut pull: PullConsumer = stream.get_consumer("slow").await.unwrap();
    let info = pull.info().await.unwrap();
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0), "{info:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn consumers_whose_acks_are_not_explicit_are_refused() {
    let streams = JsStreams::new(&common::nats_url()).await;
    let (stream, root) = streams.stream("orders", Duration::from_secs(60)).await;
    // An ack of message N under `AckPolicy::All` also acks earlier messages still waiting on a
    // delayed NAK; under `None` nothing is ever redelivered.
    for (name, policy) in [("all", AckPolicy::All), ("none", AckPolicy::None)] {
        let pull = match stream
            .create_consumer(pull::Config {
                durable_name: Some(name.to_owned()),
                ack_policy: policy,
                ..Default::default()
            })
            .await
        {
            Ok(pull) => pull,
            // The server itself refuses pull consumers without acks.
            Err(e) if policy == AckPolicy::None => {
                assert!(e.to_string().contains("ack"), "{e}");
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        let source = JetStreamSource::new(streams.js.clone(), pull, format!("{root}.dlq"));
        let err = source.deliveries().await.err().expect("refused");
        assert!(
            matches!(err, idem::Error::Config(_)) && err.to_string().contains("ack policy"),
            "{err}"
        );
    }
    let pull = pull_consumer(&stream, "explicit", Duration::from_secs(30), -1).await;
    let source = JetStreamSource::new(streams.js.clone(), pull, format!("{root}.dlq"));
    assert!(source.deliveries().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn a_stream_that_keeps_messages_longer_than_the_records_is_refused() {
    let streams = JsStreams::new(&common::nats_url()).await;
    const DAY: Duration = Duration::from_secs(86_400);
    // Records are kept 7 days by default: a message the stream still holds after that would
    // run again when it is redelivered or the stream is replayed.
    for (suffix, max_age, accepted) in [
        ("forever", Duration::ZERO, false),
        ("eight-days", 8 * DAY, false),
        ("seven-days", 7 * DAY, true),
        ("one-hour", Duration::from_secs(3600), true),
    ] {
        let (stream, root) = streams
            .stream_with(
                suffix,
                stream::Config {
                    max_age,
                    ..Default::default()
                },
            )
            .await;
        let pull = pull_consumer(&stream, "fulfilment", Duration::from_secs(30), -1).await;
        let source = JetStreamSource::new(streams.js.clone(), pull, format!("{root}.dlq"));
        match source.deliveries().await {
            Ok(_) => assert!(accepted, "{suffix} accepted"),
            Err(e) => {
                assert!(!accepted, "{suffix} refused: {e}");
                assert!(
                    matches!(e, idem::Error::Config(_)) && e.to_string().contains("max_age"),
                    "{e}"
                );
            }
        }
        // Records kept 30 days outlive any of these streams but the one without a max_age.
        let pull = pull_consumer(&stream, "audit", Duration::from_secs(30), -1).await;
        let source =
            JetStreamSource::new(streams.js.clone(), pull, format!("{root}.dlq")).retain(30 * DAY);
        assert_eq!(
            source.deliveries().await.is_ok(),
            !max_age.is_zero(),
            "{suffix} with records of 30 days"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn a_consumer_that_stops_redelivering_is_refused() {
    let streams = JsStreams::new(&common::nats_url()).await;
    let (stream, root) = streams.stream("orders", Duration::from_secs(60)).await;
    // With `max_deliver` the server stops at the limit: a message whose dead letter could not
    // be published there would never come back.
    let pull = pull_consumer(&stream, "limited", Duration::from_secs(30), 5).await;
    let source = JetStreamSource::new(streams.js.clone(), pull, format!("{root}.dlq"));
    let err = source.deliveries().await.err().expect("refused");
    assert!(
        matches!(err, idem::Error::Config(_)) && err.to_string().contains("max_deliver"),
        "{err}"
    );
    let pull = pull_consumer(&stream, "unlimited", Duration::from_secs(30), -1).await;
    let source = JetStreamSource::new(streams.js.clone(), pull, format!("{root}.dlq"));
    assert!(source.deliveries().await.is_ok());
}

/// A guarded handler that fails for good on every message.
fn poisoned(
    consumer: &Consumer<MemoryStore>,
    reason: &'static str,
) -> impl Handler<(idem::consumer::GuardedHandler, (), HandlerError)> + use<> {
    consumer.guarded(move |_msg: Message, _claim| async move {
        Err::<(), _>(HandlerError::permanent(reason))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn a_dead_letter_that_cannot_be_published_is_retried_until_it_is() {
    let streams = JsStreams::new(&common::nats_url()).await;
    let (stream, root) = streams.stream("orders", Duration::from_secs(60)).await;
    publish(&streams.js, &format!("{root}.paid"), "m-1", "poison").await;
    // An ack wait longer than the test: only the runner's own retry brings the message back.
    let pull = pull_consumer(&stream, "fulfilment", Duration::from_secs(60), -1).await;
    // No stream captures the dead letters' subject yet: publishing them fails.
    let dlq_subject = format!("{}.late.fulfilment", streams.prefix);
    let source = JetStreamSource::new(streams.js.clone(), pull, dlq_subject);
    let consumer = quick(Consumer::new(source.consumer_name(), MemoryStore::new()).unwrap());
    let handler = poisoned(&consumer, "no such order");
    let (retried, dlq, landed) = running(
        &consumer,
        source.deliveries().await.unwrap(),
        handler,
        4,
        async {
            let retried = until(Duration::from_secs(10), || {
                consumer.stats().ack_failures >= 3
            })
            .await;
            // The dead letters' stream appears: the next attempt lands.
            let (dlq, _) = streams.stream("late", Duration::from_secs(60)).await;
            let landed = holds(&dlq, 1, Duration::from_secs(10)).await;
            (retried, dlq, landed)
        },
    )
    .await;
    assert!(
        retried,
        "retried soon, not after the ack wait: {:?}",
        consumer.stats()
    );
    assert!(landed, "{:?}", consumer.stats());
    let stats = consumer.stats();
    assert_eq!(stats.dead_lettered, 1, "{stats:?}");
    assert!(stats.retried >= 3, "{stats:?}");
    assert_eq!(outstanding(&stream, "fulfilment").await, (0, 0));
    let letter = dlq.get_raw_message(1).await.unwrap();
    assert_eq!(&letter.payload[..], b"poison");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn a_recreated_stream_does_not_reuse_the_keys_of_the_one_it_replaced() {
    let streams = JsStreams::new(&common::nats_url()).await;
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut settled = Vec::new();
    for incarnation in 0..2 {
        if incarnation == 1 {
            streams
                .js
                .delete_stream(streams.stream_name("orders"))
                .await
                .unwrap();
        }
        let (stream, root) = streams.stream("orders", Duration::from_secs(60)).await;
        // No message id: the key is the stored message's identity, sequence 1 both times.
        publish_with(&streams.js, &format!("{root}.paid"), &[], "{}").await;
        let pull = pull_consumer(&stream, "fulfilment", Duration::from_secs(60), -1).await;
        let source = JetStreamSource::new(streams.js.clone(), pull, format!("{root}.dlq"));
        let consumer = Consumer::new("fulfilment", store.clone()).unwrap();
        let (r, k) = (runs.clone(), keys.clone());
        let handler = consumer.guarded(move |msg: Message, _claim| {
            r.fetch_add(1, Ordering::SeqCst);
            k.lock().unwrap().push(msg.key.to_string());
            async { Ok::<_, HandlerError>(()) }
        });
        let done = running(
            &consumer,
            source.deliveries().await.unwrap(),
            handler,
            4,
            async {
                until(Duration::from_secs(10), || {
                    let s = consumer.stats();
                    s.acked() + s.dead_lettered == 1
                })
                .await
            },
        )
        .await;
        assert!(done, "{:?}", consumer.stats());
        settled.push(consumer.stats());
    }
    assert_eq!(
        (settled[1].completed, settled[1].replayed),
        (1, 0),
        "the new stream's first message is a new message: {settled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let keys = keys.lock().unwrap().clone();
    assert_ne!(keys[0], keys[1]);
    let name = streams.stream_name("orders");
    assert!(
        keys.iter().all(|k| k.starts_with(&format!("{name}:1:"))),
        "{keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn a_dead_letter_leaves_the_control_headers_behind_and_writes_clean_values() {
    let streams = JsStreams::new(&common::nats_url()).await;
    let (stream, root) = streams
        .stream_with(
            "orders",
            stream::Config {
                allow_rollup: true,
                max_age: Duration::from_secs(3600),
                ..Default::default()
            },
        )
        .await;
    // A dead-letter stream that allows no rollups, and is not the stream the publisher expected.
    let (dlq, dlq_root) = streams.stream("dlq", Duration::from_secs(60)).await;
    let name = streams.stream_name("orders");
    publish_with(
        &streams.js,
        &format!("{root}.paid"),
        &[
            ("Nats-Msg-Id", "m-1"),
            ("Nats-Expected-Stream", &name),
            ("Nats-Expected-Last-Sequence", "0"),
            ("Nats-Expected-Last-Subject-Sequence", "0"),
            ("Nats-Rollup", "sub"),
            ("Nats-TTL", "1h"),
            ("Trace-Id", "t-1"),
        ],
        "poison",
    )
    .await;
    let pull = pull_consumer(&stream, "fulfilment", Duration::from_secs(60), -1).await;
    let source = JetStreamSource::new(streams.js.clone(), pull, format!("{dlq_root}.fulfilment"));
    let consumer = quick(Consumer::new(source.consumer_name(), MemoryStore::new()).unwrap());
    // A reason with a line break (a header injection, were it written as it is) and text
    // that is not ASCII.
    let handler = poisoned(
        &consumer,
        "no such order\r\nX-Injected: yes — commande introuvable",
    );
    let landed = running(
        &consumer,
        source.deliveries().await.unwrap(),
        handler,
        4,
        holds(&dlq, 1, Duration::from_secs(10)),
    )
    .await;
    assert!(landed, "{:?}", consumer.stats());
    assert_eq!(outstanding(&stream, "fulfilment").await, (0, 0));
    let letter = dlq.get_raw_message(1).await.unwrap();
    let headers = &letter.headers;
    for control in [
        "Nats-Expected-Stream",
        "Nats-Expected-Last-Sequence",
        "Nats-Expected-Last-Subject-Sequence",
        "Nats-Rollup",
        "Nats-TTL",
    ] {
        assert!(
            headers.get(control).is_none(),
            "{control} copied: {headers:?}"
        );
    }
    assert_eq!(headers.get("Trace-Id").unwrap().as_str(), "t-1");
    assert_eq!(headers.get(KEY).unwrap().as_str(), "m-1");
    assert!(headers.get("X-Injected").is_none(), "{headers:?}");
    // The line break is spaces; the rest arrives as it was written.
    assert_eq!(
        headers.get(REASON).unwrap().as_str(),
        "no such order  X-Injected: yes — commande introuvable"
    );
}

/// Re-drives the dead letter at `seq` of `dlq` as the README says: its payload and headers
/// published again to the subject it came from, then removed from the dead letters.
async fn redrive(js: &async_nats::jetstream::Context, dlq: &stream::Stream, seq: u64) {
    redrive_as(js, dlq, seq, false).await
}

/// [`redrive`]; with `original_id`, the copy is published with its original message id as its
/// `Nats-Msg-Id`, as an operator might.
async fn redrive_as(
    js: &async_nats::jetstream::Context,
    dlq: &stream::Stream,
    seq: u64,
    original_id: bool,
) {
    let letter = dlq.get_raw_message(seq).await.expect("the dead letter");
    let subject = letter
        .headers
        .get(ORIGINAL_SUBJECT)
        .expect("its original subject")
        .as_str()
        .to_owned();
    let mut headers = letter.headers.clone();
    if original_id {
        let key = headers.get(KEY).expect("its key").clone();
        headers.insert("Nats-Msg-Id", key);
    }
    js.publish_with_headers(subject, headers, letter.payload.clone())
        .await
        .expect("publish")
        .await
        .expect("the server confirmed");
    dlq.delete_message(seq).await.expect("removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn a_redriven_message_that_fails_again_is_dead_lettered_again() {
    let streams = JsStreams::new(&common::nats_url()).await;
    let window = Duration::from_secs(1);
    let (stream, root) = streams.stream("orders", window).await;
    let (dlq, dlq_root) = streams.stream("dlq", Duration::from_secs(60)).await;
    publish(&streams.js, &format!("{root}.paid"), "m-1", "poison").await;
    let pull = pull_consumer(&stream, "fulfilment", Duration::from_secs(60), -1).await;
    let source = JetStreamSource::new(streams.js.clone(), pull, format!("{dlq_root}.fulfilment"));
    let consumer = quick(Consumer::new(source.consumer_name(), MemoryStore::new()).unwrap());
    let handler = poisoned(&consumer, "no such order");
    let landed = running(
        &consumer,
        source.deliveries().await.unwrap(),
        handler,
        4,
        async {
            let mut landed = vec![holds(&dlq, 1, Duration::from_secs(10)).await];
            // An operator re-drives it within the dead-letter stream's duplicate window, and it
            // fails again: its second dead letter must not be taken for a duplicate of the first.
            // Once as the README says, once under its original id (past the orders stream's own
            // duplicate window, which would drop it).
            for (seq, original_id) in [(1, false), (2, true)] {
                tokio::time::sleep(window).await;
                redrive_as(&streams.js, &dlq, seq, original_id).await;
                landed.push(holds(&dlq, 1, Duration::from_secs(10)).await);
            }
            landed
        },
    )
    .await;
    assert_eq!(landed, [true; 3], "{:?}", consumer.stats());
    assert_eq!(consumer.stats().dead_lettered, 3);
    assert_eq!(outstanding(&stream, "fulfilment").await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn a_redriven_dead_letter_is_processed_under_its_original_key() {
    let streams = JsStreams::new(&common::nats_url()).await;
    let (stream, root) = streams.stream("orders", Duration::from_secs(60)).await;
    let (dlq, dlq_root) = streams.stream("dlq", Duration::from_secs(60)).await;
    // One message with an id, one without (keyed by the stored message's identity).
    publish(&streams.js, &format!("{root}.paid"), "m-1", "a").await;
    publish_with(&streams.js, &format!("{root}.paid"), &[], "b").await;
    let store = MemoryStore::new();
    // Two consumers of the stream: `audit` processes both, `fulfilment` gives up on them
    // until the warehouse is fixed.
    let fixed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let audit_runs = Arc::new(AtomicUsize::new(0));
    let audit_pull = pull_consumer(&stream, "audit", Duration::from_secs(60), -1).await;
    let audit_source =
        JetStreamSource::new(streams.js.clone(), audit_pull, format!("{dlq_root}.audit"));
    let audit = quick(Consumer::new("audit", store.clone()).unwrap());
    let runs = audit_runs.clone();
    let audit_handler = audit.guarded(move |_msg: Message, _claim| {
        runs.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, HandlerError>(()) }
    });
    let pull = pull_consumer(&stream, "fulfilment", Duration::from_secs(60), -1).await;
    let source = JetStreamSource::new(streams.js.clone(), pull, format!("{dlq_root}.fulfilment"));
    let fulfilment = quick(Consumer::new("fulfilment", store.clone()).unwrap());
    let (f, k) = (fixed.clone(), keys.clone());
    let handler = fulfilment.guarded(move |msg: Message, _claim| {
        let fixed = f.load(Ordering::SeqCst);
        if fixed {
            k.lock().unwrap().push(msg.key.to_string());
        }
        async move {
            if fixed {
                Ok(())
            } else {
                Err(HandlerError::permanent("the warehouse rejects it"))
            }
        }
    });
    let work = async {
        assert!(until(Duration::from_secs(10), || audit.stats().completed == 2).await);
        assert!(holds(&dlq, 2, Duration::from_secs(10)).await);
        fixed.store(true, Ordering::SeqCst);
        let first = dlq.get_raw_message(1).await.unwrap();
        let second = dlq.get_raw_message(2).await.unwrap();
        let original_keys = [
            first.headers.get(KEY).unwrap().as_str().to_owned(),
            second.headers.get(KEY).unwrap().as_str().to_owned(),
        ];
        redrive(&streams.js, &dlq, 1).await;
        redrive(&streams.js, &dlq, 2).await;
        let done = until(Duration::from_secs(10), || {
            fulfilment.stats().completed == 2 && audit.stats().replayed == 2
        })
        .await;
        (done, original_keys)
    };
    let ((done, original_keys), ()) = tokio::join!(
        running(
            &fulfilment,
            source.deliveries().await.unwrap(),
            handler,
            4,
            work
        ),
        async {
            let deliveries = audit_source.deliveries().await.unwrap();
            let stop = until(Duration::from_secs(30), || {
                fulfilment.stats().completed == 2 && audit.stats().replayed == 2
            });
            audit
                .run_until(deliveries, audit_handler, 4, async {
                    stop.await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                })
                .await
        }
    );
    assert!(
        done,
        "fulfilment {:?}, audit {:?}",
        fulfilment.stats(),
        audit.stats()
    );
    // The re-driven copies came back under the keys of the messages they copy: `fulfilment`
    // ran them as those messages, and `audit`, which had processed them, replayed.
    let mut expected = original_keys.to_vec();
    expected.sort();
    let place = format!("{}:2:", streams.stream_name("orders"));
    assert!(
        expected[0].starts_with(&place) && expected[1] == "m-1",
        "{expected:?}"
    );
    let mut ran = keys.lock().unwrap().clone();
    ran.sort();
    assert_eq!(ran, expected);
    assert_eq!(audit_runs.load(Ordering::SeqCst), 2, "{:?}", audit.stats());
    assert_eq!(outstanding(&stream, "audit").await, (0, 0));
    assert_eq!(outstanding(&stream, "fulfilment").await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn a_message_failing_for_now_is_dead_lettered_before_the_streams_max_age_deletes_it() {
    let streams = JsStreams::new(&common::nats_url()).await;
    // The stream deletes a message four seconds after it stored it, acked or not.
    let (stream, root) = streams
        .stream_with(
            "orders",
            stream::Config {
                max_age: Duration::from_secs(4),
                duplicate_window: Duration::from_secs(1),
                ..Default::default()
            },
        )
        .await;
    let (dlq, dlq_root) = streams.stream("dlq", Duration::from_secs(60)).await;
    publish(&streams.js, &format!("{root}.paid"), "m-1", "{\"order\":1}").await;
    let pull = pull_consumer(&stream, "fulfilment", Duration::from_secs(1), -1).await;
    let source = JetStreamSource::new(streams.js.clone(), pull, format!("{dlq_root}.fulfilment"));
    // No delivery limit of its own, and retries half a second apart: the stream's max_age
    // comes before any limit would.
    let consumer = Consumer::new(source.consumer_name(), MemoryStore::new())
        .unwrap()
        .backoff(Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_millis(500),
        });
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let handler = consumer.guarded(move |_msg: Message, _claim| {
        r.fetch_add(1, Ordering::SeqCst);
        async { Err::<(), _>(HandlerError::transient("the warehouse API timed out")) }
    });
    let landed = running(
        &consumer,
        source.deliveries().await.unwrap(),
        handler,
        4,
        holds(&dlq, 1, Duration::from_secs(12)),
    )
    .await;
    assert!(
        landed,
        "the stream deleted the message and nothing kept it: {:?}, {} runs",
        consumer.stats(),
        runs.load(Ordering::SeqCst)
    );
    assert!(runs.load(Ordering::SeqCst) >= 2, "it was retried first");
    let letter = dlq.get_raw_message(1).await.unwrap();
    assert_eq!(&letter.payload[..], b"{\"order\":1}");
    let reason = letter.headers.get(REASON).unwrap().as_str().to_owned();
    assert!(
        reason.contains("max_age") && reason.contains("timed out"),
        "{reason}"
    );
    assert_eq!(consumer.stats().dead_lettered, 1, "{:?}", consumer.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn a_message_left_unknown_until_its_dead_letter_is_finished_by_the_completer_once() {
    use common::bank::LossyBank;
    use idem::completer::Completer;
    let streams = JsStreams::new(&common::nats_url()).await;
    let (stream, root) = streams.stream("orders", Duration::from_secs(1)).await;
    let (dlq, dlq_root) = streams.stream("dlq", Duration::from_secs(60)).await;
    publish(&streams.js, &format!("{root}.paid"), "m-1", "250").await;
    let pull = pull_consumer(&stream, "payments", Duration::from_secs(30), -1).await;
    let source = JetStreamSource::new(streams.js.clone(), pull, format!("{dlq_root}.payments"));
    let store = MemoryStore::new();
    let consumer = quick(Consumer::new(source.consumer_name(), store.clone()).unwrap())
        .max_deliveries(2)
        .resumable();
    let bank = Arc::new(LossyBank::default());
    let b = bank.clone();
    let handler = consumer.guarded(move |msg: Message, claim: idem::ClaimInfo| {
        let paid = b.pay(&claim, &msg.payload);
        async move { paid }
    });
    let completer = Completer::new(store.clone()).consumer(&consumer, handler.clone());
    let finished = running(
        &consumer,
        source.deliveries().await.unwrap(),
        handler,
        4,
        async {
            // Every delivery's answer is lost, until the delivery limit dead-letters it.
            assert!(
                holds(&dlq, 1, Duration::from_secs(10)).await,
                "dead-lettered"
            );
            assert_eq!((bank.runs(), bank.moves()), (2, 1));
            // The bank is back; nobody delivers the message again. The completer, given the
            // consumer's handler, finishes it once its resume delay (two seconds) has passed.
            bank.fix();
            let end = tokio::time::Instant::now() + Duration::from_secs(10);
            let mut completed = 0;
            while completed == 0 && tokio::time::Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(200)).await;
                completed += completer.run_once().await.unwrap().completed;
            }
            // The dead letter, re-driven, comes back under its key: a replay, acked.
            redrive(&streams.js, &dlq, 1).await;
            let replayed = until(Duration::from_secs(10), || consumer.stats().replayed == 1).await;
            (completed, replayed)
        },
    )
    .await;
    assert_eq!(finished, (1, true), "{:?}", consumer.stats());
    assert_eq!(bank.runs(), 3, "two deliveries and the completer's run");
    assert_eq!(bank.moves(), 1, "one payment, under one downstream key");
    assert_eq!(consumer.stats().dead_lettered, 1);
    assert_eq!(consumer.stats().completed, 0, "no delivery completed it");
    assert_eq!(outstanding(&stream, "payments").await, (0, 0));
}
