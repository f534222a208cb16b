use idem::{idempotent, Error};

// `refund` and `cancel` would share records: a cancel would replay the refund's answer.
#[idempotent(scope = "<order_no>", key = key)]
async fn refund(order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
