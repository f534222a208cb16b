use idem::{Error, Transition};

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", guard = "amount_cents")]
async fn mark_paid(db: &sqlx::PgPool, order_no: &str, amount_cents: u64) -> Result<Transition, Error>;

fn main() {}
