use idem::{idempotent, Error};

// The claim would run out before the body is done, and a retry would run it again.
#[idempotent(scope = "refund:<order_no>", key = key, lease = "1ms")]
async fn refund(order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
