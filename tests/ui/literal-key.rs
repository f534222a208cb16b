use idem::{idempotent, Error};

// Every call would share one key, and get the first call's answer.
#[idempotent(scope = "refund:<order_no>", key = "refund")]
async fn refund(order_no: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
