//! Checked against PostgreSQL migrations: an enum type for the order states (and a value added
//! by a later `ALTER TYPE`), a CHECK list for the refund states, columns added by
//! `ALTER TABLE`.

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
    set = "paid_at = now(), paid_by",
    returning = Order,
    machine = OrderStatus,
    migrations = "../migrations/pg",
)]
pub async fn mark_paid(
    db: &sqlx::PgPool,
    order_no: &str,
    amount_cents: i64,
    paid_by: Option<String>,
) -> Result<Transition<Order, OrderStatus>, Error>;

#[idem::state_transition(table = "refunds", key = "id", state = "state", from = "REQUESTED", to = "SENT", migrations = "../migrations/pg")]
pub async fn refund_sent(db: &mut sqlx::PgConnection, id: i64) -> Result<Transition, Error>;

#[idem::versioned_update(table = "user_profile", key = "user_id", set = "nickname", migrations = "../migrations/pg")]
pub async fn rename(db: &sqlx::PgPool, user_id: i64, nickname: &str, version: i64) -> Result<Versioned, Error>;

#[idem::create_once(table = "orders", unique = "order_no", returning = Order, migrations = "../migrations/pg")]
pub async fn insert_order(db: &sqlx::PgPool, order_no: &str, user_id: i64, amount_cents: i64) -> Result<Created<Order>, Error>;

fn main() {}
