use idem::{idempotent, Error};

// A syntax error stops the reading of the arguments: it is the only error reported.
#[idempotent(key = key +, scope = "refund:<order_no>")]
async fn refund(order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
