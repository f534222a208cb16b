use idem::{Error, Transition};

// The owner is one column.
#[idem::state_transition(table = "orders", key = "order_no", from = "PAID", to = "REFUNDING", owner = "refund_request, refunded_by")]
async fn begin_refund(db: &sqlx::PgPool, order_no: &str, refund_request: &str, refunded_by: &str) -> Result<Transition, Error>;

fn main() {}
