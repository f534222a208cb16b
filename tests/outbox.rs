//! The transactional outbox and its relay: events commit or roll back with the state change,
//! ids are deterministic, several relays publish each partition in order, a failing publish
//! blocks only its partition, `NOTIFY` wakes a PostgreSQL relay, and a relay killed between the
//! broker's confirmation and mark-sent publishes again, which JetStream's dedupe absorbs.

mod common;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::outbox::{Event, OutboxBackend, PendingEvent, Poll, Publisher, Relay, Unreachable};
use idem::outbox::{MySqlOutbox, PgOutbox, SqliteOutbox};
use idem::{BoxError, SqliteStore};

/// A broker that records what it confirmed.
#[derive(Clone, Default)]
struct Recorder {
    published: Arc<Mutex<Vec<Event>>>,
    /// While set, every publish fails: the broker is out of reach.
    down: Arc<AtomicBool>,
    /// Ids of events the broker refuses (a topic no stream captures).
    refused: Arc<Mutex<HashSet<String>>>,
}

impl Recorder {
    fn published(&self) -> Vec<Event> {
        self.published.lock().unwrap().clone()
    }

    fn ids(&self) -> Vec<String> {
        self.published().into_iter().map(|e| e.id).collect()
    }

    fn refuse(&self, id: &str) {
        self.refused.lock().unwrap().insert(id.to_owned());
    }
}

impl Publisher for Recorder {
    async fn publish(&self, event: &Event) -> Result<(), BoxError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(Box::new(Unreachable::new("connection refused")));
        }
        if self.refused.lock().unwrap().contains(&event.id) {
            return Err("no stream captures the subject".into());
        }
        // A little latency, so concurrent relays overlap.
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.published.lock().unwrap().push(event.clone());
        Ok(())
    }
}

async fn sqlite_outbox() -> (SqliteStore, SqliteOutbox, common::SqliteFile) {
    let file = common::SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.unwrap();
    let outbox = SqliteOutbox::new(store.pool().clone());
    outbox.migrate().await.unwrap();
    sqlx::query("CREATE TABLE orders (order_no TEXT PRIMARY KEY, status TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    (store, outbox, file)
}

fn event(partition: &str, n: usize) -> Event {
    Event::new(
        format!("{partition}-{n}"),
        "order.paid",
        partition,
        format!("{n}"),
    )
}

#[tokio::test]
async fn events_commit_and_roll_back_with_the_state_change() {
    let (store, outbox, _file) = sqlite_outbox().await;
    // Rolled back: neither the order nor its event.
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO orders VALUES ('ORD-1', 'PAID')")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(outbox.enqueue(&mut tx, &event("ORD-1", 0)).await.unwrap());
    tx.rollback().await.unwrap();
    assert_eq!(outbox.counts().await.unwrap().pending, 0);
    // Committed: both; the same id again enqueues nothing.
    for expected in [true, false] {
        let mut tx = store.pool().begin().await.unwrap();
        sqlx::query("INSERT OR IGNORE INTO orders VALUES ('ORD-1', 'PAID')")
            .execute(&mut *tx)
            .await
            .unwrap();
        assert_eq!(
            outbox.enqueue(&mut tx, &event("ORD-1", 0)).await.unwrap(),
            expected
        );
        tx.commit().await.unwrap();
    }
    let pending = outbox.pending(10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].event, event("ORD-1", 0));

    let broker = Recorder::default();
    let relay = Relay::new(outbox.clone(), broker.clone());
    assert_eq!(relay.run_once().await.unwrap(), 1);
    assert_eq!(relay.run_once().await.unwrap(), 0);
    assert_eq!(broker.published(), vec![event("ORD-1", 0)]);
    let counts = outbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.sent), (0, 1));
    // Retention: nothing is young enough to keep at zero.
    assert_eq!(
        outbox.purge_sent(Duration::from_secs(3600)).await.unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(outbox.purge_sent(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(outbox.counts().await.unwrap().sent, 0);
}

#[tokio::test]
async fn an_event_no_broker_can_take_is_refused_at_enqueue_and_nothing_is_written() {
    let (store, outbox, _file) = sqlite_outbox().await;
    let mut tx = store.pool().begin().await.unwrap();
    for bad in [
        Event::new(
            "evt-1\r\nNats-Expected-Stream: x",
            "order.paid",
            "ORD-1",
            "{}",
        ),
        Event::new("", "order.paid", "ORD-1", "{}"),
        Event::new("evt-2", "order paid", "ORD-1", "{}"),
        Event::new("evt-3", "x".repeat(300), "ORD-1", "{}"),
        Event::new("evt-4", "order.paid", "ORD\n1", "{}"),
    ] {
        match outbox.enqueue(&mut tx, &bad).await {
            Err(idem::Error::Config(msg)) => {
                assert!(msg.contains("cannot be published"), "{msg}")
            }
            other => panic!("{bad:?} was not refused: {other:?}"),
        }
    }
    assert!(outbox.enqueue(&mut tx, &event("ORD-1", 0)).await.unwrap());
    tx.commit().await.unwrap();
    let pending = outbox.pending(10).await.unwrap();
    assert_eq!(pending.len(), 1, "only the valid event: {pending:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn the_jetstream_publisher_refuses_a_line_break_in_an_event_id_instead_of_panicking() {
    use idem::consumer::nats::JetStreamPublisher;
    let streams = common::JsStreams::new(&common::nats_url()).await;
    let (mut stream, root) = streams.stream("invalid", Duration::from_secs(120)).await;
    let publisher = JetStreamPublisher::new(streams.js.clone());
    let subject = format!("{root}.order.paid");
    // An id that would smuggle a header into the message, and a partition key with a line
    // break: errors, and nothing reaches the stream.
    for bad in [
        Event::new(
            "evt-1\r\nNats-Expected-Stream: other",
            subject.as_str(),
            "ORD-1",
            "{}",
        ),
        Event::new("evt-2", subject.as_str(), "ORD\r\n2", "{}"),
    ] {
        let err = publisher.publish(&bad).await.unwrap_err();
        assert!(err.to_string().contains("cannot be published"), "{err}");
    }
    assert_eq!(stream.info().await.unwrap().state.messages, 0);
    publisher
        .publish(&Event::new("evt-3", subject.as_str(), "ORD-3", "{}"))
        .await
        .unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 1);
}

#[tokio::test]
async fn a_failing_publish_blocks_only_its_partition_and_keeps_its_order() {
    let (store, outbox, _file) = sqlite_outbox().await;
    let mut tx = store.pool().begin().await.unwrap();
    for n in 0..3 {
        outbox.enqueue(&mut tx, &event("A", n)).await.unwrap();
    }
    tx.commit().await.unwrap();
    let broker = Recorder::default();
    broker.down.store(true, Ordering::SeqCst);
    let relay = Relay::new(outbox.clone(), broker.clone());
    assert_eq!(relay.run_once().await.unwrap(), 0);
    let pending = outbox.pending(10).await.unwrap();
    assert_eq!(pending.len(), 3);
    assert_eq!(pending[0].attempts, 1);
    assert_eq!(
        pending[0].last_error.as_deref(),
        Some("the broker is out of reach: connection refused")
    );
    // Its backoff holds A's head back; an event of another partition goes meanwhile.
    let mut tx = store.pool().begin().await.unwrap();
    outbox.enqueue(&mut tx, &event("B", 0)).await.unwrap();
    tx.commit().await.unwrap();
    broker.down.store(false, Ordering::SeqCst);
    assert_eq!(relay.run_once().await.unwrap(), 1);
    assert_eq!(broker.published(), vec![event("B", 0)]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    while relay.run_once().await.unwrap() > 0 {}
    let order: Vec<String> = broker.published().into_iter().map(|e| e.id).collect();
    assert_eq!(order, ["B-0", "A-0", "A-1", "A-2"]);
}

/// Enqueues `per` events in each of `partitions` partitions, each partition's in order, one
/// transaction per event, all partitions at once; runs `relays` relays until all are sent.
/// Every event is published once, and each partition in its order.
async fn relays_publish_each_partition_in_order<O: Operate>(outbox: O, relays: usize) {
    const PARTITIONS: usize = 12;
    const PER: usize = 25;
    let broker = Recorder::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut running = Vec::new();
    for _ in 0..relays {
        let relay = Relay::new(outbox.clone(), broker.clone())
            .batch(8)
            .poll(Duration::from_millis(20));
        let mut stop = stop_rx.clone();
        running.push(tokio::spawn(async move {
            relay
                .run_until(Poll, async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        }));
    }
    let mut producers = Vec::new();
    for p in 0..PARTITIONS {
        let tasks: Vec<_> = (0..PER).map(|n| event(&format!("P{p}"), n)).collect();
        let outbox = &outbox;
        producers.push(async move {
            for e in tasks {
                // One transaction per event, each on a task of its own.
                let outbox = outbox.clone();
                tokio::spawn(async move { outbox.enqueue_alone(&e, true).await })
                    .await
                    .unwrap();
            }
        });
    }
    futures_util::future::join_all(producers).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while outbox.counts().await.unwrap().pending > 0 {
        assert!(tokio::time::Instant::now() < deadline, "relays stalled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_tx.send(true).unwrap();
    for r in running {
        r.await.unwrap();
    }
    let published = broker.published();
    assert_eq!(published.len(), PARTITIONS * PER, "each event once");
    let mut seen: HashMap<String, Vec<usize>> = HashMap::new();
    for e in published {
        seen.entry(e.partition_key.clone())
            .or_default()
            .push(std::str::from_utf8(&e.payload).unwrap().parse().unwrap());
    }
    assert_eq!(seen.len(), PARTITIONS);
    for (p, order) in seen {
        assert_eq!(order, (0..PER).collect::<Vec<_>>(), "partition {p}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_sqlite_relays_publish_each_partition_once_in_order() {
    let (_store, outbox, _file) = sqlite_outbox().await;
    relays_publish_each_partition_in_order(outbox, 3).await;
}

async fn pg_outbox() -> (PgOutbox, common::PgSchema) {
    let schema = common::PgSchema::create(&common::pg_url(), 16).await;
    let outbox = PgOutbox::new(schema.pool.clone());
    outbox.migrate().await.unwrap();
    // Migrating again, from several instances at once, is harmless.
    let again = futures_util::future::join_all((0..3).map(|_| outbox.migrate())).await;
    assert!(again.iter().all(Result::is_ok), "{again:?}");
    (outbox, schema)
}

/// A MySQL outbox in a database of its own, on a pool whose connections keep the server's
/// default isolation (`REPEATABLE READ`): the outbox must not depend on the store's pool.
async fn my_outbox() -> (MySqlOutbox, common::MyDatabase) {
    let db = common::MyDatabase::create(&common::mysql_url(), 16).await;
    let outbox = MySqlOutbox::new(db.pool.clone());
    outbox.migrate().await.unwrap();
    // Migrating again, from several instances at once, is harmless.
    let again = futures_util::future::join_all((0..3).map(|_| outbox.migrate())).await;
    assert!(again.iter().all(Result::is_ok), "{again:?}");
    (outbox, db)
}

/// A test `$name` that runs the generic test `$body` on a new outbox of one database.
macro_rules! outbox_test {
    (sqlite, $name:ident, $body:ident) => {
        #[tokio::test]
        async fn $name() {
            let (_store, outbox, _file) = sqlite_outbox().await;
            $body(outbox).await;
        }
    };
    (postgres, $name:ident, $body:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[cfg_attr(
            not(idem_postgres),
            ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
        )]
        async fn $name() {
            let (outbox, _schema) = pg_outbox().await;
            $body(outbox).await;
        }
    };
    (mysql, $name:ident, $body:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[cfg_attr(
            not(idem_mysql),
            ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
        )]
        async fn $name() {
            let (outbox, _db) = my_outbox().await;
            $body(outbox).await;
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn several_mysql_relays_publish_each_partition_once_in_order() {
    let (outbox, _db) = my_outbox().await;
    relays_publish_each_partition_in_order(outbox, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn several_postgres_relays_publish_each_partition_once_in_order() {
    let (outbox, _schema) = pg_outbox().await;
    relays_publish_each_partition_in_order(outbox, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn notify_wakes_a_postgres_relay_long_before_its_poll() {
    let (outbox, _schema) = pg_outbox().await;
    let broker = Recorder::default();
    let relay = Relay::new(outbox.clone(), broker.clone()).poll(Duration::from_secs(60));
    let listener = outbox.listener().await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run_until(listener, async {
                let _ = stop_rx.await;
            })
            .await
    });
    // Let the relay's first round find nothing and go to sleep on its listener.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = tokio::time::Instant::now();
    let mut tx = outbox.pool().begin().await.unwrap();
    outbox.enqueue(&mut tx, &event("N", 0)).await.unwrap();
    // Not before the commit.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(broker.published().is_empty());
    tx.commit().await.unwrap();
    while broker.published().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not woken by NOTIFY"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_tx.send(()).unwrap();
    running.await.unwrap();
    assert_eq!(broker.published(), vec![event("N", 0)]);
}

/// A publisher that confirms the first event with the broker and then never returns: a relay
/// killed between the broker's confirmation and mark-sent.
struct DiesAfterPublishing<P> {
    inner: P,
    died: Arc<tokio::sync::Notify>,
}

impl<P: Publisher> Publisher for DiesAfterPublishing<P> {
    async fn publish(&self, event: &Event) -> Result<(), BoxError> {
        self.inner.publish(event).await?;
        self.died.notify_one();
        std::future::pending().await
    }
}

/// A relay killed between JetStream's confirmation and mark-sent: after its lease, another
/// relay publishes the event again and marks it sent, and the stream holds one message.
async fn a_relay_killed_after_the_broker_confirmed_publishes_again_and_jetstream_drops_the_copy<
    O: Operate,
>(
    outbox: O,
) {
    use idem::consumer::nats::JetStreamPublisher;
    let streams = common::JsStreams::new(&common::nats_url()).await;
    let (mut stream, root) = streams.stream("events", Duration::from_secs(120)).await;
    outbox
        .add(&[Event::new(
            "evt-ORD-9-paid",
            format!("{root}.order.paid"),
            "ORD-9",
            "{}",
        )])
        .await;
    let publisher = JetStreamPublisher::new(streams.js.clone());
    relay_dies_after_publishing_and_another_publishes_again(&outbox, publisher).await;
    // Two publishes of one id; the stream holds one message.
    assert_eq!(stream.info().await.unwrap().state.messages, 1);
}

/// Runs a relay on `outbox`'s one event that dies once `publisher` confirmed it, then another
/// after the first one's lease: it publishes the event again and marks it sent.
async fn relay_dies_after_publishing_and_another_publishes_again<O, P>(outbox: &O, publisher: P)
where
    O: Operate,
    P: Publisher + Clone + 'static,
{
    let died = Arc::new(tokio::sync::Notify::new());
    let dying = Relay::new(
        outbox.clone(),
        DiesAfterPublishing {
            inner: publisher.clone(),
            died: died.clone(),
        },
    )
    .lease(Duration::from_millis(500));
    let task = tokio::spawn(async move { dying.run_once().await });
    died.notified().await;
    task.abort();
    let _ = task.await;
    assert_eq!(outbox.counts().await.unwrap().pending, 1, "not marked sent");

    // After the lease, another relay publishes it again and marks it sent.
    let relay = Relay::new(outbox.clone(), publisher).lease(Duration::from_millis(500));
    assert_eq!(relay.run_once().await.unwrap(), 0, "still leased");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(relay.run_once().await.unwrap(), 1);
    let counts = outbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.sent), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn a_sqlite_relay_killed_after_the_broker_confirmed_publishes_again_and_jetstream_drops_the_copy()
 {
    let (_store, outbox, _file) = sqlite_outbox().await;
    a_relay_killed_after_the_broker_confirmed_publishes_again_and_jetstream_drops_the_copy(outbox)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    any(not(idem_nats), not(idem_mysql)),
    ignore = "needs NATS and MySQL: set NATS_URL=nats://… and IDEM_MYSQL_URL=mysql://…"
)]
async fn a_mysql_relay_killed_after_the_broker_confirmed_publishes_again_and_jetstream_drops_the_copy()
 {
    let (outbox, _db) = my_outbox().await;
    a_relay_killed_after_the_broker_confirmed_publishes_again_and_jetstream_drops_the_copy(outbox)
        .await;
}

/// The same without a broker's dedupe: the event is published twice under one id, which a
/// guarded consumer replays.
async fn a_killed_relays_event_is_published_again_after_its_lease<O: Operate>(outbox: O) {
    outbox.add(&[event("K", 0)]).await;
    let broker = Recorder::default();
    relay_dies_after_publishing_and_another_publishes_again(&outbox, broker.clone()).await;
    assert_eq!(broker.ids(), ["K-0", "K-0"]);
}

outbox_test!(
    sqlite,
    a_killed_sqlite_relays_event_is_published_again_after_its_lease,
    a_killed_relays_event_is_published_again_after_its_lease
);

outbox_test!(
    mysql,
    a_killed_mysql_relays_event_is_published_again_after_its_lease,
    a_killed_relays_event_is_published_again_after_its_lease
);

/// The refund of `ORD-2` by `$refund` (a transactional `#[idempotent]` function on `$store`
/// that enqueues an event on `$outbox`): an error rolls the transition and its event back
/// together; success enqueues once, and the retry replays and enqueues nothing.
macro_rules! refunds_enqueue_once_and_roll_back_with_their_error {
    ($refund:ident, $store:ident, $outbox:ident) => {
        assert!(
            $refund(&$store, &$outbox, "ORD-2", "k-1", true)
                .await
                .is_err()
        );
        assert_eq!($outbox.counts().await.unwrap().pending, 0);
        let status: String = sqlx::query_scalar("SELECT status FROM orders")
            .fetch_one($store.pool())
            .await
            .unwrap();
        assert_eq!(status, "PAID");
        let id = $refund(&$store, &$outbox, "ORD-2", "k-1", false)
            .await
            .unwrap();
        assert_eq!(
            $refund(&$store, &$outbox, "ORD-2", "k-1", false)
                .await
                .unwrap(),
            id
        );
        let pending = $outbox.pending(10).await.unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].event.id, id);
        assert_eq!(
            id,
            idem::outbox::event_id("refund:ORD-2", "k-1", "refunded")
        );
    };
}

/// `$name`: a transactional refund on `$store` that moves `orders` to `REFUNDED` and enqueues
/// its event on `$outbox`, or fails after both when asked to.
macro_rules! refund {
    ($name:ident, $store:ty, $outbox:ty) => {
        #[idem::idempotent(scope = "refund:<order_no>", key = key, store = store, skip(outbox), transaction = tx, claim = claim)]
        async fn $name(
            store: &$store,
            outbox: &$outbox,
            order_no: &str,
            key: &str,
            fail: bool,
        ) -> Result<String, idem::Error> {
            // `?` is a placeholder to SQLite and MySQL alike.
            sqlx::query("UPDATE orders SET status = 'REFUNDED' WHERE order_no = ?")
                .bind(order_no)
                .execute(&mut **tx)
                .await
                .map_err(|e| idem::Error::Store(e.into()))?;
            let event = Event::for_claim(&claim, "refunded", "order.refunded", order_no, "{}");
            outbox.enqueue(tx, &event).await?;
            if fail {
                return Err(idem::Error::Config("the gateway said no".into()));
            }
            Ok(event.id)
        }
    };
}

refund!(refund, SqliteStore, SqliteOutbox);
refund!(refund_on_mysql, idem::MySqlStore, MySqlOutbox);

#[tokio::test]
async fn a_transactional_idempotent_body_enqueues_once_and_rolls_back_with_its_error() {
    let (store, outbox, _file) = sqlite_outbox().await;
    sqlx::query("INSERT INTO orders VALUES ('ORD-2', 'PAID')")
        .execute(store.pool())
        .await
        .unwrap();
    refunds_enqueue_once_and_roll_back_with_their_error!(refund, store, outbox);
}

// ---- parking ----------------------------------------------------------------------------------

/// What an operator and a test do with an outbox, on either backend.
trait Operate: OutboxBackend + Clone + 'static {
    async fn add(&self, events: &[Event]);
    async fn parked(&self) -> Vec<PendingEvent>;
    async fn pending(&self) -> Vec<PendingEvent>;
    async fn unpark(&self, seq: i64) -> bool;
    async fn unpark_all(&self) -> u64;
    async fn hold(&self, seq: i64, reason: &str) -> bool;
    async fn sent(&self) -> Vec<PendingEvent>;
    async fn upgrade(&self);
    /// Rewrites an event's id behind the outbox's back: a row written before ids were checked.
    async fn corrupt_id(&self, id: &str, to: &str);
    /// Enqueues `event` in a transaction of its own, committed or rolled back.
    fn enqueue_alone(&self, event: &Event, commit: bool) -> impl Future<Output = bool> + Send;
    /// Marks every waiting event sent when it was enqueued, behind the outbox's back.
    async fn sent_when_enqueued(&self);
}

/// `$p1` and `$p2` are the database's first two placeholders.
macro_rules! operate {
    ($outbox:ty, $p1:literal, $p2:literal) => {
        impl Operate for $outbox {
            async fn add(&self, events: &[Event]) {
                let mut tx = self.pool().begin().await.unwrap();
                for e in events {
                    assert!(self.enqueue(&mut tx, e).await.unwrap());
                }
                tx.commit().await.unwrap();
            }
            async fn parked(&self) -> Vec<PendingEvent> {
                <$outbox>::parked(self, 100).await.unwrap()
            }
            async fn pending(&self) -> Vec<PendingEvent> {
                <$outbox>::pending(self, 100).await.unwrap()
            }
            async fn unpark(&self, seq: i64) -> bool {
                <$outbox>::unpark(self, seq).await.unwrap()
            }
            async fn unpark_all(&self) -> u64 {
                <$outbox>::unpark_all(self).await.unwrap()
            }
            async fn hold(&self, seq: i64, reason: &str) -> bool {
                <$outbox>::hold(self, seq, reason).await.unwrap()
            }
            async fn sent(&self) -> Vec<PendingEvent> {
                <$outbox>::sent(self, 100).await.unwrap()
            }
            async fn upgrade(&self) {
                self.migrate().await.unwrap()
            }
            async fn corrupt_id(&self, id: &str, to: &str) {
                let sql = format!(
                    "UPDATE {} SET id = {} WHERE id = {}",
                    self.table(),
                    $p1,
                    $p2
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(to)
                    .bind(id)
                    .execute(self.pool())
                    .await
                    .unwrap();
            }
            fn enqueue_alone(
                &self,
                event: &Event,
                commit: bool,
            ) -> impl Future<Output = bool> + Send {
                async move {
                    let mut tx = self.pool().begin().await.unwrap();
                    let enqueued = self.enqueue(&mut tx, event).await.unwrap();
                    match commit {
                        true => tx.commit().await.unwrap(),
                        false => tx.rollback().await.unwrap(),
                    }
                    enqueued
                }
            }
            async fn sent_when_enqueued(&self) {
                let sql = format!(
                    "UPDATE {} SET sent_at = created_at WHERE sent_at IS NULL",
                    self.table()
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .execute(self.pool())
                    .await
                    .unwrap();
            }
        }
    };
}

operate!(SqliteOutbox, "$1", "$2");
operate!(PgOutbox, "$1", "$2");
operate!(MySqlOutbox, "?", "?");

/// Runs rounds of `relay` until `done`, at most 20 s.
async fn rounds_until<O: Operate, P: Publisher>(
    relay: &Relay<O, P>,
    mut done: impl AsyncFnMut() -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "rounds never got there"
        );
        relay.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The broker refuses `A-0` three times: it is parked, logged and counted, and `A`'s later
/// events go; sent back by an operator once the cause is fixed, it is published.
async fn a_refused_event_is_parked_and_its_partition_goes_on<O: Operate>(outbox: O) {
    outbox
        .add(&[event("A", 0), event("A", 1), event("B", 0), event("A", 2)])
        .await;
    let broker = Recorder::default();
    broker.refuse("A-0");
    let relay = Relay::new(outbox.clone(), broker.clone()).park_after(3);
    rounds_until(&relay, async || outbox.counts().await.unwrap().parked == 1).await;
    while relay.run_once().await.unwrap() > 0 {}
    assert_eq!(broker.ids(), ["B-0", "A-1", "A-2"]);
    let counts = outbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.parked, counts.sent), (0, 1, 3));
    let parked = outbox.parked().await;
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].event, event("A", 0));
    assert_eq!((parked[0].failures, parked[0].attempts), (3, 3));
    assert_eq!(
        parked[0].last_error.as_deref(),
        Some("no stream captures the subject")
    );
    assert!(
        outbox.pending().await.is_empty(),
        "a parked event is not pending"
    );

    // The cause fixed, an operator sends it back: published next, once.
    broker.refused.lock().unwrap().clear();
    assert!(outbox.unpark(parked[0].seq).await);
    assert!(!outbox.unpark(parked[0].seq).await, "no longer parked");
    assert_eq!(relay.run_once().await.unwrap(), 1);
    assert_eq!(broker.ids(), ["B-0", "A-1", "A-2", "A-0"]);
    let counts = outbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.parked, counts.sent), (0, 0, 4));
}

/// An operator parks a waiting event: the relays leave it, its partition goes on, the sent
/// events are listed newest first; sent back, it is published. Only a waiting event can be
/// parked so.
async fn an_operator_parks_an_event_and_sends_it_back<O: Operate>(outbox: O) {
    outbox
        .add(&[event("A", 0), event("A", 1), event("B", 0)])
        .await;
    let pending = outbox.pending().await;
    assert_eq!(pending.len(), 3);
    assert!(
        pending.iter().all(|p| p.age < Duration::from_secs(60)),
        "{pending:?}"
    );
    let a0 = pending[0].seq;
    assert!(outbox.hold(a0, "held for the audit").await);
    assert!(!outbox.hold(a0, "again").await, "already parked");
    let parked = outbox.parked().await;
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].event, event("A", 0));
    assert_eq!(parked[0].last_error.as_deref(), Some("held for the audit"));
    assert_eq!(parked[0].failures, 0, "an operator's park is no refusal");

    let broker = Recorder::default();
    let relay = Relay::new(outbox.clone(), broker.clone());
    while relay.run_once().await.unwrap() > 0 {}
    assert_eq!(broker.ids(), ["A-1", "B-0"]);
    let sent: Vec<String> = outbox
        .sent()
        .await
        .into_iter()
        .map(|p| p.event.id)
        .collect();
    assert_eq!(sent, ["B-0", "A-1"], "newest first");
    let b0 = outbox.sent().await[0].seq;
    assert!(
        !outbox.hold(b0, "too late").await,
        "a sent event is not parked"
    );
    assert!(!outbox.hold(9_999, "no such").await);

    assert!(outbox.unpark(a0).await);
    assert_eq!(relay.run_once().await.unwrap(), 1);
    assert_eq!(broker.ids(), ["A-1", "B-0", "A-0"]);
    let counts = outbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.parked, counts.sent), (0, 0, 3));
}

outbox_test!(
    sqlite,
    on_sqlite_an_operator_parks_an_event_and_sends_it_back,
    an_operator_parks_an_event_and_sends_it_back
);

outbox_test!(
    postgres,
    on_postgres_an_operator_parks_an_event_and_sends_it_back,
    an_operator_parks_an_event_and_sends_it_back
);

/// Counts every counter by name.
#[derive(Default, Clone)]
struct Counted(Arc<Mutex<HashMap<String, u64>>>);

struct CountedFn(String, Counted);

impl metrics::CounterFn for CountedFn {
    fn increment(&self, value: u64) {
        *self.1.0.lock().unwrap().entry(self.0.clone()).or_default() += value;
    }
    fn absolute(&self, _: u64) {}
}

impl metrics::Recorder for Counted {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(Arc::new(CountedFn(key.name().to_owned(), self.clone())))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

outbox_test!(
    mysql,
    on_mysql_an_operator_parks_an_event_and_sends_it_back,
    an_operator_parks_an_event_and_sends_it_back
);

#[tokio::test]
async fn a_refused_sqlite_event_is_parked_counted_and_its_partition_goes_on() {
    // The runtime is on this thread: the local recorder sees the relay's counter.
    let counted = Counted::default();
    let _recording = metrics::set_default_local_recorder(&counted);
    let (_store, outbox, _file) = sqlite_outbox().await;
    a_refused_event_is_parked_and_its_partition_goes_on(outbox).await;
    assert_eq!(
        counted.0.lock().unwrap().get("idem_outbox_parked_total"),
        Some(&1)
    );
}

outbox_test!(
    postgres,
    a_refused_postgres_event_is_parked_and_its_partition_goes_on,
    a_refused_event_is_parked_and_its_partition_goes_on
);

outbox_test!(
    mysql,
    a_refused_mysql_event_is_parked_and_its_partition_goes_on,
    a_refused_event_is_parked_and_its_partition_goes_on
);

/// A broker out of reach never parks anything, however long it lasts; and an event no broker
/// can take is parked at its first claim, without a publish.
async fn only_refusals_park<O: Operate>(outbox: O) {
    outbox
        .add(&[event("A", 0), event("C", 0), event("C", 1)])
        .await;
    outbox
        .corrupt_id("C-0", "C-0\r\nNats-Expected-Stream: x")
        .await;
    let broker = Recorder::default();
    broker.down.store(true, Ordering::SeqCst);
    let relay = Relay::new(outbox.clone(), broker.clone()).park_after(1);
    // Three attempts, each a refusal under `park_after(1)` if it counted.
    rounds_until(&relay, async || {
        let pending = outbox.pending().await;
        pending
            .iter()
            .any(|p| p.event.id == "A-0" && p.attempts >= 3)
    })
    .await;
    let parked = outbox.parked().await;
    assert_eq!(parked.len(), 1, "only the invalid one: {parked:?}");
    assert!(
        parked[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("not a valid idempotency key")),
        "{parked:?}"
    );
    let pending = outbox.pending().await;
    let a = pending.iter().find(|p| p.event.id == "A-0").unwrap();
    assert_eq!(a.failures, 0, "{a:?}");
    assert!(a.attempts >= 3, "{a:?}");
    assert!(broker.published().is_empty());
    broker.down.store(false, Ordering::SeqCst);
    rounds_until(&relay, async || outbox.counts().await.unwrap().pending == 0).await;
    let mut ids = broker.ids();
    ids.sort();
    assert_eq!(ids, ["A-0", "C-1"]);
    // Sent back, it is parked again at once: it still cannot be published.
    assert_eq!(outbox.unpark_all().await, 1);
    relay.run_once().await.unwrap();
    assert_eq!(outbox.counts().await.unwrap().parked, 1);
}

outbox_test!(sqlite, on_sqlite_only_refusals_park, only_refusals_park);

outbox_test!(postgres, on_postgres_only_refusals_park, only_refusals_park);

outbox_test!(mysql, on_mysql_only_refusals_park, only_refusals_park);

/// Events enqueued in an outbox table of the first version (no parking columns): migrating
/// adds them, and the events are published or parked as any other.
async fn an_outbox_table_of_the_first_version_is_brought_up_to_date<O: Operate>(outbox: O) {
    outbox.add(&[event("A", 0), event("B", 0)]).await;
    for _ in 0..2 {
        outbox.upgrade().await;
    }
    let broker = Recorder::default();
    broker.refuse("A-0");
    let relay = Relay::new(outbox.clone(), broker.clone()).park_after(1);
    assert_eq!(relay.run_once().await.unwrap(), 1);
    assert_eq!(broker.ids(), ["B-0"]);
    let counts = outbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.parked, counts.sent), (0, 1, 1));
}

const FIRST_SQLITE_OUTBOX: &str = "CREATE TABLE idem_outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, \
     id TEXT NOT NULL UNIQUE, topic TEXT NOT NULL, partition_key TEXT NOT NULL, \
     payload BLOB NOT NULL, created_at INTEGER NOT NULL, sent_at INTEGER, lease_until INTEGER, \
     lease_owner TEXT, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT)";

const FIRST_POSTGRES_OUTBOX: &str = "CREATE TABLE idem_outbox (\
     seq bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, id text NOT NULL UNIQUE, \
     topic text NOT NULL, partition_key text NOT NULL, payload bytea NOT NULL, \
     created_at timestamptz NOT NULL, sent_at timestamptz, lease_until timestamptz, \
     lease_owner text, attempts integer NOT NULL DEFAULT 0, last_error text)";

#[tokio::test]
async fn a_sqlite_outbox_table_of_the_first_version_is_brought_up_to_date() {
    let file = common::SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.unwrap();
    sqlx::query(FIRST_SQLITE_OUTBOX)
        .execute(store.pool())
        .await
        .unwrap();
    let outbox = SqliteOutbox::new(store.pool().clone());
    an_outbox_table_of_the_first_version_is_brought_up_to_date(outbox).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn a_postgres_outbox_table_of_the_first_version_is_brought_up_to_date() {
    let schema = common::PgSchema::create(&common::pg_url(), 4).await;
    sqlx::query(FIRST_POSTGRES_OUTBOX)
        .execute(&schema.pool)
        .await
        .unwrap();
    let outbox = PgOutbox::new(schema.pool.clone());
    an_outbox_table_of_the_first_version_is_brought_up_to_date(outbox).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn an_event_for_a_subject_no_stream_captures_is_parked_and_its_partition_goes_on() {
    use idem::consumer::nats::JetStreamPublisher;
    let (_store, outbox, _file) = sqlite_outbox().await;
    let streams = common::JsStreams::new(&common::nats_url()).await;
    let (mut stream, root) = streams.stream("events", Duration::from_secs(120)).await;
    let nowhere = format!("{}.nowhere.order.paid", streams.prefix);
    outbox
        .add(&[
            Event::new("evt-lost", nowhere.as_str(), "ORD-1", "{}"),
            Event::new("evt-next", format!("{root}.order.paid"), "ORD-1", "{}"),
        ])
        .await;
    let relay =
        Relay::new(outbox.clone(), JetStreamPublisher::new(streams.js.clone())).park_after(2);
    rounds_until(&relay, async || outbox.counts().await.unwrap().sent == 1).await;
    let parked = Operate::parked(&outbox).await;
    assert_eq!(parked.len(), 1);
    assert_eq!(
        (parked[0].event.id.as_str(), parked[0].failures),
        ("evt-lost", 2)
    );
    assert_eq!(stream.info().await.unwrap().state.messages, 1, "evt-next");
}

/// An outbox whose `mark_sent` says "unavailable" (a deadlock, a lock wait that ran out) its
/// first `failing` times.
#[derive(Clone)]
struct ContendedMarks<O> {
    inner: O,
    failing: Arc<std::sync::atomic::AtomicU32>,
}

impl<O: OutboxBackend> OutboxBackend for ContendedMarks<O> {
    fn claim(
        &self,
        owner: &str,
        lease: Duration,
        limit: u32,
    ) -> impl Future<Output = idem::Result<Vec<idem::outbox::ClaimedEvent>>> + Send {
        self.inner.claim(owner, lease, limit)
    }
    async fn mark_sent(&self, seq: i64) -> idem::Result<()> {
        let left = self.failing.load(Ordering::SeqCst);
        if left > 0 {
            self.failing.store(left - 1, Ordering::SeqCst);
            return Err(idem::Error::Unavailable(
                "Deadlock found when trying to get lock".into(),
            ));
        }
        self.inner.mark_sent(seq).await
    }
    fn retry_later(
        &self,
        seq: i64,
        delay: Duration,
        error: &str,
        refused: bool,
    ) -> impl Future<Output = idem::Result<()>> + Send {
        self.inner.retry_later(seq, delay, error, refused)
    }
    fn park(&self, seq: i64, error: &str) -> impl Future<Output = idem::Result<()>> + Send {
        self.inner.park(seq, error)
    }
    fn counts(&self) -> impl Future<Output = idem::Result<idem::outbox::OutboxCounts>> + Send {
        self.inner.counts()
    }
    fn purge_sent(&self, older_than: Duration) -> impl Future<Output = idem::Result<u64>> + Send {
        self.inner.purge_sent(older_than)
    }
}

/// Marking a published event sent meets contention a few times: the relay tries again and
/// marks it, so that it is not published a second time after its lease. Contention that
/// does not pass leaves it to be published again, never lost.
#[tokio::test]
async fn a_relay_marks_an_event_sent_through_passing_contention() {
    let (_store, outbox, _file) = sqlite_outbox().await;
    Operate::add(&outbox, &[event("M", 0), event("M", 1)]).await;
    let contended = ContendedMarks {
        inner: outbox.clone(),
        failing: Arc::new(3.into()),
    };
    let broker = Recorder::default();
    let relay = Relay::new(contended.clone(), broker.clone()).lease(Duration::from_millis(300));
    assert_eq!(relay.run_once().await.unwrap(), 1);
    assert_eq!(broker.ids(), ["M-0"]);
    assert_eq!(outbox.counts().await.unwrap().sent, 1);

    contended.failing.store(u32::MAX, Ordering::SeqCst);
    assert_eq!(relay.run_once().await.unwrap(), 0);
    assert_eq!(outbox.counts().await.unwrap().pending, 1, "not marked");
    contended.failing.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(relay.run_once().await.unwrap(), 1);
    assert_eq!(broker.ids(), ["M-0", "M-1", "M-1"]);
    assert_eq!(outbox.counts().await.unwrap().sent, 2);
}

// ---- every database ---------------------------------------------------------------------------

/// An event commits or rolls back with its transaction, a known id is not enqueued again, the
/// relay publishes it once, and it is purged after its retention.
async fn an_event_is_kept_with_its_transaction_published_once_and_purged<O: Operate>(outbox: O) {
    assert!(outbox.enqueue_alone(&event("T", 0), false).await);
    assert_eq!(outbox.counts().await.unwrap().pending, 0, "rolled back");
    assert!(outbox.enqueue_alone(&event("T", 0), true).await);
    assert!(
        !outbox.enqueue_alone(&event("T", 0), true).await,
        "known id"
    );
    let pending = outbox.pending().await;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].event, event("T", 0));
    assert_eq!((pending[0].attempts, pending[0].failures), (0, 0));
    assert_eq!(pending[0].last_error, None);

    let broker = Recorder::default();
    let relay = Relay::new(outbox.clone(), broker.clone());
    assert_eq!(relay.run_once().await.unwrap(), 1);
    assert_eq!(relay.run_once().await.unwrap(), 0);
    assert_eq!(broker.published(), vec![event("T", 0)]);
    let sent = outbox.sent().await;
    assert_eq!((sent.len(), sent[0].attempts), (1, 1));
    assert_eq!(
        outbox.purge_sent(Duration::from_secs(3600)).await.unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(outbox.purge_sent(Duration::ZERO).await.unwrap(), 1);
    let counts = outbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.parked, counts.sent), (0, 0, 0));
}

outbox_test!(
    postgres,
    a_postgres_event_is_kept_with_its_transaction_published_once_and_purged,
    an_event_is_kept_with_its_transaction_published_once_and_purged
);

outbox_test!(
    mysql,
    a_mysql_event_is_kept_with_its_transaction_published_once_and_purged,
    an_event_is_kept_with_its_transaction_published_once_and_purged
);

/// More sent events than one purge statement deletes: the purge goes on batch after batch
/// until none is left, and keeps every event still waiting.
async fn sent_events_are_purged_batch_after_batch_and_waiting_ones_kept<O: Operate>(outbox: O) {
    const SENT: usize = 2_500;
    let events: Vec<Event> = (0..SENT)
        .map(|n| event(&format!("S{}", n % 50), n))
        .collect();
    outbox.add(&events).await;
    outbox.sent_when_enqueued().await;
    outbox.add(&[event("W", 0), event("W", 1)]).await;
    assert_eq!(
        outbox.purge_sent(Duration::from_secs(3600)).await.unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        outbox.purge_sent(Duration::ZERO).await.unwrap(),
        SENT as u64
    );
    let counts = outbox.counts().await.unwrap();
    assert_eq!((counts.pending, counts.parked, counts.sent), (2, 0, 0));
}

outbox_test!(
    sqlite,
    sent_sqlite_events_are_purged_batch_after_batch_and_waiting_ones_kept,
    sent_events_are_purged_batch_after_batch_and_waiting_ones_kept
);

outbox_test!(
    mysql,
    sent_mysql_events_are_purged_batch_after_batch_and_waiting_ones_kept,
    sent_events_are_purged_batch_after_batch_and_waiting_ones_kept
);

/// Two transactions that each enqueued an event, then enqueue the other's: InnoDB finds the
/// deadlock and rolls one back. Its enqueue is `Unavailable` (retry the transaction), never an
/// event lost or kept twice: the other commits both events, and the retry enqueues nothing
/// new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn a_deadlocked_mysql_enqueue_is_unavailable_and_its_retry_enqueues_nothing_twice() {
    let (outbox, _db) = my_outbox().await;
    let (x, y) = (event("X", 0), event("Y", 0));
    let mut first = outbox.pool().begin().await.unwrap();
    let mut second = outbox.pool().begin().await.unwrap();
    assert!(outbox.enqueue(&mut first, &x).await.unwrap());
    assert!(outbox.enqueue(&mut second, &y).await.unwrap());
    let (a, b) = tokio::join!(
        async {
            let got = outbox.enqueue(&mut first, &y).await;
            (got, first)
        },
        async {
            // The first waits on the second's `Y` by now.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let got = outbox.enqueue(&mut second, &x).await;
            (got, second)
        },
    );
    let (survivor, victim) = match (a, b) {
        ((Ok(enqueued), tx), (Err(e), _)) | ((Err(e), _), (Ok(enqueued), tx)) => {
            assert!(
                matches!(e, idem::Error::Unavailable(_)) && e.is_retryable(),
                "{e:?}"
            );
            assert!(e.to_string().contains("Deadlock"), "{e}");
            // The victim's own event went with its rollback: the survivor enqueued it.
            assert!(enqueued);
            (tx, e)
        }
        (a, b) => panic!("one of two deadlocked enqueues fails: {:?} {:?}", a.0, b.0),
    };
    drop(victim);
    survivor.commit().await.unwrap();
    // The rolled-back transaction, retried: both events are there already.
    assert!(!outbox.enqueue_alone(&x, true).await);
    assert!(!outbox.enqueue_alone(&y, true).await);
    let mut ids: Vec<String> = Operate::pending(&outbox)
        .await
        .into_iter()
        .map(|p| p.event.id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["X-0", "Y-0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn a_transactional_idempotent_body_on_mysql_enqueues_once_and_rolls_back_with_its_error() {
    let db = common::MyDatabase::create(&common::mysql_url(), 8).await;
    let store = idem::MySqlStore::connect(&db.url).await.unwrap();
    let outbox = MySqlOutbox::new(store.pool().clone());
    outbox.migrate().await.unwrap();
    sqlx::query(
        "CREATE TABLE orders (order_no VARCHAR(32) PRIMARY KEY, status VARCHAR(16) NOT NULL)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    sqlx::query("INSERT INTO orders VALUES ('ORD-2', 'PAID')")
        .execute(store.pool())
        .await
        .unwrap();
    refunds_enqueue_once_and_roll_back_with_their_error!(refund_on_mysql, store, outbox);
}

// ---- ordered consumption ----------------------------------------------------------------------

/// Events of 4 partitions published by the relay, consumed by 8 concurrent handlers whose
/// first attempt at every third event fails for now: in ordered mode each partition completes
/// its events one at a time, in the order they were enqueued.
async fn the_relays_order_survives_jetstream_consumption(ordered: bool) {
    use async_nats::jetstream::consumer::pull;
    use common::partitions::{PartitionLog, events};
    use idem::consumer::nats::{JetStreamPublisher, JetStreamSource};
    use idem::consumer::{Backoff, Consumer};
    const PARTITIONS: usize = 4;
    const PER: u32 = 12;
    let (_store, outbox, _file) = sqlite_outbox().await;
    let streams = common::JsStreams::new(&common::nats_url()).await;
    let (stream, root) = streams.stream("ordered", Duration::from_secs(120)).await;
    outbox
        .add(&events(&format!("{root}.order"), PARTITIONS, PER))
        .await;
    let relay = Relay::new(outbox.clone(), JetStreamPublisher::new(streams.js.clone()));
    while relay.run_once().await.unwrap() > 0 {}
    assert_eq!(
        outbox.counts().await.unwrap().sent,
        (PARTITIONS as u64) * u64::from(PER)
    );

    let pull = stream
        .create_consumer(pull::Config {
            durable_name: Some("ordered".into()),
            ack_wait: Duration::from_secs(10),
            ..Default::default()
        })
        .await
        .unwrap();
    let source = JetStreamSource::new(streams.js.clone(), pull, format!("{root}.dlq"));
    let log = PartitionLog::default();
    let consumer = Consumer::new("ordered", idem::MemoryStore::new())
        .unwrap()
        .ordered(ordered)
        .backoff(Backoff {
            initial: Duration::from_millis(30),
            max: Duration::from_millis(100),
        });
    let handler = consumer.guarded(log.handler());
    let deliveries = source.deliveries().await.unwrap();
    let (c, l) = (consumer.clone(), log.clone());
    let total = PARTITIONS * PER as usize;
    tokio::time::timeout(
        Duration::from_secs(30),
        c.run_until(deliveries, handler, 8, async move {
            while l.completed() < total {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }),
    )
    .await
    .expect("every event completed");
    log.check(PARTITIONS, PER).unwrap();
    assert!(log.most_at_once() > 1, "partitions ran concurrently");
    assert_eq!(consumer.stats().completed, total as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn an_ordered_jetstream_consumer_completes_each_partition_in_the_relays_order() {
    the_relays_order_survives_jetstream_consumption(true).await;
}
