use idem::Error;

mod deps {}

// Every generated path goes through `crate = "…"`: a path that does not exist is one error, on
// the string.
#[idem::idempotent(scope = "refund:<order_no>", key = key, crate = "crate::deps::idem")]
async fn refund(order_no: String, key: String, cents: u64) -> Result<u64, Error> {
    Ok(cents)
}

fn main() {}
