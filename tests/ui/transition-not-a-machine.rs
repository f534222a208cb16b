use idem::{Error, Transition};

pub enum OrderStatus {
    Pending,
    Paid,
}

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", machine = OrderStatus)]
async fn mark_paid(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

fn main() {}
