//! The service's events: `order.paid` and `order.refunded`, enqueued in the outbox in the same
//! transaction as the transition they announce, and the relay that publishes them to NATS
//! JetStream when `NATS_URL` is set. Without it they wait in the outbox (`GET /api/outbox`).

use std::sync::OnceLock;
use std::time::Duration;

use idem::outbox::{Event, OutboxBackend, PendingEvent, Poll, Relay, Wake, event_id};
use idem::outbox::{MySqlOutbox, PgOutbox, SqliteOutbox};
use idem::{Error, Transition};
use serde_json::json;

use crate::db::{Db, MyDb, Order, OrderStatus, PgDb, SqliteDb};

/// The stream the events go to, and the subjects it captures.
pub const STREAM: &str = "ORDERS";
pub const SUBJECTS: &str = "order.>";

static RELAY: OnceLock<String> = OnceLock::new();

/// Where the relay publishes, or why it does not run.
pub fn relay_state() -> &'static str {
    RELAY
        .get()
        .map(String::as_str)
        .unwrap_or("off: set NATS_URL to publish the events")
}

fn db_error(e: sqlx::Error) -> Error {
    Error::Store(e.into())
}

/// The transitions that announce themselves, and the outbox they announce through.
pub trait Events: Db {
    /// The outbox, in the service's database.
    type Outbox: OutboxOps + Clone + 'static;

    fn outbox(&self) -> Self::Outbox;

    /// PENDING → PAID, enqueueing `order.paid` in the same transaction when it applies.
    fn mark_paid_announced(
        &self,
        order_no: &str,
        amount_cents: i64,
    ) -> impl Future<Output = Result<Transition<Order, OrderStatus>, Error>> + Send;

    /// REFUNDING → CANCELLED once the gateway moved the money, by the request that began the
    /// refund, enqueueing `order.refunded` in the same transaction when it applies.
    fn finish_refund_announced(
        &self,
        order_no: &str,
        refund_request: &str,
        refund_id: &str,
    ) -> impl Future<Output = Result<Transition<Order, OrderStatus>, Error>> + Send;

    /// The oldest events not yet published.
    fn pending_events(
        &self,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<PendingEvent>, Error>> + Send;

    /// Runs the relay to JetStream on this task until the process ends.
    fn relay(
        &self,
        js: async_nats::jetstream::Context,
    ) -> impl Future<Output = Result<(), Error>> + Send;
}

fn paid_event(order: &Order) -> Event {
    Event::new(
        event_id("order", &order.order_no, "paid"),
        "order.paid",
        order.order_no.as_str(),
        json!({ "orderNo": order.order_no, "amountCents": order.amount_cents }).to_string(),
    )
}

/// An order is refunded at most once (CANCELLED is final), so its event id comes from the
/// order alone.
fn refunded_event(order: &Order, refund_id: &str) -> Event {
    Event::new(
        event_id("order", &order.order_no, "refunded"),
        "order.refunded",
        order.order_no.as_str(),
        json!({
            "orderNo": order.order_no,
            "amountCents": order.amount_cents,
            "refundId": refund_id,
        })
        .to_string(),
    )
}

/// The transitions of `db.rs`, run on a transaction that also enqueues their event when they
/// apply; when they do not, nothing was written and the outcome says why.
macro_rules! events {
    ($db:ty, $outbox:ty, $module:ident) => {
        impl Events for $db {
            type Outbox = $outbox;

            fn outbox(&self) -> $outbox {
                <$outbox>::new(self.pool.clone())
            }

            async fn mark_paid_announced(
                &self,
                order_no: &str,
                amount_cents: i64,
            ) -> Result<Transition<Order, OrderStatus>, Error> {
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                let outcome =
                    crate::db::$module::mark_paid(&mut *tx, order_no, amount_cents).await?;
                if let Transition::Applied(order) = &outcome {
                    self.outbox().enqueue(&mut tx, &paid_event(order)).await?;
                    tx.commit().await.map_err(db_error)?;
                }
                Ok(outcome)
            }

            async fn finish_refund_announced(
                &self,
                order_no: &str,
                refund_request: &str,
                refund_id: &str,
            ) -> Result<Transition<Order, OrderStatus>, Error> {
                let mut tx = self.pool.begin().await.map_err(db_error)?;
                let outcome = crate::db::$module::finish_refund(
                    &mut *tx,
                    order_no,
                    refund_request,
                    refund_id,
                )
                .await?;
                if let Transition::Applied(order) = &outcome {
                    let event = refunded_event(order, refund_id);
                    self.outbox().enqueue(&mut tx, &event).await?;
                    tx.commit().await.map_err(db_error)?;
                }
                Ok(outcome)
            }

            async fn pending_events(&self, limit: u32) -> Result<Vec<PendingEvent>, Error> {
                self.outbox().pending(limit).await
            }

            async fn relay(&self, js: async_nats::jetstream::Context) -> Result<(), Error> {
                let relay = Relay::new(
                    self.outbox(),
                    idem::consumer::nats::JetStreamPublisher::new(js),
                )
                .poll(Duration::from_millis(200));
                let wake = self.outbox().wake().await?;
                let _ = RELAY.set("publishing to NATS JetStream".into());
                relay.run_until(wake, std::future::pending()).await;
                Ok(())
            }
        }
    };
}

events!(SqliteDb, SqliteOutbox, sqlite);
events!(PgDb, PgOutbox, postgres);
events!(MyDb, MySqlOutbox, mysql);

/// What the outboxes do their own way: create their table, and wake their relay
/// (PostgreSQL's `NOTIFY`; SQLite and MySQL poll).
pub trait OutboxOps: OutboxBackend {
    type Wake: Wake + 'static;
    fn migrate(&self) -> impl Future<Output = Result<(), Error>> + Send;
    fn wake(&self) -> impl Future<Output = Result<Self::Wake, Error>> + Send;
}

impl OutboxOps for SqliteOutbox {
    type Wake = Poll;
    fn migrate(&self) -> impl Future<Output = Result<(), Error>> + Send {
        SqliteOutbox::migrate(self)
    }
    async fn wake(&self) -> Result<Poll, Error> {
        Ok(Poll)
    }
}

impl OutboxOps for MySqlOutbox {
    type Wake = Poll;
    fn migrate(&self) -> impl Future<Output = Result<(), Error>> + Send {
        MySqlOutbox::migrate(self)
    }
    async fn wake(&self) -> Result<Poll, Error> {
        Ok(Poll)
    }
}

impl OutboxOps for PgOutbox {
    type Wake = sqlx::postgres::PgListener;
    fn migrate(&self) -> impl Future<Output = Result<(), Error>> + Send {
        PgOutbox::migrate(self)
    }
    fn wake(&self) -> impl Future<Output = Result<Self::Wake, Error>> + Send {
        self.listener()
    }
}

/// Creates the outbox table if missing.
pub async fn prepare<D: Events>(db: &D) -> Result<(), Error> {
    db.outbox().migrate().await
}

/// Connects to NATS at `url`, makes sure the stream exists, and runs the relay in the
/// background.
pub async fn start_relay<D: Events>(db: D, url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let client = async_nats::connect(url).await?;
    let js = async_nats::jetstream::new(client);
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec![SUBJECTS.into()],
        // As long as the consumers keep their records (7 days by default): a message the stream
        // still holds always finds its record (the fulfilment worker refuses a stream that
        // keeps messages longer).
        max_age: idem::consumer::MESSAGE_RETAIN,
        ..Default::default()
    })
    .await?;
    tokio::spawn(async move {
        if let Err(e) = db.relay(js).await {
            tracing::error!(error = %e, "the outbox relay stopped");
        }
    });
    Ok(())
}
