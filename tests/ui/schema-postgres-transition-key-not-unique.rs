use idem::{Error, Transition};

// `refunds.order_no` is not unique: an order can have many refunds, and the UPDATE would move
// every one of them.
#[idem::state_transition(
    table = "refunds",
    key = "order_no",
    state = "state",
    from = "REQUESTED",
    to = "SENT",
    migrations = "migrations/pg"
)]
pub async fn send_refund(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
