//! Stores: where records live. One trait, three implementations, one conformance suite.
//!
//! The trait does not assume SQL: a store only needs an atomic "insert if absent", a
//! compare-and-swap on the fence, and a clock of its own. Concurrency is decided by those
//! primitives (a unique index and `INSERT … ON CONFLICT`, an `UPDATE … WHERE fence = $n`, a
//! locked compare-and-swap in memory), never by read-then-write in the caller.

use std::future::Future;
use std::pin::Pin;

use futures_util::FutureExt as _;
use futures_util::future::Either;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, Record, StoredResponse, Unfinished};

pub mod admin;
pub(crate) mod changes;
pub use admin::{
    ForcedRelease, ListOrder, Listing, RecordInfo, RecordQuery, Retried, StateCounts, StoreStats,
};
pub use changes::{Changes, Listening};

pub mod memory;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "read-first")]
pub(crate) mod read_first;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "sql")]
#[cfg_attr(docsrs, doc(cfg(feature = "sql")))]
pub mod schema;
#[cfg(feature = "sql")]
pub(crate) mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
pub mod sweeper;
#[cfg(feature = "sql")]
mod tx;

#[cfg(feature = "sql")]
#[cfg_attr(docsrs, doc(cfg(feature = "sql")))]
pub use sql::{SqlKind, SqlStoreBuilder, ping_when_idle};
#[cfg(feature = "sql")]
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
    /// Records that pass the query's filters, in its order ([`RecordQuery::order`]), read
    /// from at most [`RecordQuery::examine`] records (see
    /// [Bounded reads](admin#bounded-reads)), without their recovery points and answers.
    /// Records whose retention ended but that are not purged yet are included (with
    /// `expires_in` zero). Answered with [`Reply::Listed`] (a store written before it answers
    /// [`Reply::Records`], taken as complete when it holds fewer than the limit).
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
        /// The fence the operator saw: when given, only a record that still has it is released
        /// (otherwise [`ForcedRelease::FenceMoved`]), so a decision taken on a page or a
        /// listing left open never releases a claim taken since.
        fence: Option<u64>,
    },
    /// Counts by state and scope prefix, the oldest claim in progress, the records whose
    /// retention ends within `expiring_within`, read with bounded work: [`StoreStats`] says
    /// what each count covers. Answered with [`Reply::Stats`].
    Stats {
        /// The window of "expiring soon".
        expiring_within: Duration,
    },
    /// Keeps the claim in progress after an outcome that may have had its effect (a gateway
    /// that timed out, an answer lost): never released, so no retry runs the work as new. If
    /// `claim.fence` still owns the record, its lease ends now (the same request's retry
    /// resumes it at once, with the recovery point and the next attempt number), `note` is kept
    /// as why, a resumable record becomes due to the completer `resume_in` from now, and the
    /// record holds unfinished work: it does not expire until it is finished or released
    /// ([`lifecycle::unfinished`](crate::lifecycle::unfinished)). Answered with
    /// [`Reply::Done`].
    Suspend {
        /// The claim.
        claim: ClaimRef<'a>,
        /// Why the outcome is unknown, for operators.
        note: &'a str,
        /// How long the completer waits before it resumes it.
        resume_in: Duration,
    },
    /// At most `limit` resumable claims due to be finished: in progress, their request stored,
    /// their lease run out and their resume time passed, those due longest first. Answered with
    /// [`Reply::Due`].
    Due {
        /// The most claims to list.
        limit: usize,
    },
    /// Parks unfinished work whose attempts ran out: if the record is in progress with
    /// `claim.fence` and its lease ran out, it becomes parked with `note`, and is never run
    /// again by itself (a `begin` is answered [`BeginOutcome::Parked`]) nor purged, until an
    /// operator retries ([`Operation::Retry`]) or releases it ([`Operation::ForceRelease`]).
    /// Answered with [`Reply::Done`], or [`Error::FenceLost`] when the record changed.
    Park {
        /// The claim as the completer found it due.
        claim: ClaimRef<'a>,
        /// Why it is parked (the last error), for operators.
        note: &'a str,
    },
    /// The operator's retry of parked work: the record is in progress again with its lease run
    /// out, due to the completer now, its attempt number back to 1 (so the completer's limit
    /// counts afresh), its note kept. Answered with [`Reply::Retried`].
    Retry {
        /// The rendered scope.
        scope: &'a str,
        /// The key.
        key: &'a str,
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
            Operation::Suspend { .. } => "suspend",
            Operation::Due { .. } => "due",
            Operation::Park { .. } => "park",
            Operation::Retry { .. } => "retry",
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
    /// To [`Operation::Inspect`] (and [`Operation::List`], from a store that answers it as it
    /// did before [`Reply::Listed`]).
    Records(Vec<RecordInfo>),
    /// To [`Operation::List`].
    Listed(Listing),
    /// To [`Operation::ForceRelease`].
    ForceReleased(ForcedRelease),
    /// To [`Operation::Stats`] (boxed: every reply is as large as its largest variant).
    Stats(Box<StoreStats>),
    /// To [`Operation::Due`].
    Due(Vec<Unfinished>),
    /// To [`Operation::Retry`].
    Retried(Retried),
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
            Reply::Listed(_) => "Listed",
            Reply::ForceReleased(_) => "ForceReleased",
            Reply::Stats(_) => "Stats",
            Reply::Due(_) => "Due",
            Reply::Retried(_) => "Retried",
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
/// [`defer`](Store::defer). The typed methods (`begin`,
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
///     fn defer(&self, write: idem::store::Deferred) {
///         self.inner.defer(write)
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

    /// Runs a fenced write from a context that cannot wait: a guard dropped by a panic or a
    /// cancelled future (a release, or a suspension when the work may be half done), or a
    /// caller dropped while its answer was being stored (a completion: the body returned, so
    /// its effect happened and the claim must not be released). Must not block: a store that
    /// does I/O hands it to [`spawn_deferred`] with a handle of its own; one that answers at
    /// once runs [`Deferred::operation`] through its `call`.
    fn defer(&self, write: Deferred);

    /// Where this store announces that a running claim ended ([`Changes`]), so that a waiting
    /// duplicate replays the first answer as soon as it is stored rather than at its next
    /// ask. `None` (the default): waiting duplicates only ask again on their own schedule.
    /// A store that wraps another passes the inner store's on.
    fn changes(&self) -> Option<&Changes> {
        None
    }

    /// [`Operation::Begin`].
    fn begin<'a>(
        &'a self,
        req: BeginRequest<'a>,
    ) -> impl Future<Output = Result<BeginOutcome>> + Send + 'a {
        // A policy that would let a record expire under its running body never reaches the
        // store, however it was built ([`Policy::check`](crate::Policy::check)). Combinators,
        // not an `async` block: the future a guarded call carries is the store's own plus a
        // tag, where a block would hold the store's future twice (once as what it captured,
        // once as what it awaits).
        match req.policy.check() {
            Ok(()) => Either::Left(self.call(Operation::Begin(req)).map(|reply| match reply? {
                Reply::Begun(outcome) => Ok(outcome),
                other => Err(mismatched("begin", &other)),
            })),
            Err(refused) => Either::Right(std::future::ready(Err(refused))),
        }
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

    /// [`Operation::Suspend`].
    fn suspend<'a>(
        &'a self,
        claim: ClaimRef<'a>,
        note: &'a str,
        resume_in: Duration,
    ) -> impl Future<Output = Result<()>> + Send + 'a {
        let op = Operation::Suspend {
            claim,
            note,
            resume_in,
        };
        done(self.call(op), "suspend")
    }

    /// [`Operation::Due`].
    fn due(&self, limit: usize) -> impl Future<Output = Result<Vec<Unfinished>>> + Send + '_ {
        expect(self.call(Operation::Due { limit }), "due", |r| match r {
            Reply::Due(due) => Ok(due),
            other => Err(other),
        })
    }

    /// [`Operation::Park`].
    fn park<'a>(
        &'a self,
        claim: ClaimRef<'a>,
        note: &'a str,
    ) -> impl Future<Output = Result<()>> + Send + 'a {
        done(self.call(Operation::Park { claim, note }), "park")
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
    /// [`Operation::List`]: the records only (see [`listing`](Self::listing)).
    fn list<'a>(
        &'a self,
        query: &'a RecordQuery,
    ) -> impl Future<Output = Result<Vec<RecordInfo>>> + Send + 'a {
        self.listing(query).map(|listed| listed.map(|l| l.records))
    }

    /// [`Operation::List`]: the records, and whether they are every record that passes the
    /// query's filters.
    fn listing<'a>(
        &'a self,
        query: &'a RecordQuery,
    ) -> impl Future<Output = Result<Listing>> + Send + 'a {
        expect(self.call(Operation::List(query)), "list", |r| match r {
            Reply::Listed(listing) => Ok(listing),
            Reply::Records(records) => {
                let complete = records.len() < query.limit;
                Ok(Listing::new(records, complete))
            }
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

    /// [`Operation::ForceRelease`] of whatever claim is in progress under `(scope, key)`.
    fn force_release<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<ForcedRelease>> + Send + 'a {
        let op = Operation::ForceRelease {
            scope,
            key,
            fence: None,
        };
        expect(self.call(op), "force_release", |r| match r {
            Reply::ForceReleased(done) => Ok(done),
            other => Err(other),
        })
    }

    /// [`Operation::ForceRelease`] of the claim with `fence` only: what an operator saw. A
    /// record whose fence moved on since is left as it is
    /// ([`ForcedRelease::FenceMoved`]).
    fn force_release_fenced<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        fence: u64,
    ) -> impl Future<Output = Result<ForcedRelease>> + Send + 'a {
        let op = Operation::ForceRelease {
            scope,
            key,
            fence: Some(fence),
        };
        expect(self.call(op), "force_release", |r| match r {
            Reply::ForceReleased(done) => Ok(done),
            other => Err(other),
        })
    }

    /// [`Operation::Retry`].
    fn retry<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<Retried>> + Send + 'a {
        expect(
            self.call(Operation::Retry { scope, key }),
            "retry",
            |r| match r {
                Reply::Retried(done) => Ok(done),
                other => Err(other),
            },
        )
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
fn expect<'a, T>(
    call: impl Future<Output = Result<Reply>> + Send + 'a,
    operation: &'static str,
    pick: impl FnOnce(Reply) -> std::result::Result<T, Reply> + Send + 'a,
) -> impl Future<Output = Result<T>> + Send + 'a {
    call.map(move |reply| pick(reply?).map_err(|other| mismatched(operation, &other)))
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

/// The claim `op` ends or pauses, if it does: what a store announces ([`Changes`]) once the
/// operation succeeded.
pub(crate) fn ends<'a>(op: &Operation<'a>) -> Option<(&'a str, &'a str)> {
    match *op {
        Operation::Complete { claim, .. }
        | Operation::Release(claim)
        | Operation::Suspend { claim, .. }
        | Operation::Park { claim, .. } => Some((claim.scope, claim.key)),
        Operation::ForceRelease { scope, key, .. } => Some((scope, key)),
        _ => None,
    }
}

/// Runs `call`, and when it succeeded and `ends` names the claim its operation ends or pauses
/// ([`ends`]), announces it on `changes`: what a store's [`Store::call`] wraps its writes in.
///
/// A combinator, not an `async fn`: an `async fn` holds its argument and the future it awaits
/// apart, so the store's future would be carried twice.
#[cfg_attr(not(any(feature = "sql", feature = "redis")), allow(dead_code))]
pub(crate) fn announced<'a>(
    changes: &'a Changes,
    ends: Option<(&'a str, &'a str)>,
    call: impl Future<Output = Result<Reply>> + 'a,
) -> impl Future<Output = Result<Reply>> + 'a {
    call.then(move |reply| async move {
        if let (Some((scope, key)), Ok(_)) = (ends, &reply) {
            changes.announce(scope, key).await;
        }
        reply
    })
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe form of [`Store`], for a store chosen at run time (see [`SharedStore`]).
/// Implemented for every [`Store`].
pub trait DynStore: Send + Sync + 'static {
    /// See [`Store::call`].
    fn call_dyn<'a>(&'a self, op: Operation<'a>) -> BoxFuture<'a, Result<Reply>>;
    /// See [`Store::defer`].
    fn defer_dyn(&self, write: Deferred);
    /// See [`Store::changes`].
    fn changes_dyn(&self) -> Option<&Changes>;
}

impl<S: Store> DynStore for S {
    fn call_dyn<'a>(&'a self, op: Operation<'a>) -> BoxFuture<'a, Result<Reply>> {
        Box::pin(self.call(op))
    }
    fn defer_dyn(&self, write: Deferred) {
        self.defer(write)
    }
    fn changes_dyn(&self) -> Option<&Changes> {
        self.changes()
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
    fn defer(&self, write: Deferred) {
        self.0.defer_dyn(write)
    }
    fn changes(&self) -> Option<&Changes> {
        self.0.changes_dyn()
    }
}

/// A fenced write to run in the background ([`Store::defer`]): on the claim `(scope, key,
/// fence)`, one of the writes that end or keep it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferred {
    /// The rendered scope.
    pub scope: String,
    /// The key.
    pub key: String,
    /// The claim's fence.
    pub fence: u64,
    /// What to write.
    pub write: DeferredWrite,
}

/// What a [`Deferred`] write does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeferredWrite {
    /// [`Operation::Release`]: the body was dropped before it could have had any effect.
    Release,
    /// [`Operation::Complete`] with this answer: the body returned, its caller was dropped
    /// while the answer was being stored.
    Complete(StoredResponse),
    /// [`Operation::Suspend`]: the body was dropped and its work may be half done.
    Suspend {
        /// Why, for operators.
        note: String,
        /// When the completer may resume it.
        resume_in: Duration,
    },
}

impl Deferred {
    /// The write as the operation a store runs.
    pub fn operation(&self) -> Operation<'_> {
        let claim = ClaimRef {
            scope: &self.scope,
            key: &self.key,
            fence: self.fence,
        };
        match &self.write {
            DeferredWrite::Release => Operation::Release(claim),
            DeferredWrite::Complete(response) => Operation::Complete { claim, response },
            DeferredWrite::Suspend { note, resume_in } => Operation::Suspend {
                claim,
                note,
                resume_in: *resume_in,
            },
        }
    }
}

/// The body of [`Store::defer`] for a store that writes over I/O: spawns the write on the
/// current Tokio runtime with `store` (a handle of the store), tries it again a few times over
/// about four seconds while the store is unavailable, and logs a failure other than a lost
/// fence (someone took the claim over, so there is nothing left to write). Outside a runtime it
/// logs and leaves the claim to run out its lease.
pub fn spawn_deferred<S: Store>(store: S, write: Deferred) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            target: "idem",
            scope = write.scope,
            key = write.key,
            operation = write.operation().name(),
            "a claim's write was deferred outside a Tokio runtime; the claim runs out its lease instead"
        );
        return;
    };
    rt.spawn(async move {
        let mut result = store.call(write.operation()).await;
        for pause_ms in [50, 200, 1_000, 3_000] {
            if !matches!(result, Err(Error::Unavailable(_))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            result = store.call(write.operation()).await;
        }
        if let Err(e) = result
            && !matches!(e, Error::FenceLost { .. })
        {
            tracing::warn!(target: "idem", scope = write.scope, key = write.key, operation = write.operation().name(), error = %e, "a deferred write of a claim failed; the claim runs out its lease instead");
        }
    });
}
