use idem::Transition;

#[derive(Debug)]
pub enum DbError {
    Down,
}

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID")]
async fn mark_paid(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, DbError>;

fn main() {}
