use idem::{Error, Transition, Versioned};

// `orders.user_id` is not unique: a user has many orders.
#[idem::state_transition(table = "orders", key = "user_id", from = "PENDING", to = "CANCELLED", migrations = "migrations/sqlite")]
pub async fn cancel_for_user(db: &sqlx::SqlitePool, user_id: i64) -> Result<Transition, Error>;

// A versioned update is keyed the same way.
#[idem::versioned_update(table = "orders", key = "user_id", set = "note", version = "amount_cents", migrations = "migrations/sqlite")]
pub async fn note_for_user(db: &sqlx::SqlitePool, user_id: i64, note: &str, amount_cents: i64) -> Result<Versioned, Error>;

fn main() {}
