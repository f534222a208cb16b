use idem::{idempotent, Error};

pub struct Receipt {
    pub cents: u64,
}

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund(order_no: String, key: String) -> Result<Receipt, Error> {
    Ok(Receipt { cents: 1 })
}

fn main() {}
