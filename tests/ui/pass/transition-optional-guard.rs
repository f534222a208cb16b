//! A guard argument that is an `Option` is compared NULL-safely, so `None` matches a NULL
//! column (`IS NOT DISTINCT FROM`, `IS`): it compiles (its outcomes are in tests/transitions.rs).

use idem::{Error, Transition};

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", guard = "amount_cents")]
async fn mark_paid(db: &sqlx::PgPool, order_no: &str, amount_cents: Option<i64>) -> Result<Transition, Error>;

fn main() {
    let _ = mark_paid;
}
