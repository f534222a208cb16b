//! The HTTP API: handlers, extractors, errors and the router.

use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::http::{IdempotencyKey, IdempotencyLayer, Problem};
use idem::{Key, Store, Transition, Versioned, idempotent};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::db::{Db, Order, OrderStatus, PgDb, SqliteDb};
use crate::events::{self, Events};
use crate::gateway::MoneyMove;

/// The application state: the database (with the simulated payment gateway's ledger and the
/// outbox) and the idempotency store (in the same database, or in Redis).
#[derive(Clone)]
pub struct App<D, S> {
    pub db: D,
    pub idem: S,
}

/// Connects to `database_url` (PostgreSQL), or opens the SQLite file it names, and returns the
/// router with a description of where things are kept. Idempotency records go to `redis` when
/// given, else into the same database as the orders. With `nats_url`, a relay publishes the
/// outbox's events to JetStream; without it they wait in the outbox (`GET /api/outbox`).
pub async fn build(
    database_url: &str,
    redis: Option<idem::RedisStore>,
    nats_url: Option<&str>,
) -> Result<(Router, String), Box<dyn std::error::Error>> {
    if database_url.starts_with("postgres") {
        let db = PgDb::connect(database_url).await?;
        with_events(db, redis, nats_url, "PostgreSQL".into()).await
    } else {
        let db = SqliteDb::open(database_url).await?;
        with_events(db, redis, nats_url, format!("SQLite ({database_url})")).await
    }
}

async fn with_events<D: Events>(
    db: D,
    redis: Option<idem::RedisStore>,
    nats_url: Option<&str>,
    database: String,
) -> Result<(Router, String), Box<dyn std::error::Error>> {
    events::prepare(&db).await?;
    if let Some(url) = nats_url {
        events::start_relay(db.clone(), url).await?;
    }
    Ok(match redis {
        Some(idem) => (
            router(App { db, idem }),
            format!("{database}; idempotency records in Redis"),
        ),
        None => {
            let idem = db.store().clone();
            (router(App { db, idem }), database)
        }
    })
}

/// Connects to the Redis store named by `url`: one `redis://…` URL for a standalone server or
/// Valkey, several separated by commas for a cluster; keys under `prefix` (default `idem:`).
pub async fn connect_redis(
    url: &str,
    prefix: Option<&str>,
) -> Result<idem::RedisStore, idem::Error> {
    let mut builder = idem::RedisStore::builder();
    if let Some(prefix) = prefix {
        builder = builder.prefix(prefix);
    }
    let nodes: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    if nodes.len() > 1 {
        builder.connect_cluster(nodes).await
    } else {
        builder.connect(url).await
    }
}

/// Every route, behind the idempotency layer. Replays answer 200 (the first answer may be
/// 201), with the first body byte for byte and `Idempotent-Replayed: true`.
pub fn router<D: Events, S: Store + Clone>(app: App<D, S>) -> Router {
    Router::new()
        .route("/api/orders", post(create_order::<D, S>))
        .route("/api/orders/by-key/{key}", get(order_by_key::<D, S>))
        .route("/api/payments/callback", post(payment_callback::<D, S>))
        .route("/api/orders/{order_no}/refunds", post(refund::<D, S>))
        .route("/api/orders/{order_no}/ship", post(ship::<D, S>))
        .route("/api/orders/{order_no}/confirm", post(confirm::<D, S>))
        .route(
            "/api/users/{user_id}/profile",
            get(profile::<D, S>).patch(update_profile::<D, S>),
        )
        .route("/api/gateway/ledger", get(ledger::<D, S>))
        .route("/api/outbox", get(outbox::<D, S>))
        .layer(IdempotencyLayer::new().replay_status(StatusCode::OK))
        .with_state(app)
}

// ---- errors ------------------------------------------------------------------------------------

/// The API's errors, as RFC 9457 problem details.
#[derive(Debug)]
pub enum AppError {
    Idem(idem::Error),
    Problem(Box<Problem>),
}

impl AppError {
    fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        AppError::Problem(Box::new(Problem::new(status, code, detail)))
    }
}

impl From<idem::Error> for AppError {
    fn from(e: idem::Error) -> Self {
        AppError::Idem(e)
    }
}

impl From<Problem> for AppError {
    fn from(p: Problem) -> Self {
        AppError::Problem(Box::new(p))
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            AppError::Idem(e) => e.into_response(),
            AppError::Problem(p) => (*p).into_response(),
        }
    }
}

// ---- extractors --------------------------------------------------------------------------------

/// A JSON body. A body that is not JSON, or not this JSON, is a problem+json answer like every
/// other error (`INVALID_BODY`, with axum's status: 400, 415 or 422).
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, AppError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(Body(value)),
            Err(e) => Err(AppError::new(e.status(), "INVALID_BODY", e.body_text())),
        }
    }
}

/// A path parameter; one that does not parse is a 400 problem+json answer (`INVALID_PATH`).
pub struct Param<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Param<T> {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Param(value)),
            Err(e) => Err(AppError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_PATH",
                e.body_text(),
            )),
        }
    }
}

/// The caller: demo authentication by the `X-User-Id` header, user 1 ("demo") without it.
#[derive(Debug, Clone, Copy)]
pub struct User {
    pub id: i64,
}

impl<S: Send + Sync> FromRequestParts<S> for User {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AppError> {
        match parts.headers.get("x-user-id") {
            None => Ok(User { id: 1 }),
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|id| *id > 0)
                .map(|id| User { id })
                .ok_or_else(|| {
                    AppError::new(
                        StatusCode::BAD_REQUEST,
                        "INVALID_USER",
                        "X-User-Id must be a positive integer",
                    )
                }),
        }
    }
}

/// A demo knob: `X-Demo-Delay-Ms` makes order creation slow, to watch a concurrent retry get
/// 409 while the first request runs.
#[derive(Debug, Clone, Copy)]
pub struct DemoDelay(Duration);

impl<S: Send + Sync> FromRequestParts<S> for DemoDelay {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AppError> {
        match parts.headers.get("x-demo-delay-ms") {
            None => Ok(DemoDelay(Duration::ZERO)),
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .filter(|ms| *ms <= 10_000)
                .map(|ms| DemoDelay(Duration::from_millis(ms)))
                .ok_or_else(|| {
                    AppError::new(
                        StatusCode::BAD_REQUEST,
                        "INVALID_DELAY",
                        "X-Demo-Delay-Ms must be 0..=10000",
                    )
                }),
        }
    }
}

// ---- orders ------------------------------------------------------------------------------------

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateOrder {
    pub sku_id: i64,
    pub qty: i64,
}

/// The catalogue: a fixed price per SKU.
fn price_cents(sku_id: i64) -> i64 {
    500 + sku_id.rem_euclid(100) * 25
}

/// `POST /api/orders`: 201 with the order; the same request again replays it; another body
/// under the same key is 422; while the first runs, 409.
///
/// Scoped per user: one user's key never replays another user's order.
#[idempotent(
    scope = "order:<user.id>",
    key = key,
    store = app.idem,
    skip(app, user, delay),
    lease = "30s",
    claim = claim
)]
pub async fn create_order<D: Db, S: Store + Clone>(
    State(app): State<App<D, S>>,
    user: User,
    delay: DemoDelay,
    key: IdempotencyKey,
    Body(req): Body<CreateOrder>,
) -> Result<(StatusCode, Json<Order>), AppError> {
    if !(1..=100).contains(&req.qty) || req.sku_id <= 0 {
        return Err(AppError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "INVALID_ORDER",
            "skuId must be positive and qty between 1 and 100",
        ));
    }
    tokio::time::sleep(delay.0).await;
    // The order number comes from the request's identity (user and key): even if its record
    // were gone, the same request could not create a second order. The unique index is the
    // hard stop behind the guard.
    let order_no = format!(
        "ORD-{}",
        claim.downstream_key("order")[5..21].to_ascii_uppercase()
    );
    let order = Order {
        order_no,
        user_id: user.id,
        sku_id: req.sku_id,
        qty: req.qty,
        amount_cents: price_cents(req.sku_id) * req.qty,
        status: OrderStatus::Pending.as_str().into(),
    };
    let created = app.db.create_order(&order).await?;
    Ok((StatusCode::CREATED, Json(created.into_row())))
}

/// `GET /api/orders/by-key/{key}`: did my request happen? 200 with its result, 409 while it
/// runs, 404 when unknown (safe to send it again with the same key).
pub async fn order_by_key<D: Db, S: Store + Clone>(
    State(app): State<App<D, S>>,
    user: User,
    Param(key): Param<String>,
) -> Result<Response, AppError> {
    let key = Key::parse(&key)?;
    let scope = idem::scope!("order:<user.id>")?;
    Ok(idem::http::lookup(&app.idem, &scope, &key).await)
}

// ---- payments ----------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentCallback {
    pub order_no: String,
    pub amount_cents: i64,
}

/// The answer to a state transition: the order, and whether this call was a duplicate.
#[derive(Debug, Serialize)]
pub struct TransitionAnswer {
    pub duplicated: bool,
    pub order: Order,
}

fn transition_answer(
    outcome: Transition<Order, OrderStatus>,
    what: &str,
) -> Result<Json<TransitionAnswer>, AppError> {
    match outcome {
        Transition::Applied(order) => Ok(Json(TransitionAnswer {
            duplicated: false,
            order,
        })),
        Transition::AlreadyApplied(order) => Ok(Json(TransitionAnswer {
            duplicated: true,
            order,
        })),
        Transition::GuardMismatch(order) => Err(Problem::new(
            StatusCode::CONFLICT,
            "AMOUNT_MISMATCH",
            format!("the {what} does not match order {}", order.order_no),
        )
        .with("expectedAmountCents", order.amount_cents)
        .into()),
        Transition::Illegal { current } => Err(Problem::new(
            StatusCode::CONFLICT,
            "ILLEGAL_TRANSITION",
            format!("the order is {current}"),
        )
        .with("currentStatus", current.as_str())
        .into()),
        Transition::NotFound => Err(AppError::new(
            StatusCode::NOT_FOUND,
            "ORDER_NOT_FOUND",
            "no such order",
        )),
    }
}

/// `POST /api/payments/callback`: PENDING → PAID when the amount matches. A duplicate callback
/// is 200 with `"duplicated": true`; a mismatched amount is 409 and a warning in the log.
///
/// The transition and its `order.paid` event commit together (see `events.rs`).
pub async fn payment_callback<D: Events, S: Store + Clone>(
    State(app): State<App<D, S>>,
    Body(cb): Body<PaymentCallback>,
) -> Result<Json<TransitionAnswer>, AppError> {
    let outcome = app
        .db
        .mark_paid_announced(&cb.order_no, cb.amount_cents)
        .await?;
    if let Transition::GuardMismatch(order) = &outcome {
        tracing::warn!(
            order_no = %order.order_no,
            paid_cents = cb.amount_cents,
            expected_cents = order.amount_cents,
            "payment callback amount does not match the order: not applied"
        );
    }
    transition_answer(outcome, "paid amount")
}

// ---- refunds -----------------------------------------------------------------------------------

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Refund {
    pub refund_id: String,
    pub order_no: String,
    pub amount_cents: i64,
    pub status: String,
}

/// The order in the path, when it belongs to the caller. Checked by the extractor, before the
/// idempotency guard runs: a key can then never replay another user's refund.
pub struct OwnedOrder {
    pub order_no: String,
}

impl<D: Db, S: Store + Clone> FromRequestParts<App<D, S>> for OwnedOrder {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, app: &App<D, S>) -> Result<Self, AppError> {
        let Param(order_no) = Param::<String>::from_request_parts(parts, app).await?;
        let user = User::from_request_parts(parts, app).await?;
        match app.db.find_order(&order_no).await? {
            Some(order) if order.user_id == user.id => Ok(OwnedOrder { order_no }),
            _ => Err(AppError::new(
                StatusCode::NOT_FOUND,
                "ORDER_NOT_FOUND",
                "no such order",
            )),
        }
    }
}

/// `POST /api/orders/{order_no}/refunds`: refunds a paid order through the gateway, once per
/// (order, key): the gateway call carries the guard's downstream key, so even a take-over of an
/// abandoned attempt cannot move the money twice. Then PAID → CANCELLED, with its
/// `order.refunded` event in the same transaction.
#[idempotent(scope = "refund:<order_no>", key = key, store = app.idem, skip(app), claim = claim)]
pub async fn refund<D: Events, S: Store + Clone>(
    State(app): State<App<D, S>>,
    OwnedOrder { order_no }: OwnedOrder,
    key: IdempotencyKey,
) -> Result<(StatusCode, Json<Refund>), AppError> {
    let Some(order) = app.db.find_order(&order_no).await? else {
        return Err(AppError::new(
            StatusCode::NOT_FOUND,
            "ORDER_NOT_FOUND",
            "no such order",
        ));
    };
    if order.status != OrderStatus::Paid.as_str() {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "ORDER_NOT_REFUNDABLE",
            format!(
                "only a PAID order can be refunded; this one is {}",
                order.status
            ),
        )
        .with("currentStatus", order.status)
        .into());
    }
    let money = app
        .db
        .gateway_refund(
            &claim.downstream_key("gateway-refund"),
            &order_no,
            order.amount_cents,
        )
        .await?;
    let cancelled = app
        .db
        .cancel_paid_announced(&order_no, &money.id, &claim)
        .await?;
    if !cancelled.is_done() {
        // The money moved but the order changed state meanwhile: say so, do not hide it.
        tracing::error!(order_no, refund = %money.id, outcome = cancelled.kind(), "refunded, but could not cancel the order");
    }
    Ok((
        StatusCode::CREATED,
        Json(Refund {
            refund_id: money.id,
            order_no,
            amount_cents: money.amount_cents,
            status: OrderStatus::Cancelled.as_str().into(),
        }),
    ))
}

/// An event waiting in the outbox.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboxEntry {
    pub seq: i64,
    pub id: String,
    pub topic: String,
    pub partition_key: String,
    pub payload: Value,
    pub attempts: u32,
    pub last_error: Option<String>,
}

/// `GET /api/outbox`: the events not yet published, oldest first, and whether a relay runs.
pub async fn outbox<D: Events, S: Store + Clone>(
    State(app): State<App<D, S>>,
) -> Result<Json<Value>, AppError> {
    let pending: Vec<OutboxEntry> = app
        .db
        .pending_events(100)
        .await?
        .into_iter()
        .map(|p| OutboxEntry {
            seq: p.seq,
            payload: serde_json::from_slice(&p.event.payload).unwrap_or_else(|_| {
                Value::String(String::from_utf8_lossy(&p.event.payload).into())
            }),
            id: p.event.id,
            topic: p.event.topic,
            partition_key: p.event.partition_key,
            attempts: p.attempts,
            last_error: p.last_error,
        })
        .collect();
    Ok(Json(json!({
        "relay": events::relay_state(),
        "pending": pending,
    })))
}

/// The gateway's ledger.
#[derive(Debug, Serialize)]
pub struct Ledger {
    pub count: usize,
    pub moves: Vec<MoneyMove>,
}

/// `GET /api/gateway/ledger`: every money move, to count them.
pub async fn ledger<D: Db, S: Store + Clone>(
    State(app): State<App<D, S>>,
) -> Result<Json<Ledger>, AppError> {
    let moves = app.db.gateway_moves().await?;
    Ok(Json(Ledger {
        count: moves.len(),
        moves,
    }))
}

// ---- shipping ----------------------------------------------------------------------------------

/// `POST /api/orders/{order_no}/ship`: PAID → SHIPPED.
pub async fn ship<D: Db, S: Store + Clone>(
    State(app): State<App<D, S>>,
    Param(order_no): Param<String>,
) -> Result<Json<TransitionAnswer>, AppError> {
    transition_answer(app.db.ship(&order_no).await?, "shipment")
}

/// `POST /api/orders/{order_no}/confirm`: SHIPPED → DONE.
pub async fn confirm<D: Db, S: Store + Clone>(
    State(app): State<App<D, S>>,
    Param(order_no): Param<String>,
) -> Result<Json<TransitionAnswer>, AppError> {
    transition_answer(app.db.confirm(&order_no).await?, "confirmation")
}

// ---- profiles ----------------------------------------------------------------------------------

/// `GET /api/users/{user_id}/profile`.
pub async fn profile<D: Db, S: Store + Clone>(
    State(app): State<App<D, S>>,
    Param(user_id): Param<i64>,
) -> Result<Response, AppError> {
    match app.db.profile(user_id).await? {
        Some(p) => Ok(Json(p).into_response()),
        None => Err(AppError::new(
            StatusCode::NOT_FOUND,
            "USER_NOT_FOUND",
            "no such user",
        )),
    }
}

#[derive(Debug, Deserialize)]
pub struct ProfileUpdate {
    pub nickname: String,
    pub version: i64,
}

/// `PATCH /api/users/{user_id}/profile` with the version read: 200 with the new version, or
/// 409 with the latest one when someone updated it first (read again, then retry).
pub async fn update_profile<D: Db, S: Store + Clone>(
    State(app): State<App<D, S>>,
    Param(user_id): Param<i64>,
    Body(update): Body<ProfileUpdate>,
) -> Result<Json<Value>, AppError> {
    if update.nickname.is_empty() || update.nickname.len() > 64 {
        return Err(AppError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "INVALID_NICKNAME",
            "1 to 64 bytes",
        ));
    }
    match app
        .db
        .update_profile(user_id, &update.nickname, update.version)
        .await?
    {
        Versioned::Updated { version } => {
            Ok(Json(json!({ "userId": user_id, "version": version })))
        }
        Versioned::Stale { current_version } => Err(Problem::new(
            StatusCode::CONFLICT,
            "STALE_VERSION",
            "the profile was updated since it was read: read it again and retry",
        )
        .with("currentVersion", current_version)
        .into()),
        Versioned::NotFound => Err(AppError::new(
            StatusCode::NOT_FOUND,
            "USER_NOT_FOUND",
            "no such user",
        )),
    }
}
