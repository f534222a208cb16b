use idem::{Error, Transition};

// `amount_cents` is a BIGINT column.
#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", guard = "amount_cents", migrations = "migrations/pg")]
pub async fn mark_paid(db: &sqlx::PgPool, order_no: &str, amount_cents: &str) -> Result<Transition, Error>;

fn main() {}
