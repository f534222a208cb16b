//! The transition macros on every executor type, with and without a machine.

use idem::{Created, Error, Transition, Versioned};

idem::state_machine! {
    pub enum OrderStatus {
        Pending = "PENDING",
        Paid = "PAID",
        Shipped = "SHIPPED",
        Done = "DONE",
        Cancelled = "CANCELLED",
    }
    Pending -> Paid -> Shipped -> Done;
    Pending -> Cancelled;
    Paid -> Cancelled;
}

#[derive(sqlx::FromRow)]
pub struct Order {
    pub id: i64,
    pub status: String,
}

#[idem::state_transition(
    table = "app.orders",
    key = "order_no",
    state = "status",
    from = ["PENDING"],
    to = "PAID",
    guard = "amount_cents",
    set = "paid_at = now(), paid_by",
    returning = Order,
    machine = OrderStatus,
    crate = "::idem",
)]
pub async fn mark_paid(
    db: &sqlx::PgPool,
    order_no: &str,
    amount_cents: i64,
    paid_by: &str,
) -> Result<Transition<Order, OrderStatus>, Error>;

#[idem::state_transition(table = "orders", key = "order_no", from = "PAID", to = "SHIPPED")]
pub async fn ship(db: &mut sqlx::SqliteConnection, order_no: &str) -> Result<Transition, Error>;

#[idem::versioned_update(table = "user_profile", key = "user_id", set = "nickname", version = "rev")]
pub async fn rename(
    db: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    user_id: i64,
    nickname: String,
    rev: i64,
) -> Result<Versioned, Error>;

#[idem::create_once(table = "orders", unique = "order_no", returning = Order)]
pub async fn insert_order(db: &sqlx::SqlitePool, order_no: &str, amount_cents: i64) -> Result<Created<Order>, Error>;

fn main() {}
