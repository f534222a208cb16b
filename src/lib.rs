//! idem makes a service idempotent by annotation: a retried, raced, replayed or redelivered
//! request runs its side effect once, and every attempt gets the first answer back, byte for
//! byte.
//!
//! ```toml
//! [dependencies]
//! idem = "0.1"            # SQLite store by default; add features = ["postgres", "axum"]
//! ```
//!
//! ```
//! use idem::{idempotent, MemoryStore};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Refund { order_no: String, cents: u64 }
//!
//! #[idempotent(scope = "refund:<order_no>", key = key, store = store)]
//! async fn refund(store: &MemoryStore, order_no: String, key: &str, cents: u64)
//!     -> Result<Refund, idem::Error>
//! {
//!     // Move the money here: this runs once per (order, key), however often it is called.
//!     Ok(Refund { order_no, cents })
//! }
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let first = refund(&store, "ORD-1".into(), "k-1", 250).await?;
//! let again = refund(&store, "ORD-1".into(), "k-1", 250).await?;   // replayed, body not run
//! assert_eq!(first.cents, again.cents);
//! # Ok::<(), idem::Error>(())
//! # }).unwrap();
//! ```
//!
//! The pieces:
//! - [`macro@idempotent`] rewrites an `async fn` into begin → replay or run → complete.
//! - [`macro@state_transition`] generates the guarded `UPDATE` of a state machine and says what
//!   happened when it did not apply.
//! - Stores: [`MemoryStore`], [`SqliteStore`] (feature `sqlite`, default), [`PgStore`] (feature
//!   `postgres`), all passing one conformance suite.
//! - [`begin`] and [`Guard`]: the same lifecycle by hand.
//!
//! # Features
//!
//! - `sqlite` (default): the SQLite store, bundled.
//! - `postgres`: the PostgreSQL store.
//! - `axum`: the HTTP integration: `IdempotencyKey` extractor, problem+json errors, replay
//!   header, lookup by key.
//! - `metrics`: counters for every outcome through the `metrics` facade.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    rust_2018_idioms
)]
#![forbid(unsafe_code)]

/// Makes an `async fn` idempotent: a retried, raced or redelivered call runs the body once,
/// and every call gets the first answer back.
///
/// The function must return `Result<T, E>` where `T` can be stored and replayed ([`Replay`]:
/// serde types, [`Idempotent<T>`], and with the `axum` feature `Json<T>` and
/// `(StatusCode, Json<T>)`) and `E: From<idem::Error>`. Its signature, attributes, docs and
/// generics stay as written; only the body is rewritten, and the future stays `Send` when the
/// body is.
///
/// # Arguments
///
/// | argument | meaning |
/// |---|---|
/// | `scope = "refund:<order_no>"` | **required.** What the operation acts on. `<placeholders>` name arguments (bound by their patterns: `Path(order_no)` binds `order_no`) or field paths of them (`<user.id>`); values are percent-encoded so different values never give the same scope. Two placeholders need a delimiter such as `:` between them. |
/// | `key = <expr>` | **required.** The idempotency key: anything [`ToKey`]: a `&str` or `String` (validated with [`KeyPolicy::DEFAULT`]), an integer message id, a [`Key`], the HTTP extractor. A bad key is rejected before the store is touched. |
/// | `store = <expr>` | The store, by place (`app.idem`, `self.store`, a `&MemoryStore` argument): it is cloned, which is cheap. Without it, the store installed with [`set_default_store`]. |
/// | `fingerprint(a, b)` | Fingerprint exactly these arguments. |
/// | `skip(a, b)` | Fingerprint every argument but these. `#[idem(skip)]` on a parameter does the same. By default every argument is fingerprinted except `self`, the key and the store when they are plain arguments; an argument that is not `Serialize` is a compile error pointing at it. |
/// | `lease = "30s"` | How long a claim lives before it is presumed abandoned (default `"5m"`). Units `ms`, `s`, `m`, `h`, `d`; checked at compile time. |
/// | `retain = "24h"` | How long the answer is replayed (default `"24h"`); at least the lease. |
/// | `on_error = "release"` | `"release"` (default): an `Err` frees the key so a retry runs the body again. `"store_final"`: errors for which [`FinalError::is_final`] holds are stored and replayed like successes. |
/// | `on_expired_lease = "reclaim"` | `"reclaim"` (default): an abandoned claim is taken over (fence + 1, with its recovery point). `"fail_closed"`: keep answering "in progress". |
/// | `transaction = tx` | Transactional mode ([`TxStore`]: SQLite or PostgreSQL): the body gets `tx: &mut sqlx::Transaction<'static, DB>`; the claim, the body's SQL and the completion commit together, and an `Err` or a panic rolls all of them back. |
/// | `crate = "path::to::idem"` | Where idem is, when it is re-exported under another path. |
///
/// # Examples
///
/// ```
/// use idem::{idempotent, Error, MemoryStore};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// pub struct Refund { pub order_no: String, pub cents: u64 }
///
/// pub struct Payments { pub idem: MemoryStore }
///
/// impl Payments {
///     #[idempotent(scope = "refund:<order_no>", key = key, store = self.idem)]
///     pub async fn refund(&self, order_no: String, key: &str, cents: u64) -> Result<Refund, Error> {
///         // Runs once per (order, key). A retry with another amount is `Error::KeyReused`.
///         Ok(Refund { order_no, cents })
///     }
/// }
/// ```
///
/// Transactional, on SQLite:
///
/// ```
/// use idem::{idempotent, Error, SqliteStore};
///
/// #[idempotent(scope = "order:<sku>", key = key, store = store, transaction = tx)]
/// async fn create_order(store: &SqliteStore, sku: i64, key: &str) -> Result<i64, Error> {
///     let row: (i64,) = sqlx::query_as("INSERT INTO orders (sku) VALUES ($1) RETURNING id")
///         .bind(sku)
///         .fetch_one(&mut **tx)
///         .await
///         .map_err(|e| Error::Store(e.into()))?;
///     Ok(row.0)
/// }
/// ```
///
/// Mistakes are compile errors on the offending tokens:
///
/// ```compile_fail
/// use idem::{idempotent, Error};
///
/// // `<order_id>` names no argument of `refund`.
/// #[idempotent(scope = "refund:<order_id>", key = key)]
/// async fn refund(order_no: String, key: String) -> Result<u64, Error> {
///     Ok(1)
/// }
/// ```
///
/// # Expansion
///
/// ```text
/// #[idempotent(scope = "refund:<order_no>", key = key, store = self.idem)]
/// pub async fn refund(&self, order_no: String, key: &str, cents: u64) -> Result<Refund, Error> {
///     BODY
/// }
/// ```
///
/// becomes, in outline (every generated name is hygienic, every path absolute):
///
/// ```text
/// pub async fn refund(&self, order_no: String, key: &str, cents: u64) -> Result<Refund, Error> {
///     let store = idem::__private::store((self.idem).clone());      // checks: a store
///     let errors = idem::__private::errors::<Error>();              // checks: From<idem::Error>
///     let policy = idem::__private::Policy::DEFAULT;                // .lease(..) .retain(..)
///     let result = idem::__private::run(&store, idem::__private::Prepared {
///         key: idem::__private::key(&(key)),                        // checks: ToKey
///         scope: { /* ScopeBuilder: "refund:" + encoded order_no */ },
///         fingerprint: (|| { /* Fingerprintable::add_to(&order_no), (&cents) */ })(),
///         policy,
///     }, errors, async move {
///         // if false { return <the return type>; }  -- types the body's `?` and `return`
///         BODY
///     }).await;                                                     // checks: Refund: Replay
///     result
/// }
/// ```
///
/// `run` begins (one statement on SQL stores); a replay decodes the stored answer and never
/// polls the body; a claim awaits the body in place (no boxing, no spawn), then completes with
/// the encoded `Ok` or releases on `Err`. A panic or a dropped future releases the claim at
/// once. In transactional mode the body is awaited between `tx_start` (open, claim) and
/// `tx_finish` (complete and commit, or roll back).
#[doc(inline)]
pub use idem_macros::idempotent;

#[doc(inline)]
pub use idem_runtime::{
    BeginOutcome, BeginRequest, Begun, BoxError, CachedStore, ClaimRef, Claimed, Clock, DynStore,
    Error, ExpiredLease, FinalError, Fingerprint, Fingerprinter, Guard, Idempotent, Key, KeyError,
    KeyPolicy, ManualClock, MemoryStore, Policy, Record, RecordState, Replay, Result, ScopeBuilder,
    SharedStore, Store, StoredResponse, Sweeper, SystemClock, ToKey, begin, default_store,
    downstream_key, set_default_store, spawn_sweeper,
};

#[doc(inline)]
pub use idem_runtime::{clock, error, fingerprint, guard, key, record, replay, scope, store};

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
#[doc(inline)]
pub use idem_runtime::SqliteStore;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[doc(inline)]
pub use idem_runtime::PgStore;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
#[doc(inline)]
pub use idem_runtime::TxStore;

/// Support for macro-generated code. Not a public API: anything here may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use idem_runtime::private::*;
}
