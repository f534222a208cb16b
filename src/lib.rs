//! idem makes a service idempotent by annotation: a retried, raced, replayed or redelivered
//! request runs its side effect once, and every attempt gets the first answer back, byte for
//! byte.
//!
//! ```toml
//! [dependencies]
//! idempotency = "0.1"  # used as `idem`; SQLite by default; add features = ["postgres", "axum"]
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
//! - [`consumer`]: the same guard on message deliveries, a runner that acks, retries and
//!   dead-letters each outcome, and adapters for NATS JetStream (`nats`) and RabbitMQ (`amqp`).
//! - [`outbox`]: events enqueued in the transaction of the state change they announce, and a
//!   relay that publishes them.
//!
//! # Features
//!
//! - `sqlite` (default): the SQLite store, bundled.
//! - `postgres`: the PostgreSQL store.
//! - `axum`: the HTTP integration: `IdempotencyKey` extractor, problem+json errors, replay
//!   header, lookup by key.
//! - `metrics`: counters for every outcome through the `metrics` facade.
//! - `nats`: NATS JetStream consumers and an outbox publisher (`consumer::nats`).
//! - `amqp`: RabbitMQ consumers and an outbox publisher (`consumer::amqp`).

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
/// | `claim = c` | The body gets `c: `[`ClaimInfo`]: its fence, whether it took over an abandoned claim, the recovery point, and [`ClaimInfo::downstream_key`] for calls to the outside world. |
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
/// `run` begins (one statement for a new key or a replay on PostgreSQL; on SQLite a `SELECT`, then
/// an `INSERT` for a new key; one more, a fence-conditional `UPDATE`, to take over an abandoned
/// claim); a replay decodes the stored answer and never
/// polls the body; a claim awaits the body in place (no boxing, no spawn), then completes with
/// the encoded `Ok` or releases on `Err`. A panic or a dropped future releases the claim at
/// once. In transactional mode the body is awaited between `tx_start` (open, claim) and
/// `tx_finish` (complete and commit, or roll back).
#[doc(inline)]
pub use idem_macros::idempotent;

#[doc(inline)]
pub use idem_runtime::{
    BeginOutcome, BeginRequest, Begun, BoxError, CachedStore, ClaimInfo, ClaimRef, Claimed, Clock,
    DynStore, Error, ExpiredLease, FinalError, Fingerprint, Fingerprinter, Guard, Idempotent, Key,
    KeyError, KeyPolicy, ManualClock, MemoryStore, Policy, Record, RecordState, Replay, Result,
    ScopeBuilder, SharedStore, Store, StoredResponse, Sweeper, SystemClock, ToKey, begin,
    default_store, downstream_key, set_default_store, spawn_sweeper,
};

#[doc(inline)]
pub use idem_runtime::{
    clock, consumer, error, fingerprint, guard, key, record, replay, scope, store, transition,
};

#[doc(inline)]
pub use idem_runtime::transition::{Created, StateMachine, Transition, Versioned};

/// Generates the guarded `UPDATE` of a state transition and classifies what happened when it
/// did not apply: [`Transition`]`::{Applied, AlreadyApplied, GuardMismatch, Illegal, NotFound}`.
///
/// Declare an `async fn` without a body. Its first argument is the executor: anything
/// [`sqlx::Acquire`](https://docs.rs/sqlx/latest/sqlx/trait.Acquire.html) for PostgreSQL or SQLite
/// (a `&PgPool`, a `&mut PgConnection`, a `&mut Transaction<…>`). Every other argument fills the
/// column of the same name. It returns `Result<Transition<R, S>, E>` with `R` the `returning` row
/// (or `()`), `S` the machine's enum (or `String`), and `E: From<idem::Error>`.
///
/// One round trip when the transition applies; one more, a `SELECT` by key, only when it does
/// not. A guard mismatch (the row is in a `from` state but a guard column differs) is logged at
/// `warn` and returned, never swallowed.
///
/// # Arguments
///
/// | argument | meaning |
/// |---|---|
/// | `table = "orders"` | **required.** The table (`schema.table` allowed). |
/// | `key = "order_no"` | **required.** The key column(s), comma-separated. |
/// | `from = "PENDING"` or `from = ["PENDING", "PAID"]` | **required.** The states the transition starts from. |
/// | `to = "PAID"` | **required.** The target state; not one of `from`. |
/// | `state = "status"` | The state column (default `status`). |
/// | `guard = "amount_cents"` | Extra columns that must equal their arguments. |
/// | `set = "paid_at = now(), paid_by"` | Extra columns to set: from the argument of the same name, or `now()` (the database's clock). |
/// | `returning = Order` | A `sqlx::FromRow` type: the row after the update (`RETURNING *`), or as found. |
/// | `machine = OrderStatus` | A [`state_machine!`]: `from` and `to` must be its states and every `from → to` one of its edges, checked at compile time; `Illegal { current }` is then typed. |
/// | `crate = "path::to::idem"` | Where idem is, when it is re-exported. |
///
/// Table and column names must be SQL identifiers (letters, digits, `_`): anything else,
/// such as an injection attempt in a name, is a compile error. Names are quoted, so they are
/// case-sensitive as written. Values are always bound as parameters.
///
/// # Examples
///
/// ```
/// use idem::{Error, Transition};
///
/// idem::state_machine! {
///     pub enum OrderStatus {
///         Pending = "PENDING",
///         Paid = "PAID",
///         Shipped = "SHIPPED",
///         Done = "DONE",
///         Cancelled = "CANCELLED",
///     }
///     Pending -> Paid -> Shipped -> Done;
///     Pending -> Cancelled;
///     Paid -> Cancelled;
/// }
///
/// #[derive(sqlx::FromRow)]
/// pub struct Order { pub order_no: String, pub status: String }
///
/// #[idem::state_transition(
///     table = "orders", key = "order_no", from = "PENDING", to = "PAID",
///     guard = "amount_cents", set = "paid_at = now()", returning = Order, machine = OrderStatus,
/// )]
/// pub async fn mark_paid(db: &sqlx::PgPool, order_no: &str, amount_cents: i64)
///     -> Result<Transition<Order, OrderStatus>, Error>;
/// ```
///
/// A transition the machine does not allow does not compile:
///
/// ```compile_fail
/// # use idem::{Error, Transition};
/// # idem::state_machine! {
/// #     pub enum OrderStatus { Pending = "PENDING", Paid = "PAID", Shipped = "SHIPPED", Cancelled = "CANCELLED" }
/// #     Pending -> Paid -> Shipped;
/// #     Pending -> Cancelled;
/// #     Paid -> Cancelled;
/// # }
/// // There is no SHIPPED -> CANCELLED edge.
/// #[idem::state_transition(table = "orders", key = "order_no", from = "SHIPPED", to = "CANCELLED", machine = OrderStatus)]
/// pub async fn cancel(db: &sqlx::PgPool, order_no: &str) -> Result<Transition<(), OrderStatus>, Error>;
/// ```
///
/// # Expansion
///
/// The example above runs, on PostgreSQL (SQLite writes `CURRENT_TIMESTAMP` for `now()`):
///
/// ```sql
/// UPDATE "orders" SET "status" = $3, "paid_at" = now()
///  WHERE "order_no" = $1 AND "status" IN ($4) AND "amount_cents" = $2 RETURNING *
/// -- $1 order_no, $2 amount_cents, $3 'PAID', $4 'PENDING'
/// ```
///
/// and, only when no row was updated:
///
/// ```sql
/// SELECT "status" AS "__idem_state",
///        COALESCE(("amount_cents" = $2), false) AS "__idem_guards_match", *
///   FROM "orders" WHERE "order_no" = $1
/// ```
///
/// then: no row → `NotFound`; state `PAID` → `AlreadyApplied(row)` (with a warn event if the
/// amount differs from this call's); state `PENDING` (so the amount differs) →
/// `GuardMismatch(row)` and a warn event; any other state → `Illegal { current }`. With a machine, a `const` block in the body checks the edge at
/// compile time.
#[doc(inline)]
pub use idem_macros::state_transition;

/// Renders a scope template from the variables in scope, exactly as `#[idempotent]` renders it
/// from a function's arguments: for looking a record up by key in another handler.
///
/// Evaluates to `Result<String, idem::Error>` (too long a scope is [`Error::InvalidScope`]).
///
/// ```
/// struct User { id: u64 }
/// let user = User { id: 7 };
/// let scope = idem::scope!("order:<user.id>").unwrap();
/// assert_eq!(scope, "order:7");
/// ```
#[doc(inline)]
pub use idem_macros::scope;

/// Declares a state machine once: an enum of states with their column texts, and the edges
/// between them. `#[state_transition(machine = …)]` refuses, at compile time, a transition the
/// machine does not allow.
///
/// The enum gets `Debug`, `Clone`, `Copy`, `Eq`, `Hash`, `as_str`, `parse`, `can_become`,
/// `Display`, `FromStr`, serde (as its text) and [`StateMachine`].
///
/// ```
/// idem::state_machine! {
///     /// The order lifecycle.
///     pub enum OrderStatus {
///         Pending = "PENDING",
///         Paid = "PAID",
///         Shipped = "SHIPPED",
///         Done = "DONE",
///         Cancelled = "CANCELLED",
///     }
///     Pending -> Paid -> Shipped -> Done;
///     Pending -> Cancelled;
///     Paid -> Cancelled;
/// }
///
/// assert!(OrderStatus::Paid.can_become(OrderStatus::Cancelled));
/// assert!(!OrderStatus::Shipped.can_become(OrderStatus::Cancelled));
/// assert_eq!(OrderStatus::parse("DONE"), Some(OrderStatus::Done));
/// ```
#[doc(inline)]
pub use idem_macros::state_machine;

/// Generates an optimistic, versioned `UPDATE`: it applies only if the row still has the
/// version that was read, and says [`Versioned`]`::{Updated { version }, Stale { current_version
/// }, NotFound}`. Retry stale updates with [`transition::retry_versioned`].
///
/// Arguments: `table`, `key` (columns), `set` (columns, from the arguments of the same name),
/// `version` (the column, default `version`; the argument of that name is the version read),
/// `crate`.
///
/// ```
/// use idem::{Error, Versioned};
///
/// #[idem::versioned_update(table = "user_profile", key = "user_id", set = "nickname")]
/// pub async fn set_nickname(db: &sqlx::PgPool, user_id: i64, nickname: &str, version: i64)
///     -> Result<Versioned, Error>;
/// ```
///
/// # Expansion
///
/// ```sql
/// UPDATE "user_profile" SET "nickname" = $2, "version" = "version" + 1
///  WHERE "user_id" = $1 AND "version" = $3 RETURNING "version"
/// -- only when nothing was updated:
/// SELECT "version" FROM "user_profile" WHERE "user_id" = $1
/// ```
#[doc(inline)]
pub use idem_macros::versioned_update;

/// Generates a create-once insert by a unique business number: it inserts, or, when the number
/// is taken, returns the row that has it ([`Created`]`::{Inserted, Existing}`), never a
/// unique-violation error. Safe inside a transaction (no statement fails).
///
/// Arguments: `table`, `unique` (the column(s) of a unique index, which must be among the
/// arguments), `returning` (a `sqlx::FromRow` type), `crate`. Every argument after the executor
/// is an inserted column.
///
/// ```
/// use idem::{Created, Error};
///
/// #[derive(sqlx::FromRow)]
/// pub struct Order { pub id: i64, pub order_no: String }
///
/// #[idem::create_once(table = "orders", unique = "order_no", returning = Order)]
/// pub async fn insert_order(db: &sqlx::PgPool, order_no: &str, user_id: i64, amount_cents: i64)
///     -> Result<Created<Order>, Error>;
/// ```
///
/// # Expansion
///
/// ```sql
/// INSERT INTO "orders" ("order_no", "user_id", "amount_cents") VALUES ($1, $2, $3)
///  ON CONFLICT ("order_no") DO NOTHING RETURNING *
/// -- only when the number was taken:
/// SELECT * FROM "orders" WHERE "order_no" = $1
/// ```
#[doc(inline)]
pub use idem_macros::create_once;

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
#[doc(inline)]
pub use idem_runtime::SqliteStore;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[doc(inline)]
pub use idem_runtime::http;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[doc(inline)]
pub use idem_runtime::PgStore;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
#[doc(inline)]
pub use idem_runtime::TxStore;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
#[doc(no_inline)]
pub use idem_runtime::sqlx;

#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
#[doc(inline)]
pub use idem_runtime::testkit;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
#[doc(inline)]
pub use idem_runtime::outbox;

/// Support for macro-generated code. Not a public API: anything here may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use idem_runtime::private::*;
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
