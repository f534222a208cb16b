use idem::{idempotent, Error};

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund(order_no: Option<u64>, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
