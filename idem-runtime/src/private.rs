//! Support for the code `#[idempotent]` generates. Not a stable API: names and signatures here
//! change without notice.
//!
//! Each property of the user's function is required by exactly one generated call, spanned on
//! the tokens it is about, so that a mistake produces one error in the right place:
//! the store ([`store`], [`tx_store`]), the `Ok` type ([`run`], [`tx_finish`]), the error type
//! ([`errors`], [`errors_final`]), the key ([`key`]), each fingerprinted argument
//! ([`Fingerprintable`]).

#![allow(missing_docs)]

use std::future::Future;

pub use crate::default_store::DefaultStore;
pub use crate::error::Error;
pub use crate::fingerprint::{Fingerprint, Fingerprinter};
pub use crate::key::{Key, ToKey};
pub use crate::record::{ExpiredLease, Policy, StoredResponse};
pub use crate::replay::{FinalError, Replay};
pub use crate::scope::ScopeBuilder;
pub use crate::store::Store;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use crate::store::TxStore;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use crate::transactional::{IsTxStore, TxClaim, TxStart, tx_finish, tx_start, tx_store};

pub use crate::transition::{
    Created, Miss, StateMachine, StateValue, Transition, Versioned, classify_miss,
    warn_guard_differs_after, warn_guard_mismatch,
};
pub use serde;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use sqlx;

pub use crate::guard::ClaimInfo;

use crate::guard::{Begun, begun};
use crate::replay::{decode_final, encode_final};

/// The return type of a guarded function: a `Result`, possibly behind an alias.
#[diagnostic::on_unimplemented(
    message = "an #[idempotent] function must return `Result<T, E>`, not `{Self}`",
    label = "not a `Result`",
    note = "the body's `Ok` value is stored and replayed; its `Err` releases the claim so a retry can run"
)]
pub trait IdemResult: Sized {
    type Ok;
    type Err;
    /// `Self`, named through the trait: a return type that is not a `Result` then becomes an
    /// error type after its one error, and nothing downstream reports it again.
    type Checked;
    fn from_ok(v: Self::Ok) -> Self;
    fn from_err(e: Self::Err) -> Self;
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
}

impl<T, E> IdemResult for Result<T, E> {
    type Ok = T;
    type Err = E;
    type Checked = Self;
    fn from_ok(v: T) -> Self {
        Ok(v)
    }
    fn from_err(e: E) -> Self {
        Err(e)
    }
    fn into_result(self) -> Self {
        self
    }
}

/// The type of the fake return edge: `R` itself, named through the trait, so that a return type
/// that is not a `Result` is reported here once and is an error type everywhere after.
pub fn unreachable<R: IdemResult>() -> R::Checked {
    unreachable!("only called under `if false`")
}

/// An argument that goes into the fingerprint.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be fingerprinted",
    label = "this argument is part of the request fingerprint, so it must implement `serde::Serialize`",
    note = "derive `serde::Serialize` for it, or leave it out of the fingerprint with `#[idem(skip)]` on the argument or `skip(…)` in the attribute"
)]
pub trait Fingerprintable {
    fn add_to(&self, f: &mut Fingerprinter) -> Result<(), Error>;
}

impl<T: serde::Serialize + ?Sized> Fingerprintable for T {
    fn add_to(&self, f: &mut Fingerprinter) -> Result<(), Error> {
        f.add(self)
    }
}

pub fn key<K: ToKey + ?Sized>(k: &K) -> Result<Key, Error> {
    k.to_key()
}

/// A value that gives a store: a store, or a smart pointer to one (`Arc<PgStore>`).
///
/// Two implementations, told apart by the marker `M`: a value that is neither makes the handle
/// an error type after one error, so nothing downstream reports the same mistake again.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an idempotency store",
    label = "not a store",
    note = "stores are `idem::MemoryStore`, `idem::SqliteStore`, `idem::PgStore`, `idem::CachedStore<_>`, a type implementing `idem::Store`, or a pointer to one such as `Arc<PgStore>`"
)]
pub trait IsStore<M> {
    type Handle: Store + Clone;
    fn into_handle(self) -> Self::Handle;
}

#[derive(Debug)]
pub enum Direct {}
#[derive(Debug)]
pub enum Pointer {}

impl<S: Store + Clone> IsStore<Direct> for S {
    type Handle = S;
    fn into_handle(self) -> S {
        self
    }
}

impl<P, S> IsStore<Pointer> for P
where
    P: std::ops::Deref<Target = S>,
    S: Store + Clone,
{
    type Handle = S;
    fn into_handle(self) -> S {
        (*self).clone()
    }
}

pub fn store<S: IsStore<M>, M>(s: S) -> S::Handle {
    s.into_handle()
}

/// How idem's errors become the function's error type, and which of its errors are final.
pub struct ErrorOps<E> {
    pub(crate) from_idem: fn(Error) -> E,
    pub(crate) finals: Option<FinalOps<E>>,
}

pub(crate) struct FinalOps<E> {
    pub(crate) is_final: fn(&E) -> bool,
    pub(crate) encode: fn(&E) -> Result<StoredResponse, Error>,
    pub(crate) decode: fn(StoredResponse) -> Result<E, Error>,
}

impl<E> std::fmt::Debug for ErrorOps<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorOps")
            .field("stores_final_errors", &self.finals.is_some())
            .finish()
    }
}

impl<E> ErrorOps<E> {
    pub(crate) fn fail<R: IdemResult<Err = E>>(&self, e: Error) -> R {
        R::from_err((self.from_idem)(e))
    }
}

/// Errors release the claim.
pub fn errors<E: From<Error>>() -> ErrorOps<E> {
    ErrorOps {
        from_idem: E::from,
        finals: None,
    }
}

/// Final errors are stored and replayed; the others release the claim.
pub fn errors_final<E: From<Error> + FinalError>() -> ErrorOps<E> {
    ErrorOps {
        from_idem: E::from,
        finals: Some(FinalOps {
            is_final: E::is_final,
            encode: encode_final::<E>,
            decode: decode_final::<E>,
        }),
    }
}

/// The identity and fingerprint of a call, or why it has none: computed before the body.
#[derive(Debug)]
pub struct Prepared {
    parts: Result<Parts, Error>,
    policy: Policy,
}

#[derive(Debug)]
struct Parts {
    scope: String,
    key: Key,
    fingerprint: Fingerprint,
}

impl Prepared {
    // A bad key is the client's error and is reported before anything about the scope.
    pub fn new(
        key: Result<Key, Error>,
        scope: Result<String, Error>,
        fingerprint: Result<Fingerprint, Error>,
        policy: Policy,
    ) -> Prepared {
        let parts = key.and_then(|key| {
            Ok(Parts {
                scope: scope?,
                key,
                fingerprint: fingerprint?,
            })
        });
        Prepared { parts, policy }
    }

    pub(crate) fn into_parts(self) -> Result<(String, Key, Fingerprint, Policy), Error> {
        let p = self.parts?;
        Ok((p.scope, p.key, p.fingerprint, self.policy))
    }
}

/// The body of a guarded function: a future, or a closure that takes the claim's
/// [`ClaimInfo`] (`claim = …`).
pub trait Body<R> {
    type Fut: Future<Output = R>;
    fn start(self, claim: impl FnOnce() -> ClaimInfo) -> Self::Fut;
}

/// A body that does not look at its claim.
#[derive(Debug)]
pub struct Plain<F>(pub F);

impl<R, F: Future<Output = R>> Body<R> for Plain<F> {
    type Fut = F;
    fn start(self, _claim: impl FnOnce() -> ClaimInfo) -> F {
        self.0
    }
}

/// A body that is handed its claim.
#[derive(Debug)]
pub struct WithClaim<C>(pub C);

impl<R, C, F> Body<R> for WithClaim<C>
where
    C: FnOnce(ClaimInfo) -> F,
    F: Future<Output = R>,
{
    type Fut = F;
    fn start(self, claim: impl FnOnce() -> ClaimInfo) -> F {
        (self.0)(claim())
    }
}

/// The separate-commits flow: claim (committed), body, complete or release.
///
/// One flat async fn that awaits the store directly: every nested async call would add its own
/// copy of the guard and the response to this future, which every caller moves around.
pub async fn run<S, R, M, B>(store: &S, prepared: Prepared, errors: ErrorOps<R::Err>, body: B) -> R
where
    S: Store,
    R: IdemResult,
    R::Ok: Replay<M>,
    B: Body<R>,
{
    let (scope, key, fingerprint, policy) = match prepared.into_parts() {
        Ok(parts) => parts,
        Err(e) => return errors.fail(e),
    };
    let outcome = store
        .begin(crate::record::BeginRequest {
            scope: &scope,
            key: key.as_str(),
            fingerprint: &fingerprint,
            policy: &policy,
        })
        .await;
    let guard = match begun(store, scope, key, policy, outcome) {
        Ok(Begun::Claimed(guard)) => guard,
        Ok(Begun::Replay(stored)) => return replay::<R, M>(stored, &errors),
        Err(e) => return errors.fail(e),
    };
    let (stored, out) = match body.start(|| guard.info()).await.into_result() {
        Ok(v) => match v.encode() {
            Ok(stored) => (stored, Ok(v)),
            Err(e) => {
                // The side effect happened but its answer cannot be stored: keep the claim (a
                // retry gets "in progress", then re-claims after the lease) rather than run it
                // twice.
                tracing::error!(target: "idem", error = %e, "cannot encode the response for storage");
                guard.keep_claimed();
                return errors.fail(e);
            }
        },
        Err(e) => match errors.finals.as_ref().filter(|f| (f.is_final)(&e)) {
            Some(finals) => match (finals.encode)(&e) {
                Ok(stored) => (stored, Err(e)),
                Err(enc) => {
                    tracing::error!(target: "idem", error = %enc, "cannot store a final error; releasing the claim instead");
                    let released = store.release(guard.claim()).await;
                    let _ = guard.released(released);
                    return R::from_err(e);
                }
            },
            None => {
                // Only successes (and final errors) are worth replaying: free the key for a
                // real retry.
                let released = store.release(guard.claim()).await;
                let _ = guard.released(released);
                return R::from_err(e);
            }
        },
    };
    let mut result = store.complete(guard.claim(), &stored).await;
    if let Err(Error::Unavailable(_)) = result {
        result = guard.retry_complete(&stored).await;
    }
    match (guard.completed(result), out) {
        (_, Err(e)) => R::from_err(e),
        (Ok(()), Ok(v)) => R::from_ok(v),
        // A newer attempt owns the record; its answer is the one that will be replayed.
        (Err(e @ Error::FenceLost { .. }), Ok(_)) => errors.fail(e),
        // The effect happened and this is its answer: hand it back. The record stays claimed
        // until its lease runs out (see Guard::complete).
        (Err(e), Ok(v)) => {
            tracing::error!(target: "idem", error = %e, "could not store the response; returning it unstored");
            R::from_ok(v)
        }
    }
}

/// A stored response, as the function's return value: its `Ok`, or a stored final error.
pub(crate) fn replay<R, M>(stored: StoredResponse, errors: &ErrorOps<R::Err>) -> R
where
    R: IdemResult,
    R::Ok: Replay<M>,
{
    note_replay(&stored);
    if stored.is_error {
        return match &errors.finals {
            Some(finals) => match (finals.decode)(stored) {
                Ok(e) => R::from_err(e),
                Err(e) => errors.fail(e),
            },
            None => errors.fail(Error::Decode(
                "the stored response is a final error, but this function does not store final errors (on_error = \"store_final\")".into(),
            )),
        };
    }
    match R::Ok::decode(stored) {
        Ok(v) => R::from_ok(v),
        Err(e) => errors.fail(e),
    }
}

/// Tells the HTTP layer, when there is one around this request, that the response is a replay.
pub(crate) fn note_replay(stored: &StoredResponse) {
    #[cfg(feature = "axum")]
    crate::http::note_replay(stored);
    #[cfg(not(feature = "axum"))]
    let _ = stored;
}

/// A driver error, sorted into "retry later" and "broken"; see [`crate::Error`].
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub fn sql_error(e: sqlx::Error) -> Error {
    crate::store::sql::map_err(e)
}

/// The connection the generated statements run on: a pool's, or the caller's own.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[allow(clippy::type_complexity)]
pub fn transition_acquire<'c, A: sqlx::Acquire<'c>>(
    executor: A,
) -> std::pin::Pin<Box<dyn Future<Output = Result<A::Connection, sqlx::Error>> + Send + 'c>> {
    executor.acquire()
}

/// Which SQL dialect a connection speaks.
#[diagnostic::on_unimplemented(
    message = "idem's generated SQL runs on PostgreSQL and SQLite, not on `{Self}`",
    label = "the executor must be a PostgreSQL or SQLite pool, connection or transaction"
)]
pub trait Dialect {
    const POSTGRES: bool;
}

#[cfg(feature = "postgres")]
impl Dialect for sqlx::PgConnection {
    const POSTGRES: bool = true;
}

#[cfg(feature = "sqlite")]
impl Dialect for sqlx::SqliteConnection {
    const POSTGRES: bool = false;
}

pub fn is_postgres<C: Dialect + ?Sized>(_conn: &C) -> bool {
    C::POSTGRES
}

/// A row kept changing under every attempt.
pub fn contention(table: &str) -> Error {
    Error::Unavailable(format!("a row of {table} kept changing under every attempt").into())
}

pub fn unknown_state(machine: &str, text: &str) -> Error {
    Error::Decode(format!("{text:?} is not a state of {machine}"))
}

pub const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

pub const fn const_str_in(text: &str, all: &[&str]) -> bool {
    let mut i = 0;
    while i < all.len() {
        if const_str_eq(text, all[i]) {
            return true;
        }
        i += 1;
    }
    false
}

pub const fn const_edge_in(from: &str, to: &str, edges: &[(&str, &str)]) -> bool {
    let mut i = 0;
    while i < edges.len() {
        if const_str_eq(from, edges[i].0) && const_str_eq(to, edges[i].1) {
            return true;
        }
        i += 1;
    }
    false
}
