//! The fulfilment worker's parts: its JetStream setup, its shipments table, and its handler, a
//! guarded transactional function that creates one shipment per paid order. The example's
//! `main` and the kill -9 tests (`tests/consumer_processes.rs`) both use them.

#![allow(dead_code)]

use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use idem::consumer::{HandlerError, Message};
use idem::{Idempotent, MySqlStore, PgStore, SqliteStore, Store, idempotent};
use serde::{Deserialize, Serialize};

/// The stream of order events, and what it captures.
pub const STREAM: &str = "ORDERS";
pub const SUBJECTS: &str = "order.>";
/// Where the worker's dead letters go, and their stream.
pub const DEAD_LETTER_STREAM: &str = "ORDERS_DLQ";
pub const DEAD_LETTERS: &str = "dlq.fulfilment";
/// The durable consumer: its name is the handler's scope.
pub const CONSUMER: &str = "fulfilment";
/// After how many deliveries a message that keeps failing is dead-lettered (by the runner: the
/// consumer itself redelivers without limit, so a dead letter that fails is not stranded).
pub const MAX_DELIVERIES: u32 = 5;
/// How long the order stream keeps messages: as long as the worker keeps its records (the
/// consumer default, 7 days), so a message redelivered or replayed always finds its record.
pub const MAX_AGE: Duration = idem::consumer::MESSAGE_RETAIN;

/// `order.paid`, as the refund service publishes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderPaid {
    pub order_no: String,
    pub amount_cents: i64,
}

/// A shipment: one per paid order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct Shipment {
    pub shipment_no: String,
    pub order_no: String,
    pub amount_cents: i64,
}

/// Creates the streams (if missing) and the durable pull consumer of `order.paid` in
/// `stream` / `dead_letter_stream` under the subject prefix `prefix` (empty in production; tests
/// isolate themselves with one).
///
/// With `replay`, the durable consumer is deleted first, so the new one delivers the stream from
/// its start again (as after restoring a backup): the guard answers every message already
/// handled with its stored shipment.
pub async fn jetstream_setup(
    js: &jetstream::Context,
    prefix: &str,
    ack_wait: Duration,
    replay: bool,
) -> Result<PullConsumer, Box<dyn std::error::Error + Send + Sync>> {
    let stream = js
        .get_or_create_stream(jetstream::stream::Config {
            name: format!("{}{STREAM}", name_prefix(prefix)),
            subjects: vec![format!("{prefix}{SUBJECTS}")],
            max_age: MAX_AGE,
            ..Default::default()
        })
        .await?;
    js.get_or_create_stream(jetstream::stream::Config {
        name: format!("{}{DEAD_LETTER_STREAM}", name_prefix(prefix)),
        subjects: vec![format!("{prefix}{DEAD_LETTERS}")],
        ..Default::default()
    })
    .await?;
    if replay {
        let _ = stream.delete_consumer(CONSUMER).await;
    }
    let consumer = stream
        .get_or_create_consumer(
            CONSUMER,
            jetstream::consumer::pull::Config {
                durable_name: Some(CONSUMER.into()),
                filter_subject: format!("{prefix}order.paid"),
                ack_wait,
                ..Default::default()
            },
        )
        .await?;
    Ok(consumer)
}

/// Deletes the order stream and the dead-letter stream under `prefix` (with the worker's durable
/// consumer), for a clean start: the next run of the service creates them empty. Returns the
/// names of the streams it deleted; a stream that does not exist is not an error.
pub async fn reset_streams(
    js: &jetstream::Context,
    prefix: &str,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let mut deleted = Vec::new();
    for stream in [STREAM, DEAD_LETTER_STREAM] {
        let name = format!("{}{stream}", name_prefix(prefix));
        match js.delete_stream(&name).await {
            Ok(_) => deleted.push(name),
            Err(e)
                if matches!(
                    e.kind(),
                    jetstream::context::DeleteStreamErrorKind::JetStream(js_error)
                        if js_error.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
                ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(deleted)
}

/// A stream-name prefix from a subject prefix (`t1.` → `T1_`).
pub fn name_prefix(prefix: &str) -> String {
    prefix
        .trim_end_matches('.')
        .replace(['.', '-'], "_")
        .to_uppercase()
        + if prefix.is_empty() { "" } else { "_" }
}

/// The longest order number a shipment takes: the refund service's (`VARCHAR(64)` on MySQL,
/// where a longer value would be refused by the column, not shipped). A message with a longer
/// one can never ship on any database.
pub const MAX_ORDER_NO: usize = 64;

pub const CREATE_SHIPMENTS_SQLITE: &str = "CREATE TABLE IF NOT EXISTS shipments (
    shipment_no TEXT PRIMARY KEY,
    order_no TEXT NOT NULL UNIQUE,
    amount_cents INTEGER NOT NULL,
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)";

pub const CREATE_SHIPMENTS_PG: &str = "CREATE TABLE IF NOT EXISTS shipments (
    shipment_no text PRIMARY KEY,
    order_no text NOT NULL UNIQUE,
    amount_cents bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now())";

/// Order numbers are compared byte for byte (`utf8mb4_bin`), as on the other databases: `ord-1`
/// is not `ORD-1`. A shipment number is `SHP-` and the order number.
pub const CREATE_SHIPMENTS_MYSQL: &str = "CREATE TABLE IF NOT EXISTS shipments (
    shipment_no VARCHAR(68) PRIMARY KEY,
    order_no VARCHAR(64) NOT NULL UNIQUE,
    amount_cents BIGINT NOT NULL,
    created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin";

/// The shipment of a paid order, read from its message. A payload that is not an `order.paid`,
/// an amount that is not positive or an order number no order has can never be shipped: final,
/// dead-lettered.
fn shipment_for(msg: &Message) -> Result<Shipment, HandlerError> {
    let paid: OrderPaid = msg.json()?;
    if paid.amount_cents <= 0 {
        return Err(HandlerError::permanent(format!(
            "order {} has a non-positive amount {}",
            paid.order_no, paid.amount_cents
        )));
    }
    if paid.order_no.is_empty() || paid.order_no.chars().count() > MAX_ORDER_NO {
        return Err(HandlerError::permanent(format!(
            "an order number has 1 to {MAX_ORDER_NO} characters, not {}",
            paid.order_no.chars().count()
        )));
    }
    Ok(Shipment {
        shipment_no: format!("SHP-{}", paid.order_no.trim_start_matches("ORD-")),
        order_no: paid.order_no,
        amount_cents: paid.amount_cents,
    })
}

/// A database the worker keeps its shipments and its records in: its `shipments` table, and
/// the handler on its store.
pub trait Shipments: Store + Clone + Send + Sync + 'static {
    /// Creates the `shipments` table if missing.
    fn create_shipments(&self) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// The handler: one shipment per message id, in the message's own transaction.
    fn fulfil(
        &self,
        msg: Message,
    ) -> impl Future<Output = Result<Idempotent<Shipment>, HandlerError>> + Send;
}

// No `ON CONFLICT` (or `INSERT IGNORE`): the guard is what keeps a message from shipping twice,
// and the unique order number turns a second shipment into an error that would be seen
// (retried, then dead-lettered), never into a silent no-op.
const INSERT: &str =
    "INSERT INTO shipments (shipment_no, order_no, amount_cents) VALUES ($1, $2, $3)";
const INSERT_MYSQL: &str =
    "INSERT INTO shipments (shipment_no, order_no, amount_cents) VALUES (?, ?, ?)";

/// The handler, declared once for every database the worker runs on: only the store's type,
/// the table and the placeholders of the insert differ.
macro_rules! fulfil {
    ($($(#[$doc:meta])* $name:ident: $store:ty, $create:expr, $insert:expr;)*) => {$(
        $(#[$doc])*
        #[idempotent(scope = "fulfil:<msg.consumer>", key = msg.key, store = store, transaction = tx)]
        pub async fn $name(
            store: &$store,
            msg: Message,
        ) -> Result<Idempotent<Shipment>, HandlerError> {
            let shipment = shipment_for(&msg)?;
            sqlx::query($insert)
                .bind(&shipment.shipment_no)
                .bind(&shipment.order_no)
                .bind(shipment.amount_cents)
                .execute(&mut **tx)
                .await
                .map_err(HandlerError::transient)?;
            Ok(Idempotent::Fresh(shipment))
        }

        impl Shipments for $store {
            async fn create_shipments(&self) -> Result<(), sqlx::Error> {
                sqlx::query($create).execute(self.pool()).await.map(drop)
            }

            fn fulfil(
                &self,
                msg: Message,
            ) -> impl Future<Output = Result<Idempotent<Shipment>, HandlerError>> + Send {
                $name(self, msg)
            }
        }
    )*};
}

fulfil! {
    /// The handler on SQLite.
    fulfil_sqlite: SqliteStore, CREATE_SHIPMENTS_SQLITE, INSERT;
    /// The handler on PostgreSQL.
    fulfil_pg: PgStore, CREATE_SHIPMENTS_PG, INSERT;
    /// The handler on MySQL or MariaDB, in a transaction the store begins `READ COMMITTED`: it
    /// locks no gaps, so a new message's claim holds up no other message's.
    fulfil_mysql: MySqlStore, CREATE_SHIPMENTS_MYSQL, INSERT_MYSQL;
}

/// Runs `$body` with `$store` bound to the store of the [`Database`] `$database` (each
/// database's own type, so the body is compiled once per database).
macro_rules! with_store {
    ($database:expr, $store:ident => $body:expr) => {
        match $database {
            $crate::worker::Database::Sqlite($store, _) => $body,
            $crate::worker::Database::Postgres($store) => $body,
            $crate::worker::Database::MySql($store) => $body,
        }
    };
}
// Every program that includes this file names the databases through it but the handler's
// own tests.
#[allow(unused_imports)]
pub(crate) use with_store;

/// The database `DATABASE_URL` names, with the worker's store on it: `postgres://…`,
/// `mysql://…` (or `mariadb://…`: MySQL or MariaDB), else a SQLite file.
pub enum Database {
    Sqlite(SqliteStore, String),
    Postgres(PgStore),
    MySql(MySqlStore),
}

impl Database {
    /// Connects to the database `url` names (on MySQL with the store's pool, whose sessions
    /// read committed rows and run in strict mode), and creates the `shipments` table and the
    /// store's if missing.
    pub async fn connect(url: &str) -> Result<Database, Box<dyn std::error::Error + Send + Sync>> {
        let database = if url.starts_with("postgres") {
            Database::Postgres(PgStore::connect(url).await?)
        } else if url.starts_with("mysql:") || url.starts_with("mariadb:") {
            Database::MySql(MySqlStore::connect(&url.replacen("mariadb:", "mysql:", 1)).await?)
        } else {
            Database::Sqlite(SqliteStore::connect(url).await?, url.to_owned())
        };
        with_store!(&database, store => store.create_shipments().await?);
        Ok(database)
    }
}

impl std::fmt::Display for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(_, url) => write!(f, "SQLite {url}"),
            Database::Postgres(_) => f.write_str("PostgreSQL"),
            Database::MySql(_) => f.write_str("MySQL"),
        }
    }
}
