//! Message consumption across OS processes, against the real brokers.
//!
//! - `two_processes_one_thousand_messages`: two consumer processes on one durable JetStream
//!   consumer, 1,000 messages with forced redeliveries (a one-second ack wait; a tenth of the
//!   handlers stall past it without a word to the broker, a tenth fail once, one in a hundred is
//!   poison): every effect exactly once, exact counts of completions and retries, and exactly
//!   the poison messages dead-lettered, one copy each on the dead-letter stream.
//! - `kill_9_jetstream`: the outbox relay and the fulfilment worker (the example's handler) are
//!   killed with SIGKILL at random moments, again and again, while 500 orders are paid on
//!   PostgreSQL; after recovery there is one shipment per paid order, none missing.
//! - `kill_9_rabbitmq`: the same with RabbitMQ and 150 orders.
//!
//! A plain `main` (harness = false): the test starts copies of its own binary in a role.

mod common;

#[path = "../examples/fulfilment_worker/worker.rs"]
mod worker;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{PullConsumer, pull};
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use futures_util::StreamExt;
use idem::consumer::amqp::{AmqpPublisher, AmqpSource};
use idem::consumer::nats::{JetStreamPublisher, JetStreamSource};
use idem::consumer::{Consumer, Delivery, HandlerError, Message};
use idem::outbox::PgOutbox;
use idem::outbox::{Event, OutboxBackend, Relay, event_id};
use idem::{BoxError, Key, PgStore, SqliteStore};

const MESSAGES: usize = 1000;
const ORDERS_NATS: usize = 500;
const ORDERS_AMQP: usize = 150;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    match args.get(1).map(String::as_str) {
        Some("--consumer") => return rt.block_on(consumer_role(&args[2], &args[3])),
        Some("--relay") => return rt.block_on(relay_role(&args[2], &args[3], &args[4], &args[5])),
        Some("--worker") => {
            return rt.block_on(worker_role(&args[2], &args[3], &args[4], &args[5]));
        }
        _ => {}
    }
    // Under `cargo test -- <filter>` only the named cases run.
    let filter: Vec<&String> = args[1..].iter().filter(|a| !a.starts_with('-')).collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let mut passed = 0;
    let mut ignored = 0;
    let mut case = |name: &str, available: bool, why: &str, run: &dyn Fn()| {
        if !wanted(name) {
            return;
        }
        if available {
            run();
            println!("test consumer_processes::{name} ... ok");
            passed += 1;
        } else {
            println!("test consumer_processes::{name} ... ignored, {why}");
            ignored += 1;
        }
    };
    let nats = cfg!(idem_nats);
    let pg = cfg!(idem_postgres);
    let amqp = cfg!(idem_amqp);
    case(
        "two_processes_one_thousand_messages",
        nats,
        "needs NATS: set NATS_URL=nats://…",
        &|| rt.block_on(two_processes_one_thousand_messages()),
    );
    case(
        "kill_9_jetstream",
        nats && pg,
        "needs NATS and PostgreSQL: set NATS_URL and DATABASE_URL",
        &|| rt.block_on(kill_9("nats", ORDERS_NATS)),
    );
    case(
        "kill_9_rabbitmq",
        amqp && pg,
        "needs RabbitMQ and PostgreSQL: set AMQP_URL and DATABASE_URL",
        &|| rt.block_on(kill_9("amqp", ORDERS_AMQP)),
    );
    println!("\ntest result: ok. {passed} passed; 0 failed; {ignored} ignored");
}

// ---- two processes, 1,000 messages ------------------------------------------------------------

/// What a message's number makes its handler do.
fn class(n: usize) -> &'static str {
    if n % 100 == 42 {
        "poison"
    } else if n % 10 == 3 {
        "fails-once"
    } else if n % 10 == 7 {
        "stalls"
    } else {
        "plain"
    }
}

/// A delivery that stalls on its first attempt: it never says "still working", so the broker's
/// one-second ack wait runs out while its handler sleeps 1.5 s, and the message is redelivered,
/// to either process, while the first attempt holds its claim.
struct Forced<D> {
    inner: D,
    stalls: bool,
}

impl<D: Delivery> Delivery for Forced<D> {
    fn key(&self) -> Result<Key, String> {
        self.inner.key()
    }
    fn payload(&self) -> Bytes {
        self.inner.payload()
    }
    fn subject(&self) -> &str {
        self.inner.subject()
    }
    fn delivered(&self) -> u32 {
        self.inner.delivered()
    }
    fn max_deliveries(&self) -> Option<u32> {
        self.inner.max_deliveries()
    }
    fn keep_alive_every(&self) -> Option<Duration> {
        if self.stalls {
            None
        } else {
            self.inner.keep_alive_every()
        }
    }
    async fn ack(&self) -> Result<(), BoxError> {
        self.inner.ack().await
    }
    async fn retry(&self, delay: Duration) -> Result<(), BoxError> {
        self.inner.retry(delay).await
    }
    async fn dead_letter(&self, reason: &str) -> Result<(), BoxError> {
        let key = self
            .inner
            .key()
            .map_or_else(|e| format!("<no key: {e}>"), |k| k.as_str().to_owned());
        DEAD_LETTERED.lock().unwrap().push(key);
        self.inner.dead_letter(reason).await
    }
    async fn keep_alive(&self) -> Result<(), BoxError> {
        if self.stalls {
            Ok(())
        } else {
            self.inner.keep_alive().await
        }
    }
}

/// The key of every delivery this process dead-lettered, in order.
static DEAD_LETTERED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn number(payload: &[u8]) -> usize {
    std::str::from_utf8(payload)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(usize::MAX)
}

/// One consumer process: handles deliveries until its stdin closes, then prints its counts.
async fn consumer_role(sqlite_url: &str, prefix: &str) {
    let store = SqliteStore::connect(sqlite_url).await.unwrap();
    let client = async_nats::connect(common::nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js
        .get_stream(format!("{}_work", prefix.replace('-', "_")))
        .await
        .unwrap();
    let pull: PullConsumer = stream.get_consumer("fulfilment").await.unwrap();
    let source = JetStreamSource::new(js, pull, format!("{prefix}.dlq.fulfilment")).batch(16);
    let consumer = Consumer::new(source.consumer_name(), store.clone())
        .unwrap()
        .lease(Duration::from_secs(3))
        .max_deliveries(5)
        .backoff(idem::consumer::Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(1),
        });
    let pid = std::process::id();
    let s = store.clone();
    // Every transient failure the handler reports: the runner must retry each one, and nothing
    // else.
    static TRANSIENT: AtomicU64 = AtomicU64::new(0);
    let handler = consumer.guarded(move |msg: Message, _claim| {
        let s = s.clone();
        async move {
            let n = number(&msg.payload);
            match class(n) {
                "poison" => return Err(HandlerError::permanent("no such order")),
                "fails-once" if msg.delivered == 1 => {
                    TRANSIENT.fetch_add(1, Ordering::SeqCst);
                    return Err(HandlerError::transient("the warehouse timed out"));
                }
                "stalls" if msg.delivered == 1 => {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                _ => {}
            }
            // The effect: one row per run of the body, no unique index to hide a second one.
            sqlx::query("INSERT INTO effects (msg, pid) VALUES ($1, $2)")
                .bind(msg.key.as_str())
                .bind(i64::from(pid))
                .execute(s.pool())
                .await
                .map_err(|e| {
                    TRANSIENT.fetch_add(1, Ordering::SeqCst);
                    HandlerError::transient(e)
                })?;
            Ok(n)
        }
    });
    let deliveries = source.deliveries().await.unwrap().map(|d| {
        d.map(|d| {
            let stalls = class(number(&d.payload())) == "stalls" && d.delivered() == 1;
            Forced { inner: d, stalls }
        })
    });
    let stdin_closed = tokio::task::spawn_blocking(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
    });
    consumer
        .run_until(deliveries, handler, 16, async {
            let _ = stdin_closed.await;
        })
        .await;
    let s = consumer.stats();
    println!(
        "STATS {} {} {} {} {} {} {}",
        s.completed,
        s.replayed,
        s.in_progress,
        s.retried,
        s.dead_lettered,
        s.ack_failures,
        TRANSIENT.load(Ordering::SeqCst)
    );
    println!("DEAD {}", DEAD_LETTERED.lock().unwrap().join(" "));
}

async fn two_processes_one_thousand_messages() {
    let streams = common::JsStreams::new(&common::nats_url()).await;
    let prefix = streams.prefix.clone();
    let (stream, root) = streams.stream("work", Duration::from_secs(120)).await;
    let (mut dlq, _) = streams.stream("dlq", Duration::from_secs(120)).await;
    assert_eq!(root, format!("{prefix}.work"));
    stream
        .create_consumer(pull::Config {
            durable_name: Some("fulfilment".into()),
            ack_wait: Duration::from_secs(1),
            ..Default::default()
        })
        .await
        .unwrap();
    let publishes = futures_util::future::join_all((0..MESSAGES).map(|n| {
        let js = streams.js.clone();
        let subject = format!("{root}.paid");
        async move {
            js.send_publish(
                subject,
                PublishMessage::build()
                    .payload(Bytes::from(n.to_string()))
                    .message_id(format!("m-{n}")),
            )
            .await?
            .await
        }
    }))
    .await;
    assert!(publishes.iter().all(Result::is_ok));

    let file = common::SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.unwrap();
    sqlx::query("CREATE TABLE effects (msg TEXT NOT NULL, pid INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<Child> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .args(["--consumer", &file.url, &prefix])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();

    // Until every message is settled: nothing pending, nothing unacked.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut pull: PullConsumer = stream.get_consumer("fulfilment").await.unwrap();
    loop {
        let info = pull.info().await.unwrap();
        if info.num_pending == 0 && info.num_ack_pending == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "not settled: {info:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut totals = [0u64; 7];
    let mut dead_keys: Vec<String> = Vec::new();
    for child in &mut children {
        drop(child.stdin.take());
    }
    for mut child in children {
        let out = BufReader::new(child.stdout.take().unwrap());
        let lines: Vec<String> = out.lines().map_while(Result::ok).collect();
        let line = lines
            .iter()
            .find(|l| l.starts_with("STATS "))
            .expect("a consumer reported its counts");
        let dead_line = lines
            .iter()
            .find(|l| l.starts_with("DEAD"))
            .expect("a consumer reported what it dead-lettered");
        dead_keys.extend(dead_line[4..].split_whitespace().map(str::to_owned));
        assert!(child.wait().unwrap().success());
        let counts: Vec<u64> = line[6..].split(' ').map(|n| n.parse().unwrap()).collect();
        assert!(counts[0] > 0, "both processes completed messages: {line}");
        for (t, c) in totals.iter_mut().zip(counts) {
            *t += c;
        }
    }
    let [
        completed,
        replayed,
        in_progress,
        retried,
        dead,
        ack_failures,
        transient,
    ] = totals;
    let poison = (0..MESSAGES).filter(|n| class(*n) == "poison").count() as u64;
    let fails_once = (0..MESSAGES).filter(|n| class(*n) == "fails-once").count() as u64;
    let stalls = (0..MESSAGES).filter(|n| class(*n) == "stalls").count() as u64;
    println!(
        "two processes: completed={completed} replayed={replayed} in_progress={in_progress} retried={retried} dead_lettered={dead} ack_failures={ack_failures} transient_failures={transient}"
    );
    assert_eq!(completed, MESSAGES as u64 - poison, "each effect once");
    // Every poison message is dead-lettered, and nothing else is. A poison message whose ack
    // wait ran out while it queued is redelivered and dead-lettered a second time: the dead
    // letter's `Nats-Msg-Id` makes the stream keep one (checked at the end).
    assert_eq!(dead, dead_keys.len() as u64, "one count per dead-lettering");
    let poison_keys: std::collections::BTreeSet<String> = (0..MESSAGES)
        .filter(|n| class(*n) == "poison")
        .map(|n| format!("m-{n}"))
        .collect();
    let dead_set: std::collections::BTreeSet<String> = dead_keys.iter().cloned().collect();
    assert_eq!(dead_set, poison_keys, "poison dead-lettered, nothing else");
    println!(
        "poison messages dead-lettered again after a redelivery: {}",
        dead - poison
    );
    // A message that fails once does so on its first delivery; when that delivery was overtaken
    // (its ack wait ran out while it queued, and the redelivery ran first), it replays instead.
    assert_eq!(
        retried, transient,
        "one retry for every transient failure, and no other"
    );
    assert!(
        transient >= fails_once / 2,
        "the messages failing once did fail, and were retried: {transient} of {fails_once}"
    );
    // A stalled handler's late ack is accepted when the broker has not yet handed the message
    // out again (no consumer pulled in the half second between the ack wait and the end of the
    // stall), so not every stall is redelivered; most are, or the test forced nothing.
    assert!(
        in_progress + replayed >= stalls / 2,
        "the stalled messages were redelivered while or after they ran: {in_progress} + {replayed} of {stalls}"
    );

    let effects: Vec<(String, i64)> =
        sqlx::query_as("SELECT msg, count(*) FROM effects GROUP BY msg")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(effects.len() as u64, MESSAGES as u64 - poison);
    for (msg, n) in &effects {
        assert_eq!(*n, 1, "{msg} had {n} effects");
    }
    assert_eq!(dlq.info().await.unwrap().state.messages, poison);
}

// ---- kill -9 loops --------------------------------------------------------------------------

/// The relay: the outbox on PostgreSQL to JetStream or RabbitMQ, woken by `NOTIFY`.
async fn relay_role(broker: &str, pg_url: &str, schema: &str, target: &str) {
    let pool = common::PgSchema::pool_for(pg_url, schema, 4).await;
    let outbox = PgOutbox::new(pool);
    let listener = outbox.listener().await.unwrap();
    let forever = std::future::pending::<()>();
    if broker == "nats" {
        let client = async_nats::connect(common::nats_url()).await.unwrap();
        let publisher = JetStreamPublisher::new(async_nats::jetstream::new(client));
        Relay::new(outbox, publisher)
            .lease(Duration::from_secs(2))
            .poll(Duration::from_millis(250))
            .run_until(listener, forever)
            .await;
    } else {
        let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
            .await
            .unwrap();
        let _ = target;
        Relay::new(outbox, publisher)
            .lease(Duration::from_secs(2))
            .poll(Duration::from_millis(250))
            .run_until(listener, forever)
            .await;
    }
}

/// The fulfilment worker, with the example's handler, on PostgreSQL.
async fn worker_role(broker: &str, pg_url: &str, schema: &str, target: &str) {
    let pool = common::PgSchema::pool_for(pg_url, schema, 8).await;
    let store = PgStore::builder().build(pool).await.unwrap();
    let s = store.clone();
    let handler = move |msg: Message| {
        let s = s.clone();
        async move { worker::fulfil_pg(&s, msg).await }
    };
    if broker == "nats" {
        let client = async_nats::connect(common::nats_url()).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let pull = worker::jetstream_setup(&js, target, Duration::from_secs(2), false)
            .await
            .unwrap();
        let source = JetStreamSource::new(js, pull, format!("{target}{}", worker::DEAD_LETTERS));
        let consumer = Consumer::new(source.consumer_name(), store)
            .unwrap()
            .max_deliveries(worker::MAX_DELIVERIES);
        consumer
            .run(source.deliveries().await.unwrap(), handler, 16)
            .await;
    } else {
        let conn = lapin::Connection::connect(&common::amqp_url(), Default::default())
            .await
            .unwrap();
        let channel = conn.create_channel().await.unwrap();
        // The queue's dead letters go where the test looks for them: none should.
        let source = AmqpSource::new(channel, target)
            .prefetch(16)
            .dead_letter_queue(format!("{target}.dead"));
        let consumer = Consumer::new(source.queue(), store)
            .unwrap()
            .max_deliveries(10);
        consumer
            .run(source.deliveries("worker").await.unwrap(), handler, 16)
            .await;
    }
}

/// A tiny deterministic generator, seeded from the clock: where the kills land.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

struct Roles {
    exe: std::path::PathBuf,
    args: Vec<String>,
}

impl Roles {
    fn spawn(&self, role: &str) -> Child {
        Command::new(&self.exe)
            .arg(role)
            .args(&self.args)
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    }
}

async fn kill_9(broker: &str, orders: usize) {
    let url = common::pg_url();
    let schema = common::PgSchema::create(&url, 8).await;
    let pool = schema.pool.clone();
    let outbox = PgOutbox::new(pool.clone());
    outbox.migrate().await.unwrap();
    PgStore::builder().build(pool.clone()).await.unwrap();
    for stmt in [
        "CREATE TABLE orders (order_no text PRIMARY KEY, amount_cents bigint NOT NULL, status text NOT NULL)",
        worker::CREATE_SHIPMENTS_PG,
    ] {
        sqlx::query(stmt).execute(&pool).await.unwrap();
    }

    // Where the events go, and where the worker reads them.
    let mut nats_streams = Vec::new();
    let mut amqp: Option<(lapin::Connection, lapin::Channel, String, String)> = None;
    let (target, topic) = if broker == "nats" {
        let prefix = format!("{}.", common::unique("k9").replace('_', "-"));
        let client = async_nats::connect(common::nats_url()).await.unwrap();
        let js = async_nats::jetstream::new(client);
        worker::jetstream_setup(&js, &prefix, Duration::from_secs(2), false)
            .await
            .unwrap();
        let names = worker::name_prefix(&prefix);
        nats_streams = vec![
            format!("{names}{}", worker::STREAM),
            format!("{names}{}", worker::DEAD_LETTER_STREAM),
        ];
        (prefix.clone(), format!("{prefix}order.paid"))
    } else {
        let conn = lapin::Connection::connect(&common::amqp_url(), Default::default())
            .await
            .unwrap();
        let channel = conn.create_channel().await.unwrap();
        let queue = format!("{}.order.paid", common::unique("k9"));
        let dead = format!("{queue}.dead");
        channel
            .queue_declare(dead.as_str().into(), Default::default(), Default::default())
            .await
            .unwrap();
        let mut args = lapin::types::FieldTable::default();
        args.insert(
            "x-dead-letter-exchange".into(),
            lapin::types::AMQPValue::LongString("".into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            lapin::types::AMQPValue::LongString(dead.as_str().into()),
        );
        channel
            .queue_declare(
                queue.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args,
            )
            .await
            .unwrap();
        amqp = Some((conn, channel, queue.clone(), dead));
        (queue.clone(), queue)
    };

    let roles = Roles {
        exe: std::env::current_exe().unwrap(),
        args: vec![
            broker.into(),
            url.clone(),
            schema.name.clone(),
            target.clone(),
        ],
    };
    let mut relays = vec![roles.spawn("--relay"), roles.spawn("--relay")];
    let mut worker = roles.spawn("--worker");

    // Pay the orders, a few at a time, while the killing goes on.
    let payer = {
        let (pool, outbox, topic) = (pool.clone(), outbox.clone(), topic.clone());
        tokio::spawn(async move {
            for n in 0..orders {
                let order_no = format!("ORD-{n:05}");
                let mut tx = pool.begin().await.unwrap();
                sqlx::query("INSERT INTO orders VALUES ($1, $2, 'PAID')")
                    .bind(&order_no)
                    .bind(100 + n as i64)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let payload = serde_json::json!({ "orderNo": order_no, "amountCents": 100 + n });
                let event = Event::new(
                    event_id("order", &order_no, "paid"),
                    topic.as_str(),
                    order_no.as_str(),
                    payload.to_string(),
                );
                outbox.enqueue(&mut tx, &event).await.unwrap();
                tx.commit().await.unwrap();
                if n % 10 == 9 {
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            }
        })
    };

    let mut rng = Lcg(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64);
    let mut kills: HashMap<&str, usize> = HashMap::new();
    let killing_until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < killing_until || !payer.is_finished() {
        tokio::time::sleep(Duration::from_millis(150 + rng.next(600))).await;
        if rng.next(2) == 0 {
            let i = rng.next(relays.len() as u64) as usize;
            relays[i].kill().unwrap();
            relays[i].wait().unwrap();
            relays[i] = roles.spawn("--relay");
            *kills.entry("relay").or_default() += 1;
        } else {
            worker.kill().unwrap();
            worker.wait().unwrap();
            worker = roles.spawn("--worker");
            *kills.entry("worker").or_default() += 1;
        }
    }
    payer.await.unwrap();

    // Recovery: no more kills; everything paid is shipped.
    let deadline = Instant::now() + Duration::from_secs(90);
    let shipped = loop {
        let shipped: i64 = sqlx::query_scalar("SELECT count(*) FROM shipments")
            .fetch_one(&pool)
            .await
            .unwrap();
        if shipped as usize >= orders {
            break shipped;
        }
        assert!(
            Instant::now() < deadline,
            "{shipped} of {orders} shipped after recovery"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Let any late duplicate arrive and be answered before looking.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for mut child in relays.into_iter().chain([worker]) {
        let _ = child.kill();
        let _ = child.wait();
    }
    println!("kill -9 {broker}: {kills:?}, {shipped} shipments for {orders} orders");
    assert!(kills.get("relay").copied().unwrap_or(0) >= 3, "{kills:?}");
    assert!(kills.get("worker").copied().unwrap_or(0) >= 3, "{kills:?}");

    let missing: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders o WHERE NOT EXISTS \
         (SELECT 1 FROM shipments s WHERE s.order_no = o.order_no)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let (rows, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT order_no) FROM shipments")
            .fetch_one(&pool)
            .await
            .unwrap();
    let mismatched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM shipments s JOIN orders o USING (order_no) \
         WHERE s.amount_cents <> o.amount_cents",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(missing, 0, "every paid order shipped");
    assert_eq!(
        (rows, distinct),
        (orders as i64, orders as i64),
        "no duplicates"
    );
    assert_eq!(mismatched, 0);
    let counts = outbox.counts().await.unwrap();
    assert_eq!(
        (counts.pending, counts.parked, counts.sent),
        (0, 0, orders as u64),
        "every event sent, none parked"
    );

    // Nothing was dead-lettered: no handler ever saw a second shipment.
    if broker == "nats" {
        let client = async_nats::connect(common::nats_url()).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let mut dlq = js.get_stream(&nats_streams[1]).await.unwrap();
        assert_eq!(dlq.info().await.unwrap().state.messages, 0);
        for name in &nats_streams {
            let _ = js.delete_stream(name).await;
        }
    } else if let Some((conn, channel, queue, dead)) = amqp {
        let dead_letters = channel
            .queue_declare(
                dead.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await
            .unwrap();
        assert_eq!(dead_letters.message_count(), 0);
        for q in [queue, dead] {
            let _ = channel
                .queue_delete(q.as_str().into(), Default::default())
                .await;
        }
        let _ = conn.close(200, "done".into()).await;
    }
}
