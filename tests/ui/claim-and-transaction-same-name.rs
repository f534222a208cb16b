use idem::{idempotent, Error, SqliteStore};

#[idempotent(scope = "order:<sku>", key = key, store = store, transaction = tx, claim = tx)]
async fn create(store: &SqliteStore, sku: i64, key: String) -> Result<i64, Error> {
    Ok(sku)
}

fn main() {}
