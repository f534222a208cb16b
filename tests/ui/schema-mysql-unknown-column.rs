use idem::{Error, Transition};

// `paid_at` was added by the second migration; `paid_on` is in none.
#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", set = "paid_on = now()", migrations = "migrations/mysql")]
pub async fn mark_paid(db: &sqlx::MySqlPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
