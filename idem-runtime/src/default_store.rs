//! The store used by `#[idempotent]` functions that do not name one.

use std::sync::OnceLock;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, Record, StoredResponse};
use crate::store::{SharedStore, Store};

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
    async fn begin(&self, req: BeginRequest<'_>) -> Result<BeginOutcome> {
        get()?.begin(req).await
    }
    async fn complete(&self, claim: ClaimRef<'_>, response: &StoredResponse) -> Result<()> {
        get()?.complete(claim, response).await
    }
    async fn release(&self, claim: ClaimRef<'_>) -> Result<()> {
        get()?.release(claim).await
    }
    async fn checkpoint(
        &self,
        claim: ClaimRef<'_>,
        recovery_point: &[u8],
        lease: Duration,
    ) -> Result<()> {
        get()?.checkpoint(claim, recovery_point, lease).await
    }
    async fn renew(&self, claim: ClaimRef<'_>, lease: Duration) -> Result<()> {
        get()?.renew(claim, lease).await
    }
    async fn lookup(&self, scope: &str, key: &str) -> Result<Option<Record>> {
        get()?.lookup(scope, key).await
    }
    async fn purge_expired(&self) -> Result<u64> {
        get()?.purge_expired().await
    }
    fn release_in_background(&self, scope: String, key: String, fence: u64) {
        if let Ok(store) = get() {
            store.release_in_background(scope, key, fence);
        }
    }
}
