use idem::{Error, Transition};

// The migration says `orders`: MySQL keeps a table's name as written and, on Linux, tells
// `Orders` apart from it.
#[idem::state_transition(table = "Orders", key = "order_no", from = "PENDING", to = "PAID", migrations = "migrations/mysql")]
pub async fn mark_paid(db: &sqlx::MySqlPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
