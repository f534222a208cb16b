//! `#[idempotent]` beside `#[tracing::instrument]`, in either order: each runs the body once
//! and replays the first answer.

use std::sync::atomic::{AtomicU32, Ordering};

use idem::{idempotent, Error, MemoryStore};

static ABOVE: AtomicU32 = AtomicU32::new(0);
static BELOW: AtomicU32 = AtomicU32::new(0);

#[tracing::instrument(skip(store))]
#[idempotent(scope = "above:<order_no>", key = key, store = store)]
async fn instrumented_outside(store: &MemoryStore, order_no: String, key: String) -> Result<u32, Error> {
    Ok(ABOVE.fetch_add(1, Ordering::SeqCst) + 1)
}

#[idempotent(scope = "below:<order_no>", key = key, store = store)]
#[tracing::instrument(skip(store))]
async fn instrumented_inside(store: &MemoryStore, order_no: String, key: String) -> Result<u32, Error> {
    Ok(BELOW.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::main]
async fn main() {
    let store = MemoryStore::new();
    for _ in 0..2 {
        assert_eq!(instrumented_outside(&store, "A1".into(), "k".into()).await.unwrap(), 1);
        assert_eq!(instrumented_inside(&store, "A1".into(), "k".into()).await.unwrap(), 1);
    }
    assert_eq!(ABOVE.load(Ordering::SeqCst), 1);
    assert_eq!(BELOW.load(Ordering::SeqCst), 1);
}
