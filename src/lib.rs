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
//! - Stores: [`MemoryStore`], `SqliteStore` (feature `sqlite`, default), `PgStore` (feature
//!   `postgres`), `MySqlStore` (feature `mysql`: MySQL or MariaDB), `RedisStore` (feature
//!   `redis`: Redis or Valkey, standalone or cluster), all
//!   passing one conformance suite, which `testkit` (feature `testkit`) runs on a store of your
//!   own.
//! - [`begin`] and [`Guard`]: the same lifecycle by hand.
//! - [`consumer`]: the same guard on message deliveries, a runner that acks, retries and
//!   dead-letters each outcome, and adapters for NATS JetStream (`nats`) and RabbitMQ (`amqp`).
//! - [`outbox`]: events enqueued in the transaction of the state change they announce, and a
//!   relay that publishes them.
//!
//! The [`guide`] goes on from here: the guarantees layer by layer, the completer, any `http`
//! service and its clients, messages, a walkthrough of the example service, stores, operating it.
//!
//! # An axum handler, end to end
//!
//! With the features `axum` and `sqlite` (the default): the key comes from the
//! `Idempotency-Key` header, the scope is per order, a retry gets the first answer's exact bytes
//! with `Idempotent-Replayed: true`, and a retry with another body is 422.
//!
//! ```
//! use axum::{extract::{Path, State}, http::{Request, StatusCode}, routing::post, Json, Router};
//! use idem::axum::{IdempotencyKey, IdempotencyLayer};
//! use idem::{idempotent, SqliteStore};
//! use serde::{Deserialize, Serialize};
//! use tower::ServiceExt as _;
//!
//! #[derive(Clone)]
//! struct App { idem: SqliteStore }
//!
//! #[derive(Serialize, Deserialize)]
//! struct RefundRequest { cents: u64 }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Refund { order_no: String, cents: u64 }
//!
//! #[idempotent(scope = "refund:<order_no>", key = key, store = app.idem, skip(app))]
//! async fn refund(
//!     State(app): State<App>,
//!     Path(order_no): Path<String>,
//!     key: IdempotencyKey,
//!     Json(req): Json<RefundRequest>,
//! ) -> Result<(StatusCode, Json<Refund>), idem::Error> {
//!     // Move the money here: this runs once per (order, key).
//!     Ok((StatusCode::CREATED, Json(Refund { order_no, cents: req.cents })))
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let app = App { idem: SqliteStore::in_memory().await? };
//! let router = Router::new()
//!     .route("/orders/{order_no}/refunds", post(refund))
//!     .layer(IdempotencyLayer::new())
//!     .with_state(app);
//!
//! let send = |body: &'static str| {
//!     router.clone().oneshot(
//!         Request::post("/orders/ORD-1/refunds")
//!             .header("Idempotency-Key", "refund-7f3a")
//!             .header("Content-Type", "application/json")
//!             .body(axum::body::Body::from(body))
//!             .unwrap(),
//!     )
//! };
//! let first = send(r#"{"cents": 250}"#).await.unwrap();
//! assert_eq!(first.status(), StatusCode::CREATED);
//! let retry = send(r#"{"cents": 250}"#).await.unwrap();
//! assert_eq!(retry.status(), StatusCode::CREATED);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! let other = send(r#"{"cents": 999}"#).await.unwrap();
//! assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
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
#![cfg_attr(
    feature = "postgres",
    doc = "- `postgres`: [`PgStore`], for many instances sharing one database."
)]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "- `postgres`: `PgStore`, for many instances sharing one database."
)]
#![cfg_attr(
    feature = "mysql",
    doc = "- `mysql`: [`MySqlStore`], MySQL 8 or MariaDB, for many instances sharing one database, with its outbox (`outbox::MySqlOutbox`)."
)]
#![cfg_attr(
    not(feature = "mysql"),
    doc = "- `mysql`: `MySqlStore`, MySQL 8 or MariaDB, for many instances sharing one database, with its outbox (`outbox::MySqlOutbox`)."
)]
#![cfg_attr(
    feature = "axum",
    doc = "- `axum`: the [`axum`] module: the `IdempotencyKey` extractor, problem+json errors, \
           the replay layer, the lookup by key."
)]
#![cfg_attr(
    not(feature = "axum"),
    doc = "- `axum`: the `axum` module: the `IdempotencyKey` extractor, problem+json errors, \
           the replay layer, the lookup by key."
)]
#![cfg_attr(
    feature = "testkit",
    doc = "- `testkit`: the store conformance suite, [`testkit`], for a store of your own."
)]
#![cfg_attr(
    not(feature = "testkit"),
    doc = "- `testkit`: the store conformance suite, `testkit`, for a store of your own."
)]
#![cfg_attr(
    feature = "tower",
    doc = "- `tower`: the [`tower`] module, a layer that guards any `http` service (axum, tonic, \
           hyper) without annotating its handlers."
)]
#![cfg_attr(
    not(feature = "tower"),
    doc = "- `tower`: the `tower` module, a layer that guards any `http` service (axum, tonic, \
           hyper) without annotating its handlers."
)]
#![cfg_attr(
    feature = "redis",
    doc = "- `redis`: [`RedisStore`], Redis or Valkey, standalone or cluster."
)]
#![cfg_attr(
    not(feature = "redis"),
    doc = "- `redis`: `RedisStore`, Redis or Valkey, standalone or cluster."
)]
//! - `metrics`: counters for every outcome through the `metrics` facade.
//! - `nats`: NATS JetStream consumers and an outbox publisher (`consumer::nats`).
//! - `amqp`: RabbitMQ consumers and an outbox publisher (`consumer::amqp`).
#![cfg_attr(
    feature = "client",
    doc = "- `client`: the [`client`] module, a `reqwest-middleware` middleware for the client's \
           half: one key per logical operation until a definite answer, `Retry-After` \
           honoured, a lookup by key after a timeout."
)]
#![cfg_attr(
    not(feature = "client"),
    doc = "- `client`: the `client` module, a `reqwest-middleware` middleware for the client's \
           half: one key per logical operation until a definite answer, `Retry-After` \
           honoured, a lookup by key after a timeout."
)]
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
/// `(StatusCode, Json<T>)`) and `E: From<idem::Error>`. `T` owns its data (no `&str`, no
/// lifetime but `'static`): a replay rebuilds it from the stored bytes. A type parameter as
/// `T` needs `T: Serialize + DeserializeOwned`, as `E` needs `E: From<idem::Error>`, and a
/// fingerprinted argument of a type parameter or `impl Trait` needs `Serialize`; the compile
/// error names the bound that is missing. Its signature, attributes, docs and generics stay as
/// written; only the body is rewritten, and the future stays `Send` when the body is.
///
/// # Arguments
///
/// | argument | meaning |
/// |---|---|
/// | `scope = "refund:<order_no>"` | **required.** What the operation acts on: the operation's name as literal text (two functions with the same template would share their records, so a scope of placeholders alone is refused), then `<placeholders>` naming arguments (bound by their patterns: `Path(order_no)` binds `order_no`) or field paths of them (`<user.id>`), each rendered with `Display` (not a float: `f32` and `f64` render with other digits for the same amount, so they are refused; use an integer in minor units or a string). Values are percent-encoded so different values never give the same scope. Two placeholders need a delimiter such as `:` between them. |
/// | `key = <expr>` | **required.** The idempotency key, read from the request: anything [`ToKey`]: a `&str` or `String` (validated with [`KeyPolicy::DEFAULT`]), an integer message id, a [`Key`], the HTTP extractor. A bad key is rejected before the store is touched; a literal, or an expression that reads no argument (`key = KEY`, `key = next_key()`), is refused at compile time (every call would share it). |
/// | `store = <expr>` | The store, by place (`app.idem`, `self.store`, a `&MemoryStore` or `&Arc<PgStore>` argument): it is cloned, which is cheap, so a generic store needs `S: Store + Clone`. Without it, the store installed with [`set_default_store`]. An expression that builds a store (`MemoryStore::new()`, `SqliteStore::open(..)`, a builder, a struct literal) is refused at compile time: it would build a new one on every call, so every call would be a first call. |
/// | `fingerprint(a, b.c)` | Fingerprint exactly these arguments, or fields of them (`req.cents`). Not empty: a retry with other arguments must be refused, not answered. |
/// | `skip(a, b)` | Fingerprint every argument but these (names, not fields). `#[idem(skip)]` on a parameter does the same, and cannot be combined with `fingerprint(…)` listing it. By default every argument is fingerprinted except `self`, the key when it is an argument itself (`key = key`), and the store or the argument it is read from (`app` in `store = app.idem`: application state is not part of the request). An argument that `key = …` only reads (`headers` in `key = headers.key`) is fingerprinted. An argument that is not `Serialize` is a compile error pointing at it. |
/// | `lease = "30s"` | How long a claim lives before it is presumed abandoned (default `"5m"`), at least `"1s"`: a claim that runs out while the body runs lets a retry run it again. Units `ms`, `s`, `m`, `h`, `d`; checked at compile time. |
/// | `retain = "24h"` | How long the answer is replayed (default `"24h"`); at least the lease. |
/// | `wait = "2s"` | How long a duplicate of a running call (same scope, key and fingerprint) waits for its answer before it is told "in progress" ([`Error::InProgress`], 409 with `Retry-After`). Default: not at all. Within the bound the duplicate asks the store again, backing off from 5 ms to 250 ms, holding no connection in between, and replays the answer as soon as the running call completes (or claims the key and runs, if that call released it). At most the lease; not with `transaction`, where a duplicate already waits on the record's row lock. The axum layer and the tower guard set a wait for every call they serve (`axum::IdempotencyLayer::wait`, `tower::GuardLayer::wait`). |
/// | `on_error = "release"` | `"release"` (default): an `Err` frees the key so a retry runs the body again. `"store_final"`: errors for which [`FinalError::is_final`] holds are stored and replayed like successes. |
/// | `on_expired_lease = "reclaim"` | `"reclaim"` (default): an abandoned claim is taken over (fence + 1, with its recovery point). `"fail_closed"`: keep answering "in progress". |
/// | `on_cancel = "release"` | What a dropped call (a client that hung up, a timeout) does to a body still running. `"release"` (default): the body stops at its next `.await` and the claim is freed at once, so a retry runs it again (a `resumable` call's claim is suspended instead, for its retry or the completer to resume). `"finish"`: the claim, the body and the completion run to their end on a task of their own, and a retry gets "in progress", then the stored answer; choose it when the body calls the outside world and must not be cut halfway. The body must then be `Send` and own its arguments (no `&` parameters, `&self` included); not with `transaction`, where a dropped call rolls everything back. |
/// | `transaction = tx` | Transactional mode ([`TxStore`]: SQLite, PostgreSQL or MySQL): the body gets `tx: &mut sqlx::Transaction<'static, DB>`; the claim, the body's SQL and the completion commit together, and an `Err` or a panic rolls all of them back. A concurrent duplicate waits for the first transaction and replays its answer; on PostgreSQL and MySQL it waits at most `duplicate_wait(…)` on the store's builder (2 s), and only a quarter of the pool's connections wait at once, the others answered "in progress" (409 with `Retry-After`) so that retries of one slow request never take the pool. A body that uses `tx` without this argument (and binds no `tx` of its own) is a compile error at that use, which says to add it. |
/// | `resumable` | The call's fingerprinted arguments are stored with its claim (as a JSON object by argument name, at most `max_request`, else 413 `REQUEST_TOO_LARGE_TO_RESUME` before anything is claimed), so that a [`completer::Completer`] finishes it when its caller never comes back: the process died (its lease ran out), or the body said its outcome is unknown ([`ClaimInfo::outcome_unknown`]) and nobody retried. The resume function is registered under the scope template as written (`"refund:<order_no>"`); `resumable = "name"` names it otherwise. A dropped resumable call is suspended for the completer, never released. Not with `transaction` (a call cut off rolls back: nothing to resume) nor `on_expired_lease = "fail_closed"` (never taken over). |
/// | `max_request` | The size cap of a resumable call's stored request: `"512B"`, `"64KiB"`, `"1MiB"`; 1 byte to 1 MiB ([`RequestCap::MAX`]), `"64KiB"` when not given. A call whose arguments encode to more is refused with 413 `REQUEST_TOO_LARGE_TO_RESUME` ([`Error::RequestTooLarge`]) before anything is claimed. Only with `resumable`; a malformed or out-of-range size is a compile error on it. |
/// | `claim = c` | The body gets `c: `[`ClaimInfo`]: its fence, whether it took over an abandoned claim, the recovery point, and [`ClaimInfo::downstream_key`] for calls to the outside world. Likewise, a body that uses `claim` without `claim = claim` is told to add it. |
/// | `crate = "path::to::idem"` | Where idem is, when it is re-exported under another path. Without it, a crate whose `Cargo.toml` renames the dependency, or does not depend on idem at all, gets one error that says so. |
///
/// Where the attribute gives no `lease`, `retain`, `wait` or `on_expired_lease`, the call takes them
/// from the policy of the [`Context`] it runs in, else from [`Policy::DEFAULT`]: a
/// function called by a message consumer's handler keeps its records as long as the consumer
/// keeps its own (7 days by default), as long as redeliveries can come.
///
/// With the feature `utoipa`, the function also registers what its attribute declares (its
/// name, scope template, lease, retention, wait), which `openapi::Idempotency` writes into the
/// function's OpenAPI operation.
///
/// `#[idempotent]` is given once per function, on a function with a body: on a trait method,
/// put it on the method in each `impl` block, or on the trait's default body. It needs the
/// `async fn` itself: under `#[async_trait]`, which turns the methods of an `impl` into
/// functions returning a boxed future before `#[idempotent]` sees them, declare the method
/// `async fn` in the trait instead, or annotate an inherent `async fn` the method calls. Beside
/// `#[tracing::instrument]` it may come first or second.
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
///     let store = idem::__private::store(&(self.idem));             // checks: a store, Clone
///     let errors = <Error as idem::__private::ErrorType>::errors(); // checks: From<idem::Error>
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
/// `run` begins (one statement for a new key or a replay on PostgreSQL; on SQLite an `INSERT … ON
/// CONFLICT DO NOTHING`, then a `SELECT` when the key exists; one more, a fence-conditional
/// `UPDATE`, to take over an abandoned claim); a replay decodes the stored answer and never
/// polls the body; a claim awaits the body in place (no boxing, no spawn), then completes with
/// the encoded `Ok` or releases on `Err`. A panic or a dropped future releases the claim at
/// once. In transactional mode the body is awaited between `tx_start` (open, claim) and
/// `tx_finish` (complete and commit, or roll back).
#[doc(inline)]
pub use idem_macros::idempotent;

/// Everything the runtime exports, under the same names: the runtime's one list (its
/// `lib.rs`) is the facade's, with the macros beside it.
#[doc(inline)]
pub use idem_runtime::*;

/// The sqlx idem is built with, linked rather than inlined.
#[cfg(feature = "sql")]
#[doc(no_inline)]
pub use idem_runtime::sqlx;

/// Generates the guarded `UPDATE` of a state transition and classifies what happened when it
/// did not apply: [`Transition`]`::{Applied, AlreadyApplied, AppliedByAnother, GuardMismatch,
/// Illegal, NotFound}`. Only `Applied` says this call moved the row; with `owner = …`, a row
/// already in `to` also says whether this owner or another put it there.
///
/// Declare an `async fn` without a body. Its first argument is the executor: anything
/// [`sqlx::Acquire`](https://docs.rs/sqlx/latest/sqlx/trait.Acquire.html) for PostgreSQL, SQLite or
/// MySQL (a `&PgPool`, a `&mut PgConnection`, a `&mut Transaction<…>`). Every other argument fills the
/// column of the same name, and must be a type the executor's database can bind (`u64` on
/// PostgreSQL is an error on the argument). It returns `Result<Transition<R, S>, E>` with `R`
/// the `returning` row (written when `returning` is given, and only then), `S` the machine's
/// enum (only with `machine = …`) or `String`, and `E: From<idem::Error>`: each part is checked
/// where it is written.
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
/// | `key = "order_no"` | **required.** The key column(s), comma-separated. Their arguments are not `Option`s: `=` is never true for NULL, so a `None` would never find the row. |
/// | `from = "PENDING"` or `from = ["PENDING", "PAID"]` | **required.** The states the transition starts from: at least one, each one name (`"PENDING, PAID"` is refused: write a list). |
/// | `to = "PAID"` | **required.** The target state; one name, not one of `from`. |
/// | `state = "status"` | The state column (default `status`); not a key or guard column. |
/// | `guard = "amount_cents"` | Extra columns that must equal their arguments; not key columns. An argument that is an `Option` is compared so that `None` matches NULL (`IS NOT DISTINCT FROM` on PostgreSQL, `IS` on SQLite): a guard on a nullable column, where `=` would never match a NULL row. |
/// | `owner = "refund_request"` | A column that records who applied the transition: set to the argument of the same name when it applies, and compared with it when the row is already in `to`, so that this owner's earlier transition is `AlreadyApplied` and another's is `AppliedByAnother`. Use it before an irreversible effect: the request that won `PAID → REFUNDING` may refund (and resume after a crash); any other may not. Not the state, a key, a guard or a `set` column; the argument is not an `Option`. |
/// | `set = "paid_at = now(), paid_by"` | Extra columns to set: from the argument of the same name, or `now()` (the database's clock). Not the state column (the transition sets it to `to`), a key column (the row would move) or a guard column. |
/// | `returning = Order` | A `sqlx::FromRow` type: the row after the update (`RETURNING *`), or as found. The return type says `Transition<Order, …>`. |
/// | `machine = OrderStatus` | A [`state_machine!`]: `from` and `to` must be its states and every `from → to` one of its edges, checked at compile time; `Illegal { current }` is then typed. |
/// | `migrations = "../migrations"` | Where the migrations to check against are (see below), or `false` to check nothing against them. |
/// | `crate = "path::to::idem"` | Where idem is, when it is re-exported. |
///
/// Table and column names must be SQL identifiers (letters, digits, `_`): anything else,
/// such as an injection attempt in a name, is a compile error. Names are quoted, so they are
/// case-sensitive as written. Values are always bound as parameters.
///
/// # Checked against the migrations
///
/// At compile time, with no database, the attribute reads the crate's sqlx migrations and
/// replays their DDL (in sqlx's order; `.down.sql` files are not applied) into the tables,
/// columns, types, `NOT NULL`, `CHECK` constraints, enum types and keys they leave. The
/// migrations may be PostgreSQL's, SQLite's or MySQL's: the executor's type says which
/// (`PgPool`, `SqliteConnection`, `Transaction<'_, MySql>`), else their words do (`$$` bodies,
/// `AUTOINCREMENT`, backquotes and `ENGINE =`). MySQL's `ENUM('PENDING', …)` columns, `UNIQUE
/// KEY`, `ALTER TABLE … MODIFY | CHANGE | RENAME COLUMN` and `DROP INDEX` are followed. It then
/// checks, each error on the attribute's string or on the argument:
///
/// - the table exists (with the nearest name as a suggestion);
/// - every column the attribute names (`key`, `guard`, `state`, the targets of `set`) exists,
///   naming the migration that created the table and the last that changed it;
/// - `from` and `to` are values the state column allows, by its enum type, MySQL's
///   `ENUM(…)` or its `CHECK (… IN (…))`, and with `machine = …` so is every state of the
///   machine (a `const` check that names the state);
/// - each argument's type fits its column: `&str` for a `BIGINT` column is an error on the
///   argument. Only types idem knows are judged (integers, floats, `bool`, text, bytes, and
///   references and `Option`s of them); any other type (a newtype, `chrono`, `uuid`) is taken
///   at its word. Dates, times, UUIDs, JSON and decimals are judged on PostgreSQL only: SQLite
///   stores whatever is bound, and MySQL converts text to them;
/// - on PostgreSQL, a table or column written in another case than the migration's (the
///   generated SQL quotes names, so `"Orders"` is not `orders`); on MySQL, a table (MySQL on
///   Linux tells table names apart by case; column names it does not);
/// - the `key` columns of a transition or a versioned update include a primary key or unique
///   constraint (otherwise one `UPDATE` could move many rows).
///
/// The `returning` type's fields are not compared with the columns: an attribute cannot see
/// the fields of a struct declared elsewhere. What is checked is that the type can be read from
/// a row (`sqlx::FromRow`), on `returning`.
///
/// When the state column (or a key, guard or set column) is of a PostgreSQL enum type, the
/// generated statements cast the text bound to it (`CAST($1 AS "order_status")`) and read the
/// state back as text: without the migrations, such a column fails at run time.
///
/// Where the migrations are: the crate's `migrations/`, or the `[migrate] migrations-dir` of its
/// `sqlx.toml`, as for `sqlx::migrate!()`; or `migrations = "…"`, a directory of migrations or a
/// single `.sql` schema file, relative to the file the attribute is in (as for
/// `include_str!`). No migrations found: nothing is checked, and nothing is said.
///
/// A statement the SQL parser cannot read makes what it names uncertain: a problem with an
/// uncertain table or column is a warning (a deprecation warning whose note is the message),
/// never an error, since the statement may have made the difference.
///
/// Cargo rebuilds the crate when a migration the check read changes. To have it rebuild when a
/// migration is added, put this in the crate's `build.rs`:
///
/// ```text
/// fn main() {
///     println!("cargo:rerun-if-changed=migrations");
/// }
/// ```
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
/// `GuardMismatch(row)` and a warn event; any other state → `Illegal { current }`. With a
/// machine, a `const` block in the body checks the edge at compile time.
///
/// With `owner = "refund_request"`, the `UPDATE` also sets `"refund_request" = $n`, and the
/// `SELECT` reads `COALESCE(("refund_request" = $n), false) AS "__idem_owner_match"`: a row
/// already in `to` is then `AlreadyApplied(row)` when it matches and `AppliedByAnother(row)`
/// when it does not.
#[doc(inline)]
pub use idem_macros::state_transition;

/// Renders a scope template from the variables in scope, exactly as `#[idempotent]` renders it
/// from a function's arguments: for looking a record up by key in another handler. The template
/// follows the same rules: literal text (the operation's name), placeholders naming variables or
/// their fields, rendered with `Display`.
///
/// Evaluates to `Result<String, idem::Error>` (too long a scope is [`Error::InvalidScope`]).
///
/// ```
/// struct User { id: u64 }
/// let user = User { id: 7 };
/// let scope = idem::scope!("order:<user.id>").unwrap();
/// assert_eq!(scope, "order:7");
/// ```
///
/// Where idem is re-exported under another path, say where after the template, as `crate =
/// "…"` says it to the attributes:
///
/// ```
/// mod deps {
///     pub(crate) use idem;
/// }
/// # struct User { id: u64 }
/// # fn main() {
/// # let user = User { id: 7 };
/// let scope = idem::scope!("order:<user.id>", crate = "crate::deps::idem").unwrap();
/// # assert_eq!(scope, "order:7");
/// # }
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
///
/// Where idem is re-exported under another path, say where with `#[idem(crate = "…")]` on the
/// enum (the attribute is the macro's, not the enum's):
///
/// ```
/// mod deps {
///     pub(crate) use idem;
/// }
///
/// idem::state_machine! {
///     #[idem(crate = "crate::deps::idem")]
///     pub enum Light { Red = "RED", Green = "GREEN" }
///     Red -> Green -> Red;
/// }
/// # fn main() { assert!(Light::Red.can_become(Light::Green)); }
/// ```
#[doc(inline)]
pub use idem_macros::state_machine;

/// Generates an optimistic, versioned `UPDATE`: it applies only if the row still has the
/// version that was read, and says [`Versioned`]`::{Updated { version }, Stale { current_version
/// }, NotFound}`. Retry stale updates with [`transition::retry_versioned`].
///
/// Arguments: `table`, `key` (columns), `set` (columns, from the arguments of the same name; not
/// the version column, which the update bumps itself, nor a key column), `version` (the column,
/// default `version`; the argument of that name, an `i64` or narrower, is the version read),
/// `migrations`, `crate`. Checked against the migrations as
/// [`#[state_transition]`](macro@state_transition#checked-against-the-migrations) is, and the
/// version column must be an integer column.
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
/// arguments), `returning` (a `sqlx::FromRow` type, the `R` of `Created<R>`), `migrations`,
/// `crate`. Every argument after the executor is an inserted column; the `unique` ones are not
/// `Option`s (NULLs never conflict, so a `None` would insert a row on every call). Checked against the
/// migrations as [`#[state_transition]`](macro@state_transition#checked-against-the-migrations)
/// is; besides, every `NOT NULL` column without a default must be inserted, and `unique` must
/// be a primary key or a unique constraint (`ON CONFLICT` needs one).
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

pub mod guide;

/// Support for macro-generated code. Not a public API: anything here may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use idem_runtime::private::*;
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
