use idem::{idempotent, Error};

#[idempotent(scope = "refund:<order_no>", key = key, on_cancel = "abort")]
async fn refund(order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
