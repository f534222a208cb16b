use idem::{idempotent, Error};

pub struct Headers {
    pub key: String,
}

// `key = headers.key` reads `headers`, which is not the key itself: it is fingerprinted.
#[idempotent(scope = "refund:<order_no>", key = headers.key)]
async fn refund(order_no: String, headers: Headers) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
