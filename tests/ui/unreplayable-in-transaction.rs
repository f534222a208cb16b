use idem::{idempotent, Error, SqliteStore};

pub struct OrderRow {
    pub id: i64,
}

#[idempotent(scope = "order:<sku>", key = key, store = store, transaction = tx)]
async fn create(store: &SqliteStore, sku: i64, key: String) -> Result<OrderRow, Error> {
    Ok(OrderRow { id: sku })
}

fn main() {}
