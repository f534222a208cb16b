//! Support for the code `#[idempotent]` generates. Not a stable API: names and signatures here
//! change without notice.

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
pub use crate::transactional::{
    TxClaim, TxStart, tx_finish, tx_finish_final, tx_start, tx_start_final,
};
pub use serde::Serialize;

use crate::guard::{Begun, Guard, begin};
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
    fn from_ok(v: Self::Ok) -> Self;
    fn from_err(e: Self::Err) -> Self;
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
}

impl<T, E> IdemResult for Result<T, E> {
    type Ok = T;
    type Err = E;
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

/// The error type of a guarded function must take idem's errors.
#[diagnostic::on_unimplemented(
    message = "the error type `{Self}` of an #[idempotent] function must implement `From<idem::Error>`",
    label = "idem's errors (in progress, key reused, store unavailable) are returned through this type",
    note = "add `impl From<idem::Error> for {Self}`, or use `idem::Error` itself"
)]
pub trait FromIdemError: Sized {
    fn from_idem(e: Error) -> Self;
}

impl<E: From<Error>> FromIdemError for E {
    fn from_idem(e: Error) -> Self {
        E::from(e)
    }
}

pub fn key<K: ToKey + ?Sized>(k: &K) -> Result<Key, Error> {
    k.to_key()
}

pub fn fingerprint_arg<T: Fingerprintable + ?Sized>(
    f: &mut Fingerprinter,
    value: &T,
) -> Result<(), Error> {
    value.add_to(f)
}

/// Compile-time checks on the return type, emitted with the user's spans.
pub const fn assert_result<R: IdemResult>() {}
pub const fn assert_replay<T: Replay<M>, M>() {}
pub const fn assert_from_error<E: FromIdemError>() {}
pub const fn assert_final<E: FinalError>() {}

pub(crate) fn fail<R: IdemResult>(e: Error) -> R
where
    R::Err: FromIdemError,
{
    R::from_err(R::Err::from_idem(e))
}

#[derive(Debug)]
pub struct Prepared {
    pub scope: Result<String, Error>,
    pub key: Result<Key, Error>,
    pub fingerprint: Result<Fingerprint, Error>,
    pub policy: Policy,
}

impl Prepared {
    // A bad key is the client's error and is reported before anything about the scope.
    pub(crate) fn into_parts(self) -> Result<(String, Key, Fingerprint, Policy), Error> {
        let key = self.key?;
        Ok((self.scope?, key, self.fingerprint?, self.policy))
    }
}

/// The separate-commits flow: claim (committed), body, complete or release.
pub async fn run<S, R, M, F>(store: &S, prepared: Prepared, body: F) -> R
where
    S: Store,
    R: IdemResult,
    R::Ok: Replay<M>,
    R::Err: FromIdemError,
    F: Future<Output = R>,
{
    let (scope, key, fp, policy) = match prepared.into_parts() {
        Ok(parts) => parts,
        Err(e) => return fail(e),
    };
    match begin(store, scope, key, fp, policy).await {
        Err(e) => fail(e),
        Ok(Begun::Replay(stored)) => replay::<R, M>(stored),
        Ok(Begun::Claimed(guard)) => {
            let out = body.await;
            match out.into_result() {
                Ok(v) => complete(guard, v).await,
                Err(e) => {
                    // Only successes are worth replaying: give the claim up for a real retry.
                    let _ = guard.release().await;
                    R::from_err(e)
                }
            }
        }
    }
}

/// The separate-commits flow for functions whose final errors are stored and replayed.
pub async fn run_final<S, R, M, F>(store: &S, prepared: Prepared, body: F) -> R
where
    S: Store,
    R: IdemResult,
    R::Ok: Replay<M>,
    R::Err: FromIdemError + FinalError,
    F: Future<Output = R>,
{
    let (scope, key, fp, policy) = match prepared.into_parts() {
        Ok(parts) => parts,
        Err(e) => return fail(e),
    };
    match begin(store, scope, key, fp, policy).await {
        Err(e) => fail(e),
        Ok(Begun::Replay(stored)) if stored.is_error => {
            note_replay(&stored);
            match decode_final::<R::Err>(stored) {
                Ok(e) => R::from_err(e),
                Err(e) => fail(e),
            }
        }
        Ok(Begun::Replay(stored)) => replay::<R, M>(stored),
        Ok(Begun::Claimed(guard)) => match body.await.into_result() {
            Ok(v) => complete(guard, v).await,
            Err(e) if e.is_final() => match encode_final(&e) {
                Ok(stored) => {
                    let _ = guard.complete(&stored).await;
                    R::from_err(e)
                }
                Err(enc) => {
                    tracing::error!(target: "idem", error = %enc, "cannot store a final error; releasing instead");
                    let _ = guard.release().await;
                    R::from_err(e)
                }
            },
            Err(e) => {
                let _ = guard.release().await;
                R::from_err(e)
            }
        },
    }
}

pub(crate) fn replay<R, M>(stored: crate::record::StoredResponse) -> R
where
    R: IdemResult,
    R::Ok: Replay<M>,
    R::Err: FromIdemError,
{
    if stored.is_error {
        return fail(Error::Decode(
            "the stored response is a final error, but this function does not store final errors (on_error = \"store_final\")".into(),
        ));
    }
    note_replay(&stored);
    match R::Ok::decode(stored) {
        Ok(v) => R::from_ok(v),
        Err(e) => fail(e),
    }
}

async fn complete<S, R, M>(guard: Guard<'_, S>, v: R::Ok) -> R
where
    S: Store,
    R: IdemResult,
    R::Ok: Replay<M>,
    R::Err: FromIdemError,
{
    let stored = match v.encode() {
        Ok(stored) => stored,
        Err(e) => {
            // The side effect happened but its answer cannot be stored: keep the claim (a retry
            // gets "in progress", then re-claims after the lease) rather than run it twice.
            tracing::error!(target: "idem", error = %e, "cannot encode the response for storage");
            guard.keep_claimed();
            return fail(e);
        }
    };
    match guard.complete(&stored).await {
        Ok(()) => R::from_ok(v),
        // A newer attempt owns the record; its answer is the one that will be replayed.
        Err(e @ Error::FenceLost { .. }) => fail(e),
        // The effect happened and this is its answer: hand it back. The record stays claimed
        // until its lease runs out (see Guard::complete).
        Err(e) => {
            tracing::error!(target: "idem", error = %e, "could not store the response; returning it unstored");
            R::from_ok(v)
        }
    }
}

/// Tells the HTTP layer, when there is one around this request, that the response is a replay.
pub(crate) fn note_replay(stored: &crate::record::StoredResponse) {
    #[cfg(feature = "axum")]
    crate::http::note_replay(stored);
    #[cfg(not(feature = "axum"))]
    let _ = stored;
}
