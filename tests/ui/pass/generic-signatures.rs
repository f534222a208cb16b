//! Generic stores, answers and errors with the bounds they need, an `impl Trait` argument that
//! is `Serialize`, a store behind a reference to a pointer, and boxed errors.

use std::sync::Arc;

use idem::{idempotent, Error, MemoryStore, Store};
use serde::de::DeserializeOwned;
use serde::Serialize;

#[idempotent(scope = "generic:<order_no>", key = key, store = store)]
async fn generic<S, T, E>(store: &S, order_no: String, key: String, answer: T) -> Result<T, E>
where
    S: Store + Clone,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
{
    Ok(answer)
}

/// Traits of the user's that carry the bounds as supertraits: the compiler judges them.
pub trait Answer: Serialize + DeserializeOwned {}

impl Answer for u64 {}

pub trait AppError: From<Error> {}

impl AppError for Error {}

#[idempotent(scope = "supertraits:<order_no>", key = key, store = store)]
async fn supertraits<T: Answer, E: AppError>(store: &MemoryStore, order_no: String, key: String, answer: T) -> Result<T, E> {
    Ok(answer)
}

#[idempotent(scope = "opaque:<order_no>", key = key, store = store)]
async fn opaque(store: impl Store + Clone, order_no: String, key: String, note: impl Serialize) -> Result<String, Error> {
    Ok(order_no)
}

#[idempotent(scope = "pointer:<order_no>", key = key, store = store)]
async fn pointer(store: &Arc<MemoryStore>, order_no: String, key: String, cents: u64) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    Ok(cents)
}

#[tokio::main]
async fn main() {
    let store = MemoryStore::new();
    let first: Result<u64, Error> = generic(&store, "A1".into(), "k".into(), 7u64).await;
    assert_eq!(first.unwrap(), 7);
    let replayed: Result<u64, Error> = generic(&store, "A1".into(), "k".into(), 7u64).await;
    assert_eq!(replayed.unwrap(), 7);
    assert_eq!(opaque(store.clone(), "A1".into(), "k".into(), 3u8).await.unwrap(), "A1");
    assert!(opaque(store.clone(), "A1".into(), "k".into(), 4u8).await.is_err(), "another request under the same key");
    let answer: Result<u64, Error> = supertraits(&store, "A1".into(), "k".into(), 9u64).await;
    assert_eq!(answer.unwrap(), 9);
    let shared = Arc::new(store);
    assert_eq!(pointer(&shared, "A1".into(), "k".into(), 5).await.unwrap(), 5);
}
