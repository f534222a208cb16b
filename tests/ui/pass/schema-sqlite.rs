//! Checked against SQLite migrations: the order states are a CHECK list, a column is added by
//! `ALTER TABLE`.

use idem::{Created, Error, Transition};

#[derive(sqlx::FromRow)]
pub struct Order {
    pub id: i64,
}

#[idem::state_transition(
    table = "orders",
    key = "order_no",
    from = ["PENDING", "PAID"],
    to = "CANCELLED",
    set = "note",
    migrations = "../migrations/sqlite",
)]
pub async fn cancel(db: &sqlx::SqlitePool, order_no: &str, note: Option<&str>) -> Result<Transition, Error>;

#[idem::create_once(table = "orders", unique = "order_no", returning = Order, migrations = "../migrations/sqlite")]
pub async fn insert_order(db: &sqlx::SqlitePool, order_no: &str, user_id: i64, amount_cents: i64) -> Result<Created<Order>, Error>;

fn main() {}
