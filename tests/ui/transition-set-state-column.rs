use idem::{Error, Transition};

// The state column is set to `to` by the transition itself.
#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", set = "status")]
async fn mark_paid(db: &sqlx::PgPool, order_no: &str, status: &str) -> Result<Transition, Error>;

fn main() {}
