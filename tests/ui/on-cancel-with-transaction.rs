use idem::{idempotent, Error, SqliteStore};

#[idempotent(scope = "order:<sku>", key = key, store = store, transaction = tx, on_cancel = "finish")]
async fn create_order(store: SqliteStore, sku: i64, key: String) -> Result<i64, Error> {
    Ok(sku)
}

fn main() {}
