//! Stores: where records live. One trait, three implementations, one conformance suite.
//!
//! The trait does not assume SQL: a store only needs an atomic "insert if absent", a
//! compare-and-swap on the fence, and a clock of its own. Concurrency is decided by those
//! primitives (a unique index and `INSERT … ON CONFLICT`, an `UPDATE … WHERE fence = $n`, a
//! locked compare-and-swap in memory), never by read-then-write in the caller.

use std::future::Future;
use std::pin::Pin;

use futures_util::FutureExt as _;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, Record, StoredResponse};

pub mod admin;
pub use admin::{ForcedRelease, RecordInfo, RecordQuery, StateCounts, StoreStats};

#[cfg(feature = "postgres")]
mod group;
pub mod memory;
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
pub mod sweeper;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod tx;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub use sql::SqlStoreBuilder;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use tx::TxStore;

/// One operation on a store: what [`Store::call`] is asked to do.
///
/// Every operation a store offers is a variant here, so a store is one `match` and everything
/// that wraps a store (a [`SharedStore`], the default store, a [`CachedStore`](crate::CachedStore),
/// a test double) forwards all of them with one line: `self.inner.call(op)`. New operations are
/// added as variants; the enum is `#[non_exhaustive]`, so a store written elsewhere keeps
/// compiling and answers the ones it does not know with [`Error::Unsupported`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Operation<'a> {
    /// Claims the record for `(scope, key)`, or reports why not: replay, in progress, key
    /// reused. Takes over an abandoned claim (fence + 1) when the policy allows. Answered with
    /// [`Reply::Begun`].
    Begin(BeginRequest<'a>),
    /// Stores the response and marks the record completed, if `claim.fence` still owns it.
    /// Answered with [`Reply::Done`].
    ///
    /// Repeating a completion that succeeded (same fence, same response) succeeds again and
    /// changes nothing: a caller whose reply was lost after the store committed retries it, and
    /// must not be told its own completion lost the fence.
    Complete {
        /// The claim being completed.
        claim: ClaimRef<'a>,
        /// What replays will return.
        response: &'a StoredResponse,
    },
    /// Gives the claim up so that a retry can run, if `claim.fence` still owns it. Answered
    /// with [`Reply::Done`].
    Release(ClaimRef<'a>),
    /// Records how far the side effect got and renews the lease, if `claim.fence` still owns
    /// the record. Answered with [`Reply::Done`].
    Checkpoint {
        /// The claim.
        claim: ClaimRef<'a>,
        /// What a take-over will be handed.
        recovery_point: &'a [u8],
        /// The new lease, from now.
        lease: Duration,
    },
    /// Renews the lease to `lease` from now, if `claim.fence` still owns the record, and changes
    /// nothing else (the recovery point stays as it is): for a body that runs longer than its
    /// lease, such as a message handler kept alive while it works. Answered with [`Reply::Done`].
    Renew {
        /// The claim.
        claim: ClaimRef<'a>,
        /// The new lease, from now.
        lease: Duration,
    },
    /// The live record for `(scope, key)`, if any: for clients asking "did my request happen?".
    /// Answered with [`Reply::Found`].
    Lookup {
        /// The rendered scope.
        scope: &'a str,
        /// The key.
        key: &'a str,
    },
    /// Deletes every record whose retention has ended. Answered with [`Reply::Purged`].
    PurgeExpired,
    /// Deletes one batch of records whose retention has ended, as many as the store deletes in
    /// one statement: for a purge that reports its progress. Answered with [`Reply::Purged`];
    /// none left when it answers 0.
    PurgeBatch,
    /// How many records' retention has ended (what a purge would delete now). Answered with
    /// [`Reply::Counted`].
    CountExpired,
    /// Records, oldest first, that pass the query's filters, without their recovery points and
    /// answers. Records whose retention ended but that are not purged yet are included (with
    /// `expires_in` zero). Answered with [`Reply::Records`].
    List(&'a RecordQuery),
    /// One record in full, whatever its state, its recovery point and answer included.
    /// Answered with [`Reply::Records`]: the record, or none.
    Inspect {
        /// The rendered scope.
        scope: &'a str,
        /// The key.
        key: &'a str,
    },
    /// The operator's release of a claim stuck in progress: the record becomes released and
    /// its fence moves on, so the next request with this key runs, and the previous owner, if
    /// it wakes up, cannot complete over it. Answered with [`Reply::ForceReleased`].
    ForceRelease {
        /// The rendered scope.
        scope: &'a str,
        /// The key.
        key: &'a str,
    },
    /// Counts by state and scope prefix, the oldest claim in progress, the records whose
    /// retention ends within `expiring_within`. Answered with [`Reply::Stats`].
    Stats {
        /// The window of "expiring soon".
        expiring_within: Duration,
    },
}

impl Operation<'_> {
    /// The operation's name, as errors and logs say it (`"begin"`, `"purge_expired"`).
    pub fn name(&self) -> &'static str {
        match self {
            Operation::Begin(_) => "begin",
            Operation::Complete { .. } => "complete",
            Operation::Release(_) => "release",
            Operation::Checkpoint { .. } => "checkpoint",
            Operation::Renew { .. } => "renew",
            Operation::Lookup { .. } => "lookup",
            Operation::PurgeExpired => "purge_expired",
            Operation::PurgeBatch => "purge_batch",
            Operation::CountExpired => "count_expired",
            Operation::List(_) => "list",
            Operation::Inspect { .. } => "inspect",
            Operation::ForceRelease { .. } => "force_release",
            Operation::Stats { .. } => "stats",
        }
    }

    /// [`Error::Unsupported`] for this operation: what a store answers to one it does not offer.
    pub fn unsupported(&self) -> Error {
        Error::Unsupported {
            operation: self.name(),
        }
    }
}

/// What a store answers to an [`Operation`]; each operation names the variant it expects.
#[derive(Debug)]
#[non_exhaustive]
pub enum Reply {
    /// To [`Operation::Begin`].
    Begun(BeginOutcome),
    /// To a write that has nothing to report: complete, release, checkpoint, renew.
    Done,
    /// To [`Operation::Lookup`].
    Found(Option<Record>),
    /// To [`Operation::PurgeExpired`] and [`Operation::PurgeBatch`]: how many records were
    /// deleted.
    Purged(u64),
    /// To [`Operation::CountExpired`].
    Counted(u64),
    /// To [`Operation::List`] and [`Operation::Inspect`].
    Records(Vec<RecordInfo>),
    /// To [`Operation::ForceRelease`].
    ForceReleased(ForcedRelease),
    /// To [`Operation::Stats`] (boxed: every reply is as large as its largest variant).
    Stats(Box<StoreStats>),
}

impl Reply {
    fn kind(&self) -> &'static str {
        match self {
            Reply::Begun(_) => "Begun",
            Reply::Done => "Done",
            Reply::Found(_) => "Found",
            Reply::Purged(_) => "Purged",
            Reply::Counted(_) => "Counted",
            Reply::Records(_) => "Records",
            Reply::ForceReleased(_) => "ForceReleased",
            Reply::Stats(_) => "Stats",
        }
    }
}

/// A store answered an operation with another operation's reply: a bug in the store.
fn mismatched(operation: &'static str, reply: &Reply) -> Error {
    Error::Store(
        format!(
            "the store answered `{operation}` with `Reply::{}`",
            reply.kind()
        )
        .into(),
    )
}

/// A place where idempotency records live.
///
/// A store implements two methods: [`call`](Store::call), one `match` over [`Operation`], and
/// [`release_in_background`](Store::release_in_background). The typed methods (`begin`,
/// `complete`, …) are provided on top of `call` and are what callers use; a store does not
/// override them.
///
/// Every write after `begin` is conditional on the fence `begin` handed out: a caller whose
/// claim was taken over gets [`Error::FenceLost`] and changes nothing.
/// Implementations must pass the conformance suite, [`testkit`](crate::testkit) (feature
/// `testkit`).
///
/// ```
/// use idem::store::{Operation, Reply};
/// use idem::{MemoryStore, Store};
///
/// /// A store that counts the operations it hands on.
/// struct Counted {
///     inner: MemoryStore,
///     calls: std::sync::atomic::AtomicU64,
/// }
///
/// impl Store for Counted {
///     fn call<'a>(&'a self, op: Operation<'a>) -> impl Future<Output = idem::Result<Reply>> + Send + 'a {
///         self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         self.inner.call(op)
///     }
///
///     fn release_in_background(&self, scope: String, key: String, fence: u64) {
///         self.inner.release_in_background(scope, key, fence)
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an idempotency store",
    label = "not a store",
    note = "pass a store by place (`store = app.idem`, not `store = &app.idem`): idem clones the handle, which is cheap",
    note = "stores are `idem::MemoryStore`, `idem::SqliteStore`, `idem::PgStore`, `idem::RedisStore` or a type implementing `idem::Store`"
)]
pub trait Store: Send + Sync + 'static {
    /// Runs one operation and answers with the [`Reply`] the operation names. An operation the
    /// store does not offer is answered with [`Error::Unsupported`]
    /// ([`Operation::unsupported`]).
    fn call<'a>(&'a self, op: Operation<'a>) -> impl Future<Output = Result<Reply>> + Send + 'a;

    /// Releases a claim from a context that cannot wait (a guard dropped by a panic or a
    /// cancelled future). Must not block; stores that do I/O spawn it on the current Tokio
    /// runtime.
    fn release_in_background(&self, scope: String, key: String, fence: u64);

    /// [`Operation::Begin`].
    fn begin<'a>(
        &'a self,
        req: BeginRequest<'a>,
    ) -> impl Future<Output = Result<BeginOutcome>> + Send + 'a {
        self.call(Operation::Begin(req)).map(|reply| match reply? {
            Reply::Begun(outcome) => Ok(outcome),
            other => Err(mismatched("begin", &other)),
        })
    }

    /// [`Operation::Complete`].
    fn complete<'a>(
        &'a self,
        claim: ClaimRef<'a>,
        response: &'a StoredResponse,
    ) -> impl Future<Output = Result<()>> + Send + 'a {
        done(
            self.call(Operation::Complete { claim, response }),
            "complete",
        )
    }

    /// [`Operation::Release`].
    fn release<'a>(&'a self, claim: ClaimRef<'a>) -> impl Future<Output = Result<()>> + Send + 'a {
        done(self.call(Operation::Release(claim)), "release")
    }

    /// [`Operation::Checkpoint`].
    fn checkpoint<'a>(
        &'a self,
        claim: ClaimRef<'a>,
        recovery_point: &'a [u8],
        lease: Duration,
    ) -> impl Future<Output = Result<()>> + Send + 'a {
        let op = Operation::Checkpoint {
            claim,
            recovery_point,
            lease,
        };
        done(self.call(op), "checkpoint")
    }

    /// [`Operation::Renew`].
    fn renew<'a>(
        &'a self,
        claim: ClaimRef<'a>,
        lease: Duration,
    ) -> impl Future<Output = Result<()>> + Send + 'a {
        done(self.call(Operation::Renew { claim, lease }), "renew")
    }

    /// [`Operation::Lookup`].
    fn lookup<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<Option<Record>>> + Send + 'a {
        let call = self.call(Operation::Lookup { scope, key });
        async move {
            match call.await? {
                Reply::Found(record) => Ok(record),
                other => Err(mismatched("lookup", &other)),
            }
        }
    }

    /// [`Operation::PurgeExpired`]: how many records were deleted.
    fn purge_expired(&self) -> impl Future<Output = Result<u64>> + Send + '_ {
        let call = self.call(Operation::PurgeExpired);
        async move {
            match call.await? {
                Reply::Purged(n) => Ok(n),
                other => Err(mismatched("purge_expired", &other)),
            }
        }
    }
}

/// The operations for operators, typed: listing, inspecting, releasing by hand, counting.
/// Provided for every [`Store`] on top of [`Store::call`]; a store that does not offer one
/// answers [`Error::Unsupported`].
pub trait StoreAdmin: Store {
    /// [`Operation::List`].
    fn list<'a>(
        &'a self,
        query: &'a RecordQuery,
    ) -> impl Future<Output = Result<Vec<RecordInfo>>> + Send + 'a {
        expect(self.call(Operation::List(query)), "list", |r| match r {
            Reply::Records(records) => Ok(records),
            other => Err(other),
        })
    }

    /// [`Operation::Inspect`].
    fn inspect<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<Option<RecordInfo>>> + Send + 'a {
        expect(
            self.call(Operation::Inspect { scope, key }),
            "inspect",
            |r| match r {
                Reply::Records(mut found) if found.len() <= 1 => Ok(found.pop()),
                other => Err(other),
            },
        )
    }

    /// [`Operation::ForceRelease`].
    fn force_release<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<ForcedRelease>> + Send + 'a {
        let op = Operation::ForceRelease { scope, key };
        expect(self.call(op), "force_release", |r| match r {
            Reply::ForceReleased(done) => Ok(done),
            other => Err(other),
        })
    }

    /// [`Operation::Stats`].
    fn stats(
        &self,
        expiring_within: Duration,
    ) -> impl Future<Output = Result<StoreStats>> + Send + '_ {
        expect(
            self.call(Operation::Stats { expiring_within }),
            "stats",
            |r| match r {
                Reply::Stats(stats) => Ok(*stats),
                other => Err(other),
            },
        )
    }

    /// [`Operation::CountExpired`].
    fn count_expired(&self) -> impl Future<Output = Result<u64>> + Send + '_ {
        expect(
            self.call(Operation::CountExpired),
            "count_expired",
            |r| match r {
                Reply::Counted(n) => Ok(n),
                other => Err(other),
            },
        )
    }

    /// [`Operation::PurgeBatch`].
    fn purge_batch(&self) -> impl Future<Output = Result<u64>> + Send + '_ {
        expect(
            self.call(Operation::PurgeBatch),
            "purge_batch",
            |r| match r {
                Reply::Purged(n) => Ok(n),
                other => Err(other),
            },
        )
    }
}

impl<S: Store + ?Sized> StoreAdmin for S {}

/// The typed end of an operation: `pick` takes the reply the operation names, or hands back
/// another, which is a bug in the store.
async fn expect<T>(
    call: impl Future<Output = Result<Reply>>,
    operation: &'static str,
    pick: impl FnOnce(Reply) -> std::result::Result<T, Reply>,
) -> Result<T> {
    pick(call.await?).map_err(|other| mismatched(operation, &other))
}

/// The typed end of a write that answers [`Reply::Done`]. A combinator rather than an `async`
/// block: nothing to keep across the await but the call itself, so the future a guarded call
/// carries is the store's own plus a tag.
fn done<'a>(
    call: impl Future<Output = Result<Reply>> + Send + 'a,
    operation: &'static str,
) -> impl Future<Output = Result<()>> + Send + 'a {
    call.map(move |reply| match reply? {
        Reply::Done => Ok(()),
        other => Err(mismatched(operation, &other)),
    })
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe form of [`Store`], for a store chosen at run time (see [`SharedStore`]).
/// Implemented for every [`Store`].
pub trait DynStore: Send + Sync + 'static {
    /// See [`Store::call`].
    fn call_dyn<'a>(&'a self, op: Operation<'a>) -> BoxFuture<'a, Result<Reply>>;
    /// See [`Store::release_in_background`].
    fn release_in_background_dyn(&self, scope: String, key: String, fence: u64);
}

impl<S: Store> DynStore for S {
    fn call_dyn<'a>(&'a self, op: Operation<'a>) -> BoxFuture<'a, Result<Reply>> {
        Box::pin(self.call(op))
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
    fn call<'a>(&'a self, op: Operation<'a>) -> impl Future<Output = Result<Reply>> + Send + 'a {
        self.0.call_dyn(op)
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
