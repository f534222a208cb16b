use idem::{Error, Transition};

// One string is one state: the column never holds `PENDING, PAID`.
#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING, PAID", to = "CANCELLED")]
async fn cancel(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
