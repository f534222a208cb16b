use idem::idempotent;

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund(order_no: String, key: String) -> Result<u64, std::io::Error> {
    Ok(1)
}

#[idempotent(scope = "capture:<order_no>", key = key)]
async fn capture(order_no: String, key: String) -> std::io::Result<u64> {
    Ok(1)
}

fn main() {}
