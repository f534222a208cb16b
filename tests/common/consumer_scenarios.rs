//! What every broker adapter must do, written once over a [`Broker`]: a test file instantiates
//! the scenarios for its broker with `backend_tests!`, and keeps the cases of that broker alone.
//!
//! - `published_three_times_and_redelivered_after_a_crash_has_one_effect`: one message id
//!   published three times (the broker keeps every copy) and redelivered after a consumer died
//!   inside its transactional handler: one effect, two replays.
//! - `a_poison_message_is_dead_lettered_after_one_attempt_while_the_rest_flow`: a message that
//!   fails for good is dead-lettered after its first attempt; the others complete.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::stream::BoxStream;
use idem::consumer::{Consumer, Delivery, Handler, HandlerError, Message};
use idem::{BoxError, SqliteStore, Store, idempotent};

use crate::common::{self, until};

/// A broker's deliveries to one subscription.
pub type Deliveries<D> = BoxStream<'static, Result<D, BoxError>>;

/// The name of the consumer the scenarios run (the durable consumer, the consumer's scope).
pub const CONSUMER: &str = "fulfilment";

/// A message the broker dead-lettered, as its dead-letter destination holds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeadLetter {
    /// Its message id, where it has one.
    pub key: Option<String>,
    pub payload: Vec<u8>,
    /// Why it was dead-lettered, where the broker keeps a reason.
    pub reason: Option<String>,
}

/// A broker under test: the queues or streams of one test with a dead-letter destination, and
/// a consumer named [`CONSUMER`] on them.
pub trait Broker: Sized {
    /// What a subscription delivers.
    type Delivery: Delivery + Send + 'static;
    /// An open subscription, which [`Broker::crash`] ends.
    type Subscription;
    /// Whether a dead letter says why it was dead-lettered.
    const KEEPS_REASONS: bool;

    /// Queues or streams of this test, where an unacknowledged delivery is redelivered after
    /// `ack_wait` (a broker that redelivers only when the subscription ends ignores it).
    fn open(ack_wait: Duration) -> impl Future<Output = Self>;

    /// Publishes `payload` under the message id `id`, and waits until the broker has it.
    fn publish(&self, id: &str, payload: &str) -> impl Future<Output = ()>;

    /// Publishes `copies` copies of one message, each of which the broker keeps and delivers:
    /// only the consumer's record can tell them apart.
    fn publish_copies(&self, id: &str, payload: &str, copies: usize) -> impl Future<Output = ()>;

    /// A subscription of [`CONSUMER`] (`tag` names it where the broker names subscriptions).
    fn subscribe(
        &self,
        tag: &str,
    ) -> impl Future<Output = (Self::Subscription, Deliveries<Self::Delivery>)>;

    /// Ends `subscription` as a process that died does: what it had not acknowledged comes
    /// back to the consumer's next subscription.
    fn crash(&self, subscription: Self::Subscription) -> impl Future<Output = ()>;

    /// Takes the messages in the dead-letter destination.
    fn dead_letters(&self) -> impl Future<Output = Vec<DeadLetter>>;

    /// Deletes what [`Broker::open`] made.
    fn close(self) -> impl Future<Output = ()>;
}

/// Runs `consumer` with `handler` on `deliveries`, `concurrency` at a time, while `work` runs;
/// returns what `work` returned, once the runner stopped.
pub async fn running<S, D, E, St, M, H, T>(
    consumer: &Consumer<S>,
    deliveries: St,
    handler: H,
    concurrency: usize,
    work: impl Future<Output = T>,
) -> T
where
    S: Store,
    D: Delivery,
    E: std::fmt::Display,
    St: futures_util::Stream<Item = Result<D, E>>,
    H: Handler<M>,
{
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let ((), out) = tokio::join!(
        consumer.run_until(deliveries, handler, concurrency, async {
            let _ = stop_rx.await;
        }),
        async {
            let out = work.await;
            let _ = stop_tx.send(());
            out
        }
    );
    out
}

/// The dead letters, taken once the first arrived (at most 10 s), and again a moment later so
/// that one too many is seen.
pub async fn taken_dead_letters<B: Broker>(broker: &B) -> Vec<DeadLetter> {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut dead = broker.dead_letters().await;
    while dead.is_empty() && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
        dead = broker.dead_letters().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    dead.extend(broker.dead_letters().await);
    dead.sort();
    dead
}

/// A SQLite store with an empty `shipments` table of message keys, and its file.
pub async fn shipments_store() -> (SqliteStore, common::SqliteFile) {
    let file = common::SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.unwrap();
    sqlx::query("CREATE TABLE shipments (msg TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    (store, file)
}

/// The transactional handler of the crash scenario: one shipment per message; with `entered`,
/// it says so and never finishes, as a process that dies before it commits.
#[idempotent(scope = "ship:<msg.consumer>", key = msg.key, store = store, transaction = tx, skip(entered), retain = "7d")]
async fn ship(
    store: &SqliteStore,
    entered: Option<&tokio::sync::mpsc::UnboundedSender<()>>,
    msg: Message,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO shipments (msg) VALUES ($1)")
        .bind(msg.key.as_str())
        .execute(&mut **tx)
        .await
        .map_err(HandlerError::transient)?;
    if let Some(entered) = entered {
        // The crash: the shipment is written in the open transaction, and the process dies
        // before it commits (the runner's task is aborted here).
        let _ = entered.send(());
        std::future::pending::<()>().await;
    }
    Ok(())
}

pub async fn published_three_times_and_redelivered_after_a_crash_has_one_effect<B: Broker>() {
    let broker = B::open(Duration::from_secs(1)).await;
    broker.publish_copies("order-paid-ORD-1", "{}", 3).await;
    let (store, _file) = shipments_store().await;

    // The first consumer takes the message and crashes inside the handler.
    let (entered_tx, mut entered_rx) = tokio::sync::mpsc::unbounded_channel();
    let crashing = Consumer::new(CONSUMER, store.clone()).unwrap();
    let (subscription, deliveries) = broker.subscribe("crashing").await;
    let s = store.clone();
    let task = tokio::spawn(async move {
        crashing
            .run(
                deliveries,
                move |msg: Message| {
                    let (s, e) = (s.clone(), entered_tx.clone());
                    async move { ship(&s, Some(&e), msg).await }
                },
                1,
            )
            .await
    });
    tokio::time::timeout(Duration::from_secs(10), entered_rx.recv())
        .await
        .expect("the handler started")
        .unwrap();
    task.abort();
    let _ = task.await;
    broker.crash(subscription).await;

    // A second consumer gets the redeliveries.
    let consumer = Consumer::new(CONSUMER, store.clone()).unwrap();
    let (_subscription, deliveries) = broker.subscribe("survivor").await;
    let s = store.clone();
    let handler = move |msg: Message| {
        let s = s.clone();
        async move { ship(&s, None, msg).await }
    };
    let settled = running(&consumer, deliveries, handler, 1, async {
        until(Duration::from_secs(20), || consumer.stats().acked() == 3).await
    })
    .await;
    assert!(settled, "{:?}", consumer.stats());
    let stats = consumer.stats();
    assert_eq!((stats.completed, stats.replayed), (1, 2), "{stats:?}");
    assert_eq!(stats.dead_lettered, 0);
    let shipments: Vec<(String,)> = sqlx::query_as("SELECT msg FROM shipments")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(shipments, vec![("order-paid-ORD-1".to_owned(),)]);
    broker.close().await;
}

pub async fn a_poison_message_is_dead_lettered_after_one_attempt_while_the_rest_flow<B: Broker>() {
    const MESSAGES: usize = 50;
    let broker = B::open(Duration::from_secs(5)).await;
    for n in 0..MESSAGES {
        let payload = if n == 20 { "poison" } else { "{}" };
        broker.publish(&format!("m-{n}"), payload).await;
    }
    let (runs, poison_runs) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let consumer = Consumer::new(CONSUMER, idem::MemoryStore::new())
        .unwrap()
        .max_deliveries(5);
    let (r, p) = (runs.clone(), poison_runs.clone());
    let handler = consumer.guarded(move |msg: Message, _claim| {
        r.fetch_add(1, Ordering::SeqCst);
        let poison = &msg.payload[..] == b"poison";
        if poison {
            p.fetch_add(1, Ordering::SeqCst);
        }
        async move {
            if poison {
                Err(HandlerError::permanent("no such order"))
            } else {
                Ok(msg.key.to_string())
            }
        }
    });
    let (_subscription, deliveries) = broker.subscribe("worker").await;
    let settled = running(&consumer, deliveries, handler, 8, async {
        until(Duration::from_secs(20), || {
            let s = consumer.stats();
            s.completed + s.dead_lettered == MESSAGES as u64
        })
        .await
    })
    .await;
    assert!(settled, "{:?}", consumer.stats());
    let stats = consumer.stats();
    assert_eq!(
        (stats.completed, stats.dead_lettered),
        (MESSAGES as u64 - 1, 1),
        "{stats:?}"
    );
    assert_eq!((stats.retried, stats.replayed), (0, 0), "{stats:?}");
    assert_eq!(poison_runs.load(Ordering::SeqCst), 1, "one attempt");
    assert_eq!(runs.load(Ordering::SeqCst), MESSAGES);

    // The dead letter: the payload, its key, and the reason where the broker keeps one.
    let dead = taken_dead_letters(&broker).await;
    assert_eq!(
        dead,
        vec![DeadLetter {
            key: Some("m-20".to_owned()),
            payload: b"poison".to_vec(),
            reason: B::KEEPS_REASONS.then(|| "no such order".to_owned()),
        }],
        "exactly one dead letter"
    );
    broker.close().await;
}
