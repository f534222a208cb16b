use idem::{idempotent, Error};

#[idempotent(scope = "refund:<>", key = key)]
async fn refund(order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
