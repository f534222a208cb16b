use idem::{Error, Transition};

#[idem::state_transition(table = "refunds", key = "id", state = "state", from = "SENT", to = "RETURNED", migrations = "migrations/mysql")]
pub async fn refund_returned(db: &mut sqlx::MySqlConnection, id: i64) -> Result<Transition, Error>;

fn main() {}
