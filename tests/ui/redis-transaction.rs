use idem::{idempotent, Error, RedisStore};

// Redis keeps the records outside the database: there is no transaction to join.
#[idempotent(scope = "order:<sku>", key = key, store = store, transaction = tx)]
async fn create(store: &RedisStore, sku: u32, key: &str) -> Result<u32, Error> {
    Ok(sku)
}

fn main() {}
