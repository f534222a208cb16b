use idem::{Error, Transition};

// `amount_cents = NULL` is never true: with `None` the transition could never apply.
#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", guard = "amount_cents")]
async fn mark_paid(db: &sqlx::PgPool, order_no: &str, amount_cents: Option<i64>) -> Result<Transition, Error>;

fn main() {}
