use idem::{Error, Transition};

#[idem::state_transition(table = "order", key = "order_no", from = "PENDING", to = "PAID", migrations = "migrations/mysql")]
pub async fn mark_paid(db: &sqlx::MySqlPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
