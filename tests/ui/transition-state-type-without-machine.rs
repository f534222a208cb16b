use idem::{Error, Transition};

idem::state_machine! {
    pub enum OrderStatus {
        Pending = "PENDING",
        Paid = "PAID",
    }
    Pending -> Paid;
}

// Without `machine = OrderStatus`, `from` and `to` are not checked against it.
#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAYED")]
async fn mark_paid(db: &sqlx::PgPool, order_no: &str) -> Result<Transition<(), OrderStatus>, Error>;

fn main() {}
