use idem::{Error, Transition};

// `guard = "amount_cents"` needs an `amount_cents` argument to compare with.
#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", guard = "amount_cents")]
async fn mark_paid(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
