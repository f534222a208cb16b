use idem::{idempotent, Error, MemoryStore};

#[idempotent(scope = "order:<sku>", key = key, store = store, transaction = tx)]
async fn create(store: &MemoryStore, sku: u32, key: &str) -> Result<u32, Error> {
    Ok(sku)
}

fn main() {}
