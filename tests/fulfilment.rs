//! The fulfilment worker's handler (`examples/fulfilment_worker`) on each database it runs on,
//! through the consumer runner without a broker: one shipment per paid order however often its
//! message is delivered, a second message for a shipped order refused by the database and
//! retried rather than shipped twice, and an order that can never ship dead-lettered at once.
//! The scenario is written once; `sqlite::…`, `postgres::…` and `mysql::…` run it. The broker
//! side is in `consumer_processes.rs` (kill -9 of the worker, on each database).

mod common;
#[path = "../examples/fulfilment_worker/worker.rs"]
mod worker;

use std::future::Future;

use idem::consumer::testing::TestDelivery;
use idem::consumer::{Consumer, Message, Settlement};
use idem::{MySqlStore, PgStore, SqliteStore};

use worker::{Shipment, Shipments};

/// A database the worker runs on: a store of its own with an empty `shipments` table.
trait Database: Shipments {
    /// What must live as long as the scenario: the database file, the schema, the database.
    type Guard;

    fn fresh() -> impl Future<Output = (Self, Self::Guard)>;

    /// The committed shipments, by the bytes of their order numbers.
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

/// On MySQL as a service connects: the store's own pool (`READ COMMITTED`, strict mode).
async fn mysql_store() -> (MySqlStore, common::MyDatabase) {
    let database = common::MyDatabase::create(&common::mysql_url(), 1).await;
    (MySqlStore::connect(&database.url).await.unwrap(), database)
}

/// [`Database`] for each store: its fixture, with the worker's `shipments` table.
macro_rules! database {
    ($($store:ty: $guard:ty = $fresh:path;)*) => {$(
        impl Database for $store {
            type Guard = $guard;

            async fn fresh() -> ($store, $guard) {
                let (store, guard) = $fresh().await;
                store.create_shipments().await.unwrap();
                (store, guard)
            }

            async fn shipments(&self) -> Vec<Shipment> {
                let mut rows: Vec<Shipment> =
                    sqlx::query_as("SELECT shipment_no, order_no, amount_cents FROM shipments")
                        .fetch_all(self.pool())
                        .await
                        .unwrap();
                // By their bytes: each database's collation orders text its own way.
                rows.sort_by(|a, b| a.order_no.cmp(&b.order_no));
                rows
            }
        }
    )*};
}

database! {
    SqliteStore: common::SqliteFile = sqlite_store;
    PgStore: common::PgSchema = pg_store;
    MySqlStore: common::MyDatabase = mysql_store;
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

    // Order numbers are compared byte for byte on every database (on MySQL a case-insensitive
    // collation would take `ord-1` for `ORD-1` and refuse it), and the longest one an order
    // has, in characters of any width, ships.
    let longest = format!("ORD-{}", "é".repeat(worker::MAX_ORDER_NO - 4));
    for (id, order_no, amount) in [
        ("order-paid-ord-1", "ord-1", 900),
        ("order-paid-longest", longest.as_str(), 300),
    ] {
        let settled = consumer.handle(&paid(id, order_no, amount), &handler).await;
        assert_eq!(settled, Settlement::Completed, "{order_no}");
    }

    // An amount that is not positive, a payload that is no `order.paid`, or an order number no
    // order has can never ship: dead-lettered at once, on every database alike.
    for bad in [
        paid("order-paid-ORD-3", "ORD-3", 0),
        TestDelivery::new("order-paid-ORD-4", "not json"),
        paid("order-paid-too-long", &format!("{longest}9"), 100),
        paid("order-paid-empty", "", 100),
    ] {
        let settled = consumer.handle(&bad, &handler).await;
        assert!(matches!(settled, Settlement::DeadLetter(_)), "{settled:?}");
    }

    let mut expected = vec![
        shipment(1, 1500),
        shipment(2, 700),
        Shipment {
            shipment_no: "SHP-ord-1".into(),
            order_no: "ord-1".into(),
            amount_cents: 900,
        },
        Shipment {
            shipment_no: format!("SHP-{}", "é".repeat(worker::MAX_ORDER_NO - 4)),
            order_no: longest.clone(),
            amount_cents: 300,
        },
    ];
    expected.sort_by(|a, b| a.order_no.cmp(&b.order_no));
    assert_eq!(store.shipments().await, expected);
    let stats = consumer.stats();
    assert_eq!(
        (stats.completed, stats.replayed, stats.dead_lettered),
        (4, 1, 4),
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

mod mysql {
    crate::backend_tests!(
        #[cfg_attr(
            not(idem_mysql),
            ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
        )]
        idem::MySqlStore: one_shipment_per_paid_order
    );
}
