//! Checked against MySQL migrations: the order states are the column's `ENUM`, grown by
//! `ALTER TABLE … MODIFY COLUMN`; the refund states a CHECK list; a column renamed by
//! `CHANGE COLUMN`; a `TINYINT(1)` set from a `bool`; a column written in another case (MySQL
//! compares column names ignoring case). The check says nothing about any of it: its warnings
//! would be errors here.

#![deny(deprecated)]

use idem::{Created, Error, Transition, Versioned};

idem::state_machine! {
    pub enum OrderStatus {
        Pending = "PENDING",
        Paid = "PAID",
        Shipped = "SHIPPED",
        Done = "DONE",
        Refunded = "REFUNDED",
        Cancelled = "CANCELLED",
    }
    Pending -> Paid -> Shipped -> Done -> Refunded;
    Pending -> Cancelled;
    Paid -> Cancelled;
}

#[derive(sqlx::FromRow)]
pub struct Order {
    pub id: i64,
    pub order_no: String,
}

#[idem::state_transition(
    table = "orders",
    key = "order_no",
    from = "PENDING",
    to = "PAID",
    guard = "amount_cents",
    set = "paid_at = now(), paid_by_user, express",
    returning = Order,
    machine = OrderStatus,
    migrations = "../migrations/mysql",
)]
pub async fn mark_paid(
    db: &sqlx::MySqlPool,
    order_no: &str,
    amount_cents: i64,
    paid_by_user: Option<String>,
    express: bool,
) -> Result<Transition<Order, OrderStatus>, Error>;

#[idem::state_transition(table = "refunds", key = "id", state = "state", from = "REQUESTED", to = "SENT", migrations = "../migrations/mysql")]
pub async fn refund_sent(db: &mut sqlx::MySqlConnection, id: i64) -> Result<Transition, Error>;

#[allow(non_snake_case)]
#[idem::state_transition(table = "orders", key = "Order_No", from = "DONE", to = "REFUNDED", migrations = "../migrations/mysql")]
pub async fn refunded(db: &mut sqlx::Transaction<'_, sqlx::MySql>, Order_No: &str) -> Result<Transition, Error>;

#[idem::versioned_update(table = "user_profile", key = "user_id", set = "nickname", migrations = "../migrations/mysql")]
pub async fn rename(db: &sqlx::MySqlPool, user_id: i64, nickname: &str, version: i64) -> Result<Versioned, Error>;

#[idem::create_once(table = "orders", unique = "order_no", returning = Order, migrations = "../migrations/mysql")]
pub async fn insert_order(db: &sqlx::MySqlPool, order_no: &str, user_id: i64, amount_cents: i64) -> Result<Created<Order>, Error>;

fn main() {}
