use idem::{idempotent, Error};

// Four mistakes in one attribute (an unknown placeholder, an unknown argument, a malformed
// duration, a missing key): each is reported once, on its own tokens, and nothing else; the
// function is still emitted as written, so its callers produce no errors.
#[idempotent(scope = "refund:<order>", ttl = "5m", lease = "soon")]
async fn refund(order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

async fn caller() -> Result<u64, Error> {
    refund("A1".into(), "k".into()).await
}

fn main() {
    let _ = caller;
}
