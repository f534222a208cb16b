use idem::{Error, Transition};

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", set = "paid_at = now(), order_no")]
async fn mark_paid(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
