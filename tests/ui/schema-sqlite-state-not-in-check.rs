use idem::{Error, Transition};

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "paid", migrations = "migrations/sqlite")]
pub async fn mark_paid(db: &sqlx::SqlitePool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
