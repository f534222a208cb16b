use idem::{Error, Transition};

#[idem::state_transition(table = "orders", key = "order_no", from = "PAID", to = "REFUNDING", migrations = "migrations/pg")]
pub async fn refund(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
