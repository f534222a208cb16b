//! `migrations = false`: nothing is checked against them.

use idem::{Error, Transition};

#[idem::state_transition(table = "no_such_table", key = "order_no", from = "PENDING", to = "PAID", migrations = false)]
pub async fn mark_paid(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
