//! Stores: where records live. One trait, three implementations, one conformance suite.
//!
//! The trait does not assume SQL: a store only needs an atomic "insert if absent", a
//! compare-and-swap on the fence, and a clock of its own. Concurrency is decided by those
//! primitives (a unique index and `INSERT … ON CONFLICT`, an `UPDATE … WHERE fence = $n`, a
//! locked compare-and-swap in memory), never by read-then-write in the caller.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, Record, StoredResponse};

#[cfg(feature = "postgres")]
mod group;
pub mod memory;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub mod outbox;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub mod schema;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod tx;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub use sql::SqlStoreBuilder;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use tx::TxStore;

/// A place where idempotency records live.
///
/// Every write after `begin` is conditional on the fence `begin` handed out: a caller whose
/// claim was taken over gets [`Error::FenceLost`](crate::Error::FenceLost) and changes nothing.
/// Implementations must pass the conformance suite in `tests/conformance.rs`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an idempotency store",
    label = "not a store",
    note = "pass a store by place (`store = app.idem`, not `store = &app.idem`): idem clones the handle, which is cheap",
    note = "stores are `idem::MemoryStore`, `idem::SqliteStore`, `idem::PgStore`, `idem::RedisStore` or a type implementing `idem::Store`"
)]
pub trait Store: Send + Sync + 'static {
    /// Claims the record for `(scope, key)`, or reports why not: replay, in progress, key
    /// reused. Takes over an abandoned claim (fence + 1) when the policy allows.
    fn begin(&self, req: BeginRequest<'_>) -> impl Future<Output = Result<BeginOutcome>> + Send;

    /// Stores the response and marks the record completed, if `claim.fence` still owns it.
    ///
    /// Repeating a completion that succeeded (same fence, same response) succeeds again and
    /// changes nothing: a caller whose reply was lost after the store committed retries it, and
    /// must not be told its own completion lost the fence.
    fn complete(
        &self,
        claim: ClaimRef<'_>,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Gives the claim up so that a retry can run, if `claim.fence` still owns it.
    fn release(&self, claim: ClaimRef<'_>) -> impl Future<Output = Result<()>> + Send;

    /// Records how far the side effect got and renews the lease, if `claim.fence` still owns
    /// the record.
    fn checkpoint(
        &self,
        claim: ClaimRef<'_>,
        recovery_point: &[u8],
        lease: Duration,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Renews the lease to `lease` from now, if `claim.fence` still owns the record, and
    /// changes nothing else (the recovery point stays as it is): for a body that runs longer
    /// than its lease, such as a message handler kept alive while it works.
    fn renew(
        &self,
        claim: ClaimRef<'_>,
        lease: Duration,
    ) -> impl Future<Output = Result<()>> + Send;

    /// The live record for `(scope, key)`, if any: for clients asking "did my request happen?".
    fn lookup(&self, scope: &str, key: &str)
    -> impl Future<Output = Result<Option<Record>>> + Send;

    /// Deletes every record whose retention has ended; returns how many.
    fn purge_expired(&self) -> impl Future<Output = Result<u64>> + Send;

    /// Releases a claim from a context that cannot wait (a guard dropped by a panic or a
    /// cancelled future). Must not block; stores that do I/O spawn it on the current Tokio
    /// runtime.
    fn release_in_background(&self, scope: String, key: String, fence: u64);
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe form of [`Store`], for a store chosen at run time (see [`SharedStore`]).
/// Implemented for every [`Store`].
pub trait DynStore: Send + Sync + 'static {
    /// See [`Store::begin`].
    fn begin_dyn<'a>(&'a self, req: BeginRequest<'a>) -> BoxFuture<'a, Result<BeginOutcome>>;
    /// See [`Store::complete`].
    fn complete_dyn<'a>(
        &'a self,
        claim: ClaimRef<'a>,
        response: &'a StoredResponse,
    ) -> BoxFuture<'a, Result<()>>;
    /// See [`Store::release`].
    fn release_dyn<'a>(&'a self, claim: ClaimRef<'a>) -> BoxFuture<'a, Result<()>>;
    /// See [`Store::checkpoint`].
    fn checkpoint_dyn<'a>(
        &'a self,
        claim: ClaimRef<'a>,
        recovery_point: &'a [u8],
        lease: Duration,
    ) -> BoxFuture<'a, Result<()>>;
    /// See [`Store::renew`].
    fn renew_dyn<'a>(&'a self, claim: ClaimRef<'a>, lease: Duration) -> BoxFuture<'a, Result<()>>;
    /// See [`Store::lookup`].
    fn lookup_dyn<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Record>>>;
    /// See [`Store::purge_expired`].
    fn purge_expired_dyn(&self) -> BoxFuture<'_, Result<u64>>;
    /// See [`Store::release_in_background`].
    fn release_in_background_dyn(&self, scope: String, key: String, fence: u64);
}

impl<S: Store> DynStore for S {
    fn begin_dyn<'a>(&'a self, req: BeginRequest<'a>) -> BoxFuture<'a, Result<BeginOutcome>> {
        Box::pin(self.begin(req))
    }
    fn complete_dyn<'a>(
        &'a self,
        claim: ClaimRef<'a>,
        response: &'a StoredResponse,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.complete(claim, response))
    }
    fn release_dyn<'a>(&'a self, claim: ClaimRef<'a>) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.release(claim))
    }
    fn checkpoint_dyn<'a>(
        &'a self,
        claim: ClaimRef<'a>,
        recovery_point: &'a [u8],
        lease: Duration,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.checkpoint(claim, recovery_point, lease))
    }
    fn renew_dyn<'a>(&'a self, claim: ClaimRef<'a>, lease: Duration) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.renew(claim, lease))
    }
    fn lookup_dyn<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Record>>> {
        Box::pin(self.lookup(scope, key))
    }
    fn purge_expired_dyn(&self) -> BoxFuture<'_, Result<u64>> {
        Box::pin(self.purge_expired())
    }
    fn release_in_background_dyn(&self, scope: String, key: String, fence: u64) {
        self.release_in_background(scope, key, fence)
    }
}

/// A store behind an `Arc<dyn DynStore>`: any store, chosen at run time, cheap to clone.
///
/// This is what [`set_default_store`](crate::set_default_store) installs. Each call boxes its
/// future; name a concrete store (`store = …`) on hot paths.
#[derive(Clone)]
pub struct SharedStore(Arc<dyn DynStore>);

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedStore")
    }
}

impl SharedStore {
    /// Wraps a store.
    pub fn new<S: Store>(store: S) -> Self {
        SharedStore(Arc::new(store))
    }
}

impl Store for SharedStore {
    async fn begin(&self, req: BeginRequest<'_>) -> Result<BeginOutcome> {
        self.0.begin_dyn(req).await
    }
    async fn complete(&self, claim: ClaimRef<'_>, response: &StoredResponse) -> Result<()> {
        self.0.complete_dyn(claim, response).await
    }
    async fn release(&self, claim: ClaimRef<'_>) -> Result<()> {
        self.0.release_dyn(claim).await
    }
    async fn checkpoint(
        &self,
        claim: ClaimRef<'_>,
        recovery_point: &[u8],
        lease: Duration,
    ) -> Result<()> {
        self.0.checkpoint_dyn(claim, recovery_point, lease).await
    }
    async fn renew(&self, claim: ClaimRef<'_>, lease: Duration) -> Result<()> {
        self.0.renew_dyn(claim, lease).await
    }
    async fn lookup(&self, scope: &str, key: &str) -> Result<Option<Record>> {
        self.0.lookup_dyn(scope, key).await
    }
    fn purge_expired(&self) -> impl Future<Output = Result<u64>> + Send {
        self.0.purge_expired_dyn()
    }
    fn release_in_background(&self, scope: String, key: String, fence: u64) {
        self.0.release_in_background_dyn(scope, key, fence)
    }
}

/// The body of [`Store::release_in_background`] for stores that release over I/O: spawns
/// `release(scope, key)` on the current Tokio runtime and logs a failure other than a lost fence
/// (someone took the claim over, so nothing is left to release). Outside a runtime it logs and
/// leaves the claim to run out its lease.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
pub(crate) fn spawn_release<F, Fut>(scope: String, key: String, release: F)
where
    F: FnOnce(String, String) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            target: "idem",
            scope,
            key,
            "a claim was dropped outside a Tokio runtime; it is re-claimed when its lease runs out"
        );
        return;
    };
    rt.spawn(async move {
        if let Err(e) = release(scope, key).await
            && !matches!(e, crate::Error::FenceLost { .. })
        {
            tracing::warn!(target: "idem", error = %e, "releasing a dropped claim failed; it is re-claimed when its lease runs out");
        }
    });
}
