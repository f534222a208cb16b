use idem::{Error, Transition};

// The migration says `orders`, unquoted: PostgreSQL folds it to lower case, and the generated
// SQL quotes `"Orders"`.
#[idem::state_transition(table = "Orders", key = "order_no", from = "PENDING", to = "PAID", migrations = "migrations/pg")]
pub async fn mark_paid(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
