use idem::{Error, Transition};

// `REFUNDED` was added to the column's ENUM by `ALTER TABLE … MODIFY COLUMN`; `REFUNDING` never.
#[idem::state_transition(table = "orders", key = "order_no", from = "PAID", to = "REFUNDING", migrations = "migrations/mysql")]
pub async fn refund(db: &sqlx::MySqlPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
