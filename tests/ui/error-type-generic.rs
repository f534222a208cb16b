use idem::idempotent;

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund<E>(order_no: String, key: String) -> Result<u64, E> {
    Ok(1)
}

fn main() {}
