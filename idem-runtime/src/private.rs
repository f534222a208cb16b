//! Support for the code the macros generate. Not a stable API: names and signatures here change
//! without notice.
//!
//! Only shims live here: each property of the user's code is required by exactly one generated
//! call, spanned on the tokens it is about, so that a mistake produces one error in the right
//! place — the store ([`store`], [`tx_store`]), the `Ok` type ([`run`], [`tx_finish`]), the error
//! type ([`errors`], [`errors_final`]), the key ([`key`]), each fingerprinted argument
//! ([`Fingerprintable`]). The lifecycle itself is [`crate::flow`].

#![allow(missing_docs)]

pub use crate::default_store::DefaultStore;
pub use crate::error::Error;
pub use crate::fingerprint::{Fingerprint, Fingerprinter};
pub use crate::flow::{Body, ErrorOps, IdemResult, Plain, Prepared, WithClaim, run};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use crate::flow::{TxClaim, TxStart, tx_finish, tx_start};
pub use crate::guard::ClaimInfo;
pub use crate::key::{Key, ToKey};
pub use crate::record::{ExpiredLease, Policy, StoredResponse};
pub use crate::replay::{FinalError, Replay};
pub use crate::scope::ScopeBuilder;
pub use crate::store::Store;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use crate::store::TxStore;
pub use crate::transition::{
    Created, Miss, StateMachine, StateValue, Transition, Versioned, classify_miss,
    warn_guard_differs_after, warn_guard_mismatch,
};
pub use serde;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use sqlx;

use crate::flow::FinalOps;
use crate::replay::{decode_final, encode_final};

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

/// An argument that `key = …` reads but is not itself (`key = req.key`): it goes into the
/// fingerprint like any other argument, and when it cannot, the message says why it is there.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be fingerprinted",
    label = "`key = …` reads this argument, and only an argument that is the key itself (`key = key`) is left out of the fingerprint",
    note = "if it is not part of the request, leave it out with `#[idem(skip)]` on the argument or `skip(…)` in the attribute; if it is, derive `serde::Serialize` for it"
)]
pub trait KeySource {
    fn add_to(&self, f: &mut Fingerprinter) -> Result<(), Error>;
}

impl<T: serde::Serialize + ?Sized> KeySource for T {
    fn add_to(&self, f: &mut Fingerprinter) -> Result<(), Error> {
        f.add(self)
    }
}

/// A value in a scope placeholder.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a scope value",
    label = "a placeholder is rendered with `Display`",
    note = "an `Option` or a struct has no `Display`: name a field that is always there (`<user.id>`), or an argument that holds the text"
)]
pub trait ScopeValue {
    fn add_to(&self, scope: &mut ScopeBuilder);
}

impl<T: std::fmt::Display + ?Sized> ScopeValue for T {
    fn add_to(&self, scope: &mut ScopeBuilder) {
        scope.value(self);
    }
}

pub fn key<K: ToKey + ?Sized>(k: &K) -> Result<Key, Error> {
    k.to_key()
}

#[derive(Debug)]
pub enum Direct {}
#[derive(Debug)]
pub enum Pointer {}

/// Declares a trait for "a value that gives a store with this capability": the store itself, or
/// a smart pointer to one (`Arc<PgStore>`), told apart by the marker `M`. A value that is
/// neither matches no implementation, so its handle is an error type after one error, spanned on
/// the argument, and nothing downstream reports the same mistake again.
macro_rules! store_argument {
    ($(#[$doc:meta])* $name:ident: $bound:path) => {
        $(#[$doc])*
        pub trait $name<M> {
            type Handle: $bound + Clone;
            fn into_handle(self) -> Self::Handle;
        }

        impl<S: $bound + Clone> $name<Direct> for S {
            type Handle = S;
            fn into_handle(self) -> S {
                self
            }
        }

        impl<P, S> $name<Pointer> for P
        where
            P: std::ops::Deref<Target = S>,
            S: $bound + Clone,
        {
            type Handle = S;
            fn into_handle(self) -> S {
                (*self).clone()
            }
        }
    };
}

store_argument!(
    /// A value that gives a store.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` is not an idempotency store",
        label = "not a store",
        note = "stores are `idem::MemoryStore`, `idem::SqliteStore`, `idem::PgStore`, `idem::CachedStore<_>`, a type implementing `idem::Store`, or a pointer to one such as `Arc<PgStore>`"
    )]
    IsStore: Store
);

pub fn store<S: IsStore<M>, M>(s: S) -> S::Handle {
    s.into_handle()
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
store_argument!(
    /// A value that gives a store that can run the body in its transaction.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot run a guarded body inside a database transaction",
        label = "not a transactional store",
        note = "`transaction = …` needs `idem::SqliteStore` or `idem::PgStore` (or a pointer to one)"
    )]
    IsTxStore: TxStore
);

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub fn tx_store<S: IsTxStore<M>, M>(s: S) -> S::Handle {
    s.into_handle()
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
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<A::Connection, sqlx::Error>> + Send + 'c>,
> {
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
