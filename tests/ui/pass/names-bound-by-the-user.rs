//! The body may bind `tx` and `claim` itself (a parameter, a `let`, a closure's parameter, a
//! pattern): without `transaction = …` or `claim = …`, they are the user's.

use idem::{idempotent, Error, MemoryStore};

pub struct Channel {
    pub tx: u32,
}

#[idempotent(scope = "param:<order_no>", key = key, store = store)]
async fn parameter(store: &MemoryStore, order_no: String, key: String, tx: u32) -> Result<u32, Error> {
    Ok(tx)
}

#[idempotent(scope = "let:<order_no>", key = key, store = store)]
async fn local(store: &MemoryStore, order_no: String, key: String) -> Result<u32, Error> {
    let claim = 2;
    Ok(claim)
}

#[idempotent(scope = "closure:<order_no>", key = key, store = store)]
async fn closure(store: &MemoryStore, order_no: String, key: String) -> Result<u32, Error> {
    let double = |tx: u32| tx * 2;
    Ok(double(2))
}

#[idempotent(scope = "pattern:<order_no>", key = key, store = store)]
async fn pattern(store: &MemoryStore, order_no: String, key: String, channel: Option<u32>) -> Result<u32, Error> {
    let Channel { tx } = Channel { tx: 4 };
    let claim = match channel {
        Some(claim) => claim,
        None => tx,
    };
    Ok(claim)
}

#[tokio::main]
async fn main() {
    let store = MemoryStore::new();
    assert_eq!(parameter(&store, "A1".into(), "k".into(), 1).await.unwrap(), 1);
    assert_eq!(local(&store, "A1".into(), "k".into()).await.unwrap(), 2);
    assert_eq!(closure(&store, "A1".into(), "k".into()).await.unwrap(), 4);
    assert_eq!(pattern(&store, "A1".into(), "k".into(), None).await.unwrap(), 4);
}
