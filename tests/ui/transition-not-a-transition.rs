use idem::Error;

#[derive(sqlx::FromRow)]
pub struct Order {
    pub id: i64,
}

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", returning = Order)]
async fn mark_paid(db: &sqlx::PgPool, order_no: &str) -> Result<Order, Error>;

fn main() {}
