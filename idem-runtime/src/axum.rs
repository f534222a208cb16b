//! HTTP integration for axum (feature `axum`): the `Idempotency-Key` extractor, errors as
//! RFC 9457 problem details, the replay layer, and the lookup by key for recovering clients.
//!
//! ```
//! use axum::{http::StatusCode, routing::post, Router};
//! use idem::axum::IdempotencyLayer;
//!
//! # async fn create_order() {}
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     // Replays carry the stored bytes and `Idempotent-Replayed: true`; this API answers its
//!     // replays with 200 although the first answer was 201.
//!     .layer(IdempotencyLayer::new().replay_status(StatusCode::OK));
//! ```
//!
//! With the `#[idempotent]` handlers of the `idem` crate, see its guide and the refund service
//! example.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Once};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody as _};
use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use http::request::Parts;
use http::{HeaderName, HeaderValue, Request, StatusCode};

use crate::context::{self, ReplayWatch, Replayed};
use crate::error::{Error, codes};
use crate::key::{Key, KeyPolicy, ToKey};
use crate::record::{RecordState, StoredResponse};
use crate::store::Store;

use crate::http as http_api;
pub use crate::http::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, Problem};

/// Which header carries the key, and which keys are accepted. Set on [`IdempotencyLayer`]; the
/// extractor falls back to `Idempotency-Key` with [`KeyPolicy::DEFAULT`].
#[derive(Debug, Clone)]
pub struct KeyConfig {
    header: HeaderName,
    policy: KeyPolicy,
}

impl Default for KeyConfig {
    fn default() -> Self {
        KeyConfig {
            header: IDEMPOTENCY_KEY,
            policy: KeyPolicy::DEFAULT,
        }
    }
}

/// The idempotency key of a request, validated before any store access.
///
/// A missing or malformed key rejects the request with 400 `application/problem+json`, code
/// `INVALID_IDEMPOTENCY_KEY`. Use it as the `key = …` of `#[idempotent]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(pub Key);

impl IdempotencyKey {
    /// The key.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl ToKey for IdempotencyKey {
    fn to_key(&self) -> Result<Key, Error> {
        Ok(self.0.clone())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Error> {
        let default = KeyConfig::default();
        let config = parts.extensions.get::<KeyConfig>().unwrap_or(&default);
        http_api::key_in(&parts.headers, &config.header, config.policy).map(IdempotencyKey)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.into_http()
    }
}

/// A problem detail (RFC 9457) as a response; see [`Problem`].
pub fn problem(status: StatusCode, code: &str, detail: &str) -> Response {
    Problem::new(status, code, detail).into_response()
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        Problem::from_error(&self).into_response()
    }
}

impl<T: IntoResponse> IntoResponse for crate::replay::Idempotent<T> {
    fn into_response(self) -> Response {
        let replayed = self.is_replay();
        let mut resp = self.into_inner().into_response();
        if replayed {
            http_api::mark_replayed(resp.headers_mut());
        }
        resp
    }
}

/// The answer for a client recovering from a timeout, asking whether its request happened.
///
/// - Completed: the stored answer's bytes with its stored status (201 for a record completed
///   with 201, a stored final error's own status), `Idempotent-Replayed: true`. An answer stored
///   without an HTTP status is 200 when it is a success and 422 when it is a final error; a
///   stored status that is not one is a 500, never a guess. It is labelled by what was stored:
///   an answer of the tower guard (feature `tower`) is sent as the guard replays it, with the
///   headers it kept (its own `Content-Type` among them) and its body; any other answer is
///   `application/json` when its bytes are JSON (what a `Json<T>` answer and a serde value
///   store), else `application/octet-stream` (an encoding of its own,
///   [`ReplayBytes`](crate::replay::ReplayBytes)).
/// - In progress: 409 `REQUEST_IN_PROGRESS` with `Retry-After`.
/// - Unknown: 404 `IDEMPOTENCY_KEY_NOT_FOUND` (safe to send the request again with the same
///   key).
///
/// Every answer, whatever its status, carries `Cache-Control: no-store`: it is about one
/// caller's request, and changes as the request runs; and `X-Content-Type-Options: nosniff`,
/// so that a browser reads it only as what it is labelled.
pub async fn lookup<S: Store>(store: &S, scope: &str, key: &Key) -> Response {
    let mut resp = match store.lookup(scope, key.as_str()).await {
        Err(e) => e.into_response(),
        Ok(None) => problem(
            StatusCode::NOT_FOUND,
            codes::IDEMPOTENCY_KEY_NOT_FOUND,
            "no request with this key is known: it is safe to send it again with the same key",
        ),
        Ok(Some(record)) => match (record.state, record.response) {
            (RecordState::Completed, Some(stored)) if let Some(not_kept) = stored.not_kept() => {
                not_kept.into_response()
            }
            (RecordState::Completed, Some(stored)) => match stored_answer(stored) {
                Ok(mut resp) => {
                    http_api::mark_replayed(resp.headers_mut());
                    resp
                }
                Err(e) => Error::Decode(format!(
                    "record (scope {scope:?}, key {:?}): {e}",
                    key.as_str()
                ))
                .into_response(),
            },
            _ => Error::InProgress {
                retry_after: crate::flow::retry_hint()
                    .hint(record.lease_remaining.unwrap_or_default(), None),
            }
            .into_response(),
        },
    };
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp.headers_mut()
        .insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    resp
}

/// How an answer of the tower guard starts (its envelope's magic, `tower/envelope.rs`). Only an
/// answer stored with an HTTP status is read as one: what `ReplayBytes` stores has none, so
/// bytes of a service's own that happen to start so are never taken for the guard's headers.
const TOWER_ENVELOPE: &[u8] = b"idem/http";

/// A completed record's answer as the lookup sends it, labelled by what was stored.
fn stored_answer(stored: StoredResponse) -> Result<Response, String> {
    if stored.status.is_some() && stored.body.starts_with(TOWER_ENVELOPE) {
        return tower_answer(&stored);
    }
    let status = lookup_status(&stored)?;
    let content_type = if serde_json::from_slice::<serde::de::IgnoredAny>(&stored.body).is_ok() {
        "application/json"
    } else {
        "application/octet-stream"
    };
    let mut resp = Response::new(Body::from(stored.body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(resp)
}

/// An answer the tower guard stored: its status, the headers it kept and its body, as the
/// guard replays it (trailers aside).
#[cfg(feature = "tower")]
fn tower_answer(stored: &StoredResponse) -> Result<Response, String> {
    let answer = crate::tower::StoredHttpResponse::decode(stored).map_err(|e| e.to_string())?;
    let mut resp = Response::new(Body::from(answer.body));
    *resp.status_mut() = answer.status;
    *resp.headers_mut() = answer.headers;
    Ok(resp)
}

/// Without the `tower` feature the guard's envelope is not read here: an error, never its
/// bytes under a label they do not have.
#[cfg(not(feature = "tower"))]
fn tower_answer(_: &StoredResponse) -> Result<Response, String> {
    Err("an answer the tower guard stored: build with the `tower` feature to look it up".into())
}

/// The status the lookup answers a completed record with: the stored one, read exactly.
fn lookup_status(stored: &StoredResponse) -> Result<StatusCode, String> {
    match stored.status {
        Some(s) => {
            StatusCode::from_u16(s).map_err(|_| format!("stored status {s} is not a status"))
        }
        None if stored.is_error => Ok(StatusCode::UNPROCESSABLE_ENTITY),
        None => Ok(StatusCode::OK),
    }
}

/// A tower layer for idempotent axum handlers: a response that is a replayed answer is sent
/// with the stored bytes and status and `Idempotent-Replayed: true`, and the key extractor uses
/// the layer's header name and key policy.
///
/// The layer changes only a response that *is* the replayed value: one whose status and body
/// are exactly what the `Json<T>` or `(StatusCode, Json<T>)` a guarded call replayed renders
/// to. A handler that calls a guarded function as one step and answers something else (another
/// document, or an error from a later step) keeps its own response, without the header.
///
/// Without the layer, replays still return the first answer, decoded and rendered again (equal,
/// and byte-identical for types whose serialization is deterministic), but without the header.
#[derive(Debug, Clone, Default)]
pub struct IdempotencyLayer {
    config: Arc<LayerConfig>,
}

#[derive(Debug, Clone, Default)]
struct LayerConfig {
    key: KeyConfig,
    replay_status: Option<StatusCode>,
    wait: Option<Duration>,
}

impl IdempotencyLayer {
    /// `Idempotency-Key`, the default key policy, replays with their original status.
    pub fn new() -> Self {
        IdempotencyLayer::default()
    }

    fn edit(mut self, f: impl FnOnce(&mut LayerConfig)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// The header that carries the key.
    pub fn header(self, name: HeaderName) -> Self {
        self.edit(|c| c.key.header = name)
    }

    /// Which keys are accepted, e.g. [`KeyPolicy::Uuid`].
    pub fn key_policy(self, policy: KeyPolicy) -> Self {
        self.edit(|c| c.key.policy = policy)
    }

    /// Answer replays with this status instead of the original one (some APIs answer 201 the
    /// first time and 200 on every replay).
    pub fn replay_status(self, status: StatusCode) -> Self {
        self.edit(|c| c.replay_status = Some(status))
    }

    /// Lets a duplicate of a running request wait up to `wait` for its answer, and replay it,
    /// before it is answered 409 `IN_PROGRESS`: for the guarded calls of the layer's handlers
    /// whose attribute sets no `wait` of its own. No connection is held while it waits; see
    /// [`Policy::wait`](crate::Policy#structfield.wait). At most the calls' lease.
    pub fn wait(self, wait: Duration) -> Self {
        self.edit(|c| c.wait = Some(wait))
    }
}

impl<S> tower_layer::Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service of [`IdempotencyLayer`].
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<LayerConfig>,
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S, B> tower_service::Service<Request<B>> for IdempotencyService<S>
where
    S: tower_service::Service<Request<B>, Response = Response> + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        req.extensions_mut().insert(self.config.key.clone());
        // The handler runs in the request's context, whose replay watch tells the layer which
        // answers were replayed, and what their values render to.
        let watch = ReplayWatch::new();
        let mut cx = context::Context::current().watch_replays(&watch);
        if let Some(wait) = self.config.wait {
            cx = cx.wait(wait);
        }
        let fut = cx.scope(self.inner.call(req));
        let config = self.config.clone();
        Box::pin(async move {
            let resp = fut.await?;
            let replays = watch.take();
            if replays.is_empty() {
                return Ok(resp);
            }
            Ok(answer_replay(resp, replays, config.replay_status).await)
        })
    }
}

/// The response, or, when it is exactly the rendering of an answer replayed during the request,
/// that answer's stored bytes and status, marked as a replay.
///
/// Only a body as long as one of those renderings can be one: the layer reads at most the
/// longest of them and one byte more, and a longer body (a download, server-sent events) goes
/// on to the client as it comes, what was read first, never buffered whole.
async fn answer_replay(
    resp: Response,
    replays: Vec<Replayed>,
    status: Option<StatusCode>,
) -> Response {
    let (mut parts, body) = resp.into_parts();
    let Some(longest) = replays
        .iter()
        .filter_map(|r| r.rendered.as_ref().map(Vec::len))
        .max()
    else {
        return Response::from_parts(parts, body);
    };
    let bytes = match read_up_to(body, longest).await {
        Ok(Read::Whole(bytes)) => bytes,
        Ok(Read::Over(rest)) => return Response::from_parts(parts, Body::new(rest)),
        Err(e) => {
            tracing::error!(target: "idem", error = %e, "could not read the handler's response body");
            return Error::Store(e.into()).into_response();
        }
    };
    let replay = replays.into_iter().rev().find(|r| {
        r.stored.status == Some(parts.status.as_u16())
            && !r.stored.is_error
            && r.rendered.as_deref() == Some(&bytes[..])
    });
    let Some(Replayed { stored, .. }) = replay else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    if let Some(status) = status {
        parts.status = status;
    }
    parts.headers.remove(CONTENT_LENGTH);
    http_api::mark_replayed(&mut parts.headers);
    Response::from_parts(parts, Body::from(stored.body))
}

/// A response body as [`read_up_to`] found it.
enum Read {
    /// It ended within the limit, without trailers.
    Whole(Bytes),
    /// It did not: what was read, then the rest, as it comes.
    Over(Prefixed),
}

/// Reads `body` until it ends or passes `limit` bytes (or sends trailers, which no replayed
/// answer has), and not a frame further.
async fn read_up_to(mut body: Body, limit: usize) -> Result<Read, axum::Error> {
    let mut read = BytesMut::new();
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        let frame = match frame {
            None => return Ok(Read::Whole(read.freeze())),
            Some(frame) => frame?,
        };
        let trailers = match frame.into_data() {
            Ok(data) => {
                read.extend_from_slice(&data);
                if read.len() <= limit {
                    continue;
                }
                None
            }
            Err(frame) => frame.into_trailers().ok(),
        };
        return Ok(Read::Over(Prefixed {
            prefix: Some(read.freeze()).filter(|p| !p.is_empty()),
            trailers,
            rest: body,
        }));
    }
}

/// The part of a response body the layer read, its trailers if reading stopped at them, then
/// the rest of the body.
struct Prefixed {
    prefix: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
    rest: Body,
}

impl http_body::Body for Prefixed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(prefix))));
        }
        if let Some(trailers) = self.trailers.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.trailers.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let before = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let rest = http_body::Body::size_hint(&self.rest);
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(rest.lower() + before);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + before);
        }
        hint
    }
}

/// Tells the layer around this request that a guarded call replayed `stored`, which `value` now
/// renders to; warns once when nothing watches replays.
fn note_replay<T: serde::Serialize>(stored: &StoredResponse, value: &T) {
    if !context::replays_watched() {
        warn_without_layer();
        return;
    }
    // What axum's `Json` writes for the value: the layer compares the response with it.
    if let Ok(rendered) = serde_json::to_vec(value) {
        context::note_replay(stored, Some(rendered));
    }
}

/// Warns once when a replay happens outside [`IdempotencyLayer`].
pub(crate) fn warn_without_layer() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        tracing::warn!(
            target: "idem",
            "an HTTP response was replayed outside idem::axum::IdempotencyLayer: add the layer for byte-identical replays and the Idempotent-Replayed header"
        );
    });
}

mod replay_impls {
    use axum::Json;
    use http::StatusCode;
    use serde::Serialize;
    use serde::de::DeserializeOwned;

    use crate::error::Error;
    use crate::record::StoredResponse;
    use crate::replay::{JsonBody, Replay, marker};

    fn body<T: Serialize>(value: &T, status: StatusCode) -> Result<StoredResponse, Error> {
        Ok(StoredResponse {
            status: Some(status.as_u16()),
            is_error: false,
            body: serde_json::to_vec(value)
                .map_err(|e| Error::Encode(e.to_string()))?
                .into(),
        })
    }

    /// The replayed value, noted for the layer when there is one around the request.
    fn value<T: Serialize + DeserializeOwned>(stored: &StoredResponse) -> Result<T, Error> {
        let value =
            serde_json::from_slice(&stored.body).map_err(|e| Error::Decode(e.to_string()))?;
        super::note_replay(stored, &value);
        Ok(value)
    }

    /// Stored as the JSON body with status 200.
    impl<T: JsonBody> Replay<marker::Http> for Json<T> {
        fn encode(&self) -> Result<StoredResponse, Error> {
            body(&self.0, StatusCode::OK)
        }
        fn decode(stored: StoredResponse) -> Result<Self, Error> {
            value(&stored).map(Json)
        }
    }

    /// Stored as the status and the JSON body.
    impl<T: JsonBody> Replay<marker::Http> for (StatusCode, Json<T>) {
        fn encode(&self) -> Result<StoredResponse, Error> {
            body(&self.1.0, self.0)
        }
        fn decode(stored: StoredResponse) -> Result<Self, Error> {
            // Read exactly: a status that does not decode is an error, never replayed as 200.
            let status = match stored.status {
                Some(s) => StatusCode::from_u16(s).map_err(|_| {
                    Error::Decode(format!("the stored HTTP status {s} is not a status"))
                })?,
                None => return Err(Error::Decode("the stored answer has no HTTP status".into())),
            };
            Ok((status, Json(value(&stored)?)))
        }
    }
}
