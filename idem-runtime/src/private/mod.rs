//! Support for the code the macros generate. Not a stable API: names and signatures here change
//! without notice.
//!
//! Only shims live here: each property of the user's code is required by exactly one generated
//! call, spanned on the tokens it is about, so that a mistake produces one error in the right
//! place — the store (`store`, `tx_store`), the `Ok` type (`run`, `tx_finish`), the error
//! type ([`ErrorType`], [`FinalErrorType`]), the key ([`key`]), each fingerprinted argument
//! ([`Fingerprintable`]). The lifecycle itself is [`crate::flow`].

#![allow(missing_docs)]

pub use crate::__idem_contract as contract;
pub use crate::default_store::DefaultStore;
pub use crate::error::Error;
pub use crate::fingerprint::{Fingerprint, Fingerprinter};
pub use crate::flow::{
    Body, DetachedBody, ErrorOps, IdemResult, Plain, Prepared, Timing, WithClaim, default_policy,
    run, run_detached,
};
#[cfg(feature = "sql")]
pub use crate::flow::{TxClaim, TxStart, tx_finish, tx_start};
pub use crate::guard::ClaimInfo;
pub use crate::key::{Key, ToKey};
pub use crate::record::{ExpiredLease, Policy, StoredResponse};
pub use crate::replay::{FinalError, Replay};
pub use crate::scope::ScopeBuilder;
pub use crate::store::Store;
#[cfg(feature = "sql")]
pub use crate::store::TxStore;
pub use crate::transition::{
    Created, Miss, StateMachine, StateValue, Transition, Versioned, classify_miss,
    warn_guard_differs_after, warn_guard_mismatch,
};
pub use serde;
#[cfg(feature = "sql")]
pub use sqlx;

use std::marker::PhantomData;

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
    /// The argument as a resumable call stores it.
    fn request_value(&self) -> Result<serde_json::Value, Error>;
}

impl<T: serde::Serialize + ?Sized> Fingerprintable for T {
    fn add_to(&self, f: &mut Fingerprinter) -> Result<(), Error> {
        f.add(self)
    }
    fn request_value(&self) -> Result<serde_json::Value, Error> {
        request_value(self)
    }
}

fn request_value<T: serde::Serialize + ?Sized>(v: &T) -> Result<serde_json::Value, Error> {
    serde_json::to_value(v)
        .map_err(|e| Error::Encode(format!("a resumable call's argument cannot be stored: {e}")))
}

/// The stored arguments of a resumable call: a JSON object, by argument name.
#[derive(Debug, Default)]
pub struct RequestArgs(serde_json::Map<String, serde_json::Value>);

impl RequestArgs {
    pub fn new() -> Self {
        RequestArgs::default()
    }

    pub fn add(&mut self, name: &str, value: serde_json::Value) {
        self.0.insert(name.to_owned(), value);
    }

    pub fn finish(self) -> Result<Vec<u8>, Error> {
        serde_json::to_vec(&self.0)
            .map_err(|e| Error::Encode(format!("a resumable call's request cannot be stored: {e}")))
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
    /// The argument as a resumable call stores it.
    fn request_value(&self) -> Result<serde_json::Value, Error>;
}

impl<T: serde::Serialize + ?Sized> KeySource for T {
    fn add_to(&self, f: &mut Fingerprinter) -> Result<(), Error> {
        f.add(self)
    }
    fn request_value(&self) -> Result<serde_json::Value, Error> {
        request_value(self)
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

/// A scope value, for the check that refuses floats: `(&ScopeProbe(&v)).scope_kind()` picks
/// [`FloatScope`] for `f32` and `f64` (and references to them) and [`AnyScope`] for anything
/// else, by autoref, and only [`StableScope`] passes [`stable_scope_value`].
#[derive(Debug)]
pub struct ScopeProbe<'a, T: ?Sized>(pub &'a T);

/// A float in a scope placeholder.
#[derive(Debug)]
pub struct FloatInScope;
/// Any other scope value.
#[derive(Debug)]
pub struct StableScope;

/// The kind is an associated type: for a value whose type is an error already (a misspelled
/// field), it is an error too, and the compiler says nothing more about it.
pub trait FloatScope {
    type Kind;
    fn scope_kind(&self) -> Self::Kind;
}
macro_rules! float_scope {
    ($($t:ty),*) => {$(
        impl FloatScope for ScopeProbe<'_, $t> {
            type Kind = FloatInScope;
            fn scope_kind(&self) -> FloatInScope {
                FloatInScope
            }
        }
    )*};
}
float_scope!(f64, f32, &f64, &f32);

pub trait AnyScope {
    fn scope_kind(&self) -> StableScope {
        StableScope
    }
}
impl<T: ?Sized> AnyScope for &ScopeProbe<'_, T> {}

/// A scope value that renders the same for the same request.
#[diagnostic::on_unimplemented(
    message = "a float cannot be a scope value: it makes no stable key",
    label = "this placeholder is a float",
    note = "the same amount can render with other digits (`0.1 + 0.2` is `0.30000000000000004`), so a retry could get another scope: use an integer in minor units (cents, as `u64` or `i64`) or the text the client sent (`String`)"
)]
pub trait StableScopeValue {}
impl StableScopeValue for StableScope {}

pub fn stable_scope_value<K: StableScopeValue>(_: K) {}

pub fn key<K: ToKey + ?Sized>(k: &K) -> Result<Key, Error> {
    k.to_key()
}

#[derive(Debug)]
pub enum Direct {}
#[derive(Debug)]
pub enum Pointer {}

#[derive(Debug)]
pub enum PointerToPointer {}

/// Declares a trait for "a value that gives a store with this capability": the store itself, a
/// smart pointer to one (`Arc<PgStore>`, `&MemoryStore`) or a reference to such a pointer
/// (`&Arc<PgStore>`), told apart by the marker `M`. A value that is none of these matches no
/// implementation, so its handle is an error type after one error, spanned on the argument, and
/// nothing downstream reports the same mistake again.
macro_rules! store_argument {
    ($(#[$doc:meta])* $name:ident: $bound:path) => {
        $(#[$doc])*
        pub trait $name<'a, M> {
            type Handle: $bound;
            fn handle(&'a self) -> &'a Self::Handle;
        }

        impl<'a, S: $bound> $name<'a, Direct> for S {
            type Handle = S;
            fn handle(&'a self) -> &'a S {
                self
            }
        }

        impl<'a, P, S> $name<'a, Pointer> for P
        where
            P: std::ops::Deref<Target = S> + 'a,
            S: $bound,
        {
            type Handle = S;
            fn handle(&'a self) -> &'a S {
                self
            }
        }

        impl<'a, P, Q, S> $name<'a, PointerToPointer> for P
        where
            P: std::ops::Deref<Target = Q> + 'a,
            Q: std::ops::Deref<Target = S> + 'a,
            S: $bound,
        {
            type Handle = S;
            fn handle(&'a self) -> &'a S {
                self
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

/// The store `store = …` names: a clone of its handle, which is cheap. `Clone` is a bound of
/// its own, so a store that is not `Clone` (a generic `S: Store`) is told that, not that it is
/// no store.
pub fn store<'a, S: IsStore<'a, M>, M>(s: &'a S) -> S::Handle
where
    S::Handle: Clone,
{
    s.handle().clone()
}

#[cfg(feature = "sql")]
store_argument!(
    /// A value that gives a store that can run the body in its transaction.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot run a guarded body inside a database transaction",
        label = "not a transactional store",
        note = "`transaction = …` needs `idem::SqliteStore`, `idem::PgStore` or `idem::MySqlStore` (or a pointer to one)"
    )]
    IsTxStore: TxStore
);

#[cfg(feature = "sql")]
pub fn tx_store<'a, S: IsTxStore<'a, M>, M>(s: &'a S) -> S::Handle
where
    S::Handle: Clone,
{
    s.handle().clone()
}

/// The error type of a guarded function: idem's own failures become it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error type of an #[idempotent] function: it has no `From<idem::Error>`",
    label = "idem's own errors are returned as this type",
    note = "idem returns its own failures (a store that is down, a key reused with another request, a call still in progress) as the function's error type: implement `From<idem::Error>` for it, e.g. with a variant that wraps `idem::Error`",
    note = "a type of another crate (`std::io::Error`, `String`) cannot be given that impl here: return an error type of your own that wraps it, or `idem::Error`, or `Box<dyn std::error::Error + Send + Sync>`"
)]
pub trait ErrorType: Sized {
    /// Errors release the claim.
    fn errors<M>() -> ErrorOps<Self, M>;
}

#[diagnostic::do_not_recommend]
impl<E: From<Error>> ErrorType for E {
    fn errors<M>() -> ErrorOps<E, M> {
        ErrorOps::releasing()
    }
}

/// The error type of a function with `on_error = "store_final"`: it says which of its errors
/// are final, and they can be stored.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say which of its errors are final",
    label = "`on_error = \"store_final\"` stores this type's final errors",
    note = "implement `idem::FinalError` for it (`is_final`; the type must be `Serialize` and `Deserialize`, as a final error is stored and replayed), or leave out `on_error` so that every error releases the claim"
)]
pub trait FinalErrorType: Sized {
    /// Final errors are stored and replayed; the others release the claim.
    fn with_finals<M>(ops: ErrorOps<Self, M>) -> ErrorOps<Self, M>;
}

#[diagnostic::do_not_recommend]
impl<E: FinalError> FinalErrorType for E {
    fn with_finals<M>(ops: ErrorOps<E, M>) -> ErrorOps<E, M> {
        ErrorOps {
            finals: Some(FinalOps {
                is_final: E::is_final,
                encode: encode_final::<E>,
                decode: decode_final::<E>,
            }),
            ..ops
        }
    }
}

/// Errors release the claim: for an error type not written in the signature (`AppResult<T>`).
pub fn errors<E: ErrorType, M>() -> ErrorOps<E, M> {
    E::errors()
}

/// Final errors are stored and replayed; the others release the claim: for an error type not
/// written in the signature.
pub fn errors_final<E: ErrorType + FinalErrorType, M>() -> ErrorOps<E, M> {
    E::with_finals(E::errors())
}

pub use crate::replay::Shape;

/// Picks the marker of an `Ok` type written like an HTTP answer (`Json<T>`,
/// `(StatusCode, Json<T>)`) by method resolution: `(&ShapeProbe::<T>::new()).shape()` is
/// [`HttpShape::shape`] when `T` is axum's, else [`AnyShape::shape`], whose marker stays
/// inferred as for any other type. So a `T` inside that lacks serde is named, and another
/// crate's `Json` is left alone.
#[derive(Debug)]
pub struct ShapeProbe<T>(PhantomData<fn() -> T>);

impl<T> ShapeProbe<T> {
    pub fn new() -> Self {
        ShapeProbe(PhantomData)
    }
}

impl<T> Default for ShapeProbe<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The answers of the HTTP integration: their marker is [`marker::Http`](crate::replay::marker::Http).
pub trait HttpShape {
    fn shape(&self) -> Shape<crate::replay::marker::Http>;
}

/// Every other type: the marker is inferred.
pub trait AnyShape {
    fn shape<M>(&self) -> Shape<M>;
}

impl<T> AnyShape for &ShapeProbe<T> {
    fn shape<M>(&self) -> Shape<M> {
        Shape(PhantomData)
    }
}

#[cfg(feature = "axum")]
impl<T> HttpShape for ShapeProbe<axum::Json<T>> {
    fn shape(&self) -> Shape<crate::replay::marker::Http> {
        Shape(PhantomData)
    }
}

#[cfg(feature = "axum")]
impl<T> HttpShape for ShapeProbe<(http::StatusCode, axum::Json<T>)> {
    fn shape(&self) -> Shape<crate::replay::marker::Http> {
        Shape(PhantomData)
    }
}

mod machine;
pub use machine::*;
pub mod columns;
#[cfg(feature = "sql")]
mod sql;
#[cfg(feature = "sql")]
pub use sql::*;

/// Marks the implementation of a check trait that applies.
#[derive(Debug)]
pub enum Holds {}

/// Marks a second implementation that never applies: with two candidates, the compiler weighs
/// the first one's bounds before choosing it, so a type that fails them matches no
/// implementation, is reported once, and is an error type in the code after the check.
#[derive(Debug)]
pub enum Never {}

/// Implemented by no type.
pub trait Impossible {
    fn never() -> std::convert::Infallible;
}

/// Registers what a guarded function promises, for `idem::openapi` (feature `utoipa`): the
/// function's name, its module, its scope template, its lease, retention and wait in
/// milliseconds if the attribute sets them, and whether it is transactional. Nothing without the
/// feature.
#[cfg(feature = "utoipa")]
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_contract {
    ($($args:expr),* $(,)?) => {
        $crate::openapi::__submit! { $crate::openapi::Contract::new($($args),*) }
    };
}

/// See the `utoipa` version: nothing to register without the feature.
#[cfg(not(feature = "utoipa"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_contract {
    ($($args:tt)*) => {};
}
