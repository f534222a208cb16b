use idem::{Error, Transition};

// `paid_by` is nullable: a row whose `paid_by` is NULL never equals the guard, so the
// transition would answer GuardMismatch for it forever.
#[idem::state_transition(
    table = "orders",
    key = "order_no",
    from = "PENDING",
    to = "PAID",
    guard = "paid_by",
    migrations = "migrations/pg"
)]
pub async fn mark_paid(db: &sqlx::PgPool, order_no: &str, paid_by: &str) -> Result<Transition, Error>;

fn main() {}
