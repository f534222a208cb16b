use idem::{idempotent, Error};

const REFUND_KEY: &str = "refund";

fn next_key() -> String {
    "k".to_owned()
}

// A key that reads no argument is the same on every call (or unrelated to the request): every
// call after the first gets the first call's answer.
#[idempotent(scope = "refund:<order_no>", key = REFUND_KEY)]
async fn refund(order_no: String) -> Result<u64, Error> {
    Ok(1)
}

#[idempotent(scope = "charge:<order_no>", key = format!("charge-{}", REFUND_KEY))]
async fn charge(order_no: String) -> Result<u64, Error> {
    Ok(1)
}

#[idempotent(scope = "ship:<order_no>", key = next_key())]
async fn ship(order_no: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
