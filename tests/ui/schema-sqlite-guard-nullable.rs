use idem::{Error, Transition};

// `note` is nullable (added by `ALTER TABLE … ADD COLUMN note TEXT`).
#[idem::state_transition(
    table = "orders",
    key = "order_no",
    from = "PENDING",
    to = "PAID",
    guard = "amount_cents, note",
    migrations = "migrations/sqlite"
)]
pub async fn mark_paid(db: &sqlx::SqlitePool, order_no: &str, amount_cents: i64, note: &str) -> Result<Transition, Error>;

fn main() {}
