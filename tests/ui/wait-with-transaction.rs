use idem::{idempotent, Error, SqliteStore};

// A transactional duplicate already waits for the running call, on the record's row lock.
#[idempotent(scope = "order:<sku>", key = key, store = store, transaction = tx, wait = "2s")]
async fn create_order(store: SqliteStore, sku: i64, key: String) -> Result<i64, Error> {
    Ok(sku)
}

fn main() {}
