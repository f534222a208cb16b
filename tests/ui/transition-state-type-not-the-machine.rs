use idem::{Error, Transition};

idem::state_machine! {
    pub enum OrderStatus {
        Pending = "PENDING",
        Paid = "PAID",
    }
    Pending -> Paid;
}

idem::state_machine! {
    pub enum RefundStatus {
        Requested = "REQUESTED",
        Refunded = "REFUNDED",
    }
    Requested -> Refunded;
}

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", machine = OrderStatus)]
async fn mark_paid(db: &sqlx::PgPool, order_no: &str) -> Result<Transition<(), RefundStatus>, Error>;

fn main() {}
