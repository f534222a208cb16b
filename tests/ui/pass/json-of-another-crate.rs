//! A `Json` that is not axum's, as the `Ok` type: replayed as the serde type it is. Only
//! axum's `Json<T>` and `(StatusCode, Json<T>)` are HTTP answers.

use idem::{idempotent, Error, MemoryStore};
use serde::{Deserialize, Serialize};

mod wire {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    pub struct Json<T>(pub T);
}

use wire::Json;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub cents: u64,
}

#[idempotent(scope = "refund:<order_no>", key = key, store = store)]
async fn refund(store: &MemoryStore, order_no: String, key: String) -> Result<Json<Receipt>, Error> {
    Ok(Json(Receipt { cents: order_no.len() as u64 }))
}

#[idempotent(scope = "capture:<order_no>", key = key, store = store)]
async fn capture(store: &MemoryStore, order_no: String, key: String) -> Result<(u16, Json<Receipt>), Error> {
    Ok((201, Json(Receipt { cents: order_no.len() as u64 })))
}

#[tokio::main]
async fn main() {
    let store = MemoryStore::new();
    let first = refund(&store, "A1".into(), "k".into()).await.unwrap();
    assert_eq!(refund(&store, "A1".into(), "k".into()).await.unwrap(), first);
    let first = capture(&store, "A1".into(), "k".into()).await.unwrap();
    assert_eq!(capture(&store, "A1".into(), "k".into()).await.unwrap(), first);
}
