use idem::{Error, Transition};

// `refund_request = NULL` is never true: a row already in `to` would never be this owner's.
#[idem::state_transition(table = "orders", key = "order_no", from = "PAID", to = "REFUNDING", owner = "refund_request")]
async fn begin_refund(db: &sqlx::PgPool, order_no: &str, refund_request: Option<&str>) -> Result<Transition, Error>;

fn main() {}
