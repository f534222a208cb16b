//! Message consumption across OS processes, against the real brokers, on each database: one
//! SQLite file, a PostgreSQL schema, a MySQL (MariaDB) database. Every case runs on each
//! (`…_on_sqlite`, `…_on_postgres`, `…_on_mysql`) with the same assertions.
//!
//! - `two_processes_one_thousand_messages`: two consumer processes on one durable JetStream
//!   consumer, in separate commits, 1,000 messages with forced redeliveries (a one-second ack
//!   wait; a tenth of the handlers stall past it without a word to the broker, a tenth fail
//!   once, one in a hundred is poison): every effect exactly once, exact counts of completions
//!   and retries, and exactly the poison messages dead-lettered, one copy each on the
//!   dead-letter stream.
//! - `kill_9_jetstream`: two outbox relays and the fulfilment worker (the example's
//!   transactional handler, connected as the example connects) are killed with SIGKILL at random
//!   moments, again and again, while 500 orders are paid over ten seconds, each in a transaction
//!   that enqueues its `order.paid`; after recovery there is one shipment per paid order, none
//!   missing, every event sent once and none parked, nothing dead-lettered.
//! - `kill_9_rabbitmq`: the same with RabbitMQ and 150 orders.
//!
//! `IDEM_KILL9_SECONDS` makes the kill loops longer (default 10), with as many more orders.
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
use idem::outbox::{Event, OutboxBackend, Poll, Publisher, Relay, Wake, event_id};
use idem::outbox::{MySqlOutbox, PgOutbox, SqliteOutbox};
use idem::{BoxError, Key, MySqlStore, PgStore, SqliteStore, Store};
use sqlx::AssertSqlSafe;
use worker::Shipments;

const MESSAGES: usize = 1000;
/// Orders the kill loops pay each second, while they kill processes.
const ORDERS_PER_SECOND_NATS: usize = 50;
const ORDERS_PER_SECOND_AMQP: usize = 15;
/// How long the kill loops pay orders and kill processes, unless `IDEM_KILL9_SECONDS` says.
const DEFAULT_PAYING_SECONDS: usize = 10;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    match args.get(1).map(String::as_str) {
        Some("--consumer") => return rt.block_on(consumer_role(&args[2], &args[3])),
        Some("--relay") => return rt.block_on(relay_role(&args[2], &args[3])),
        Some("--worker") => return rt.block_on(worker_role(&args[2], &args[3], &args[4])),
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
    let mysql = cfg!(idem_mysql);
    let seconds = match std::env::var("IDEM_KILL9_SECONDS") {
        Ok(n) => n
            .parse()
            .expect("IDEM_KILL9_SECONDS is a number of seconds"),
        Err(_) => DEFAULT_PAYING_SECONDS,
    };
    let paying = Duration::from_secs(seconds as u64);
    let databases = [
        ("sqlite", true, ""),
        (
            "postgres",
            pg,
            ", and PostgreSQL: set DATABASE_URL=postgres://…",
        ),
        (
            "mysql",
            mysql,
            ", and MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…",
        ),
    ];
    for (database, available, needs) in databases {
        case(
            &format!("two_processes_one_thousand_messages_on_{database}"),
            nats && available,
            &format!("needs NATS (set NATS_URL=nats://…){needs}"),
            &|| rt.block_on(two_processes_one_thousand_messages(database)),
        );
        case(
            &format!("kill_9_jetstream_on_{database}"),
            nats && available,
            &format!("needs NATS (set NATS_URL=nats://…){needs}"),
            &|| {
                let orders = ORDERS_PER_SECOND_NATS * seconds;
                rt.block_on(kill_9("nats", database, orders, paying))
            },
        );
        case(
            &format!("kill_9_rabbitmq_on_{database}"),
            amqp && available,
            &format!("needs RabbitMQ (set AMQP_URL=amqp://…){needs}"),
            &|| {
                let orders = ORDERS_PER_SECOND_AMQP * seconds;
                rt.block_on(kill_9("amqp", database, orders, paying))
            },
        );
    }
    println!("\ntest result: ok. {passed} passed; 0 failed; {ignored} ignored");
}

// ---- the service's side, on each database -----------------------------------------------

/// The service's side of a case on one database, connected as a service connects (on MySQL the
/// store's own pool: `READ COMMITTED`, strict mode): its store, and its outbox on the store's
/// pool.
#[derive(Clone)]
enum Service {
    Lite(SqliteStore, SqliteOutbox),
    Pg(PgStore, PgOutbox),
    My(MySqlStore, MySqlOutbox),
}

/// Runs `$body` with `$store` and `$outbox` bound to the service's (each database's own types,
/// so the body is compiled once per database).
macro_rules! on_service {
    ($service:expr, ($store:pat, $outbox:pat) => $body:expr) => {
        match $service {
            Service::Lite($store, $outbox) => $body,
            Service::Pg($store, $outbox) => $body,
            Service::My($store, $outbox) => $body,
        }
    };
}

/// The orders the service pays, in every database's SQL; MySQL's compared byte for byte
/// (`utf8mb4_bin`), as the worker's shipments are.
const ORDERS: &str = "CREATE TABLE orders (order_no VARCHAR(64) PRIMARY KEY, \
                      amount_cents BIGINT NOT NULL, status VARCHAR(16) NOT NULL)";
const ORDERS_MYSQL_CHARSET: &str = " DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin";

impl Service {
    async fn connect(url: &str) -> Service {
        if url.starts_with("postgres") {
            let store = PgStore::connect(url).await.unwrap();
            let outbox = PgOutbox::new(store.pool().clone());
            Service::Pg(store, outbox)
        } else if url.starts_with("mysql") {
            let store = MySqlStore::connect(url).await.unwrap();
            let outbox = MySqlOutbox::new(store.pool().clone());
            Service::My(store, outbox)
        } else {
            let store = SqliteStore::connect(url).await.unwrap();
            let outbox = SqliteOutbox::new(store.pool().clone());
            Service::Lite(store, outbox)
        }
    }

    /// `sql`, its parameters written `$1`, `$2`, …, as this database writes them.
    fn sql(&self, sql: &str) -> String {
        match self {
            Service::My(..) => common::mysql_params(sql),
            _ => sql.to_owned(),
        }
    }

    /// The outbox table, the orders and the worker's shipments.
    async fn prepare(&self) {
        let orders = match self {
            Service::My(..) => format!("{ORDERS}{ORDERS_MYSQL_CHARSET}"),
            _ => ORDERS.to_owned(),
        };
        on_service!(self, (store, outbox) => {
            outbox.migrate().await.unwrap();
            sqlx::query(AssertSqlSafe(orders)).execute(store.pool()).await.unwrap();
            store.create_shipments().await.unwrap();
        })
    }

    /// Pays order `n` and enqueues its `order.paid` to `topic`, in one transaction. A deadlock
    /// or a lock wait that ran out rolled it back (`Unavailable`, on MySQL): it is paid again
    /// whole, as the outbox asks. Returns how many times it was rolled back so.
    async fn pay(&self, n: usize, topic: &str) -> u64 {
        let order_no = format!("ORD-{n:05}");
        let amount_cents = 100 + n as i64;
        let payload = serde_json::json!({ "orderNo": order_no, "amountCents": amount_cents });
        let event = Event::new(
            event_id("order", &order_no, "paid"),
            topic,
            order_no.as_str(),
            payload.to_string(),
        );
        let insert = self.sql("INSERT INTO orders VALUES ($1, $2, 'PAID')");
        let mut rolled_back = 0;
        loop {
            let paid: Result<(), idem::Error> = on_service!(self, (store, outbox) => async {
                let mut tx = store.pool().begin().await.map_err(db_error)?;
                sqlx::query(AssertSqlSafe(insert.as_str()))
                    .bind(&order_no)
                    .bind(amount_cents)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?;
                outbox.enqueue(&mut tx, &event).await?;
                tx.commit().await.map_err(db_error)
            }
            .await);
            match paid {
                Ok(()) => return rolled_back,
                Err(idem::Error::Unavailable(e)) if rolled_back < 10 => {
                    eprintln!("paying {order_no} again: {e}");
                    rolled_back += 1;
                }
                Err(e) => panic!("paying {order_no}: {e}"),
            }
        }
    }

    /// The one number `sql` answers.
    async fn scalar(&self, sql: &str) -> i64 {
        let sql = self.sql(sql);
        on_service!(self, (store, _) => {
            sqlx::query_scalar(AssertSqlSafe(sql))
                .fetch_one(store.pool())
                .await
                .unwrap()
        })
    }

    /// The table of the effects of `two_processes_one_thousand_messages`.
    async fn create_effects(&self) {
        let create = "CREATE TABLE effects (msg VARCHAR(255) NOT NULL, pid BIGINT NOT NULL)";
        on_service!(self, (store, _) => {
            sqlx::query(create).execute(store.pool()).await.unwrap();
        })
    }

    /// One effect of message `msg` by process `pid`.
    async fn record_effect(&self, msg: &str, pid: i64) -> Result<(), sqlx::Error> {
        let insert = self.sql("INSERT INTO effects (msg, pid) VALUES ($1, $2)");
        on_service!(self, (store, _) => {
            sqlx::query(AssertSqlSafe(insert))
                .bind(msg)
                .bind(pid)
                .execute(store.pool())
                .await
                .map(drop)
        })
    }

    /// How many effects each message had.
    async fn effects(&self) -> Vec<(String, i64)> {
        let select = "SELECT msg, count(*) FROM effects GROUP BY msg";
        on_service!(self, (store, _) => {
            sqlx::query_as(select).fetch_all(store.pool()).await.unwrap()
        })
    }

    async fn outbox_counts(&self) -> idem::outbox::OutboxCounts {
        on_service!(self, (_, outbox) => outbox.counts().await.unwrap())
    }
}

fn db_error(e: sqlx::Error) -> idem::Error {
    idem::Error::Store(e.into())
}

/// A database of its own for one case: a SQLite file, a PostgreSQL schema or a MySQL database,
/// removed when dropped. Returns its URL, which every process of the case connects to.
async fn scratch_database(database: &str) -> (String, Box<dyn std::any::Any>) {
    match database {
        "sqlite" => {
            let file = common::SqliteFile::new();
            (file.url.clone(), Box::new(file))
        }
        "postgres" => {
            let schema = common::PgSchema::create(&common::pg_url(), 1).await;
            (schema.scoped_url(), Box::new(schema))
        }
        "mysql" => {
            let database = common::MyDatabase::create(&common::mysql_url(), 1).await;
            (database.url.clone(), Box::new(database))
        }
        other => panic!("no database {other:?}"),
    }
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

/// One consumer process on the database `url` names: handles deliveries until its stdin
/// closes, then prints its counts.
async fn consumer_role(url: &str, prefix: &str) {
    let service = Service::connect(url).await;
    on_service!(&service, (store, _) => consume_forced(store.clone(), &service, prefix).await)
}

/// The consumer of [`consumer_role`] with its store, in separate commits: the claim commits
/// before the body runs, and the body's effect is a write of its own.
async fn consume_forced<S: Store + Clone + 'static>(store: S, service: &Service, prefix: &str) {
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
    let s = service.clone();
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
            s.record_effect(msg.key.as_str(), i64::from(pid))
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

async fn two_processes_one_thousand_messages(database: &str) {
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

    let (url, _database) = scratch_database(database).await;
    let service = Service::connect(&url).await;
    service.create_effects().await;
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<Child> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .args(["--consumer", &url, &prefix])
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
        "two processes on {database}: completed={completed} replayed={replayed} in_progress={in_progress} retried={retried} dead_lettered={dead} ack_failures={ack_failures} transient_failures={transient}"
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

    let effects = service.effects().await;
    assert_eq!(effects.len() as u64, MESSAGES as u64 - poison);
    for (msg, n) in &effects {
        assert_eq!(*n, 1, "{msg} had {n} effects");
    }
    assert_eq!(dlq.info().await.unwrap().state.messages, poison);
}

// ---- kill -9 loops --------------------------------------------------------------------------

/// The relay: the outbox to JetStream or RabbitMQ, woken by `NOTIFY` on PostgreSQL, polling
/// elsewhere.
async fn relay_role(broker: &str, url: &str) {
    match Service::connect(url).await {
        Service::Pg(_, outbox) => {
            let listener = outbox.listener().await.unwrap();
            relay(broker, outbox, listener).await
        }
        Service::My(_, outbox) => relay(broker, outbox, Poll).await,
        Service::Lite(_, outbox) => relay(broker, outbox, Poll).await,
    }
}

async fn relay<O: OutboxBackend + 'static, W: Wake>(broker: &str, outbox: O, wake: W) {
    if broker == "nats" {
        let client = async_nats::connect(common::nats_url()).await.unwrap();
        let publisher = JetStreamPublisher::new(async_nats::jetstream::new(client));
        publish(outbox, publisher, wake).await
    } else {
        let publisher = AmqpPublisher::connect(&common::amqp_url(), "")
            .await
            .unwrap();
        publish(outbox, publisher, wake).await
    }
}

/// Publishes until the process is killed.
async fn publish<O: OutboxBackend, P: Publisher, W: Wake>(outbox: O, publisher: P, wake: W) {
    Relay::new(outbox, publisher)
        .lease(Duration::from_secs(2))
        .poll(Duration::from_millis(250))
        .run_until(wake, std::future::pending())
        .await;
}

/// The fulfilment worker, with the example's handler, on the database `url` names, as the
/// example connects to it.
async fn worker_role(broker: &str, url: &str, target: &str) {
    let database = worker::Database::connect(url).await.unwrap();
    worker::with_store!(database, store => consume(broker, store, target).await)
}

async fn consume<S: worker::Shipments>(broker: &str, store: S, target: &str) {
    let s = store.clone();
    let handler = move |msg: Message| {
        let s = s.clone();
        async move { s.fulfil(msg).await }
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

/// Pays `orders` over `paying` while it kills relays and the worker, then checks every order
/// shipped once.
async fn kill_9(broker: &str, database: &str, orders: usize, paying: Duration) {
    let started = Instant::now();
    let (url, _database) = scratch_database(database).await;
    let service = Service::connect(&url).await;
    service.prepare().await;
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
        args: vec![broker.into(), url.clone(), target.clone()],
    };
    let mut relays = vec![roles.spawn("--relay"), roles.spawn("--relay")];
    let mut worker = roles.spawn("--worker");

    // Pay the orders at an even pace while the killing goes on, so that kills land while events
    // are enqueued, claimed, published and consumed.
    let payer = {
        let (service, topic) = (service.clone(), topic.clone());
        tokio::spawn(async move {
            let mut rolled_back = 0;
            let begun = tokio::time::Instant::now();
            for n in 0..orders {
                rolled_back += service.pay(n, &topic).await;
                let due = begun + paying.mul_f64((n + 1) as f64 / orders as f64);
                tokio::time::sleep_until(due).await;
            }
            rolled_back
        })
    };

    let mut rng = Lcg(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64);
    let mut kills: HashMap<&str, usize> = HashMap::new();
    while !payer.is_finished() {
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
    let rolled_back = payer.await.unwrap();
    let killed_at = Instant::now();

    // Recovery: no more kills; everything paid is shipped.
    let deadline = Instant::now() + Duration::from_secs(90);
    let shipped = loop {
        let shipped = service.scalar("SELECT count(*) FROM shipments").await;
        if shipped as usize >= orders {
            break shipped;
        }
        assert!(
            Instant::now() < deadline,
            "{shipped} of {orders} shipped after recovery"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let recovery = killed_at.elapsed();
    // Let any late duplicate arrive and be answered before looking.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for mut child in relays.into_iter().chain([worker]) {
        let _ = child.kill();
        let _ = child.wait();
    }
    // Events a relay claimed more than once: its claim's lease ran out (a relay killed holding
    // it), or the broker refused it for a while.
    let claimed_again = service
        .scalar("SELECT count(*) FROM idem_outbox WHERE attempts > 1")
        .await;
    println!(
        "kill -9 {broker} on {database}: {kills:?}, {shipped} shipments for {orders} orders, \
         all shipped {:.1} s after the last kill, {claimed_again} events claimed again, \
         {rolled_back} payments rolled back and paid again, {:.1} s",
        recovery.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(kills.get("relay").copied().unwrap_or(0) >= 3, "{kills:?}");
    assert!(kills.get("worker").copied().unwrap_or(0) >= 3, "{kills:?}");

    let missing = service
        .scalar(
            "SELECT count(*) FROM orders o WHERE NOT EXISTS \
             (SELECT 1 FROM shipments s WHERE s.order_no = o.order_no)",
        )
        .await;
    let rows = service.scalar("SELECT count(*) FROM shipments").await;
    let distinct = service
        .scalar("SELECT count(DISTINCT order_no) FROM shipments")
        .await;
    let mismatched = service
        .scalar(
            "SELECT count(*) FROM shipments s JOIN orders o USING (order_no) \
             WHERE s.amount_cents <> o.amount_cents",
        )
        .await;
    assert_eq!(missing, 0, "every paid order shipped");
    assert_eq!(
        (rows, distinct),
        (orders as i64, orders as i64),
        "no duplicates"
    );
    assert_eq!(mismatched, 0);
    let counts = service.outbox_counts().await;
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
