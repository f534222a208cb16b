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
