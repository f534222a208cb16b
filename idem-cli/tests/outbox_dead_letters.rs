//! `idem outbox` on SQLite, PostgreSQL and MySQL, and `idem dead-letters` against a real NATS
//! JetStream and RabbitMQ: a message the consumer runner dead-lettered is listed, re-driven by
//! the tool, and handled once under its original key. Each broker test uses streams or queues
//! of its own; without `NATS_URL`/`AMQP_URL`/`DATABASE_URL`/`IDEM_MYSQL_URL` at build time its
//! tests are listed as ignored.

use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::consumer::{Consumer, HandlerError, Message};
use idem::outbox::{Event, SqliteOutbox};
use idem::{MemoryStore, SqliteStore};

fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_STORE_URL")
        .env_remove("DATABASE_URL")
        .output()
        .expect("the idem binary runs")
}

fn ok(args: &[&str]) -> String {
    let out = idem(args);
    assert!(
        out.status.success(),
        "idem {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}{}x{nanos}", std::process::id())
}

// ---- outbox ------------------------------------------------------------------------------------

/// Lists, parks, lists parked, sends back: the events `A-0`, `A-1`, `B-0` are in the outbox of
/// `url` (table `table`).
fn outbox_commands(url: &str, table: &str) {
    let base = |args: &[&'static str]| -> Vec<String> {
        args.iter()
            .copied()
            .chain(["--store", url, "--outbox-table", table])
            .map(str::to_owned)
            .collect()
    };
    let ok = |args: Vec<String>| ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let idem = |args: Vec<String>| idem(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let json =
        |args: Vec<String>| -> serde_json::Value { serde_json::from_str(&ok(args)).expect("JSON") };
    let text = ok(base(&["outbox", "list"]));
    let header = text.lines().next().unwrap();
    assert!(
        header.starts_with("seq") && header.contains("partition") && header.contains("age"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 4, "{text}");
    let listed = json(base(&["outbox", "list", "--json"]));
    let events = listed["events"].as_array().unwrap();
    let ids: Vec<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["A-0", "A-1", "B-0"]);
    let a0 = events[0]["seq"].as_i64().unwrap().to_string();
    let with = |head: &[&'static str], seq: &str, tail: &[&'static str]| -> Vec<String> {
        let mut all = base(head);
        all.push(seq.to_owned());
        all.extend(tail.iter().map(|s| (*s).to_owned()));
        all
    };

    // Parking asks first: without a terminal, --yes is required.
    let refused = idem(with(&["outbox", "park"], &a0, &[]));
    assert_eq!(refused.status.code(), Some(2));
    let out = ok(with(
        &["outbox", "park"],
        &a0,
        &["--yes", "--reason", "held for audit"],
    ));
    assert_eq!(out, format!("parked event {a0}\n"));
    let again = idem(with(&["outbox", "park"], &a0, &["--yes"]));
    assert_eq!(again.status.code(), Some(1), "already parked");

    let parked = json(base(&["outbox", "list", "--state", "parked", "--json"]));
    assert_eq!(parked["state"], "parked");
    assert_eq!(parked["events"][0]["id"], "A-0");
    assert_eq!(parked["events"][0]["last_error"], "held for audit");
    let pending = json(base(&["outbox", "list", "--json"]));
    assert_eq!(pending["events"].as_array().unwrap().len(), 2);

    // A reason is free text: what the table shows of it cannot drive the terminal.
    ok(with(&["outbox", "retry"], &a0, &[]));
    ok(with(
        &["outbox", "park"],
        &a0,
        &["--yes", "--reason", "held\u{1b}[2J\rfor\u{202e} audit"],
    ));
    let text = ok(base(&["outbox", "list", "--state", "parked"]));
    assert!(
        !text.contains(['\u{1b}', '\r', '\u{202e}'])
            && text.contains(r"held\x1b[2J\rfor\u{202e} audit"),
        "{text:?}"
    );
    let parked = json(base(&["outbox", "list", "--state", "parked", "--json"]));
    assert_eq!(
        parked["events"][0]["last_error"],
        "held\u{1b}[2J\rfor\u{202e} audit"
    );

    let out = ok(with(&["outbox", "retry"], &a0, &[]));
    assert_eq!(out, format!("sent back event {a0}\n"));
    let not_parked = idem(with(&["outbox", "retry"], &a0, &[]));
    assert_eq!(not_parked.status.code(), Some(1));
    ok(with(&["outbox", "park"], &a0, &["--yes"]));
    let all = json(base(&["outbox", "retry", "--all-parked", "--json"]));
    assert_eq!(all["unparked"], 1);
    let sent = ok(base(&["outbox", "list", "--state", "sent"]));
    assert_eq!(sent, "no sent events (3 pending, 0 parked, 0 sent)\n");
}

fn events() -> [Event; 3] {
    [
        Event::new("A-0", "order.paid", "A", "0"),
        Event::new("A-1", "order.paid", "A", "1"),
        Event::new("B-0", "order.paid", "B", "0"),
    ]
}

/// [`outbox_commands`] on a new table `$table` of an outbox `$outbox` on `$pool` (at `$url`)
/// holding [`events`], which `$drop` (a format string for the table's name) then drops.
macro_rules! outbox_commands_on {
    ($outbox:ty, $pool:ident, $url:ident, $table:ident, $drop:literal) => {
        let outbox = <$outbox>::with_table($pool.clone(), &$table).unwrap();
        outbox.migrate().await.unwrap();
        let mut tx = $pool.begin().await.unwrap();
        for e in &events() {
            outbox.enqueue(&mut tx, e).await.unwrap();
        }
        tx.commit().await.unwrap();
        outbox_commands(&$url, &$table);
        idem::sqlx::query(idem::sqlx::AssertSqlSafe(format!($drop, $table)))
            .execute(&$pool)
            .await
            .unwrap();
    };
}

#[tokio::test]
async fn outbox_list_park_and_retry_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("app.db").display());
    let store = SqliteStore::connect(&url).await.unwrap();
    let outbox = SqliteOutbox::with_table(store.pool().clone(), "app_outbox").unwrap();
    outbox.migrate().await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    for e in &events() {
        outbox.enqueue(&mut tx, e).await.unwrap();
    }
    tx.commit().await.unwrap();
    drop(store);
    outbox_commands(&url, "app_outbox");
}

#[tokio::test]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn outbox_list_park_and_retry_on_postgres() {
    let url = std::env::var("DATABASE_URL").unwrap();
    let pool = idem::sqlx::PgPool::connect(&url).await.unwrap();
    let table = unique("cli_outbox_");
    outbox_commands_on!(
        idem::outbox::PgOutbox,
        pool,
        url,
        table,
        "DROP TABLE {} CASCADE"
    );
}

#[tokio::test]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn outbox_list_park_and_retry_on_mysql() {
    let url = std::env::var("IDEM_MYSQL_URL").unwrap();
    let pool = idem::sqlx::MySqlPool::connect(&url).await.unwrap();
    // A table named with its database, as `schema.table` is on PostgreSQL.
    let database: String = idem::sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let table = format!("{database}.{}", unique("cli_outbox_"));
    outbox_commands_on!(idem::outbox::MySqlOutbox, pool, url, table, "DROP TABLE {}");
}

// ---- dead letters ------------------------------------------------------------------------------

/// Waits up to 20 s for `done`.
async fn until(mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..200 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done()
}

/// What the handler saw: the keys it completed.
type Seen = Arc<Mutex<Vec<String>>>;

/// A handler that refuses every message until `fixed`, then records its key.
macro_rules! warehouse {
    ($consumer:expr, $fixed:expr, $seen:expr) => {{
        let (fixed, seen) = ($fixed, $seen);
        $consumer.guarded(move |msg: Message, _claim| {
            let fixed = fixed.load(std::sync::atomic::Ordering::SeqCst);
            if fixed {
                seen.lock().unwrap().push(msg.key.to_string());
            }
            async move {
                if fixed {
                    Ok(())
                } else {
                    Err(HandlerError::permanent("the warehouse rejects it"))
                }
            }
        })
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_nats), ignore = "needs NATS: set NATS_URL=nats://…")]
async fn a_jetstream_dead_letter_is_listed_redriven_and_handled_once_under_its_key() {
    use async_nats::jetstream::{consumer::pull, stream};
    let url = std::env::var("NATS_URL").unwrap();
    let js = async_nats::jetstream::new(async_nats::connect(url.as_str()).await.unwrap());
    let root = unique("cliorders");
    let (orders_name, dlq_name) = (unique("CLI_ORDERS_"), unique("CLI_DLQ_"));
    let config = |name: &str, subjects: String| stream::Config {
        name: name.to_owned(),
        subjects: vec![subjects],
        max_age: Duration::from_secs(3600),
        ..Default::default()
    };
    let orders = js
        .create_stream(config(&orders_name, format!("{root}.orders.>")))
        .await
        .unwrap();
    js.create_stream(config(&dlq_name, format!("{root}.dlq.>")))
        .await
        .unwrap();
    let pull = orders
        .create_consumer(pull::Config {
            durable_name: Some("fulfilment".into()),
            ack_wait: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .unwrap();
    js.send_publish(
        format!("{root}.orders.paid"),
        async_nats::jetstream::message::PublishMessage::build()
            .payload("order 1".into())
            .message_id("m-1"),
    )
    .await
    .unwrap()
    .await
    .unwrap();

    let source = idem::consumer::nats::JetStreamSource::new(
        js.clone(),
        pull,
        format!("{root}.dlq.fulfilment"),
    );
    let consumer = Consumer::new("fulfilment", MemoryStore::new()).unwrap();
    let fixed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = Seen::default();
    let handler = warehouse!(consumer, fixed.clone(), seen.clone());
    let deliveries = source.deliveries().await.unwrap();
    let nats = ["--nats", url.as_str(), "--stream", dlq_name.as_str()];
    let args = |cmd: &[&'static str]| -> Vec<String> {
        cmd.iter()
            .map(|s| s.to_string())
            .chain(nats.iter().map(|s| s.to_string()))
            .collect()
    };
    let run = |a: Vec<String>| ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let work = async {
        assert!(
            until(|| consumer.stats().dead_lettered == 1).await,
            "{:?}",
            consumer.stats()
        );
        let listed: serde_json::Value =
            serde_json::from_str(&run(args(&["dead-letters", "list", "--json"]))).unwrap();
        let letter = &listed["dead_letters"][0];
        assert_eq!(letter["seq"], 1);
        assert_eq!(letter["key"], "m-1");
        assert_eq!(letter["original_subject"], format!("{root}.orders.paid"));
        assert_eq!(letter["consumer"], "fulfilment");
        assert_eq!(letter["delivered"], 1);
        assert_eq!(letter["reason"], "the warehouse rejects it");
        let table = run(args(&["dead-letters", "list"]));
        assert!(
            table.contains("m-1") && table.contains("the warehouse rejects it"),
            "{table}"
        );

        fixed.store(true, std::sync::atomic::Ordering::SeqCst);
        let out = run(args(&["dead-letters", "redrive", "--all"]));
        assert!(
            out.starts_with("re-drove 1 to ") && out.contains("under key m-1"),
            "{out}"
        );
        assert!(
            until(|| consumer.stats().completed == 1).await,
            "{:?}",
            consumer.stats()
        );
        // Gone from the dead letters once re-driven.
        assert_eq!(run(args(&["dead-letters", "list"])), "no dead letters\n");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    consumer.run_until(deliveries, handler, 4, work).await;
    assert_eq!(
        *seen.lock().unwrap(),
        ["m-1"],
        "handled once, under its original key"
    );
    assert_eq!(consumer.stats().completed, 1);
    let _ = js.delete_stream(&orders_name).await;
    let _ = js.delete_stream(&dlq_name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn a_rabbitmq_dead_letter_is_listed_redriven_and_handled_once_under_its_key() {
    use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
    use lapin::types::{AMQPValue, FieldTable};
    let url = std::env::var("AMQP_URL").unwrap();
    let conn = lapin::Connection::connect(&url, Default::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let (queue, dlq) = (unique("cli.orders."), unique("cli.dlq."));
    channel
        .queue_declare(
            dlq.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dlq.as_str().into()),
    );
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            arguments,
        )
        .await
        .unwrap();
    channel
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            b"order 1",
            lapin::BasicProperties::default().with_message_id("m-1".into()),
        )
        .await
        .unwrap()
        .await
        .unwrap();

    let source = idem::consumer::amqp::AmqpSource::new(channel.clone(), queue.as_str())
        .dead_letter_queue(dlq.as_str());
    let consumer = Consumer::new(queue.as_str(), MemoryStore::new()).unwrap();
    let fixed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = Seen::default();
    let handler = warehouse!(consumer, fixed.clone(), seen.clone());
    let deliveries = source.deliveries("cli-test").await.unwrap();
    let amqp = ["--amqp", url.as_str(), "--queue", dlq.as_str()];
    let run = |cmd: &[&str]| {
        let all: Vec<&str> = cmd.iter().copied().chain(amqp.iter().copied()).collect();
        ok(&all)
    };
    let work = async {
        assert!(
            until(|| consumer.stats().dead_lettered == 1).await,
            "{:?}",
            consumer.stats()
        );
        // The broker moves it to the dead-letter queue.
        let mut listed = serde_json::Value::Null;
        assert!(
            until(|| {
                listed = serde_json::from_str(&run(&["dead-letters", "list", "--json"])).unwrap();
                listed["dead_letters"]
                    .as_array()
                    .is_some_and(|a| a.len() == 1)
            })
            .await
        );
        let letter = &listed["dead_letters"][0];
        assert_eq!(letter["message_id"], "m-1");
        assert_eq!(letter["routing_key"], queue.as_str());
        assert_eq!(letter["queue"], queue.as_str());
        // The runner published it with its reason (the broker's `x-death` would only say
        // `rejected`).
        assert_eq!(letter["reason"], "the warehouse rejects it");
        // Listing gave it back.
        let table = run(&["dead-letters", "list"]);
        assert!(
            table.contains("m-1") && table.contains("the warehouse rejects it"),
            "{table}"
        );

        fixed.store(true, std::sync::atomic::Ordering::SeqCst);
        let out = run(&["dead-letters", "redrive", "m-1"]);
        assert!(out.starts_with("re-drove m-1 to exchange \"\""), "{out}");
        assert!(
            until(|| consumer.stats().completed == 1).await,
            "{:?}",
            consumer.stats()
        );
        assert_eq!(run(&["dead-letters", "list"]), "no dead letters\n");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    consumer.run_until(deliveries, handler, 4, work).await;
    assert_eq!(
        *seen.lock().unwrap(),
        ["m-1"],
        "handled once, under its original key"
    );
    for q in [&queue, &dlq] {
        let _ = channel
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
}

/// A dead letter's message id is whatever its publisher wrote: the table shows it escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_amqp), ignore = "needs RabbitMQ: set AMQP_URL=amqp://…")]
async fn a_rabbitmq_dead_letter_is_listed_without_its_control_characters() {
    use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
    use lapin::types::FieldTable;
    let url = std::env::var("AMQP_URL").unwrap();
    let conn = lapin::Connection::connect(&url, Default::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let dlq = unique("cli.dlq.esc.");
    channel
        .queue_declare(
            dlq.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let id = "m-\u{1b}]0;owned\u{7}\r1";
    channel
        .basic_publish(
            "".into(),
            dlq.as_str().into(),
            BasicPublishOptions::default(),
            b"order 1",
            lapin::BasicProperties::default().with_message_id(id.into()),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let amqp = ["--amqp", url.as_str(), "--queue", dlq.as_str()];
    let run = |cmd: &[&str]| {
        let all: Vec<&str> = cmd.iter().copied().chain(amqp.iter().copied()).collect();
        ok(&all)
    };
    let mut table = String::new();
    for _ in 0..50 {
        table = run(&["dead-letters", "list"]);
        if table != "no dead letters\n" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !table.contains(['\u{1b}', '\u{7}', '\r']) && table.contains(r"m-\x1b]0;owned\x07\r1"),
        "{table:?}"
    );
    let listed: serde_json::Value =
        serde_json::from_str(&run(&["dead-letters", "list", "--json"])).unwrap();
    assert_eq!(listed["dead_letters"][0]["message_id"], id);
    channel
        .queue_delete(dlq.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}
