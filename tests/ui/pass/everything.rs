//! Every argument of #[idempotent] at once (two functions: `transaction` and
//! `on_cancel = "finish"` exclude each other), and the re-exported crate path.

use idem::{idempotent, Error, FinalError, SqliteStore};
use serde::{Deserialize, Serialize};

mod deps {
    pub use ::idem;
}

#[derive(Debug, Serialize, Deserialize)]
pub enum PayError {
    Declined,
    Idem(String),
}

impl From<Error> for PayError {
    fn from(e: Error) -> Self {
        PayError::Idem(e.to_string())
    }
}

impl FinalError for PayError {
    fn is_final(&self) -> bool {
        matches!(self, PayError::Declined)
    }
}

pub struct User {
    pub id: u64,
}

#[idempotent(
    scope = "pay:<user.id>:<order_no>",
    key = key,
    store = store,
    fingerprint(order_no, cents),
    lease = "30s",
    retain = "7d",
    on_error = "store_final",
    on_expired_lease = "fail_closed",
    transaction = tx,
    crate = "crate::deps::idem",
)]
async fn pay(store: &SqliteStore, user: &User, order_no: String, key: String, cents: u64) -> Result<u64, PayError> {
    let _conn: &mut sqlx::Transaction<'static, sqlx::Sqlite> = tx;
    Ok(cents + user.id)
}

#[idempotent(
    scope = "refund:<order_no>",
    key = key,
    store = store,
    skip(note),
    lease = "30s",
    retain = "7d",
    on_error = "store_final",
    on_expired_lease = "fail_closed",
    on_cancel = "finish",
    claim = c,
    crate = "crate::deps::idem",
)]
async fn refund(store: SqliteStore, order_no: String, key: String, note: String) -> Result<u64, PayError> {
    tokio::task::yield_now().await;
    Ok(u64::from(c.attempt()) + order_no.len() as u64 + note.len() as u64)
}

#[tokio::main]
async fn main() {
    let store = SqliteStore::in_memory().await.unwrap();
    let user = User { id: 1 };
    assert_eq!(pay(&store, &user, "A1".into(), "k".into(), 2).await.unwrap(), 3);
    assert_eq!(pay(&store, &user, "A1".into(), "k".into(), 2).await.unwrap(), 3);
    assert_eq!(refund(store.clone(), "A1".into(), "r".into(), String::new()).await.unwrap(), 3);
    assert_eq!(refund(store, "A1".into(), "r".into(), "x".into()).await.unwrap(), 3);
}
