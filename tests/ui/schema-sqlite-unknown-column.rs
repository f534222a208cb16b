use idem::{Error, Transition};

#[idem::state_transition(table = "orders", key = "order_number", from = "PENDING", to = "PAID", migrations = "migrations/sqlite")]
pub async fn mark_paid(db: &sqlx::SqlitePool, order_number: &str) -> Result<Transition, Error>;

fn main() {}
