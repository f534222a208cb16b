use idem::{Error, Transition};

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID")]
async fn mark_paid(order_no: &str, db: &sqlx::PgPool) -> Result<Transition, Error>;

fn main() {}
