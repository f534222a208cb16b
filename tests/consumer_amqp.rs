//! The RabbitMQ adapter against a real broker: the same seam and runner as JetStream, and the
//! scenarios every broker passes (`rabbitmq::…`, from `common/consumer_scenarios.rs`): one
//! message id published three times and redelivered after a consumer's channel died mid-handler
//! has one effect; a poison message is published, with its reason, to the dead-letter exchange
//! while the rest flow. Then RabbitMQ's own: a message without a `message_id` is dead-lettered
//! unrun, the delivery limit holds on queues that do not count deliveries, a dead letter is
//! kept where a reject would have had RabbitMQ discard it (a queue without a dead-letter
//! exchange) and stays with the broker when no queue takes it, a consumer holds at most its
//! prefetch, and the outbox's AMQP publisher (which sends the messages) refuses what the broker
//! would lose.
//!
//! Each test declares queues and exchanges of its own, deleted at the end. Without `AMQP_URL` at
//! build time the tests are listed as ignored.

mod common;
#[path = "common/consumer_scenarios.rs"]
mod scenarios;

use common::proxy::{Fault, Rule};
use common::until;
use scenarios::{
    Broker, DeadLetter, Deliveries,
    a_poison_message_is_dead_lettered_after_one_attempt_while_the_rest_flow,
    published_three_times_and_redelivered_after_a_crash_has_one_effect, running,
};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use idem::consumer::amqp::{AmqpDelivery, AmqpPublisher, AmqpSource, DEFAULT_PREFETCH};
use idem::consumer::{Backoff, Consumer, HandlerError, Message};
use idem::outbox::{Event, OutboxBackend, PendingEvent, Publisher, Relay, Unreachable};
use idem::outbox::{MySqlOutbox, SqliteOutbox};
use idem::{MemoryStore, SqliteStore, idempotent};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ExchangeDeclareOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ExchangeKind};

/// A work queue with a dead-letter exchange and queue, deleted when dropped.
struct Queues {
    conn: Connection,
    channel: Channel,
    work: String,
    dead: String,
    exchange: String,
}

/// Which kind of queue the work queue is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A classic queue: no `x-delivery-count`, every redelivery says only `redelivered`.
    Classic,
    /// A quorum queue (durable, replicated): counts deliveries in `x-delivery-count`.
    Quorum,
}

impl Queues {
    async fn new() -> Queues {
        Queues::of(Kind::Classic, FieldTable::default()).await
    }

    /// A work queue of `kind`, with `args` added to its arguments.
    async fn of(kind: Kind, mut args: FieldTable) -> Queues {
        let conn = Connection::connect(&common::amqp_url(), Default::default())
            .await
            .expect("connect to RabbitMQ");
        let channel = conn.create_channel().await.unwrap();
        let base = common::unique("idem");
        let (work, dead, exchange) = (
            format!("{base}.work"),
            format!("{base}.dead"),
            format!("{base}.dlx"),
        );
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Fanout,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_declare(
                dead.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                dead.as_str().into(),
                exchange.as_str().into(),
                "".into(),
                Default::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(exchange.as_str().into()),
        );
        if kind == Kind::Quorum {
            args.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
        }
        let options = QueueDeclareOptions {
            durable: kind == Kind::Quorum,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(work.as_str().into(), options, args)
            .await
            .unwrap();
        Queues {
            conn,
            channel,
            work,
            dead,
            exchange,
        }
    }

    /// The messages in the dead-letter queue, taken.
    async fn dead_letters(&self) -> Vec<(Option<String>, Vec<u8>)> {
        let taken = self.dead_letters_with_reasons().await;
        taken
            .into_iter()
            .map(|(key, payload, _)| (key, payload))
            .collect()
    }

    /// The messages in the dead-letter queue, taken, with the reason the runner wrote.
    async fn dead_letters_with_reasons(&self) -> Vec<(Option<String>, Vec<u8>, Option<String>)> {
        let mut out = Vec::new();
        while let Some(m) = self
            .channel
            .basic_get(self.dead.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            out.push((
                m.delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.as_str().to_owned()),
                m.delivery.data.clone(),
                match m
                    .delivery
                    .properties
                    .headers()
                    .as_ref()
                    .and_then(|h| h.inner().get(idem::consumer::amqp::REASON))
                {
                    Some(AMQPValue::LongString(s)) => {
                        Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                    }
                    _ => None,
                },
            ));
        }
        out
    }

    /// A source of the work queue whose dead letters go to its dead-letter exchange.
    fn source(&self, channel: Channel) -> AmqpSource {
        AmqpSource::new(channel, self.work.as_str())
            .dead_letter_exchange(self.exchange.as_str(), "")
    }

    async fn cleanup(self) {
        // With the dead-letter queue a source declares by default.
        let declared = format!("{}.dead-letters", self.work);
        for q in [&self.work, &self.dead, &declared] {
            let _ = self
                .channel
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = self
            .channel
            .exchange_delete(self.exchange.as_str().into(), Default::default())
            .await;
        let _ = self.conn.close(200, "done".into()).await;
    }
}

/// RabbitMQ under the shared scenarios: a classic work queue with its dead-letter queue, and the
/// outbox's publisher.
struct Rabbit {
    q: Queues,
    publisher: AmqpPublisher,
}

impl Broker for Rabbit {
    type Delivery = AmqpDelivery;
    type Subscription = Channel;
    /// The runner publishes its dead letters with their reason.
    const KEEPS_REASONS: bool = true;

    /// A classic queue has no ack wait: it redelivers when the subscription's channel closes.
    async fn open(_ack_wait: Duration) -> Rabbit {
        let q = Queues::new().await;
        let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
            .await
            .unwrap();
        Rabbit { q, publisher }
    }

    async fn publish(&self, id: &str, payload: &str) {
        let e = Event::new(id, self.q.work.as_str(), "p", payload.to_owned());
        self.publisher.publish(&e).await.unwrap();
    }

    /// RabbitMQ does not deduplicate by message id: every copy is kept.
    async fn publish_copies(&self, id: &str, payload: &str, copies: usize) {
        for _ in 0..copies {
            self.publish(id, payload).await;
        }
    }

    /// A channel of its own, so that closing it ends this subscription alone.
    async fn subscribe(&self, tag: &str) -> (Channel, Deliveries<AmqpDelivery>) {
        let channel = self.q.conn.create_channel().await.unwrap();
        let deliveries = self
            .q
            .source(channel.clone())
            .deliveries(tag)
            .await
            .unwrap();
        (channel, deliveries.boxed())
    }

    /// The channel closes with its delivery unacked, and RabbitMQ requeues it.
    async fn crash(&self, channel: Channel) {
        channel.close(200, "crashed".into()).await.unwrap();
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        let taken = self.q.dead_letters_with_reasons().await;
        let letter = |(key, payload, reason)| DeadLetter {
            key,
            payload,
            reason,
        };
        taken.into_iter().map(letter).collect()
    }

    async fn close(self) {
        self.q.cleanup().await;
    }
}

mod rabbitmq {
    crate::backend_tests!(
        #[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
        super::Rabbit:
        published_three_times_and_redelivered_after_a_crash_has_one_effect(flavor = "multi_thread", worker_threads = 2),
        a_poison_message_is_dead_lettered_after_one_attempt_while_the_rest_flow(flavor = "multi_thread", worker_threads = 2),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn a_message_without_a_message_id_is_dead_lettered_unrun_while_the_rest_flow() {
    let broker = Rabbit::open(Duration::ZERO).await;
    broker.publish("m-1", "{}").await;
    broker
        .q
        .channel
        .basic_publish(
            "".into(),
            broker.q.work.as_str().into(),
            BasicPublishOptions::default(),
            b"anonymous",
            BasicProperties::default(),
        )
        .await
        .unwrap();
    broker.publish("m-2", "{}").await;
    let runs = Arc::new(AtomicUsize::new(0));
    let consumer = Consumer::new("fulfilment", MemoryStore::new())
        .unwrap()
        .max_deliveries(5);
    let r = runs.clone();
    let handler = consumer.guarded(move |_msg: Message, _claim| {
        r.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, HandlerError>(()) }
    });
    let (_channel, deliveries) = broker.subscribe("worker").await;
    let settled = running(&consumer, deliveries, handler, 8, async {
        until(Duration::from_secs(20), || {
            let s = consumer.stats();
            s.completed + s.dead_lettered == 3
        })
        .await
    })
    .await;
    assert!(settled, "{:?}", consumer.stats());
    let stats = consumer.stats();
    assert_eq!((stats.completed, stats.dead_lettered), (2, 1), "{stats:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the anonymous one never ran"
    );
    assert_eq!(
        scenarios::taken_dead_letters(&broker).await,
        vec![DeadLetter {
            key: None,
            payload: b"anonymous".to_vec(),
            reason: Some("the delivery has no message_id property".to_owned()),
        }]
    );
    broker.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn names_over_255_bytes_are_errors_not_panics() {
    let q = Queues::new().await;
    let long = "x".repeat(300);
    assert!(matches!(
        AmqpPublisher::connect(&common::amqp_url(), long.as_str()).await,
        Err(idem::Error::Config(_))
    ));
    let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
        .await
        .unwrap();
    for bad in [
        Event::new(long.as_str(), q.work.as_str(), "p", "{}"),
        Event::new("evt-1", long.as_str(), "p", "{}"),
        Event::new("evt-2", q.work.as_str(), "p\r\n", "{}"),
    ] {
        let err = publisher.publish(&bad).await.unwrap_err();
        assert!(err.to_string().contains("cannot be published"), "{err}");
    }
    let source = AmqpSource::new(q.conn.create_channel().await.unwrap(), long.as_str());
    assert!(matches!(
        source.deliveries("worker").await.err(),
        Some(idem::Error::Config(_))
    ));
    let source = AmqpSource::new(q.conn.create_channel().await.unwrap(), q.work.as_str());
    assert!(matches!(
        source.deliveries(&long).await.err(),
        Some(idem::Error::Config(_))
    ));
    // The publisher still works, and nothing invalid reached the queue.
    publisher
        .publish(&Event::new("evt-3", q.work.as_str(), "p", "{}"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let got = q
        .channel
        .basic_get(q.work.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the valid event");
    assert_eq!(
        got.delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str()),
        Some("evt-3")
    );
    assert!(
        q.channel
            .basic_get(q.work.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
            .is_none()
    );
    q.cleanup().await;
}

/// A SQLite outbox of its own.
async fn sqlite_outbox() -> (SqliteStore, SqliteOutbox, common::SqliteFile) {
    let file = common::SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.unwrap();
    let outbox = SqliteOutbox::new(store.pool().clone());
    outbox.migrate().await.unwrap();
    (store, outbox, file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn an_unroutable_event_is_not_marked_sent() {
    let q = Queues::new().await;
    let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
        .await
        .unwrap();
    // The default exchange routes by queue name: no queue has this one (a mistyped topic, a
    // queue not declared yet). The broker confirms the publish and returns the message.
    let nowhere = format!("{}.nowhere", q.work);
    let err = publisher
        .publish(&Event::new("evt-nowhere", nowhere.as_str(), "ORD-1", "{}"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("could not route"), "{err}");

    // Through the relay: the unroutable event stays pending with the reason, the routable one
    // of another partition is sent.
    let (store, outbox, _file) = sqlite_outbox().await;
    let mut tx = store.pool().begin().await.unwrap();
    outbox
        .enqueue(
            &mut tx,
            &Event::new("evt-a", nowhere.as_str(), "ORD-1", "{}"),
        )
        .await
        .unwrap();
    outbox
        .enqueue(
            &mut tx,
            &Event::new("evt-b", q.work.as_str(), "ORD-2", "{}"),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let relay = Relay::new(outbox.clone(), publisher);
    assert_eq!(relay.run_once().await.unwrap(), 1);
    let pending = outbox.pending(10).await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].event.id, "evt-a");
    let reason = pending[0].last_error.as_deref().unwrap_or("");
    assert!(reason.contains("could not route"), "{reason}");
    q.cleanup().await;
}

/// A queue of `kind` that holds one message and refuses more: its publisher is nacked, and the
/// publish is an error.
async fn a_full_queue_nacks_and_the_event_is_not_sent(kind: Kind) {
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongInt(1));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    let q = Queues::of(kind, args).await;
    let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
        .await
        .unwrap();
    // A classic queue refuses the second; a quorum queue takes one over its limit before it
    // refuses.
    for n in 0..2 {
        let _ = publisher
            .publish(&Event::new(format!("evt-{n}"), q.work.as_str(), "p", "{}"))
            .await;
    }
    let err = publisher
        .publish(&Event::new("evt-2", q.work.as_str(), "p", "{}"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    q.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn a_full_classic_queue_nacks_and_the_event_is_not_sent() {
    a_full_queue_nacks_and_the_event_is_not_sent(Kind::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn a_full_quorum_queue_nacks_and_the_event_is_not_sent() {
    a_full_queue_nacks_and_the_event_is_not_sent(Kind::Quorum).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn an_ack_the_closed_channel_never_sent_is_a_failure_not_a_completion() {
    let q = Queues::new().await;
    let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
        .await
        .unwrap();
    publisher
        .publish(&Event::new("m-1", q.work.as_str(), "p", "{}"))
        .await
        .unwrap();
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));

    // The handler completes after its channel closed: lapin answers the ack with `Ok(false)`,
    // it never reaches the broker, and RabbitMQ requeues the message.
    let channel = q.conn.create_channel().await.unwrap();
    let consumer = Consumer::new("fulfilment", store.clone()).unwrap();
    let (entered_tx, mut entered_rx) = tokio::sync::mpsc::unbounded_channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let go = Arc::new(tokio::sync::Mutex::new(Some(go_rx)));
    let r = runs.clone();
    let handler = consumer.guarded(move |_msg: Message, _claim| {
        r.fetch_add(1, Ordering::SeqCst);
        let (entered, go) = (entered_tx.clone(), go.clone());
        async move {
            let _ = entered.send(());
            if let Some(go) = go.lock().await.take() {
                let _ = go.await;
            }
            Ok::<_, HandlerError>(())
        }
    });
    let deliveries = AmqpSource::new(channel.clone(), q.work.as_str())
        .deliveries("closing")
        .await
        .unwrap();
    let c = consumer.clone();
    let run = tokio::spawn(async move { c.run(deliveries, handler, 1).await });
    entered_rx.recv().await.unwrap();
    channel.close(200, "going away".into()).await.unwrap();
    go_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the runner ends with its channel")
        .unwrap();
    let stats = consumer.stats();
    assert_eq!((stats.completed, stats.ack_failures), (0, 1), "{stats:?}");

    // The broker redelivers it; the record replays it.
    let again = Consumer::new("fulfilment", store.clone()).unwrap();
    let handler = again.guarded(|_msg: Message, _claim| async { Ok::<_, HandlerError>(()) });
    let deliveries = AmqpSource::new(q.conn.create_channel().await.unwrap(), q.work.as_str())
        .deliveries("survivor")
        .await
        .unwrap();
    let a = again.clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        a.run_until(deliveries, handler, 1, async {
            let _ = stop_rx.await;
        })
        .await
    });
    assert!(
        until(Duration::from_secs(10), || again.stats().replayed == 1).await,
        "{:?}",
        again.stats()
    );
    let _ = stop_tx.send(());
    run.await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    q.cleanup().await;
}

#[idempotent(scope = "flaky:<msg.consumer>", key = msg.key, store = store, transaction = tx, skip(runs), retain = "7d")]
async fn always_fails_in_its_transaction(
    store: &SqliteStore,
    runs: &AtomicUsize,
    msg: Message,
) -> Result<(), HandlerError> {
    runs.fetch_add(1, Ordering::SeqCst);
    sqlx::query("INSERT INTO shipments (msg) VALUES ($1)")
        .bind(msg.key.as_str())
        .execute(&mut **tx)
        .await
        .map_err(HandlerError::transient)?;
    Err(HandlerError::transient("the warehouse API timed out"))
}

/// A message that fails for now on every delivery, on a queue of `kind`: dead-lettered once
/// its third attempt fails, whether the handler releases its claim (separate commits) or rolls
/// it back with everything (transactional), and whether or not the queue counts deliveries.
async fn the_delivery_limit_fires(kind: Kind, transactional: bool) {
    let q = Queues::of(kind, FieldTable::default()).await;
    let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
        .await
        .unwrap();
    publisher
        .publish(&Event::new("m-flaky", q.work.as_str(), "p", "{}"))
        .await
        .unwrap();
    let (store, _file) = scenarios::shipments_store().await;
    let consumer = Consumer::new("fulfilment", store.clone())
        .unwrap()
        .max_deliveries(3)
        .backoff(Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
        });
    let runs = Arc::new(AtomicUsize::new(0));
    let deliveries = q
        .source(q.conn.create_channel().await.unwrap())
        .deliveries("worker")
        .await
        .unwrap();
    let (c, r) = (consumer.clone(), runs.clone());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async {
        let _ = stop_rx.await;
    };
    let run = tokio::spawn(async move {
        if transactional {
            let handler = move |msg: Message| {
                let (s, r) = (store.clone(), r.clone());
                async move { always_fails_in_its_transaction(&s, &r, msg).await }
            };
            c.run_until(deliveries, handler, 1, stop).await
        } else {
            let handler = c.guarded(move |_msg: Message, _claim| {
                r.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(HandlerError::transient("the warehouse API timed out")) }
            });
            c.run_until(deliveries, handler, 1, stop).await
        }
    });
    let limited = until(Duration::from_secs(10), || {
        consumer.stats().dead_lettered == 1
    })
    .await;
    let _ = stop_tx.send(());
    run.await.unwrap();
    assert!(limited, "never dead-lettered: {:?}", consumer.stats());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "three attempts, then the limit"
    );
    assert_eq!(consumer.stats().retried, 2, "{:?}", consumer.stats());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        q.dead_letters().await,
        vec![(Some("m-flaky".to_owned()), b"{}".to_vec())]
    );
    q.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn the_delivery_limit_fires_on_a_classic_queue() {
    the_delivery_limit_fires(Kind::Classic, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn the_delivery_limit_fires_on_a_classic_queue_for_a_transactional_handler() {
    the_delivery_limit_fires(Kind::Classic, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn the_delivery_limit_fires_on_a_quorum_queue() {
    the_delivery_limit_fires(Kind::Quorum, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn the_delivery_limit_fires_on_a_quorum_queue_for_a_transactional_handler() {
    the_delivery_limit_fires(Kind::Quorum, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn a_channel_the_broker_closed_is_reopened() {
    let q = Queues::new().await;
    // An exchange not declared yet: the broker closes the publisher's channel.
    let exchange = format!("{}.events", q.work);
    let publisher = AmqpPublisher::connect(&common::amqp_url(), exchange.as_str())
        .await
        .unwrap();
    let e = Event::new("evt-1", "order.paid", "p", "{}");
    let err = publisher.publish(&e).await.unwrap_err();
    assert!(err.to_string().contains("NOT_FOUND"), "{err}");
    // A refusal of this publish, not a broker out of reach: it counts toward parking.
    assert!(!Unreachable::is(&err), "{err:?}");
    q.channel
        .exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    q.channel
        .queue_bind(
            q.work.as_str().into(),
            exchange.as_str().into(),
            "order.paid".into(),
            Default::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let published = publisher.publish(&e).await;
    let _ = q
        .channel
        .exchange_delete(exchange.as_str().into(), Default::default())
        .await;
    published.expect("published on a new channel");
    let got = q
        .channel
        .basic_get(q.work.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the event");
    assert_eq!(
        got.delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str()),
        Some("evt-1")
    );
    q.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn a_confirmation_that_does_not_come_in_time_is_an_error_and_the_next_publish_goes_through() {
    let q = Queues::new().await;
    let url = common::amqp_url();
    let proxy = common::proxy::Proxy::amqp(&url).await;
    let publisher = AmqpPublisher::connect(&proxy.url(&url), "")
        .await
        .unwrap()
        .confirm_timeout(Duration::from_millis(500));
    // The broker's side of the publish is held for 3 s: no confirmation within the timeout.
    proxy.inject(Rule::first(
        &[b"evt-stalled"],
        Fault::Stall(Duration::from_secs(3)),
    ));
    let started = tokio::time::Instant::now();
    let err = publisher
        .publish(&Event::new("evt-stalled", q.work.as_str(), "p", "{}"))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(proxy.fired().len(), 1);
    // The broker was slow, not refusing: this never counts toward parking.
    assert!(Unreachable::is(&err), "{err:?}");
    assert!(err.to_string().contains("did not confirm"), "{err}");
    // Once the stall is over, a publish on a new channel is confirmed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    publisher
        .publish(&Event::new("evt-after", q.work.as_str(), "p", "{}"))
        .await
        .unwrap();
    q.cleanup().await;
}

/// An outbox of either database, as these tests fill and read it.
trait TestOutbox: OutboxBackend + Clone + 'static {
    /// Enqueues `events` in one transaction.
    async fn add(&self, events: &[Event]);
    async fn parked_events(&self) -> Vec<PendingEvent>;
}

macro_rules! test_outbox {
    ($outbox:ty) => {
        impl TestOutbox for $outbox {
            async fn add(&self, events: &[Event]) {
                let mut tx = self.pool().begin().await.unwrap();
                for e in events {
                    self.enqueue(&mut tx, e).await.unwrap();
                }
                tx.commit().await.unwrap();
            }
            async fn parked_events(&self) -> Vec<PendingEvent> {
                self.parked(10).await.unwrap()
            }
        }
    };
}

test_outbox!(SqliteOutbox);
test_outbox!(MySqlOutbox);

/// The broker returns an event no queue takes, again and again: the relay parks it, and the
/// partition's next event reaches its queue.
async fn an_unroutable_event_is_parked_and_its_partition_goes_on<O: TestOutbox>(outbox: O) {
    let q = Queues::new().await;
    let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
        .await
        .unwrap();
    let nowhere = format!("{}.nowhere", q.work);
    outbox
        .add(&[
            Event::new("evt-lost", nowhere.as_str(), "ORD-1", "{}"),
            Event::new("evt-next", q.work.as_str(), "ORD-1", "{}"),
        ])
        .await;
    let relay = Relay::new(outbox.clone(), publisher).park_after(2);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while outbox.counts().await.unwrap().sent == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "evt-next never went"
        );
        relay.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let parked = outbox.parked_events().await;
    assert_eq!(parked.len(), 1);
    assert_eq!(
        (parked[0].event.id.as_str(), parked[0].failures),
        ("evt-lost", 2)
    );
    assert!(
        parked[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("could not route")),
        "{parked:?}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let got = q
        .channel
        .basic_get(q.work.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("evt-next");
    assert_eq!(
        got.delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str()),
        Some("evt-next")
    );
    q.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn an_unroutable_sqlite_event_is_parked_and_its_partition_goes_on() {
    let (_store, outbox, _file) = sqlite_outbox().await;
    an_unroutable_event_is_parked_and_its_partition_goes_on(outbox).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    any(not(idem_amqp), not(idem_mysql)),
    ignore = "needs RabbitMQ and MySQL: set AMQP_URL=amqp://… and IDEM_MYSQL_URL=mysql://…"
)]
async fn an_unroutable_mysql_event_is_parked_and_its_partition_goes_on() {
    let db = common::MyDatabase::create(&common::mysql_url(), 4).await;
    let outbox = MySqlOutbox::new(db.pool.clone());
    outbox.migrate().await.unwrap();
    an_unroutable_event_is_parked_and_its_partition_goes_on(outbox).await;
}

/// Events of 4 partitions published by the relay to a queue of `kind`, consumed by 8
/// concurrent handlers whose first attempt at every third event fails for now: in ordered
/// mode each partition completes its events one at a time, in the order they were enqueued.
async fn the_relays_order_survives_consumption(kind: Kind, ordered: bool) {
    use common::partitions::{PartitionLog, events};
    const PARTITIONS: usize = 4;
    const PER: u32 = 12;
    let q = Queues::of(kind, FieldTable::default()).await;
    let (store, outbox, _file) = sqlite_outbox().await;
    let mut tx = store.pool().begin().await.unwrap();
    for e in events(&q.work, PARTITIONS, PER) {
        outbox.enqueue(&mut tx, &e).await.unwrap();
    }
    tx.commit().await.unwrap();
    let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
        .await
        .unwrap();
    let relay = Relay::new(outbox.clone(), publisher);
    while relay.run_once().await.unwrap() > 0 {}
    let total = PARTITIONS * PER as usize;
    assert_eq!(outbox.counts().await.unwrap().sent, total as u64);

    let log = PartitionLog::default();
    let consumer = Consumer::new("ordered", MemoryStore::new())
        .unwrap()
        .ordered(ordered)
        .backoff(Backoff {
            initial: Duration::from_millis(30),
            max: Duration::from_millis(100),
        });
    let handler = consumer.guarded(log.handler());
    let deliveries = AmqpSource::new(q.conn.create_channel().await.unwrap(), q.work.as_str())
        .deliveries("ordered")
        .await
        .unwrap();
    let l = log.clone();
    tokio::time::timeout(
        Duration::from_secs(30),
        consumer.run_until(deliveries, handler, 8, async move {
            while l.completed() < total {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }),
    )
    .await
    .expect("every event completed");
    log.check(PARTITIONS, PER).unwrap();
    assert!(log.most_at_once() > 1, "partitions ran concurrently");
    q.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn an_ordered_consumer_of_a_classic_queue_completes_each_partition_in_order() {
    the_relays_order_survives_consumption(Kind::Classic, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn an_ordered_consumer_of_a_quorum_queue_completes_each_partition_in_order() {
    the_relays_order_survives_consumption(Kind::Quorum, true).await;
}

/// A queue of its own, declared with no arguments at all (no dead-letter exchange), on `q`'s
/// connection; deleted, with the dead-letter queue idem declares for it, by [`drop_plain`].
async fn plain_queue(q: &Queues, suffix: &str) -> String {
    let name = format!("{}.{suffix}", q.work);
    q.channel
        .queue_declare(
            name.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    name
}

async fn drop_plain(q: &Queues, name: &str) {
    let channel = q.conn.create_channel().await.unwrap();
    for queue in [name.to_owned(), format!("{name}.dead-letters")] {
        let _ = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = channel.close(200, "done".into()).await;
}

/// How many messages `queue` holds ready, as a passive declare says (on a channel of its own:
/// a queue that does not exist closes the channel it is asked on).
async fn ready(q: &Queues, queue: &str) -> Option<u32> {
    let channel = q.conn.create_channel().await.unwrap();
    let declared = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .ok()
        .map(|q| q.message_count());
    let _ = channel.close(200, "counted".into()).await;
    declared
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn a_dead_letter_of_a_queue_without_a_dead_letter_exchange_is_kept_not_discarded() {
    let q = Queues::new().await;
    // No `x-dead-letter-exchange`: a `basic.reject` would make RabbitMQ discard the message.
    let work = plain_queue(&q, "nodlx").await;
    let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
        .await
        .unwrap();
    for id in ["m-poison", "m-ok"] {
        publisher
            .publish(&Event::new(
                id,
                work.as_str(),
                "p",
                format!("{{\"id\":\"{id}\"}}"),
            ))
            .await
            .unwrap();
    }
    let consumer = Consumer::new("fulfilment", MemoryStore::new())
        .unwrap()
        .max_deliveries(2)
        .backoff(Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
        });
    let handler = consumer.guarded(|msg: Message, _claim| async move {
        match msg.key.as_str() {
            "m-poison" => Err(HandlerError::transient("the warehouse API timed out")),
            _ => Ok(()),
        }
    });
    let deliveries = AmqpSource::new(q.conn.create_channel().await.unwrap(), work.as_str())
        .deliveries("worker")
        .await
        .unwrap();
    let settled = running(&consumer, deliveries, handler, 4, async {
        until(Duration::from_secs(10), || {
            let s = consumer.stats();
            s.completed == 1 && s.dead_lettered == 1
        })
        .await
    })
    .await;
    assert!(settled, "{:?}", consumer.stats());
    // The dead letter is in the queue idem declared for the queue's dead letters, with its
    // id, body and reason; nothing is left in the work queue.
    let dead = format!("{work}.dead-letters");
    let channel = q.conn.create_channel().await.unwrap();
    let letter = channel
        .basic_get(dead.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .expect("the dead-letter queue exists")
        .expect("the dead letter is in it, not discarded")
        .delivery;
    assert_eq!(
        letter.properties.message_id().as_ref().map(|m| m.as_str()),
        Some("m-poison")
    );
    assert_eq!(&letter.data[..], b"{\"id\":\"m-poison\"}");
    let headers = letter.properties.headers().clone().unwrap_or_default();
    let header = |name: &str| match headers.inner().get(name) {
        Some(AMQPValue::LongString(s)) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => None,
    };
    let reason = header("Idem-Dead-Letter-Reason").unwrap_or_default();
    assert!(
        reason.contains("delivery limit reached") && reason.contains("timed out"),
        "{reason:?} in {headers:?}"
    );
    assert_eq!(
        header("Idem-Original-Queue").as_deref(),
        Some(work.as_str())
    );
    assert_eq!(
        header("Idem-Original-Routing-Key").as_deref(),
        Some(work.as_str())
    );
    assert_eq!(ready(&q, &work).await, Some(0));
    assert_eq!(ready(&q, &dead).await, Some(0), "one dead letter, taken");
    drop_plain(&q, &work).await;
    q.cleanup().await;
}

/// `n` messages published to `queue`.
async fn backlog(queue: &str, n: usize) {
    let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
        .await
        .unwrap();
    for i in 0..n {
        publisher
            .publish(&Event::new(format!("m-{i}"), queue, "p", "{}"))
            .await
            .unwrap();
    }
}

/// How many deliveries `source` hands out before any is acked: what the broker lets a consumer
/// hold unacknowledged.
async fn held_before_any_ack(source: &AmqpSource, tag: &str) -> usize {
    let mut deliveries = source.deliveries(tag).await.unwrap();
    let mut held = Vec::new();
    while let Ok(Some(d)) =
        tokio::time::timeout(Duration::from_millis(800), deliveries.next()).await
    {
        held.push(d.unwrap());
    }
    held.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn a_source_holds_at_most_its_prefetch_unacknowledged() {
    let q = Queues::new().await;
    let (default, five) = (
        plain_queue(&q, "prefetch").await,
        plain_queue(&q, "five").await,
    );
    backlog(&default, 40).await;
    backlog(&five, 12).await;
    let source = AmqpSource::new(q.conn.create_channel().await.unwrap(), default.as_str());
    assert_eq!(
        held_before_any_ack(&source, "hoarder").await,
        usize::from(DEFAULT_PREFETCH),
        "the default prefetch bounds a backlog of 40"
    );
    let source = AmqpSource::new(q.conn.create_channel().await.unwrap(), five.as_str()).prefetch(5);
    assert_eq!(held_before_any_ack(&source, "hoarder").await, 5);
    drop_plain(&q, &default).await;
    drop_plain(&q, &five).await;
    q.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn a_dead_letter_no_queue_takes_leaves_the_original_with_the_broker() {
    let q = Queues::new().await;
    let work = plain_queue(&q, "nowhere").await;
    let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
        .await
        .unwrap();
    publisher
        .publish(&Event::new("m-poison", work.as_str(), "p", "{}"))
        .await
        .unwrap();
    let consumer = Consumer::new("fulfilment", MemoryStore::new())
        .unwrap()
        .backoff(Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
        });
    let handler = consumer.guarded(|_msg: Message, _claim| async {
        Err::<(), _>(HandlerError::permanent("no such order"))
    });
    // Dead letters to a queue that does not exist: the broker returns each copy unrouted.
    let channel = q.conn.create_channel().await.unwrap();
    let deliveries = AmqpSource::new(channel.clone(), work.as_str())
        .dead_letter_queue(format!("{work}.missing"))
        .deliveries("worker")
        .await
        .unwrap();
    let refused = running(&consumer, deliveries, handler, 1, async {
        until(Duration::from_secs(10), || {
            consumer.stats().ack_failures >= 3
        })
        .await
    })
    .await;
    let stats = consumer.stats();
    assert!(refused, "{stats:?}");
    // Never counted as dead-lettered, never acked: given back each time.
    assert_eq!((stats.dead_lettered, stats.acked()), (0, 0), "{stats:?}");
    assert!(stats.retried >= 3, "{stats:?}");
    channel.close(200, "stopped".into()).await.unwrap();
    // Closing the channel gives back what it held: the message is in its queue again.
    let mut back = None;
    for _ in 0..50 {
        back = ready(&q, &work).await;
        if back == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(back, Some(1), "the message is still with the broker");
    drop_plain(&q, &work).await;
    q.cleanup().await;
}
