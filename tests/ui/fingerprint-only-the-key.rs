use idem::{idempotent, Error};

// The key is the same on every retry: a retry with another amount would be answered with the
// first refund's amount.
#[idempotent(scope = "refund:<order_no>", key = key, fingerprint(key))]
async fn refund(order_no: String, key: String, cents: u64) -> Result<u64, Error> {
    Ok(cents)
}

fn main() {}
