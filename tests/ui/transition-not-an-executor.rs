use idem::{Error, Transition};

pub struct Db;

#[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "PAID")]
async fn mark_paid(db: &Db, order_no: &str) -> Result<Transition, Error>;

fn main() {}
