use idem::{Error, Transition, Versioned};

// `payment_ref` lost its unique key to `ALTER TABLE … DROP INDEX`: the UPDATE could move every
// order that shares one.
#[idem::state_transition(table = "orders", key = "payment_ref", from = "PENDING", to = "PAID", migrations = "migrations/mysql")]
pub async fn mark_paid(db: &sqlx::MySqlPool, payment_ref: &str) -> Result<Transition, Error>;

// `orders.user_id` has an index, not a unique one: a user has many orders.
#[idem::versioned_update(table = "orders", key = "user_id", set = "paid_by_user", version = "amount_cents", migrations = "migrations/mysql")]
pub async fn paid_by(db: &sqlx::MySqlPool, user_id: i64, paid_by_user: &str, amount_cents: i64) -> Result<Versioned, Error>;

fn main() {}
