use idem::{idempotent, Error};

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund(order_no: String, key: String) -> Result<u32, Error> {
    Ok(claim.attempt())
}

fn main() {}
