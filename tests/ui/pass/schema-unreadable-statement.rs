//! A statement the parser cannot read makes the table it names uncertain: a column that is not
//! in the catalog is a warning, not an error (the statement may have added it).

use idem::{Error, Transition};

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", set = "paid_at = now()", migrations = "../migrations/unreadable")]
pub async fn mark_paid(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
