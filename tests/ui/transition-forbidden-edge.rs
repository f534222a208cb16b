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

// Shipped orders cannot be cancelled: the machine has no SHIPPED -> CANCELLED edge.
#[idem::state_transition(table = "orders", key = "order_no", from = "SHIPPED", to = "CANCELLED", machine = OrderStatus)]
async fn cancel(db: &sqlx::PgPool, order_no: &str) -> Result<Transition<(), OrderStatus>, Error>;

fn main() {}
