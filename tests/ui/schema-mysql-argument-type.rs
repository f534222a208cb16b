use idem::{Error, Transition};

// `amount_cents` is a BIGINT column.
#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", guard = "amount_cents", migrations = "migrations/mysql")]
pub async fn mark_paid(db: &sqlx::MySqlPool, order_no: &str, amount_cents: &str) -> Result<Transition, Error>;

fn main() {}
