use idem::{idempotent, Error};

#[idempotent(scope = "refund:<order_no>", key = key, fingerprint(order_no, cents))]
async fn refund(order_no: String, key: String, #[idem(skip)] cents: u64) -> Result<u64, Error> {
    Ok(cents)
}

fn main() {}
