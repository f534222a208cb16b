use idem::{idempotent, Error, Store};

#[idempotent(scope = "refund:<order_no>", key = key, store = store)]
async fn refund<S: Store>(store: &S, order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
