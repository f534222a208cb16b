//! The HTTP API: handlers, extractors, errors and the router.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::axum::{IdempotencyKey, IdempotencyLayer, Problem};
use idem::completer::{Completer, Resumption, Running};
use idem::{Key, Store, Transition, Versioned, idempotent};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::admin;
use crate::db::{Db, MyDb, Order, OrderStatus, PgDb, SqliteDb};
use crate::events::{self, Events};
use crate::gateway::{DemoGateway, GatewayError, GatewayMode, MoneyMove};

/// The application state: the database (with the simulated payment gateway's ledger and the
/// outbox), the idempotency store (in the same database, or in Redis), and the secret the
/// payment gateway signs its callbacks with.
#[derive(Clone)]
pub struct App<D, S> {
    pub db: D,
    pub idem: S,
    pub webhook_secret: WebhookSecret,
}

/// The variable that holds the payment gateway's webhook secret.
pub const WEBHOOK_SECRET_VAR: &str = "PAYMENT_WEBHOOK_SECRET";

/// The secret used when `PAYMENT_WEBHOOK_SECRET` is not set: for development only, since
/// anyone who reads this file can sign a callback with it.
pub const DEV_WEBHOOK_SECRET: &str = "dev-webhook-secret";

/// The variable that lets the service start with the development secrets on an address other
/// machines reach (`ALLOW_DEV_SECRETS=1`): for a demonstration on a network, never for a
/// deployment.
pub const ALLOW_DEV_SECRETS_VAR: &str = "ALLOW_DEV_SECRETS";

/// The shared secret of the payment gateway's callbacks (HMAC-SHA256 over the body).
#[derive(Clone)]
pub struct WebhookSecret(Arc<[u8]>);

impl WebhookSecret {
    /// `PAYMENT_WEBHOOK_SECRET`, or the development default when it is unset or empty.
    pub fn from_env() -> WebhookSecret {
        match std::env::var(WEBHOOK_SECRET_VAR) {
            Ok(s) if !s.is_empty() => WebhookSecret(s.into_bytes().into()),
            _ => WebhookSecret(DEV_WEBHOOK_SECRET.as_bytes().into()),
        }
    }

    /// Whether this is the development default.
    pub fn is_dev(&self) -> bool {
        &*self.0 == DEV_WEBHOOK_SECRET.as_bytes()
    }

    /// Whether `signature` (the header's `sha256=<hex>`) signs `body`; compared in constant
    /// time.
    pub fn verifies(&self, body: &[u8], signature: &[u8]) -> bool {
        use hmac::{KeyInit, Mac};
        let Some(hex) = signature.strip_prefix(b"sha256=") else {
            return false;
        };
        let Some(tag) = decode_hex(hex) else {
            return false;
        };
        let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0) else {
            return false;
        };
        mac.update(body);
        mac.verify_slice(&tag).is_ok()
    }
}

/// Why the service must not start listening on `addrs` (what `IDEM_ADDR`, written `shown`,
/// resolved to) with the secrets its environment gives it: the published development ones, on
/// an address other machines reach, without [`ALLOW_DEV_SECRETS_VAR`]. `None` when it may.
pub fn refuse_dev_secrets(shown: &str, addrs: &[std::net::SocketAddr]) -> Option<String> {
    let dev: Vec<&str> = [
        (WebhookSecret::from_env().is_dev(), WEBHOOK_SECRET_VAR),
        (
            admin::AdminToken::from_env().is_dev(),
            admin::ADMIN_TOKEN_VAR,
        ),
    ]
    .into_iter()
    .filter_map(|(dev, var)| dev.then_some(var))
    .collect();
    let reachable = addrs.iter().any(|a| !a.ip().is_loopback());
    let allowed = std::env::var(ALLOW_DEV_SECRETS_VAR).is_ok_and(|v| v == "1");
    if dev.is_empty() || !reachable || allowed {
        return None;
    }
    let names = dev.join(" and ");
    Some(format!(
        "refusing to listen on {shown}, an address other machines can reach, with the \
         development {names} (published in the example's source: anyone can sign payment \
         callbacks or release claims with them). Set {names} to secrets of your own, listen on \
         the loopback (IDEM_ADDR=127.0.0.1:3000), or set {ALLOW_DEV_SECRETS_VAR}=1 to start with \
         them anyway"
    ))
}

fn decode_hex(hex: &[u8]) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    hex.chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

/// The service on `database_url`: connects to it (PostgreSQL, MySQL or MariaDB), or opens the
/// SQLite file it names, and returns the router (the API, and idem's admin view under `/admin`
/// for operators), a description of where things are kept (for the log), and its completer
/// (dropping it stops it). Idempotency records go to `redis` when given, else into the same
/// database as the orders. With `nats_url`, a relay publishes the outbox's events to
/// JetStream; without it they wait in the outbox (`GET /api/outbox`).
pub async fn build(
    database_url: &str,
    redis: Option<idem::RedisStore>,
    nats_url: Option<&str>,
) -> Result<(Router, String, Option<Running>), Box<dyn std::error::Error>> {
    if database_url.starts_with("postgres") {
        let db = PgDb::connect(database_url).await?;
        with_events(db, redis, nats_url, "PostgreSQL".into()).await
    } else if database_url.starts_with("mysql:") || database_url.starts_with("mariadb:") {
        let db = MyDb::connect(database_url).await?;
        with_events(db, redis, nats_url, "MySQL".into()).await
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
) -> Result<(Router, String, Option<Running>), Box<dyn std::error::Error>> {
    events::prepare(&db).await?;
    if let Some(url) = nats_url {
        events::start_relay(db.clone(), url).await?;
    }
    let webhook_secret = WebhookSecret::from_env();
    let admin_token = admin::AdminToken::from_env();
    Ok(match redis {
        Some(idem) => {
            let admin = admin::router(idem.clone(), admin_token);
            let app = App {
                db,
                idem,
                webhook_secret,
            };
            // Refunds whose client went away are finished by a completer here too: Redis keeps
            // their requests.
            let completer = completer(app.clone())
                .every(Duration::from_secs(2))
                .start()?;
            (
                router(app).nest("/admin", admin),
                format!("{database}; idempotency records in Redis"),
                Some(completer),
            )
        }
        None => {
            let idem = db.store().clone();
            let admin = admin::router(idem.clone(), admin_token);
            let app = App {
                db,
                idem,
                webhook_secret,
            };
            let completer = completer(app.clone())
                .every(Duration::from_secs(2))
                .start()?;
            (router(app).nest("/admin", admin), database, Some(completer))
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
        .route("/api/openapi.json", get(openapi))
        .layer(IdempotencyLayer::new().replay_status(StatusCode::OK))
        .with_state(app)
}

/// `GET /api/openapi.json`: the guarded operations as an OpenAPI document, each with the
/// idempotency contract its `#[idempotent]` declares (`idem::openapi`): the key header, the
/// 400/409/422 answers with their problem codes, `Idempotent-Replayed`, lease, retention. The
/// operation ids are the handlers' names, which is how the contracts are found.
async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    use utoipa::Modify as _;
    use utoipa::openapi::path::{
        HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn, PathItem,
    };
    use utoipa::openapi::{
        InfoBuilder, OpenApiBuilder, PathsBuilder, Required, Response, ResponsesBuilder,
    };

    let operation =
        |id: &str, summary: &str, path_param: Option<&str>, answers: &[(&str, &str)]| {
            let mut responses = ResponsesBuilder::new();
            for (status, description) in answers {
                responses = responses.response(*status, Response::new(*description));
            }
            let mut op = OperationBuilder::new()
                .operation_id(Some(id))
                .summary(Some(summary))
                .responses(responses.build());
            if let Some(name) = path_param {
                op = op.parameter(
                    ParameterBuilder::new()
                        .name(name)
                        .parameter_in(ParameterIn::Path)
                        .required(Required::True),
                );
            }
            op.build()
        };
    let paths = PathsBuilder::new()
        .path(
            "/api/orders",
            PathItem::new(
                HttpMethod::Post,
                operation(
                    "create_order",
                    "Create an order",
                    None,
                    &[
                        ("201", "the order, created"),
                        ("200", "the order, replayed"),
                    ],
                ),
            ),
        )
        .path(
            "/api/orders/{order_no}/refunds",
            PathItem::new(
                HttpMethod::Post,
                operation(
                    "refund",
                    "Refund a paid order",
                    Some("order_no"),
                    &[("201", "the refund"), ("200", "the refund, replayed")],
                ),
            ),
        )
        .path(
            "/api/orders/by-key/{key}",
            PathItem::new(
                HttpMethod::Get,
                operation(
                    "order_by_key",
                    "What became of the order created with this key",
                    Some("key"),
                    &[("200", "the stored answer"), ("404", "no such key")],
                ),
            ),
        );
    let mut doc = OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("refund_service")
                .version("0.1.0")
                .build(),
        )
        .paths(paths.build())
        .build();
    idem::openapi::Idempotency::new().modify(&mut doc);
    Json(doc)
}

// ---- errors ------------------------------------------------------------------------------------

/// The API's errors, as RFC 9457 problem details.
#[derive(Debug)]
pub enum AppError {
    Idem(idem::Error),
    Problem(Box<Problem>),
    /// A 401: says how to authenticate (`WWW-Authenticate`), as HTTP requires.
    Unauthorized(Box<Problem>),
}

impl AppError {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
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
            AppError::Unauthorized(p) => {
                let mut response = (*p).into_response();
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("HMAC-SHA256 header=\"X-Gateway-Signature\""),
                );
                response
            }
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

/// A JSON body signed by the payment gateway: `X-Gateway-Signature: sha256=<hex>`, the
/// HMAC-SHA256 of the body's exact bytes under the webhook secret. A missing or wrong signature
/// is 401 (`INVALID_SIGNATURE`), checked before the body is read as JSON.
pub struct Signed<T>(pub T);

impl<D: Send + Sync, S: Send + Sync, T: DeserializeOwned> FromRequest<App<D, S>> for Signed<T> {
    type Rejection = AppError;

    async fn from_request(req: Request, app: &App<D, S>) -> Result<Self, AppError> {
        let signature = req.headers().get("x-gateway-signature").cloned();
        let body = Bytes::from_request(req, app)
            .await
            .map_err(|e| AppError::new(e.status(), "INVALID_BODY", e.body_text()))?;
        let signed = signature.is_some_and(|s| app.webhook_secret.verifies(&body, s.as_bytes()));
        if !signed {
            return Err(AppError::Unauthorized(Box::new(Problem::new(
                StatusCode::UNAUTHORIZED,
                "INVALID_SIGNATURE",
                "the callback must carry X-Gateway-Signature: sha256=<hex>, the HMAC-SHA256 of the body under the gateway's webhook secret",
            ))));
        }
        // As axum's `Json` answers: 400 for text that is not JSON, 422 for JSON of another shape.
        serde_json::from_slice(&body).map(Signed).map_err(|e| {
            let status = if e.is_data() {
                StatusCode::UNPROCESSABLE_ENTITY
            } else {
                StatusCode::BAD_REQUEST
            };
            AppError::new(status, "INVALID_BODY", e.to_string())
        })
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
    Ok(idem::axum::lookup(&app.idem, &scope, &key).await)
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
        // The amount is the order's secret to keep: the caller is told it differs, not what it
        // should have been.
        Transition::GuardMismatch(order) => Err(AppError::new(
            StatusCode::CONFLICT,
            "AMOUNT_MISMATCH",
            format!("the {what} does not match order {}", order.order_no),
        )),
        Transition::AppliedByAnother(order) => Err(illegal(order.status.as_str())),
        Transition::Illegal { current } => Err(illegal(current.as_str())),
        Transition::NotFound => Err(order_not_found()),
    }
}

fn illegal(current: &str) -> AppError {
    Problem::new(
        StatusCode::CONFLICT,
        "ILLEGAL_TRANSITION",
        format!("the order is {current}"),
    )
    .with("currentStatus", current)
    .into()
}

fn order_not_found() -> AppError {
    AppError::new(StatusCode::NOT_FOUND, "ORDER_NOT_FOUND", "no such order")
}

/// `POST /api/payments/callback`: PENDING → PAID when the amount matches. The gateway signs
/// the body (`X-Gateway-Signature`, HMAC-SHA256 under `PAYMENT_WEBHOOK_SECRET`): an unsigned
/// or wrongly signed callback is 401 and changes nothing. A duplicate callback is 200 with
/// `"duplicated": true`; a mismatched amount is 409 and a warning in the log.
///
/// The transition and its `order.paid` event commit together (see `events.rs`).
pub async fn payment_callback<D: Events, S: Store + Clone>(
    State(app): State<App<D, S>>,
    Signed(cb): Signed<PaymentCallback>,
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
/// idempotency guard or a transition runs: a key can then never replay another user's refund,
/// and nobody ships or confirms another user's order. Another user's order is 404, as one that
/// does not exist: its existence is not the caller's to learn. The owner of an order never
/// changes, so reading it first decides nothing that a concurrent request could change.
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
            _ => Err(order_not_found()),
        }
    }
}

/// `POST /api/orders/{order_no}/refunds`: refunds a paid order, as a sub-flow of the order's
/// state machine, once per order whatever the number of requests and keys:
///
/// 1. The request wins the order before any money moves: PAID → REFUNDING, with the request
///    recorded as the refund's owner. One request can win; every other one (another key, a
///    second tab, a support tool) is 409 with the order's state, and moves nothing. This
///    request's own retry, after a crash or a lost answer, finds itself the owner and resumes.
/// 2. The gateway moves the money, with an idempotency key derived from the order's refund (the
///    order and its owner), so a resumed attempt cannot move it twice.
/// 3. REFUNDING → CANCELLED, by the owner only, with its `order.refunded` event in the same
///    transaction. When the gateway declined, REFUNDING → PAID instead (nothing moved, the order
///    can be refunded or shipped again); when its answer was lost, the order stays REFUNDING
///    and the same request, retried with its key, finishes it.
///
/// The idempotency key makes the same request answer the same (the retry replays the 201);
/// the guarded transition makes different requests unable to refund twice. The call is
/// resumable: its order number and key are stored with its claim, and when its client never
/// comes back (the gateway's answer was lost, or the service was killed mid-refund) the
/// [`completer`] runs it again under its claim, which finishes the refund exactly once.
#[idempotent(
    scope = "refund:<order_no>",
    key = key,
    store = app.idem,
    skip(app, gateway),
    claim = claim,
    lease = "20s",
    resumable
)]
pub async fn refund<D: Events, S: Store + Clone>(
    State(app): State<App<D, S>>,
    OwnedOrder { order_no }: OwnedOrder,
    gateway: DemoGateway,
    key: IdempotencyKey,
) -> Result<(StatusCode, Json<Refund>), AppError> {
    // This request's identity, the same on each of its attempts and unique to it.
    let request = claim.downstream_key("refund");
    let order = match app.db.begin_refund(&order_no, &request).await? {
        // Won by this call, or by an earlier attempt of this same request: carry on.
        Transition::Applied(order) | Transition::AlreadyApplied(order) => order,
        Transition::AppliedByAnother(order) => {
            return Err(Problem::new(
                StatusCode::CONFLICT,
                "REFUND_IN_PROGRESS",
                "another request is refunding this order",
            )
            .with("currentStatus", order.status)
            .into());
        }
        Transition::Illegal { current } => {
            return Err(Problem::new(
                StatusCode::CONFLICT,
                "ORDER_NOT_REFUNDABLE",
                format!("only a PAID order can be refunded; this one is {current}"),
            )
            .with("currentStatus", current.as_str())
            .into());
        }
        Transition::GuardMismatch(_) | Transition::NotFound => return Err(order_not_found()),
    };
    let gateway_key = idem::downstream_key("order-refund", &order_no, &request);
    let money = match app
        .db
        .gateway_refund(&gateway_key, &order_no, order.amount_cents, gateway.0)
        .await
    {
        Ok(money) => money,
        Err(GatewayError::Declined) => {
            // Nothing moved: give the order back, so that it can be refunded (or shipped) again.
            let back = app.db.decline_refund(&order_no, &request).await?;
            if !back.is_applied() {
                tracing::error!(
                    order_no,
                    outcome = back.kind(),
                    "refund declined, but the order could not return to PAID"
                );
            }
            return Err(AppError::new(
                StatusCode::PAYMENT_REQUIRED,
                "REFUND_DECLINED",
                "the payment gateway declined the refund; the order is PAID again",
            ));
        }
        Err(GatewayError::AnswerLost) => {
            // The money may have moved: the order stays REFUNDING, owned by this request, and
            // the claim is kept (never released): its retry with the same key, or the
            // completer when nobody retries, finishes the refund without moving money twice.
            claim.outcome_unknown("the payment gateway did not answer");
            return Err(AppError::new(
                StatusCode::BAD_GATEWAY,
                "GATEWAY_NO_ANSWER",
                "the payment gateway did not answer; retry with the same Idempotency-Key to finish the refund",
            ));
        }
        Err(GatewayError::Store(e)) => return Err(e.into()),
    };
    match app
        .db
        .finish_refund_announced(&order_no, &request, &money.id)
        .await?
    {
        Transition::Applied(_) | Transition::AlreadyApplied(_) => {}
        other => {
            // Only the owner moves a REFUNDING order, so this cannot happen: say so loudly.
            tracing::error!(order_no, refund = %money.id, outcome = other.kind(), "refunded, but could not cancel the order");
            return Err(AppError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "REFUND_NOT_RECORDED",
                "the refund moved money but the order could not be cancelled",
            ));
        }
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

/// Finishes the refunds whose client never came back: a refund whose gateway answer was lost
/// and that nobody retried (after its resume delay, one second and doubling), or one cut off by
/// a crash (once its 20-second lease ran out). It calls [`refund`] again with the stored order
/// and key, under the record's claim, with a gateway that works: the gateway's own key (from
/// the claim's downstream key) makes a money move that already happened answer as it did.
/// Every instance may run one: the store's claim decides who resumes a refund.
pub fn completer<D: Events, S: Store + Clone>(app: App<D, S>) -> Completer<S> {
    Completer::new(app.idem.clone()).resume("refund:<order_no>", move |r: Resumption| {
        let app = app.clone();
        async move {
            let order_no: String = r.arg("order_no")?;
            let order = OwnedOrder { order_no };
            let key = IdempotencyKey(r.key().clone());
            refund(State(app), order, DemoGateway(GatewayMode::Normal), key).await
        }
    })
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

/// `POST /api/orders/{order_no}/ship`: PAID → SHIPPED, for the order's owner. A refund that
/// won the order first leaves it REFUNDING or CANCELLED: 409, nothing shipped.
pub async fn ship<D: Db, S: Store + Clone>(
    State(app): State<App<D, S>>,
    OwnedOrder { order_no }: OwnedOrder,
) -> Result<Json<TransitionAnswer>, AppError> {
    transition_answer(app.db.ship(&order_no).await?, "shipment")
}

/// `POST /api/orders/{order_no}/confirm`: SHIPPED → DONE, for the order's owner.
pub async fn confirm<D: Db, S: Store + Clone>(
    State(app): State<App<D, S>>,
    OwnedOrder { order_no }: OwnedOrder,
) -> Result<Json<TransitionAnswer>, AppError> {
    transition_answer(app.db.confirm(&order_no).await?, "confirmation")
}

// ---- profiles ----------------------------------------------------------------------------------

/// The user in the path, when it is the caller: a profile is its owner's alone. Another user's
/// is 404, as one that does not exist.
pub struct OwnProfile {
    pub user_id: i64,
}

impl<S: Send + Sync> FromRequestParts<S> for OwnProfile {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let Param(user_id) = Param::<i64>::from_request_parts(parts, state).await?;
        let user = User::from_request_parts(parts, state).await?;
        if user.id == user_id {
            Ok(OwnProfile { user_id })
        } else {
            Err(user_not_found())
        }
    }
}

fn user_not_found() -> AppError {
    AppError::new(StatusCode::NOT_FOUND, "USER_NOT_FOUND", "no such user")
}

/// `GET /api/users/{user_id}/profile`, the caller's own.
pub async fn profile<D: Db, S: Store + Clone>(
    State(app): State<App<D, S>>,
    OwnProfile { user_id }: OwnProfile,
) -> Result<Response, AppError> {
    match app.db.profile(user_id).await? {
        Some(p) => Ok(Json(p).into_response()),
        None => Err(user_not_found()),
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
    OwnProfile { user_id }: OwnProfile,
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
        Versioned::NotFound => Err(user_not_found()),
    }
}
