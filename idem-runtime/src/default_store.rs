//! The store used by `#[idempotent]` functions that do not name one.

use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::store::{Operation, Reply, SharedStore, Store};

static DEFAULT: OnceLock<SharedStore> = OnceLock::new();

/// Installs the store that `#[idempotent]` functions without a `store = …` argument use.
///
/// Call it once at start-up. A second call is refused with [`Error::Config`] and changes
/// nothing: records must not silently move to another store while a service runs.
pub fn set_default_store<S: Store>(store: S) -> Result<()> {
    DEFAULT
        .set(SharedStore::new(store))
        .map_err(|_| Error::Config("a default idempotency store is already installed".into()))
}

/// The installed default store, if any.
pub fn default_store() -> Option<&'static SharedStore> {
    DEFAULT.get()
}

/// The default store, looked up on every call: [`Error::NoDefaultStore`] until one is installed.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultStore;

fn get() -> Result<&'static SharedStore> {
    DEFAULT.get().ok_or(Error::NoDefaultStore)
}

impl Store for DefaultStore {
    async fn call(&self, op: Operation<'_>) -> Result<Reply> {
        get()?.call(op).await
    }
    fn defer(&self, write: crate::store::Deferred) {
        match get() {
            Ok(store) => store.defer(write),
            Err(_) => {
                tracing::warn!(target: "idem", scope = write.scope, key = write.key, "a claim's write was deferred with no default store installed; the claim runs out its lease")
            }
        }
    }
    fn changes(&self) -> Option<&crate::store::Changes> {
        get().ok()?.changes()
    }
}
