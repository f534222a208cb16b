// The warning of `pass/schema-unreadable-statement.rs`, made an error here to show its text.
#![deny(deprecated)]

use idem::{Error, Transition};

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", set = "paid_at = now()", migrations = "migrations/unreadable")]
pub async fn mark_paid(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
