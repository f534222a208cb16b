use idem::{Error, Transition};

// The machine has a state the column's ENUM does not: no transition could write it.
idem::state_machine! {
    pub enum OrderStatus {
        Pending = "PENDING",
        Paid = "PAID",
        Disputed = "DISPUTED",
    }
    Pending -> Paid -> Disputed;
}

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID", machine = OrderStatus, migrations = "migrations/mysql")]
pub async fn mark_paid(db: &sqlx::MySqlPool, order_no: &str) -> Result<Transition<(), OrderStatus>, Error>;

fn main() {}
