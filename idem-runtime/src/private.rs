//! Support for the code the macros generate. Not a stable API: names and signatures here change
//! without notice.
//!
//! Only shims live here: each property of the user's code is required by exactly one generated
//! call, spanned on the tokens it is about, so that a mistake produces one error in the right
//! place — the store (`store`, `tx_store`), the `Ok` type (`run`, `tx_finish`), the error
//! type ([`ErrorType`], [`FinalErrorType`]), the key ([`key`]), each fingerprinted argument
//! ([`Fingerprintable`]). The lifecycle itself is [`crate::flow`].

#![allow(missing_docs)]

pub use crate::default_store::DefaultStore;
pub use crate::error::Error;
pub use crate::fingerprint::{Fingerprint, Fingerprinter};
pub use crate::flow::{
    Body, DetachedBody, ErrorOps, IdemResult, Plain, Prepared, Timing, WithClaim, default_policy,
    run, run_detached,
};
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
        ErrorOps {
            from_idem: E::from,
            finals: None,
            replay: PhantomData,
        }
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

/// The replay marker of an `Ok` type, as a value ([`ErrorOps::replayed_as`]).
#[derive(Debug)]
pub struct Shape<M>(PhantomData<fn() -> M>);

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

/// A driver error, sorted into "retry later" and "broken"; see [`crate::Error`].
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub fn sql_error(e: sqlx::Error) -> Error {
    crate::store::sql::map_err(e)
}

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

/// The first argument of a generated statement function.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an executor",
    label = "the first argument runs the statements",
    note = "take a `&PgPool`, a `&mut PgConnection`, a `&mut Transaction<'_, Postgres>` or an `impl sqlx::Acquire<'_, Database = Postgres>` (or their SQLite counterparts) as the first argument"
)]
pub trait Executor<'c, M> {
    type Database: sqlx::Database;
    type Checked;
    fn checked(self) -> Self::Checked;
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[diagnostic::do_not_recommend]
impl<'c, A: sqlx::Acquire<'c>> Executor<'c, Holds> for A {
    type Database = A::Database;
    type Checked = A;
    fn checked(self) -> A {
        self
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[diagnostic::do_not_recommend]
impl<'c, A: Impossible> Executor<'c, Never> for A {
    #[cfg(feature = "sqlite")]
    type Database = sqlx::Sqlite;
    #[cfg(not(feature = "sqlite"))]
    type Database = sqlx::Postgres;
    type Checked = A;
    fn checked(self) -> A {
        self
    }
}

/// The executor, and its database: what every later check is against. When the argument is not
/// an executor, both are error types and nothing downstream reports the same mistake again.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub fn executor<'c, A: Executor<'c, M>, M>(a: A) -> (A::Checked, PhantomData<A::Database>) {
    (a.checked(), PhantomData)
}

/// A column argument: its value is bound as a statement parameter.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be sent to {DB} as a column value",
    label = "this argument is bound as a statement parameter",
    note = "sqlx binds integers as `i16`, `i32` or `i64` (PostgreSQL has no unsigned integers), text as `&str` or `String`, and any type that implements `sqlx::Type` and `sqlx::Encode` for the database"
)]
pub trait Bind<'q, DB, M> {
    type Value;
    fn checked(self) -> Self::Value;
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[diagnostic::do_not_recommend]
impl<'q, DB: sqlx::Database, T> Bind<'q, DB, Holds> for T
where
    T: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    type Value = T;
    fn checked(self) -> T {
        self
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[diagnostic::do_not_recommend]
impl<DB, T: Impossible> Bind<'_, DB, Never> for T {
    type Value = T;
    fn checked(self) -> T {
        self
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub fn bind<'q, DB, T: Bind<'q, DB, M>, M>(_db: &PhantomData<DB>, value: T) -> T::Value {
    value.checked()
}

/// The `returning` type of a generated statement.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be read from a row",
    label = "`returning` names the type each returned row is read into",
    note = "derive `sqlx::FromRow` for it: its fields are read from the columns of the same names"
)]
pub trait RowOf<DB: sqlx::Database, M>: Sized {
    fn decode(row: &DB::Row) -> Result<Self, sqlx::Error>;
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[diagnostic::do_not_recommend]
impl<DB: sqlx::Database, R> RowOf<DB, Holds> for R
where
    R: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    fn decode(row: &DB::Row) -> Result<Self, sqlx::Error> {
        R::from_row(row)
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[diagnostic::do_not_recommend]
impl<DB: sqlx::Database, R: Impossible> RowOf<DB, Never> for R {
    #[allow(unreachable_code)]
    fn decode(_row: &DB::Row) -> Result<Self, sqlx::Error> {
        match R::never() {}
    }
}

/// The row type, checked, with the function that reads it: the statements after the check
/// need no bound of their own, so a type that fails it is reported once.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub struct Rows<DB: sqlx::Database, R> {
    decode: fn(&DB::Row) -> Result<R, sqlx::Error>,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<DB: sqlx::Database, R> std::fmt::Debug for Rows<DB, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Rows")
    }
}

/// The row type `R` (from `row`), checked against the executor's database.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub fn rows<R: RowOf<DB, M>, DB: sqlx::Database, M>(
    _db: &PhantomData<DB>,
    _row: PhantomData<R>,
) -> Rows<DB, R> {
    Rows { decode: R::decode }
}

/// A row read into the checked row type.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub fn decode<DB: sqlx::Database, R>(rows: &Rows<DB, R>, row: &DB::Row) -> Result<R, Error> {
    (rows.decode)(row).map_err(sql_error)
}

/// How a generated statement function turns an [`Error`] into its own error type.
pub fn into_error<E: From<Error>>() -> fn(Error) -> E {
    E::from
}

/// The row type written in the return type, against `returning`.
#[diagnostic::on_unimplemented(
    message = "the return type reads rows as `{Self}`, but `returning = {R}`",
    label = "not the `returning` type",
    note = "the statement's rows are read into one type: name the same one in `returning` and in the return type"
)]
pub trait SameRow<R> {
    type Row;
}

impl<R> SameRow<R> for R {
    type Row = R;
}

/// The row type, when the return type's is `returning`'s.
pub fn same_row<T: SameRow<R>, R>() -> PhantomData<T::Row> {
    PhantomData
}

/// The state type written in `Transition<_, S>`, against `machine = M`.
#[diagnostic::on_unimplemented(
    message = "`Transition<_, {Self}>` names a state type other than `machine = {M}`",
    label = "not the machine's state type",
    note = "a state read from the column is parsed into the machine's enum: write `Transition<_, {M}>`, or `Transition<_, String>` for the column's text"
)]
pub trait StateOf<M> {
    type State;
}

impl<M: StateMachine> StateOf<M> for M {
    type State = M;
}

impl<M> StateOf<M> for String {
    type State = String;
}

pub fn state_of<S: StateOf<M>, M>() -> PhantomData<S::State> {
    PhantomData
}

/// The state type written in `Transition<_, S>` of a transition without `machine = …`.
#[diagnostic::on_unimplemented(
    message = "`Transition<_, {Self}>` needs `machine = {Self}` in the attribute",
    label = "a state type other than the column's text",
    note = "with `machine = {Self}`, `from` and `to` are checked against the machine at compile time; without one, a state is the column's text: `Transition<_, String>`"
)]
pub trait TextState {
    type State;
}

impl TextState for String {
    type State = String;
}

pub fn text_state<S: TextState>() -> PhantomData<S::State> {
    PhantomData
}

/// The state column's text, parsed into the checked state type.
pub fn state_value<S: StateValue>(_state: &PhantomData<S>, text: String) -> Result<S, Error> {
    S::from_column(text)
}

/// The argument holding the version an optimistic update expects.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot hold a row version",
    label = "the version that was read",
    note = "a version is an `i64` (an `i32` or `i16` is widened): the statement compares it, bumps it and returns the new one"
)]
pub trait VersionValue {
    fn get(&self) -> i64;
}

macro_rules! version_value {
    ($($t:ty),*) => {$(
        impl VersionValue for $t {
            fn get(&self) -> i64 {
                i64::from(*self)
            }
        }

        impl VersionValue for &$t {
            fn get(&self) -> i64 {
                i64::from(**self)
            }
        }
    )*};
}

version_value!(i64, i32, i16);

pub fn version<T: VersionValue>(v: &T) -> i64 {
    v.get()
}

/// The states and edges of a `state_machine!`, as their column texts, for the compile-time
/// checks of `#[state_transition(machine = …)]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a state machine",
    label = "`machine` names a type declared with `idem::state_machine!`",
    note = "declare the states and edges once with `idem::state_machine! {{ pub enum {Self} {{ … }} … }}`"
)]
pub trait MachineTexts {
    const MACHINE: MachineText;
}

/// A machine's states and edges, as column texts.
#[derive(Debug, Clone, Copy)]
pub struct MachineText {
    pub states: &'static [&'static str],
    pub edges: &'static [(&'static str, &'static str)],
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

/// The column-type check of a column argument, against the column's type in the migrations.
///
/// Only types whose meaning idem knows (integers, floats, `bool`, text, bytes, and references
/// or `Option`s of them) are judged; any other type (a newtype, `chrono`, `uuid`,
/// `rust_decimal`) is the user's word and passes, so that the check never refuses a program
/// the database would accept.
pub mod columns {
    #![allow(non_camel_case_types, non_snake_case, clippy::upper_case_acronyms)]

    use std::marker::PhantomData;

    /// A Rust type whose fit to each column type idem can tell.
    pub trait Known {}

    macro_rules! known {
        ($($t:ty),*) => {$( impl Known for $t {} )*};
    }

    known!(
        bool,
        i8,
        i16,
        i32,
        i64,
        u8,
        u16,
        u32,
        u64,
        f32,
        f64,
        str,
        String,
        [u8],
        Vec<u8>
    );

    impl<T: Known + ?Sized> Known for &T {}
    impl<T: Known + ?Sized> Known for &mut T {}
    impl<T: Known> Known for Option<T> {}
    impl<T: Known + ?Sized> Known for Box<T> {}

    /// A column type, by the name a migration gives it: a module with a marker type and a
    /// `Fits` that says which known Rust types fit it (a trait of its own, so that the
    /// compiler's message names the column type).
    macro_rules! column_types {
        ($($name:ident $message:literal $label:literal [$($t:ty),*];)*) => {$(
            pub mod $name {
                #[derive(Debug)]
                pub enum Column {}

                #[diagnostic::on_unimplemented(
                    message = $message,
                    label = $label,
                    note = "the column's type is read from the migrations: give the argument a type that fits it, or change the column in a migration"
                )]
                pub trait Fits {}

                $( impl Fits for $t {} )*
                impl<T: Fits + ?Sized> Fits for &T {}
                impl<T: Fits + ?Sized> Fits for &mut T {}
                impl<T: Fits> Fits for Option<T> {}
                impl<T: Fits + ?Sized> Fits for Box<T> {}
            }

        )*};
    }

    column_types! {
        TEXT "`{Self}` does not fit a TEXT column" "this argument fills a TEXT column" [str, String];
        SMALLINT "`{Self}` does not fit a SMALLINT column" "this argument fills a SMALLINT column" [i8, i16, i32, i64, u8, u16, u32, u64];
        INTEGER "`{Self}` does not fit an INTEGER column" "this argument fills an INTEGER column" [i8, i16, i32, i64, u8, u16, u32, u64];
        BIGINT "`{Self}` does not fit a BIGINT column" "this argument fills a BIGINT column" [i8, i16, i32, i64, u8, u16, u32, u64];
        REAL "`{Self}` does not fit a REAL column" "this argument fills a REAL column" [i8, i16, i32, i64, u8, u16, u32, u64, f32, f64];
        DOUBLE_PRECISION "`{Self}` does not fit a DOUBLE PRECISION column" "this argument fills a DOUBLE PRECISION column" [i8, i16, i32, i64, u8, u16, u32, u64, f32, f64];
        NUMERIC "`{Self}` does not fit a NUMERIC column" "this argument fills a NUMERIC column" [i8, i16, i32, i64, u8, u16, u32, u64, f32, f64];
        BOOLEAN "`{Self}` does not fit a BOOLEAN column" "this argument fills a BOOLEAN column" [bool];
        BYTEA "`{Self}` does not fit a BYTEA column" "this argument fills a BYTEA column" [[u8], Vec<u8>];
        BLOB "`{Self}` does not fit a BLOB column" "this argument fills a BLOB column" [[u8], Vec<u8>];
        TIMESTAMP "`{Self}` does not fit a TIMESTAMP column" "this argument fills a TIMESTAMP column: PostgreSQL does not take text or numbers for it" [];
        TIMESTAMPTZ "`{Self}` does not fit a TIMESTAMPTZ column" "this argument fills a TIMESTAMPTZ column: PostgreSQL does not take text or numbers for it" [];
        DATE "`{Self}` does not fit a DATE column" "this argument fills a DATE column: PostgreSQL does not take text or numbers for it" [];
        TIME "`{Self}` does not fit a TIME column" "this argument fills a TIME column: PostgreSQL does not take text or numbers for it" [];
        UUID "`{Self}` does not fit a UUID column" "this argument fills a UUID column: PostgreSQL does not take text for it" [];
        JSON "`{Self}` does not fit a JSON column" "this argument fills a JSON column: PostgreSQL does not take text for it, bind a `serde_json::Value` or `sqlx::types::Json`" [];
        ENUM "`{Self}` does not fit a column of an enum type" "this argument fills a column of an enum type: PostgreSQL does not take text for it, bind a type declared with `#[derive(sqlx::Type)]`" [];
    }

    // Written out, not generated: the compiler quotes the bound that failed.
    impl Strict<TEXT::Column> {
        pub fn fits<T: TEXT::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<SMALLINT::Column> {
        pub fn fits<T: SMALLINT::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<INTEGER::Column> {
        pub fn fits<T: INTEGER::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<BIGINT::Column> {
        pub fn fits<T: BIGINT::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<REAL::Column> {
        pub fn fits<T: REAL::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<DOUBLE_PRECISION::Column> {
        pub fn fits<T: DOUBLE_PRECISION::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<NUMERIC::Column> {
        pub fn fits<T: NUMERIC::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<BOOLEAN::Column> {
        pub fn fits<T: BOOLEAN::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<BYTEA::Column> {
        pub fn fits<T: BYTEA::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<BLOB::Column> {
        pub fn fits<T: BLOB::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<TIMESTAMP::Column> {
        pub fn fits<T: TIMESTAMP::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<TIMESTAMPTZ::Column> {
        pub fn fits<T: TIMESTAMPTZ::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<DATE::Column> {
        pub fn fits<T: DATE::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<TIME::Column> {
        pub fn fits<T: TIME::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<UUID::Column> {
        pub fn fits<T: UUID::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<JSON::Column> {
        pub fn fits<T: JSON::Fits + ?Sized>(self, _value: &T) {}
    }

    impl Strict<ENUM::Column> {
        pub fn fits<T: ENUM::Fits + ?Sized>(self, _value: &T) {}
    }

    /// The argument `T` for a column of type `F`: method resolution picks [`KnownType`] when
    /// idem can judge `T`, and [`OtherType`] when it cannot.
    #[derive(Debug)]
    pub struct Column<F, T: ?Sized>(PhantomData<F>, PhantomData<fn(&T)>);

    pub fn column<F, T: ?Sized>(_value: &T) -> Column<F, T> {
        Column(PhantomData, PhantomData)
    }

    pub trait KnownType<F> {
        fn rule(&self) -> Strict<F> {
            Strict(PhantomData)
        }
    }

    impl<F, T: Known + ?Sized> KnownType<F> for Column<F, T> {}

    pub trait OtherType {
        fn rule(&self) -> Lenient {
            Lenient
        }
    }

    impl<F, T: ?Sized> OtherType for &Column<F, T> {}

    /// The fit of a type idem knows: each column type's `fits` requires its `Fits`.
    #[derive(Debug)]
    pub struct Strict<F>(PhantomData<F>);

    /// Any other type: the user's word.
    #[derive(Debug)]
    pub struct Lenient;

    impl Lenient {
        pub fn fits<T: ?Sized>(self, _value: &T) {}
    }
}

/// The first of `states` not in `allowed`, or `""`: for the compile-time check that every
/// state of a machine is a value its column allows.
pub const fn first_not_in(states: &[&'static str], allowed: &[&str]) -> &'static str {
    let mut i = 0;
    while i < states.len() {
        if !const_str_in(states[i], allowed) {
            return states[i];
        }
        i += 1;
    }
    ""
}

/// The length of `parts` joined.
pub const fn concat_len(parts: &[&str]) -> usize {
    let (mut i, mut n) = (0, 0);
    while i < parts.len() {
        n += parts[i].len();
        i += 1;
    }
    n
}

/// `parts` joined, as bytes: a compile-time message built from constants.
pub const fn concat<const N: usize>(parts: &[&str]) -> [u8; N] {
    let mut out = [0u8; N];
    let (mut i, mut at) = (0, 0);
    while i < parts.len() {
        let bytes = parts[i].as_bytes();
        let mut j = 0;
        while j < bytes.len() && at < N {
            out[at] = bytes[j];
            at += 1;
            j += 1;
        }
        i += 1;
    }
    out
}

/// The text of bytes joined from `&str`s.
pub const fn utf8(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(_) => "",
    }
}
