//! The fulfilment worker's handler (`examples/fulfilment_worker`) on each database it runs on,
//! through the consumer runner without a broker: one shipment per paid order however often its
//! message is delivered, a second message for a shipped order refused by the database and
//! retried rather than shipped twice, and an order that can never ship dead-lettered at once.
//! The scenario is written once; `sqlite::…` and `postgres::…` run it. The broker side is in
//! `consumer_processes.rs` (kill -9 of the worker).

mod common;
#[path = "../examples/fulfilment_worker/worker.rs"]
mod worker;

use std::future::Future;

use idem::consumer::testing::TestDelivery;
use idem::consumer::{Consumer, HandlerError, Message, Settlement};
use idem::{Idempotent, PgStore, SqliteStore, Store};

use worker::Shipment;

/// A database the worker runs on: a store of its own with an empty `shipments` table, and the
/// worker's handler for it.
trait Database: Store + Clone + Send + Sync + 'static {
    /// What must live as long as the scenario: the database file, the schema.
    type Guard;

    fn fresh() -> impl Future<Output = (Self, Self::Guard)>;

    /// The worker's handler on this database.
    fn fulfil(
        &self,
        msg: Message,
    ) -> impl Future<Output = Result<Idempotent<Shipment>, HandlerError>> + Send;

    /// The committed shipments, by order number.
    fn shipments(&self) -> impl Future<Output = Vec<Shipment>>;
}

async fn sqlite_store() -> (SqliteStore, common::SqliteFile) {
    let file = common::SqliteFile::new();
    (SqliteStore::connect(&file.url).await.unwrap(), file)
}

async fn pg_store() -> (PgStore, common::PgSchema) {
    let schema = common::PgSchema::create(&common::pg_url(), 4).await;
    let store = PgStore::builder().build(schema.pool.clone()).await.unwrap();
    (store, schema)
}

/// [`Database`] for each store: its fixture, its `shipments` table, its handler.
macro_rules! database {
    ($($store:ty: $guard:ty = $fresh:path, $create:path, $fulfil:path;)*) => {$(
        impl Database for $store {
            type Guard = $guard;

            async fn fresh() -> ($store, $guard) {
                let (store, guard) = $fresh().await;
                sqlx::query($create).execute(store.pool()).await.unwrap();
                (store, guard)
            }

            fn fulfil(
                &self,
                msg: Message,
            ) -> impl Future<Output = Result<Idempotent<Shipment>, HandlerError>> + Send {
                $fulfil(self, msg)
            }

            async fn shipments(&self) -> Vec<Shipment> {
                sqlx::query_as("SELECT shipment_no, order_no, amount_cents FROM shipments ORDER BY order_no")
                    .fetch_all(self.pool())
                    .await
                    .unwrap()
            }
        }
    )*};
}

database! {
    SqliteStore: common::SqliteFile = sqlite_store, worker::CREATE_SHIPMENTS_SQLITE, worker::fulfil_sqlite;
    PgStore: common::PgSchema = pg_store, worker::CREATE_SHIPMENTS_PG, worker::fulfil_pg;
}

/// An `order.paid` message, as the refund service publishes it.
fn paid(id: &str, order_no: &str, amount_cents: i64) -> TestDelivery {
    let payload = serde_json::to_vec(&worker::OrderPaid {
        order_no: order_no.to_owned(),
        amount_cents,
    })
    .unwrap();
    TestDelivery::new(id, payload)
}

fn shipment(n: u32, amount_cents: i64) -> Shipment {
    Shipment {
        shipment_no: format!("SHP-{n}"),
        order_no: format!("ORD-{n}"),
        amount_cents,
    }
}

async fn one_shipment_per_paid_order<D: Database>() {
    let (store, _guard) = D::fresh().await;
    let consumer = Consumer::new(worker::CONSUMER, store.clone())
        .unwrap()
        .max_deliveries(worker::MAX_DELIVERIES);
    let s = store.clone();
    let handler = move |msg: Message| {
        let s = s.clone();
        async move { s.fulfil(msg).await }
    };

    // Paid, then redelivered: shipped once, the redelivery replayed.
    let first = paid("order-paid-ORD-1", "ORD-1", 1500);
    assert_eq!(
        consumer.handle(&first, &handler).await,
        Settlement::Completed
    );
    let again = paid("order-paid-ORD-1", "ORD-1", 1500).delivered(2);
    assert_eq!(
        consumer.handle(&again, &handler).await,
        Settlement::Replayed
    );
    let second = paid("order-paid-ORD-2", "ORD-2", 700);
    assert_eq!(
        consumer.handle(&second, &handler).await,
        Settlement::Completed
    );

    // The same order under another message id: the unique order number refuses a second
    // shipment, the transaction rolls back, and the message is retried, never shipped twice.
    let copy = paid("order-paid-ORD-1-copy", "ORD-1", 1500);
    let settled = consumer.handle(&copy, &handler).await;
    assert!(matches!(settled, Settlement::Retry(_)), "{settled:?}");

    // An amount that is not positive, or a payload that is no `order.paid`, can never ship.
    for bad in [
        paid("order-paid-ORD-3", "ORD-3", 0),
        TestDelivery::new("order-paid-ORD-4", "not json"),
    ] {
        let settled = consumer.handle(&bad, &handler).await;
        assert!(matches!(settled, Settlement::DeadLetter(_)), "{settled:?}");
    }

    assert_eq!(
        store.shipments().await,
        vec![shipment(1, 1500), shipment(2, 700)]
    );
    let stats = consumer.stats();
    assert_eq!(
        (stats.completed, stats.replayed, stats.dead_lettered),
        (2, 1, 2),
        "{stats:?}"
    );
}

mod sqlite {
    crate::backend_tests!(idem::SqliteStore: one_shipment_per_paid_order);
}

mod postgres {
    crate::backend_tests!(
        #[cfg_attr(
            not(idem_postgres),
            ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
        )]
        idem::PgStore: one_shipment_per_paid_order
    );
}
