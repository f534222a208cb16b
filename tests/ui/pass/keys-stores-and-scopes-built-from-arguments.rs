//! What the checks against constant keys, stores built per call and float placeholders must let
//! through: a key built from an argument (in a macro's inline format argument too), a store
//! reached through a static or a method of the application state, integer and text
//! placeholders, and a generic `Display` placeholder.

use std::sync::LazyLock;

use idem::{idempotent, Error, MemoryStore};

static STORE: LazyLock<MemoryStore> = LazyLock::new(MemoryStore::new);

pub struct App {
    idem: MemoryStore,
}

impl App {
    fn store(&self) -> &MemoryStore {
        &self.idem
    }
}

#[idempotent(scope = "refund:<order_no>:<cents>", key = format!("{key}-refund"), store = *STORE)]
async fn refund(order_no: &str, cents: u64, key: String) -> Result<u64, Error> {
    Ok(cents)
}

#[idempotent(scope = "charge:<order_no>", key = format!("{}-charge", key.trim()), store = app.store(), skip(app))]
async fn charge(app: &App, order_no: String, key: String) -> Result<u32, Error> {
    Ok(1)
}

#[idempotent(scope = "item:<id>", key = key, store = app.store().clone(), skip(app))]
async fn item<T: std::fmt::Display + serde::Serialize + Send + Sync>(
    app: &App,
    id: T,
    key: &str,
) -> Result<u32, Error> {
    Ok(2)
}

#[tokio::main]
async fn main() {
    let app = App { idem: MemoryStore::new() };
    assert_eq!(refund("A1", 5, "k1".into()).await.unwrap(), 5);
    assert_eq!(charge(&app, "A1".into(), " k2 ".into()).await.unwrap(), 1);
    assert_eq!(item(&app, 7u8, "k3").await.unwrap(), 2);
}
