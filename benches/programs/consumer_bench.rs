//! Throughput of a guarded JetStream consumer against the same consumer unguarded, on
//! PostgreSQL, measured side by side, interleaved, in one run.
//!
//! ```text
//! NATS_URL=nats://127.0.0.1:4222 DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --release --example consumer_bench -- [--messages N] [--concurrency C] \
//!   [--rounds R] [--partitions P] [--ordered]
//! ```
//!
//! Each round publishes N messages (not timed), each with an `Idem-Partition-Key` header naming
//! one of P partitions (default 100, round robin), then times one consumer draining them
//! through the runner (`Consumer::run`, double acks, keep-alives) with C handlers at once; with
//! `--ordered` the runner is in ordered mode (`Consumer::ordered`: one message of a partition
//! at a time, in order). Every handler inserts one row into `bench_shipments`:
//!
//! - `unguarded`: the insert alone (autocommit), acked after it;
//! - `separate`: `Consumer::guarded`, separate commits: claim, insert, complete;
//! - `transactional`: an `#[idempotent(transaction = tx)]` handler: claim, insert and completion
//!   in one transaction, one commit;
//! - `handwritten`: the inbox written by hand, the limit of the transactional mode: in one
//!   transaction, `INSERT` the message id `ON CONFLICT DO NOTHING` (a duplicate stops there),
//!   the insert, the answer stored, one commit; acked after it;
//! - `replay`: the transactional consumer's messages delivered again to a new durable consumer:
//!   every one answered from its record, nothing inserted.
//!
//! The run works in a PostgreSQL schema and JetStream streams of its own, and removes them.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, message::PublishMessage};
use bytes::Bytes;
use idem::consumer::nats::JetStreamSource;
use idem::consumer::{Consumer, HandlerError, Message, PARTITION_KEY_HEADER};
use idem::{PgStore, idempotent};
use sqlx::postgres::PgPoolOptions;

#[path = "support/cli.rs"]
mod cli;
#[path = "support/pg_schema.rs"]
mod pg_schema;
use pg_schema::RunSchema;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const INSERT: &str = "INSERT INTO bench_shipments (msg, payload) VALUES ($1, $2)";

/// The hand-written inbox: the message id first (a duplicate waits on the unique index for the
/// first to commit, then finds its row and stops), the effect, the answer, one commit.
async fn handwritten(pool: &sqlx::PgPool, msg: &Message) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let claimed =
        sqlx::query("INSERT INTO bench_inbox (msg) VALUES ($1) ON CONFLICT (msg) DO NOTHING")
            .bind(msg.key.as_str())
            .execute(&mut *tx)
            .await?
            .rows_affected();
    if claimed == 0 {
        return tx.rollback().await;
    }
    sqlx::query(INSERT)
        .bind(msg.key.as_str())
        .bind(&msg.payload[..])
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE bench_inbox SET result = $2 WHERE msg = $1")
        .bind(msg.key.as_str())
        .bind("1")
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

#[idempotent(scope = "bench:<msg.consumer>", key = msg.key, store = store, transaction = tx)]
async fn transactional(store: &PgStore, msg: Message) -> Result<i64, HandlerError> {
    sqlx::query(INSERT)
        .bind(msg.key.as_str())
        .bind(&msg.payload[..])
        .execute(&mut **tx)
        .await
        .map_err(HandlerError::transient)?;
    Ok(1)
}

struct Args {
    messages: usize,
    concurrency: usize,
    rounds: usize,
    partitions: usize,
    ordered: bool,
}

const USAGE: &str = "usage: consumer_bench [--messages N] [--concurrency C] [--rounds R] \
                     [--partitions P] [--ordered]";

fn args() -> Args {
    let mut a = Args {
        messages: 3000,
        concurrency: 32,
        rounds: 3,
        partitions: 100,
        ordered: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--help" | "-h" => cli::usage(USAGE, None),
            "--ordered" => {
                a.ordered = true;
                continue;
            }
            _ => {}
        }
        let value = cli::value(&mut it, &flag, USAGE);
        let number = || -> usize {
            value
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .unwrap_or_else(|| cli::usage(USAGE, Some(&format!("{flag} needs a number"))))
        };
        match flag.as_str() {
            "--messages" => a.messages = number(),
            "--concurrency" => a.concurrency = number(),
            "--rounds" => a.rounds = number(),
            "--partitions" => a.partitions = number(),
            other => cli::usage(USAGE, Some(&format!("unknown flag {other}"))),
        }
    }
    a
}

struct Bench {
    js: jetstream::Context,
    store: PgStore,
    prefix: String,
    args: Args,
}

impl Bench {
    /// A stream holding `n` messages of its own; returns its name.
    async fn stream(&self, name: &str) -> Result<jetstream::stream::Stream, BoxError> {
        let stream_name = format!("{}_{name}", self.prefix);
        let subject = format!("{}.{name}.paid", self.prefix);
        let stream = self
            .js
            .create_stream(jetstream::stream::Config {
                name: stream_name,
                subjects: vec![subject.clone()],
                // No longer than the runner's records live: the source refuses a stream that
                // keeps messages longer.
                max_age: idem::consumer::MESSAGE_RETAIN,
                ..Default::default()
            })
            .await?;
        let partitions = self.args.partitions;
        let acks = futures_util::future::join_all((0..self.args.messages).map(|n| {
            let (js, subject) = (self.js.clone(), subject.clone());
            async move {
                js.send_publish(
                    subject,
                    PublishMessage::build()
                        .payload(Bytes::from(format!("{{\"orderNo\":\"ORD-{n}\"}}")))
                        .message_id(format!("{name}-{n}"))
                        .header(
                            PARTITION_KEY_HEADER,
                            format!("P{}", n % partitions).as_str(),
                        ),
                )
                .await?
                .await
            }
        }))
        .await;
        for ack in acks {
            ack?;
        }
        Ok(stream)
    }

    /// Drains `stream` through the durable consumer `durable`, running `variant`; the time
    /// taken. The runner is always named `bench`, so a second durable consumer of the same
    /// stream meets the records of the first.
    async fn drain(
        &self,
        stream: &jetstream::stream::Stream,
        durable: &str,
        variant: &str,
    ) -> Result<Duration, BoxError> {
        let pull = stream
            .create_consumer(pull::Config {
                durable_name: Some(durable.into()),
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            })
            .await?;
        let source = JetStreamSource::new(self.js.clone(), pull, format!("{}.dlq", self.prefix))
            .batch(self.args.concurrency * 2);
        let runner = Consumer::new("bench", self.store.clone())?.ordered(self.args.ordered);
        let total = self.args.messages as u64;
        let r = runner.clone();
        let done = async move {
            while r.stats().acked() + r.stats().dead_lettered < total {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        let deliveries = source.deliveries().await?;
        let started = Instant::now();
        let c = self.args.concurrency;
        let pool = self.store.pool().clone();
        match variant {
            "unguarded" => {
                let handler = move |msg: Message| {
                    let pool = pool.clone();
                    async move {
                        sqlx::query(INSERT)
                            .bind(msg.key.as_str())
                            .bind(&msg.payload[..])
                            .execute(&pool)
                            .await
                            .map_err(HandlerError::transient)
                    }
                };
                runner.run_until(deliveries, handler, c, done).await
            }
            "handwritten" => {
                let handler = move |msg: Message| {
                    let pool = pool.clone();
                    async move {
                        handwritten(&pool, &msg)
                            .await
                            .map_err(HandlerError::transient)
                    }
                };
                runner.run_until(deliveries, handler, c, done).await
            }
            "separate" => {
                let handler = runner.guarded(move |msg: Message, _claim| {
                    let pool = pool.clone();
                    async move {
                        sqlx::query(INSERT)
                            .bind(msg.key.as_str())
                            .bind(&msg.payload[..])
                            .execute(&pool)
                            .await
                            .map_err(HandlerError::transient)?;
                        Ok::<_, HandlerError>(1)
                    }
                });
                runner.run_until(deliveries, handler, c, done).await
            }
            _ => {
                let store = self.store.clone();
                let handler = move |msg: Message| {
                    let store = store.clone();
                    async move { transactional(&store, msg).await }
                };
                runner.run_until(deliveries, handler, c, done).await
            }
        }
        let took = started.elapsed();
        let s = runner.stats();
        let expected = if variant == "replay" {
            (0, total)
        } else {
            (total, 0)
        };
        assert_eq!(
            (s.completed, s.replayed),
            expected,
            "{variant}: every message handled once: {s:?}"
        );
        Ok(took)
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = args();
    let nats = std::env::var("NATS_URL").map_err(|_| "set NATS_URL")?;
    let db = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL (PostgreSQL)")?;
    let prefix = format!("CBENCH_{}", std::process::id());
    let schema = RunSchema::create(&db, "cbench").await?;
    let options = schema.connect_options(&db)?;
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(args.concurrency).unwrap_or(32).min(40))
        .connect_with(options)
        .await?;
    sqlx::query("CREATE TABLE bench_shipments (msg text NOT NULL, payload bytea NOT NULL)")
        .execute(&pool)
        .await?;
    sqlx::query("CREATE TABLE bench_inbox (msg text PRIMARY KEY, result text)")
        .execute(&pool)
        .await?;
    let store = PgStore::builder().build(pool).await?;
    let js = jetstream::new(async_nats::connect(&nats).await?);
    let bench = Bench {
        js: js.clone(),
        store,
        prefix: prefix.clone(),
        args,
    };
    let mode = if bench.args.ordered {
        "ordered"
    } else {
        "unordered"
    };
    println!(
        "messages={} concurrency={} rounds={} partitions={} mode={mode}",
        bench.args.messages, bench.args.concurrency, bench.args.rounds, bench.args.partitions
    );

    let variants = ["unguarded", "separate", "transactional", "handwritten"];
    // The replays of the transactional variant's messages come last.
    let mut totals = [Duration::ZERO; 5];
    let mut streams = Vec::new();
    for round in 0..bench.args.rounds {
        // Rotated, so that no variant always goes first.
        for i in 0..variants.len() {
            let v = (i + round) % variants.len();
            let name = format!("r{round}{}", variants[v]);
            let stream = bench.stream(&name).await?;
            let took = bench.drain(&stream, "bench", variants[v]).await?;
            totals[v] += took;
            println!(
                "ROUND {round} variant={} msgs_per_sec={:.0}",
                variants[v],
                bench.args.messages as f64 / took.as_secs_f64()
            );
            if variants[v] == "transactional" {
                // The same messages through a second durable consumer: all replays.
                let took = bench.drain(&stream, "bench_again", "replay").await?;
                totals[4] += took;
                println!(
                    "ROUND {round} variant=replay msgs_per_sec={:.0}",
                    bench.args.messages as f64 / took.as_secs_f64()
                );
            }
            streams.push(stream);
        }
    }
    let total_msgs = (bench.args.messages * bench.args.rounds) as f64;
    let rate = |d: Duration| total_msgs / d.as_secs_f64();
    let base = rate(totals[0]);
    for (v, name) in [
        "unguarded",
        "separate",
        "transactional",
        "handwritten",
        "replay",
    ]
    .iter()
    .enumerate()
    {
        println!(
            "RESULT consumer=jetstream store=postgres mode={mode} variant={name} msgs_per_sec={:.0} ratio={:.2}",
            rate(totals[v]),
            rate(totals[v]) / base
        );
    }

    for s in streams {
        let name = s.cached_info().config.name.clone();
        let _ = js.delete_stream(&name).await;
    }
    schema.drop().await?;
    Ok(())
}
