use idem::idempotent;

#[idempotent(scope = "pay:<order_no>", key = key, on_error = "store_final")]
async fn pay<E: From<idem::Error>>(order_no: String, key: String) -> Result<u64, E> {
    Ok(1)
}

fn main() {}
