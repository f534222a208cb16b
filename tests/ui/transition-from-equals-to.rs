use idem::{Error, Transition};

#[idem::state_transition(table = "orders", key = "order_no", from = "PAID", to = "PAID")]
async fn repay(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
