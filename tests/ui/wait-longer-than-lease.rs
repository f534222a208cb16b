use idem::{idempotent, Error};

// A duplicate would go on waiting after the running call is presumed dead.
#[idempotent(scope = "refund:<order_no>", key = key, lease = "10s", wait = "1m")]
async fn refund(order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
