use idem::{Error, Transition};

idem::state_machine! {
    pub enum OrderStatus {
        Pending = "PENDING",
        Paid = "PAID",
        Shipped = "SHIPPED",
        Done = "DONE",
        Cancelled = "CANCELLED",
    }
    Pending -> Paid -> Shipped -> Done;
    Pending -> Cancelled;
    Paid -> Cancelled;
}

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "REFUNDED", machine = OrderStatus)]
async fn refund(db: &sqlx::PgPool, order_no: &str) -> Result<Transition<(), OrderStatus>, Error>;

fn main() {}
