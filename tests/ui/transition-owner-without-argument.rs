use idem::{Error, Transition};

#[idem::state_transition(table = "orders", key = "order_no", from = "PAID", to = "REFUNDING", owner = "refund_request")]
async fn begin_refund(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
