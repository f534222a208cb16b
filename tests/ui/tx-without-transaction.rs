use idem::{idempotent, Error, SqliteStore};

#[idempotent(scope = "order:<sku>", key = key, store = store)]
async fn create(store: &SqliteStore, sku: i64, key: String) -> Result<i64, Error> {
    sqlx::query("INSERT INTO orders (sku) VALUES ($1)")
        .bind(sku)
        .execute(&mut **tx)
        .await
        .map_err(|e| Error::Store(e.into()))?;
    Ok(sku)
}

fn main() {}
