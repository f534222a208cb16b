//! The fulfilment worker: consumes `order.paid` from NATS JetStream and creates one shipment per
//! paid order, however often the event is published or redelivered.
//!
//! ```text
//! NATS_URL=nats://127.0.0.1:4222 cargo run --example fulfilment_worker          # SQLite fulfilment_worker.db
//! NATS_URL=… DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run --example fulfilment_worker
//! NATS_URL=… DATABASE_URL=mysql://root@127.0.0.1:3306/fulfilment cargo run --example fulfilment_worker
//! cargo run --example fulfilment_worker -- --replay    # consume the stream again from its start
//! cargo run --example fulfilment_worker -- --reset     # delete the streams, for a clean start
//! ```
//!
//! Its handler is a transactional `#[idempotent]` function (`worker.rs`): the claim on the
//! message id, the shipment row and the completion commit together, and the runner acks only
//! after that commit. A payload it can never process goes to `dlq.fulfilment` with the reason.
//! See the guide (`src/guide/walkthrough.md`) for a walkthrough with the refund service.

mod worker;

use std::time::Duration;

use idem::Idempotent;
use idem::consumer::nats::JetStreamSource;
use idem::consumer::{Consumer, HandlerError, Message};
use tracing_subscriber::EnvFilter;

use worker::{Shipment, Shipments};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Prints what a handler did: a new shipment, or the one a redelivery replayed.
fn report(result: &Result<Idempotent<Shipment>, HandlerError>, msg_id: &str) {
    match result {
        Ok(Idempotent::Fresh(s)) => println!(
            "shipment {} for {} ({} cents), message {msg_id}",
            s.shipment_no, s.order_no, s.amount_cents
        ),
        Ok(Idempotent::Replayed(s)) => println!(
            "message {msg_id} again: shipment {} already created, acked without a second one",
            s.shipment_no
        ),
        Err(_) => {}
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .init();
    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let db_url =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://fulfilment_worker.db".into());
    // Tests isolate themselves under a subject prefix; in production it is empty.
    let prefix = std::env::var("FULFILMENT_PREFIX").unwrap_or_default();
    let ack_wait = std::env::var("FULFILMENT_ACK_WAIT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis)
        .unwrap_or(Duration::from_secs(30));

    let client = async_nats::connect(&nats_url).await?;
    let js = async_nats::jetstream::new(client);
    if std::env::args().any(|a| a == "--reset") {
        // A clean start: the streams go (the service recreates them empty when it starts);
        // the databases are files to delete, or tables to drop, and are the user's to remove.
        let deleted = worker::reset_streams(&js, &prefix).await?;
        println!("deleted the streams {deleted:?} from {nats_url}");
        return Ok(());
    }
    let replay = std::env::args().any(|a| a == "--replay");
    let pull = worker::jetstream_setup(&js, &prefix, ack_wait, replay).await?;
    let source = JetStreamSource::new(js, pull, format!("{prefix}{}", worker::DEAD_LETTERS));
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };

    let database = worker::Database::connect(&db_url).await?;
    let consuming = format!("fulfilment_worker consuming order.paid from {nats_url} ({database})");
    let stats = worker::with_store!(database, store => {
        consume(source, store, &consuming, shutdown).await?
    });
    println!(
        "stopped: {} completed, {} replayed, {} retried, {} in progress elsewhere, {} dead-lettered",
        stats.completed, stats.replayed, stats.retried, stats.in_progress, stats.dead_lettered
    );
    Ok(())
}

/// Runs the worker's handler on `store` over the deliveries of `source` until `shutdown`,
/// saying `consuming` once they flow; what it did.
async fn consume<S: Shipments>(
    source: JetStreamSource,
    store: S,
    consuming: &str,
    shutdown: impl Future<Output = ()>,
) -> Result<idem::consumer::Stats, BoxError> {
    let deliveries = source.deliveries().await?;
    println!("{consuming}");
    let consumer = Consumer::new(source.consumer_name(), store.clone())?
        .max_deliveries(worker::MAX_DELIVERIES);
    let handler = move |msg: Message| {
        let store = store.clone();
        async move {
            let id = msg.key.to_string();
            let r = store.fulfil(msg).await;
            report(&r, &id);
            r
        }
    };
    consumer.run_until(deliveries, handler, 32, shutdown).await;
    Ok(consumer.stats())
}
