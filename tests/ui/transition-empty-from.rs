use idem::{Error, Transition};

#[idem::state_transition(table = "orders", key = "order_no", from = [], to = "CANCELLED")]
async fn cancel(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
