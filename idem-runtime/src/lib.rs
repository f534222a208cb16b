//! The runtime of idem ([`idempotency`](https://docs.rs/idempotency) on crates.io, library
//! `idem`): keys, scopes, fingerprints, the idempotency record lifecycle and the stores that keep
//! records.
//!
//! Applications depend on `idempotency`, which re-exports everything here as `idem::…`, together
//! with the `#[idempotent]` and `#[state_transition]` macros. This crate is what the macros expand to, and
//! the API for guarding an operation by hand:
//!
//! ```
//! use idem::{begin, Begun, Fingerprint, Key, MemoryStore, Policy, StoredResponse};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let key = Key::parse("order-7f3a")?;
//! let fp = Fingerprint::of(&("sku-9001", 2))?;
//! if let Begun::Claimed(guard) = begin(&store, "order:u1".into(), key, fp, Policy::DEFAULT).await? {
//!     guard.complete(&StoredResponse::ok(b"{\"orderNo\":\"A1\"}".to_vec())).await?;
//! }
//! # Ok::<(), idem::Error>(())
//! # }).unwrap();
//! ```
//!
//! # Features
//!
#![cfg_attr(
    feature = "sqlite",
    doc = "- `sqlite` (default): [`SqliteStore`], bundled SQLite through sqlx."
)]
#![cfg_attr(
    not(feature = "sqlite"),
    doc = "- `sqlite` (default): `SqliteStore`, bundled SQLite through sqlx."
)]
#![cfg_attr(feature = "postgres", doc = "- `postgres`: [`PgStore`].")]
#![cfg_attr(not(feature = "postgres"), doc = "- `postgres`: `PgStore`.")]
#![cfg_attr(
    feature = "mysql",
    doc = "- `mysql`: [`MySqlStore`], MySQL 8 or MariaDB: records in both modes, the operators' operations and the outbox (`outbox::MySqlOutbox`)."
)]
#![cfg_attr(
    not(feature = "mysql"),
    doc = "- `mysql`: `MySqlStore`, MySQL 8 or MariaDB: records in both modes, the operators' operations and the outbox (`outbox::MySqlOutbox`)."
)]
#![cfg_attr(
    feature = "redis",
    doc = "- `redis`: [`RedisStore`], Redis or Valkey, standalone or cluster."
)]
#![cfg_attr(
    not(feature = "redis"),
    doc = "- `redis`: `RedisStore`, Redis or Valkey, standalone or cluster."
)]
//! - `axum`: the `axum` module: the `IdempotencyKey` extractor, problem+json errors, the replay
//!   layer.
//! - `tower`: the `tower` module: a layer that guards any `http` service (axum, tonic, hyper)
//!   without annotating its handlers.
//! - `testkit`: the store conformance suite, `testkit`.
//! - `metrics`: counters for every outcome through the `metrics` facade.
//! - `nats`: NATS JetStream consumers ([`consumer::nats`]) and an outbox publisher.
//! - `amqp`: RabbitMQ consumers ([`consumer::amqp`]) and an outbox publisher.
//! - `client`: the `client` module: a reqwest-middleware middleware that keeps one key per
//!   logical operation across retries, honours `Retry-After`, and asks by key after a timeout.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    rust_2018_idioms
)]
#![forbid(unsafe_code)]

#[cfg(all(
    feature = "sql",
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql"))
))]
compile_error!(
    "the feature `sql` is the SQL stores' shared engine: turn on a store's feature (`sqlite`, `postgres` or `mysql`) instead"
);

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod admin;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod axum;
pub mod cache;
#[cfg(feature = "client")]
#[cfg_attr(docsrs, doc(cfg(feature = "client")))]
pub mod client;
pub mod clock;
pub mod completer;
pub mod consumer;
pub mod context;
mod default_store;
pub mod error;
pub mod fingerprint;
pub mod flow;
pub mod guard;
#[cfg(any(
    feature = "axum",
    feature = "tower",
    feature = "client",
    feature = "utoipa"
))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(
        feature = "axum",
        feature = "tower",
        feature = "client",
        feature = "utoipa"
    )))
)]
pub mod http;
pub mod key;
pub mod lifecycle;
pub mod limit;
mod observe;
#[cfg(feature = "utoipa")]
#[cfg_attr(docsrs, doc(cfg(feature = "utoipa")))]
pub mod openapi;
#[cfg(feature = "sql")]
#[cfg_attr(docsrs, doc(cfg(feature = "sql")))]
pub mod outbox;
pub mod record;
pub mod replay;
pub mod scope;
pub mod store;
#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub mod testkit;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;
pub mod transition;

#[doc(hidden)]
pub mod private;

pub use crate::cache::CachedStore;
pub use crate::clock::{Clock, ManualClock, SystemClock};
pub use crate::context::Context;
pub use crate::default_store::{default_store, set_default_store};
pub use crate::error::{BoxError, Error, KeyError, Result};
pub use crate::fingerprint::{Fingerprint, Fingerprinter};
pub use crate::flow::{
    Begun, HintBasis, RetryHint, begin, default_policy, set_retry_hint, with_default_policy,
    with_retry_hint,
};
pub use crate::guard::{ClaimInfo, Guard, downstream_key};
pub use crate::key::{Key, KeyPolicy, ToKey};
pub use crate::limit::BoundedStore;
pub use crate::record::{
    BeginOutcome, BeginRequest, ClaimRef, Claimed, ExpiredLease, Policy, Record, RecordState,
    RequestCap, StoredRequest, StoredResponse, Unfinished,
};
pub use crate::replay::{FinalError, Idempotent, Replay};
pub use crate::scope::ScopeBuilder;
pub use crate::store::memory::MemoryStore;
pub use crate::store::sweeper::{Sweeper, spawn_sweeper};
pub use crate::store::{DynStore, SharedStore, Store};
pub use crate::transition::{Created, StateMachine, Transition, Versioned};

#[cfg(feature = "sql")]
pub use crate::store::TxStore;

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use crate::store::mysql::MySqlStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use crate::store::postgres::{GroupCommit, PgStore};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use crate::store::redis::{RedisStore, RedisStoreBuilder};
#[cfg(feature = "sql-groups")]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "sqlite"))))]
pub use crate::store::sql::GroupCommitStats;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use crate::store::sqlite::SqliteStore;
/// The sqlx idem is built with: use it for pools and rows, so the versions agree.
#[cfg(feature = "sql")]
#[cfg_attr(docsrs, doc(cfg(feature = "sql")))]
pub use sqlx;
