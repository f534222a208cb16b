//! A guard for any `http` service (feature `tower`): the guarantees of `#[idempotent]` as a
//! tower layer, for services whose handlers cannot or will not be annotated — a proxy, a
//! generated gRPC service, routes built from closures. It serves axum, tonic and plain hyper.
//!
//! ```
//! use std::convert::Infallible;
//!
//! use bytes::Bytes;
//! use http::{header::LOCATION, Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use idem::tower::{GuardBody, GuardLayer};
//! use idem::MemoryStore;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! /// Creates an order: under the guard, once per key, however often it is sent.
//! async fn create_order(
//!     req: Request<GuardBody<Full<Bytes>>>,
//! ) -> Result<Response<Full<Bytes>>, Infallible> {
//!     let _order = req.into_body().collect().await.map(|b| b.to_bytes());
//!     Ok(Response::builder()
//!         .status(StatusCode::CREATED)
//!         .header(LOCATION, "/orders/1")
//!         .body(Full::from(r#"{"id":1}"#))
//!         .unwrap())
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let service = ServiceBuilder::new()
//!     .layer(
//!         GuardLayer::new(MemoryStore::new())
//!             // The authenticated caller, as an auth layer left it: one caller's key never
//!             // replays another's answer.
//!             .principal(|parts| {
//!                 let user = parts.headers.get("x-user")?.to_str().ok()?;
//!                 Some(user.to_owned())
//!             }),
//!     )
//!     .service_fn(create_order);
//!
//! let order = || {
//!     Request::post("/orders")
//!         .header("idempotency-key", "0b2c1c6e-1f7b-4f0f-9d3a-8f2f6f0a1111")
//!         .header("x-user", "u-7")
//!         .body(Full::from(r#"{"sku":9001}"#))
//!         .unwrap()
//! };
//! let first = service.clone().oneshot(order()).await?;
//! assert_eq!(first.status(), StatusCode::CREATED);
//! let again = service.clone().oneshot(order()).await?;
//! assert_eq!(again.status(), StatusCode::CREATED);
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//! assert_eq!(again.headers()[LOCATION], "/orders/1");
//! assert_eq!(again.into_body().collect().await?.to_bytes(), r#"{"id":1}"#);
//! # Ok::<(), idem::BoxError>(())
//! # }).unwrap();
//! ```
//!
//! # What it does
//!
//! For each request whose method is guarded ([`GuardLayer::require_key`], by default `POST` and
//! `PATCH`; [`GuardLayer::guard_when_keyed`] for methods guarded only when a key is sent):
//!
//! 1. The key is read from the `Idempotency-Key` header ([`GuardLayer::header`]) and checked
//!    with the [`KeyPolicy`]. Missing or malformed: 400 `INVALID_IDEMPOTENCY_KEY`.
//! 2. The principal is found ([`GuardLayer::principal`]). None: 401 `MISSING_PRINCIPAL`,
//!    unless the layer was built with [`GuardLayer::allow_anonymous`] (see [Scope](#scope)).
//! 3. The body is read whole, up to [`GuardLayer::body_limit`] (1 MiB by default). Longer: 413
//!    `REQUEST_BODY_TOO_LARGE`; the inner service is never called.
//! 4. The scope is rendered with [`ScopeBuilder`] from the method, the route and the principal
//!    (below), the fingerprint with [`Fingerprinter`] from the method, the path with its query
//!    and the body bytes, and the lifecycle begins ([`flow::begin`](crate::flow::begin); on a
//!    [resumable route](#resumable-routes), [`flow::begin_resumable`](crate::flow::begin_resumable)
//!    with the request, refused with 413 `REQUEST_TOO_LARGE_TO_RESUME` when it is too large to
//!    store):
//!    - a completed record with the same fingerprint is replayed: its status, its stored headers
//!      and its body bytes, with `Idempotent-Replayed: true` and `Cache-Control: no-store` (a
//!      replay is one caller's answer, never for a cache to share); the inner service is not
//!      called;
//!    - another fingerprint under the same key: 422 `KEY_REUSED_WITH_DIFFERENT_BODY`;
//!    - a live claim: 409 `REQUEST_IN_PROGRESS` with `Retry-After`;
//!    - an unavailable store: 503 `IDEMPOTENCY_STORE_UNAVAILABLE` with `Retry-After`.
//! 5. Claimed: the inner service runs with the buffered body and the claim
//!    ([`ClaimInfo`](crate::ClaimInfo): attempt, recovery point, [`ClaimInfo::downstream_key`](crate::ClaimInfo::downstream_key)) in the request's
//!    extensions, on a task of its own: a client that hangs up does not cut it off, its answer
//!    is stored and the client's retry gets it. Its answer is read whole (unless it is a stream,
//!    [`GuardLayer::stream_if`], or grows past the policy's `max_answer`, 1 MiB by default:
//!    then it goes on to the client as it comes, never buffered, and a retry is told 409
//!    `ANSWER_NOT_KEPT`), and one of three
//!    things becomes of it:
//!    - stored, when the rule says so ([`GuardLayer::store_if`]: by default a 2xx whose gRPC
//!      status, if any, is `0`), under the completion policy every guarded call shares: an
//!      answer that cannot be stored is still sent, and its claim kept until its lease runs
//!      out; a record a newer attempt took over answers 409 `REQUEST_SUPERSEDED`
//!      ([`Error::FenceLost`]);
//!    - released, when the answer says nothing happened ([`GuardLayer::release_if`]: by default
//!      a 4xx, or a gRPC refusal), so that a retry runs afresh;
//!    - kept, its outcome unknown, for every other answer (a 5xx: a proxy's 502 after its
//!      upstream committed), an error of the inner service, an answer body that breaks off, and
//!      any answer for which the inner service called [`ClaimInfo::outcome_unknown`](crate::ClaimInfo::outcome_unknown): the claim
//!      stays in progress ([`Guard::suspend`](crate::Guard::suspend)), shown as unfinished by
//!      `idem records` and the admin view and never expired, and the same key's retry resumes
//!      it as the next attempt with the same downstream key. Never a release: only an answer
//!      known to have done nothing frees the key.
//!
//! Other methods pass through untouched, their bodies streamed. Errors are RFC 9457
//! `application/problem+json` bodies, the same type as the axum integration's ([`Problem`]).
//! Tracing events and metrics for every outcome come from the core, as for `#[idempotent]`.
//!
//! # Scope
//!
//! `<namespace>:<METHOD>:<route>:<principal>`; every part is a value of [`ScopeBuilder`],
//! percent-encoded, so that no two requests' parts can render the same scope.
//!
//! The principal is what keeps one caller's key from replaying another caller's answer, so the
//! guard fails closed without one: a guarded request for which [`GuardLayer::principal`] finds
//! none (or that has no principal function at all) is refused with 401 `MISSING_PRINCIPAL`
//! before the store is read. 401, not 500: the request lacks an identity, which the client can
//! supply; the inner service never runs, and the guard sends no `WWW-Authenticate` challenge,
//! which belongs to the layer that authenticates. A service whose callers are all one party (a
//! gateway's internal hop, a job runner) says so with [`GuardLayer::allow_anonymous`]: requests
//! without a principal are then guarded in one key space, `<namespace>:<METHOD>:<route>`, shared
//! by every anonymous caller. The namespace is `http` unless set
//! ([`GuardLayer::namespace`], for services that share a store and have routes in common). The
//! route is what [`GuardLayer::route`] returns, else the request's path. With axum, the matched
//! route template is in the request's extensions; give it to the guard, so that the key of
//! `POST /orders/7/refunds` is scoped to `/orders/{order_no}/refunds` (and reusing it for another
//! order is key reuse, 422):
//!
//! ```
//! use axum::{extract::MatchedPath, routing::post, Router};
//! use idem::tower::GuardLayer;
//! use idem::MemoryStore;
//!
//! # async fn refund() {}
//! let app: Router = Router::new()
//!     .route("/orders/{order_no}/refunds", post(refund))
//!     // `Router::layer` wraps each route after routing, so the matched path is known.
//!     .layer(
//!         GuardLayer::new(MemoryStore::new())
//!             .route(|parts| Some(parts.extensions.get::<MatchedPath>()?.as_str().to_owned()))
//!             .principal(|parts| Some(parts.headers.get("x-user")?.to_str().ok()?.to_owned())),
//!     );
//! ```
//!
//! With the `axum` feature on as well, [`axum_matched_path`] is that function.
//!
//! # What is stored
//!
//! The status, the headers named by [`GuardLayer::stored_headers`] (by default `content-type`,
//! `content-encoding` and `location`), the trailers and the body bytes, in a small versioned
//! envelope decoded strictly ([`StoredHttpResponse`] documents the format). A first answer reaches
//! its client with all its headers; a replay carries the stored ones.
//!
//! # Resumable routes
//!
//! An answer that is lost after the inner service moved the money, or an unknown outcome, keeps
//! the claim for the same key's retry; when the client never retries, nothing would finish it.
//! A layer built with [`GuardLayer::resumable`] stores each guarded request with its claim (its
//! method, path and query, `content-type`, the key's header and the headers named with
//! [`GuardLayer::resumable_headers`], and the body: [`StoredHttpRequest`], at most 64 KiB or
//! [`GuardLayer::max_request`], else 413 `REQUEST_TOO_LARGE_TO_RESUME`), and a [`Completer`](crate::completer::Completer) given
//! [`resend`] sends it through the guarded service again once the claim is due (its lease ran
//! out, or its unknown outcome waited its resume delay). The re-sent request carries the
//! resumption in its extensions, where no client can put it: the guard takes the completer's
//! claim under the record's own scope, key and fingerprint (the principal's header need not be
//! stored), the inner service runs as the next attempt with the same downstream key, and its
//! answer is stored, so the client's later retry replays it byte for byte. The completer learns
//! how the call ended (stored, released by a refusal, kept unknown again) as it does for
//! `#[idempotent(resumable)]`, and parks the claim for an operator after its attempts run out.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use idem::completer::Completer;
//! use idem::tower::{resend, GuardBody, GuardLayer};
//! use idem::{ClaimInfo, ManualClock, MemoryStore};
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! /// Pays out through a gateway, whose first answer is lost.
//! async fn payout(
//!     req: Request<GuardBody<Full<Bytes>>>,
//! ) -> Result<Response<Full<Bytes>>, Infallible> {
//!     let claim = req.extensions().get::<ClaimInfo>().cloned().expect("under the guard");
//!     // The gateway is called with claim.downstream_key("payout"): the same for every
//!     // attempt, so the gateway deduplicates a repeated call.
//!     let (status, body) = if claim.attempt() == 1 {
//!         claim.outcome_unknown("the gateway timed out");
//!         (StatusCode::GATEWAY_TIMEOUT, "")
//!     } else {
//!         (StatusCode::CREATED, r#"{"paid":250}"#)
//!     };
//!     Ok(Response::builder().status(status).body(Full::from(body)).unwrap())
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let clock = ManualClock::new();
//! let store = MemoryStore::with_clock(clock.clone());
//! let service = GuardLayer::new(store.clone())
//!     .principal(|parts| Some(parts.headers.get("x-user")?.to_str().ok()?.to_owned()))
//!     .resumable("payouts")
//!     .layer(service_fn(payout));
//! let request = || {
//!     Request::post("/payouts")
//!         .header("idempotency-key", "0b2c1c6e-1f7b-4f0f-9d3a-8f2f6f0a1111")
//!         .header("x-user", "u-7")
//!         .body(Full::from(r#"{"cents":250}"#))
//!         .unwrap()
//! };
//!
//! // The client gets a 504 and never comes back.
//! let first = service.clone().oneshot(request()).await?;
//! assert_eq!(first.status(), StatusCode::GATEWAY_TIMEOUT);
//!
//! // A completer beside the service (started with `.start()` in a real one) sends it again
//! // once its resume delay has passed.
//! let completer = Completer::new(store).resume("payouts", resend::<Full<Bytes>, _>(service.clone()));
//! clock.advance(Duration::from_secs(2));
//! assert_eq!(completer.run_once().await?.completed, 1);
//!
//! // Whenever the client retries, it gets the completer's answer.
//! let late = service.clone().oneshot(request()).await?;
//! assert_eq!(late.status(), StatusCode::CREATED);
//! assert_eq!(late.headers()["idempotent-replayed"], "true");
//! assert_eq!(late.into_body().collect().await?.to_bytes(), r#"{"paid":250}"#);
//! # Ok::<(), idem::BoxError>(())
//! # }).unwrap();
//! ```
//!
//! The request envelope keeps only the headers named, and what it keeps stays in the store in
//! clear until the record expires: `Authorization`, `Cookie` and other credentials are never
//! stored unless named (see [`GuardLayer::resumable_headers`] for the trade-off). Give
//! [`resend`] the guarded service below the layer that authenticates. The completer needs a
//! store that keeps requests: memory, SQLite and PostgreSQL.
//!
//! # gRPC
//!
//! A tonic service is an `http` service: put the layer in front of it and send the key as the
//! `idempotency-key` metadata. The body is the framed message, so the fingerprint covers the
//! request message; the trailers (`grpc-status`, `grpc-message`) are stored and replayed, and
//! only answers with `grpc-status` 0 are stored by default.
//!
//! The guard's own refusals of a gRPC call (a request whose content type is `application/grpc`)
//! are gRPC statuses, in a trailers-only answer ([`Problem::into_grpc`]), each its own code: a
//! missing or malformed key `INVALID_ARGUMENT` (3); the key used for another request
//! `FAILED_PRECONDITION` (9); the request still running, parked or superseded `ABORTED` (10),
//! with `grpc-retry-pushback-ms`, gRPC's retry hint; a body too large `RESOURCE_EXHAUSTED` (8);
//! the store unreachable `UNAVAILABLE` (14). `grpc-message` says `CODE: detail`, and the
//! `idempotency-error` metadata holds the problem code alone.

mod body;
mod envelope;
mod resume;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use http::request::Parts;
use http::{HeaderMap, HeaderName, Method, Request, Response, StatusCode};
use http_body::Body;

use crate::error::{BoxError, Error, KeyError, Result};
use crate::fingerprint::{Fingerprint, Fingerprinter};
use crate::flow::{Begun, begin, begin_resumable};
use crate::guard::{Guard, Recorded};
use crate::http::{self as http_api, Problem};
use crate::key::{Key, KeyPolicy};
use crate::record::{Policy, RequestCap, StoredRequest};
use crate::scope::ScopeBuilder;
use crate::store::Store;
use resume::Resumed;

pub use body::GuardBody;
pub use envelope::{StoredHttpRequest, StoredHttpResponse};
pub use resume::resend;

pub use crate::http::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

/// How many bytes of a guarded request's body are read by default: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// The problem code of a guarded request refused for want of a principal (HTTP 401).
pub const MISSING_PRINCIPAL: &str = "MISSING_PRINCIPAL";

/// Warns once that a layer without a principal function refuses every guarded request.
fn warn_no_principal() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!(
            target: "idem",
            "idem::tower::GuardLayer has no principal function and does not allow anonymous callers: every guarded request is refused with 401 (set .principal(…), or .allow_anonymous() where every caller is one party)"
        );
    });
}

/// What a claim's outcome is while the inner service runs, until its answer says more.
const NO_ANSWER: &str = "the inner service did not answer";

/// A function of a request's parts: the route or the principal.
type PartsFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// Whether a request passes through unguarded; see [`GuardLayer::pass_through`].
type PartsRule = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;

/// The rule that decides which answers are stored.
type StoreRule = Arc<dyn Fn(&Answer<'_>) -> bool + Send + Sync>;

/// An answer of the inner service, read whole, as the rule of [`GuardLayer::store_if`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    status: StatusCode,
    headers: &'a HeaderMap,
    trailers: Option<&'a HeaderMap>,
}

impl Answer<'_> {
    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// All the answer's headers.
    pub fn headers(&self) -> &HeaderMap {
        self.headers
    }

    /// The trailers, if the answer had any.
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers
    }

    /// The gRPC status, when there is one (in the trailers, or in the headers of a
    /// trailers-only answer); an unreadable one reads as `UNKNOWN` (2).
    pub fn grpc_status(&self) -> Option<u32> {
        [self.trailers, Some(self.headers)]
            .into_iter()
            .flatten()
            .find_map(|m| m.get("grpc-status"))
            .map(|s| s.to_str().ok().and_then(|s| s.parse().ok()).unwrap_or(2))
    }

    /// The default rule of [`GuardLayer::store_if`]: a 2xx status whose gRPC status, when there
    /// is one, is `0`.
    pub fn is_success(&self) -> bool {
        let grpc_ok = [Some(self.headers), self.trailers]
            .into_iter()
            .flatten()
            .filter_map(|m| m.get("grpc-status"))
            .all(|s| s == "0");
        self.status.is_success() && grpc_ok
    }

    /// The default rule of [`GuardLayer::stream_if`]: a `text/event-stream` answer (server-sent
    /// events), which may never end.
    pub fn is_event_stream(&self) -> bool {
        self.headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(';')
                    .next()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"))
            })
    }

    /// The default rule of [`GuardLayer::release_if`]: an answer that says the request was
    /// refused before it had any effect. A 4xx status (the request was invalid, unauthorized,
    /// in conflict, rate-limited), or a gRPC status of the same kind: `INVALID_ARGUMENT`,
    /// `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`, `RESOURCE_EXHAUSTED`,
    /// `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED`, `UNAUTHENTICATED`. A 5xx, and
    /// `UNKNOWN`, `DEADLINE_EXCEEDED`, `ABORTED`, `INTERNAL`, `UNAVAILABLE`, `DATA_LOSS`, are
    /// not refusals: a proxy's 502 or 504 can come after its upstream acted.
    pub fn is_refusal(&self) -> bool {
        match self.grpc_status() {
            Some(0) | None => self.status.is_client_error(),
            Some(code) => matches!(code, 3 | 5 | 6 | 7 | 8 | 9 | 11 | 12 | 16),
        }
    }
}

/// A tower layer that makes an `http` service idempotent; see the [module](self) documentation.
///
/// Built with by-value setters; cheap to clone (the store is cloned per request, the settings
/// are shared).
#[derive(Clone)]
pub struct GuardLayer<St> {
    store: St,
    config: Arc<Config>,
}

#[derive(Clone)]
struct Config {
    header: HeaderName,
    key_policy: KeyPolicy,
    require_key: Vec<Method>,
    when_keyed: Vec<Method>,
    namespace: String,
    route: Option<PartsFn>,
    principal: Option<PartsFn>,
    /// Requests that pass through unguarded, whatever their method (streaming RPCs).
    pass_through: Option<PartsRule>,
    allow_anonymous: bool,
    body_limit: usize,
    stored_headers: Vec<HeaderName>,
    store_if: StoreRule,
    release_if: StoreRule,
    stream_if: StoreRule,
    policy: Policy,
    /// How long a duplicate waits, over the policy's own.
    wait: Option<Duration>,
    /// The resume name of a resumable route: its requests are stored with their claims.
    resumable: Option<String>,
    /// The request headers a resumable route stores besides `content-type` and the key's.
    resumable_headers: Vec<HeaderName>,
    /// The size cap of a resumable route's stored request.
    max_request: RequestCap,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("header", &self.header)
            .field("key_policy", &self.key_policy)
            .field("require_key", &self.require_key)
            .field("when_keyed", &self.when_keyed)
            .field("namespace", &self.namespace)
            .field("route", &self.route.as_ref().map(|_| "fn"))
            .field("principal", &self.principal.as_ref().map(|_| "fn"))
            .field("pass_through", &self.pass_through.as_ref().map(|_| "fn"))
            .field("allow_anonymous", &self.allow_anonymous)
            .field("body_limit", &self.body_limit)
            .field("stored_headers", &self.stored_headers)
            .field("policy", &self.policy)
            .field("wait", &self.wait)
            .field("resumable", &self.resumable)
            .field("resumable_headers", &self.resumable_headers)
            .field("max_request", &self.max_request)
            .finish_non_exhaustive()
    }
}

impl<St> fmt::Debug for GuardLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What the guard does with a request, by its method, key and principal.
enum Admission {
    /// Not guarded: hand it on as it is.
    PassThrough,
    /// Guarded under this key, for this principal (`None`: an anonymous caller, allowed).
    Guard(Key, Option<String>),
    /// Guarded, and refused: its key is missing or malformed, or it has no principal.
    Refuse(Problem),
}

impl Config {
    fn admit(&self, parts: &Parts) -> Admission {
        if self.pass_through.as_ref().is_some_and(|f| f(parts)) {
            return Admission::PassThrough;
        }
        let required = self.require_key.contains(&parts.method);
        if !required && !self.when_keyed.contains(&parts.method) {
            return Admission::PassThrough;
        }
        let key = match http_api::key_in(&parts.headers, &self.header, self.key_policy) {
            Ok(key) => key,
            Err(Error::InvalidKey(KeyError::Missing)) if !required => {
                return Admission::PassThrough;
            }
            Err(e) => return Admission::Refuse(Problem::from_error(&e)),
        };
        match self.principal.as_ref().and_then(|f| f(parts)) {
            Some(principal) => Admission::Guard(key, Some(principal)),
            None if self.allow_anonymous => Admission::Guard(key, None),
            None => {
                if self.principal.is_none() {
                    warn_no_principal();
                }
                Admission::Refuse(Problem::new(
                    StatusCode::UNAUTHORIZED,
                    MISSING_PRINCIPAL,
                    "the request has no authenticated principal, so whose key this is cannot be told",
                ))
            }
        }
    }

    /// The identity, the fingerprint and, on a resumable route, the stored request of a
    /// guarded request whose body is `body`.
    fn call(&self, identity: Identity, parts: &Parts, body: &Bytes) -> Result<Call> {
        let (key, principal) = match identity {
            Identity::Resumed(resumed) => {
                return Ok(Call {
                    handed_scope: Some(resumed.scope.clone()),
                    scope: resumed.scope,
                    key: resumed.key,
                    fingerprint: resumed.fingerprint,
                    request: Some(resumed.request),
                    principal: None,
                });
            }
            Identity::Admitted { key, principal } => (key, principal),
        };
        let scope = self.scope(parts, principal.as_deref())?;
        let fingerprint = fingerprint(parts, body)?;
        let request = match &self.resumable {
            Some(name) => Some(self.stored_request(name, parts, body)?),
            None => None,
        };
        Ok(Call {
            scope,
            key,
            fingerprint,
            request,
            handed_scope: None,
            principal,
        })
    }

    /// The request as a resumable route stores it: its envelope, with the headers it keeps.
    fn stored_request(&self, name: &str, parts: &Parts, body: &Bytes) -> Result<StoredRequest> {
        let mut headers = HeaderMap::new();
        let names = [&CONTENT_TYPE, &self.header]
            .into_iter()
            .chain(&self.resumable_headers);
        for name in names {
            if headers.contains_key(name) {
                continue;
            }
            for value in parts.headers.get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        let envelope = StoredHttpRequest {
            method: parts.method.clone(),
            target: parts
                .uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
            headers,
            body: body.clone(),
        };
        // Refused by its size before it is encoded: a request too large to store is the
        // client's 413, whatever part of it is large.
        self.max_request.admit(envelope.encoded_len())?;
        Ok(
            StoredRequest::within(name, envelope.encode()?, self.max_request)?
                .with_policy(&self.policy),
        )
    }

    /// `<namespace>:<METHOD>:<route>[:<principal>]`, every part encoded.
    fn scope(&self, parts: &Parts, principal: Option<&str>) -> Result<String> {
        let route = self.route.as_ref().and_then(|f| f(parts));
        let route = route.as_deref().unwrap_or_else(|| parts.uri.path());
        let mut s = ScopeBuilder::with_capacity(
            self.namespace.len() + route.len() + principal.map_or(0, str::len) + 16,
        );
        s.value(self.namespace.as_str())
            .literal(":")
            .value(parts.method.as_str())
            .literal(":")
            .value(route);
        if let Some(p) = principal {
            s.literal(":").value(p);
        }
        s.finish()
    }
}

/// Hashes bytes as one byte string (not as a sequence of numbers).
struct RawBytes<'a>(&'a [u8]);

impl serde::Serialize for RawBytes<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// The method, the path with its query, and the body bytes, in that order.
fn fingerprint(parts: &Parts, body: &[u8]) -> Result<Fingerprint> {
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
    let mut f = Fingerprinter::new();
    f.add(parts.method.as_str())?;
    f.add(target)?;
    f.add(&RawBytes(body))?;
    Ok(f.finish())
}

impl<St: Store + Clone> GuardLayer<St> {
    /// A guard on `store` with the defaults: key in `Idempotency-Key` (any visible-ASCII key of
    /// up to 255 bytes), required for `POST` and `PATCH`; bodies up to 1 MiB; scope from the
    /// path; 2xx answers stored with their `content-type`, `content-encoding` and `location`;
    /// the default [`Policy`]. It has no principal function yet, and refuses every guarded
    /// request until it has one ([`GuardLayer::principal`]) or allows anonymous callers
    /// ([`GuardLayer::allow_anonymous`]).
    pub fn new(store: St) -> Self {
        GuardLayer {
            store,
            config: Arc::new(Config {
                header: IDEMPOTENCY_KEY,
                key_policy: KeyPolicy::DEFAULT,
                require_key: vec![Method::POST, Method::PATCH],
                when_keyed: Vec::new(),
                namespace: "http".to_owned(),
                route: None,
                principal: None,
                pass_through: None,
                allow_anonymous: false,
                body_limit: DEFAULT_BODY_LIMIT,
                stored_headers: vec![CONTENT_TYPE, CONTENT_ENCODING, LOCATION],
                store_if: Arc::new(|a: &Answer<'_>| a.is_success()),
                release_if: Arc::new(|a: &Answer<'_>| a.is_refusal()),
                stream_if: Arc::new(|a: &Answer<'_>| a.is_event_stream()),
                policy: Policy::DEFAULT,
                wait: None,
                resumable: None,
                resumable_headers: Vec::new(),
                max_request: RequestCap::DEFAULT,
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// The header that carries the key.
    pub fn header(self, name: HeaderName) -> Self {
        self.edit(|c| c.header = name)
    }

    /// Which keys are accepted, e.g. [`KeyPolicy::Uuid`].
    pub fn key_policy(self, policy: KeyPolicy) -> Self {
        self.edit(|c| c.key_policy = policy)
    }

    /// The methods that are guarded and must carry a key (400 without one). Replaces the
    /// default, `POST` and `PATCH`.
    pub fn require_key(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.edit(|c| c.require_key = methods)
    }

    /// Requests for which `f` holds pass through unguarded, whatever their method and key: the
    /// streaming RPCs of a gRPC service (every gRPC call is a `POST`), whose answers must flow
    /// as they come and cannot be replayed. Without it, a streaming answer is read up to the
    /// policy's [`max_answer`](Policy::max_answer), then streams through from there, and its
    /// record is completed without it (a retry is told 409 `ANSWER_NOT_KEPT`).
    ///
    /// ```
    /// # use idem::{tower::GuardLayer, MemoryStore};
    /// let layer = GuardLayer::new(MemoryStore::new())
    ///     .pass_through(|parts| parts.uri.path() == "/shop.Orders/Watch");
    /// # drop(layer);
    /// ```
    pub fn pass_through(self, f: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        self.edit(|c| c.pass_through = Some(Arc::new(f)))
    }

    /// The methods that are guarded when they carry a key and pass through when they do not
    /// (none by default; `PUT` and `DELETE` are candidates). A method named here and in
    /// [`GuardLayer::require_key`] requires its key.
    pub fn guard_when_keyed(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.edit(|c| c.when_keyed = methods)
    }

    /// The first part of every scope (default `http`): give services that share a store and
    /// have routes in common names of their own.
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        let namespace = namespace.into();
        self.edit(|c| c.namespace = namespace)
    }

    /// How a request's route is found: the framework's matched route template, when the
    /// function finds one in the request's parts (see the module documentation for axum). When
    /// it returns `None`, or is not set, the route is the request's path.
    pub fn route(self, f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.edit(|c| c.route = Some(Arc::new(f)))
    }

    /// How the authenticated principal is found in a request's parts (a header, or an
    /// extension an auth layer put there): it is part of the scope, so one principal's key never
    /// replays another's answer. Put this layer after the one that authenticates. A guarded
    /// request for which it returns `None` is refused with 401 `MISSING_PRINCIPAL`, unless
    /// [`GuardLayer::allow_anonymous`] is set.
    pub fn principal(self, f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.edit(|c| c.principal = Some(Arc::new(f)))
    }

    /// Guards requests that have no principal too, all in one key space shared by every
    /// anonymous caller (the same key and body replays one anonymous caller's answer to
    /// another). For services whose callers are one party; without it, such requests are
    /// refused with 401 `MISSING_PRINCIPAL`. Requests with a principal keep their own key space.
    pub fn allow_anonymous(self) -> Self {
        self.edit(|c| c.allow_anonymous = true)
    }

    /// The most bytes of a guarded request's body that are read (default
    /// [`DEFAULT_BODY_LIMIT`]); a longer body is refused with 413 before the inner service is
    /// called.
    pub fn body_limit(self, bytes: usize) -> Self {
        self.edit(|c| c.body_limit = bytes)
    }

    /// The headers of an answer that are stored and replayed with it. Replaces the default,
    /// `content-type`, `content-encoding` and `location`.
    pub fn stored_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names = names.into_iter().collect();
        self.edit(|c| c.stored_headers = names)
    }

    /// Which answers are stored and replayed. The default is [`Answer::is_success`]. To replay
    /// final client errors too:
    /// `.store_if(|a| a.is_success() || a.status() == StatusCode::UNPROCESSABLE_ENTITY)`.
    /// An answer that is not stored either releases the claim ([`GuardLayer::release_if`]) or
    /// leaves its outcome unknown.
    pub fn store_if(self, rule: impl Fn(&Answer<'_>) -> bool + Send + Sync + 'static) -> Self {
        self.edit(|c| c.store_if = Arc::new(rule))
    }

    /// Which answers that are not stored say that nothing happened, and free the key so that a
    /// retry runs afresh. The default is [`Answer::is_refusal`] (4xx, and gRPC's refusals).
    ///
    /// Every other answer that is not stored (a 5xx by default: a proxy's 502 or 504 may come
    /// after its upstream moved the money), an error of the inner service and an answer body
    /// that breaks off leave the outcome unknown: the claim is kept in progress
    /// ([`Guard::suspend`](crate::Guard::suspend)), visible as unfinished, and the same key's
    /// retry resumes it as a new attempt, with the same [`ClaimInfo::downstream_key`](crate::ClaimInfo::downstream_key) to hand
    /// the upstream. The inner service says so itself on any answer with
    /// [`ClaimInfo::outcome_unknown`](crate::ClaimInfo::outcome_unknown), from the request's extensions.
    pub fn release_if(self, rule: impl Fn(&Answer<'_>) -> bool + Send + Sync + 'static) -> Self {
        self.edit(|c| c.release_if = Arc::new(rule))
    }

    /// Which answers stream through as they come, never buffered nor stored, decided on the
    /// status and headers alone ([`Answer::trailers`] is `None` here). The default is
    /// [`Answer::is_event_stream`] (server-sent events). An answer whose body grows past the
    /// policy's [`max_answer`](Policy::max_answer) (1 MiB by default) streams through too, from
    /// the point the guard stopped reading it. Either way the request ran: when the answer
    /// would have been stored ([`GuardLayer::store_if`]) its record is completed without it,
    /// and a retry is answered 409 `ANSWER_NOT_KEPT`
    /// ([`Error::AnswerNotKept`]) rather than run again; other
    /// answers release or keep the claim as [`GuardLayer::release_if`] says.
    pub fn stream_if(self, rule: impl Fn(&Answer<'_>) -> bool + Send + Sync + 'static) -> Self {
        self.edit(|c| c.stream_if = Arc::new(rule))
    }

    /// Lease, retention, the largest answer kept ([`Policy::max_answer`]) and what to do with
    /// an abandoned claim.
    pub fn policy(self, policy: Policy) -> Self {
        self.edit(|c| c.policy = policy)
    }

    /// Lets a duplicate of a running request wait up to `wait` for its answer, and replay it,
    /// before it is answered 409 `IN_PROGRESS`: the policy's
    /// [`wait`](Policy#structfield.wait), whichever order this and [`GuardLayer::policy`] are
    /// called in. The duplicate holds no connection while it waits. At most the lease: a
    /// longer wait answers every guarded request with 500 and says why in the log.
    pub fn wait(self, wait: Duration) -> Self {
        self.edit(|c| c.wait = Some(wait))
    }

    /// Makes the guarded routes resumable: each guarded request is stored with its claim, as a
    /// [`StoredRequest`] named `name` whose payload is the request's envelope
    /// ([`StoredHttpRequest`]: the method, the path and query, the headers of
    /// [`GuardLayer::resumable_headers`], the body). When its client never comes back (the
    /// process died and the lease ran out, or the answer was an unknown outcome that nobody
    /// retried), a [`Completer`](crate::completer::Completer) with
    /// `.resume(name, resend(service))` ([`resend`]) sends it through the guarded service
    /// again, under the completer's claim; the answer is stored, and the client's later retry
    /// replays it.
    ///
    /// A resumable request is stored whole: its envelope holds at most
    /// [`GuardLayer::max_request`] bytes (64 KiB unless set), and a larger one is refused
    /// before it is claimed, with 413 `REQUEST_TOO_LARGE_TO_RESUME`
    /// ([`Error::RequestTooLarge`]); the inner service never runs. `name` is 1 to 200 bytes of printable ASCII (the completer checks it
    /// when it starts); a layer whose name is not answers every guarded request with 500.
    ///
    /// ```
    /// use idem::tower::GuardLayer;
    /// use idem::MemoryStore;
    ///
    /// let layer = GuardLayer::new(MemoryStore::new())
    ///     .principal(|parts| Some(parts.headers.get("x-user")?.to_str().ok()?.to_owned()))
    ///     .resumable("refunds")
    ///     // The inner service reads the caller's tenant; the principal's header is not needed
    ///     // again: the completer's request runs under the record's own scope.
    ///     .resumable_headers([http::HeaderName::from_static("x-tenant")]);
    /// # drop(layer);
    /// ```
    pub fn resumable(self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.edit(|c| c.resumable = Some(name))
    }

    /// The request headers a resumable route ([`GuardLayer::resumable`]) stores and the
    /// completer sends again, besides the two it always keeps: `content-type` and the key's
    /// header. Replaces what an earlier call named. Every value of a named header is kept, in
    /// order; a header that is not named is not stored, and the completer's request does not
    /// carry it.
    ///
    /// The trade-off: what is stored stays in the store, in clear, for as long as the record
    /// lives (until the call completes, then its retention), and is sent again later, when what
    /// it said may no longer hold. So credentials (`Authorization`, `Cookie`,
    /// `Proxy-Authorization`) are never stored unless they are named here, and naming them is
    /// rarely right: a bearer token expires before a parked claim is retried, and whoever can
    /// read the store could replay it elsewhere. The completer needs none of them to find the
    /// record (it runs under the record's own scope, principal included); name instead what the
    /// inner service reads to do its work (a tenant, a content encoding, an API version), and
    /// give [`resend`] the guarded service below the layer that authenticates.
    ///
    /// ```
    /// use http::HeaderName;
    /// use idem::tower::GuardLayer;
    /// use idem::MemoryStore;
    ///
    /// let layer = GuardLayer::new(MemoryStore::new())
    ///     .allow_anonymous()
    ///     .resumable("payouts")
    ///     .resumable_headers([
    ///         HeaderName::from_static("x-tenant"),
    ///         HeaderName::from_static("api-version"),
    ///     ]);
    /// # drop(layer);
    /// ```
    pub fn resumable_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names = names.into_iter().collect();
        self.edit(|c| c.resumable_headers = names)
    }

    /// The most bytes a resumable route's stored request (its envelope: the method, the path
    /// and query, the stored headers, the body) may take: [`RequestCap::DEFAULT`] (64 KiB)
    /// unless set, at most [`RequestCap::MAX`] (1 MiB). A larger request is answered 413
    /// `REQUEST_TOO_LARGE_TO_RESUME` before anything is claimed. Keep
    /// [`GuardLayer::body_limit`] above it, or the body limit's 413 comes first.
    ///
    /// ```
    /// use idem::tower::GuardLayer;
    /// use idem::{MemoryStore, RequestCap};
    ///
    /// // A cap out of range is refused here, at start-up: `RequestCap::new` says why.
    /// let layer = GuardLayer::new(MemoryStore::new())
    ///     .allow_anonymous()
    ///     .resumable("uploads")
    ///     .max_request(RequestCap::new(512 * 1024)?);
    /// # drop(layer);
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn max_request(self, cap: RequestCap) -> Self {
        self.edit(|c| c.max_request = cap)
    }
}

impl<S, St: Clone> tower_layer::Layer<S> for GuardLayer<St> {
    type Service = GuardService<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        GuardService {
            inner,
            store: self.store.clone(),
            config: self.config.clone(),
        }
    }
}

/// With the `axum` feature: the route template axum matched (`/orders/{order_no}`), for
/// [`GuardLayer::route`].
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub fn axum_matched_path(parts: &Parts) -> Option<String> {
    parts
        .extensions
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_owned())
}

/// The service of [`GuardLayer`].
#[derive(Clone)]
pub struct GuardService<S, St> {
    inner: S,
    store: St,
    config: Arc<Config>,
}

impl<S, St> fmt::Debug for GuardService<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardService")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, St, ReqB, ResB> tower_service::Service<Request<ReqB>> for GuardService<S, St>
where
    S: tower_service::Service<Request<GuardBody<ReqB>>, Response = Response<ResB>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store + Clone,
    ReqB: Body + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<GuardBody<ResB>>;
    type Error = S::Error;
    type Future = BoxFuture<std::result::Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The instance that was polled ready serves this request; a clone takes its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let grpc = http_api::is_grpc(req.headers());
        let answer = handle(inner, self.store.clone(), self.config.clone(), req);
        Box::pin(async move {
            let resp = answer.await?;
            // The guard's own refusals reach a gRPC client as gRPC statuses; the inner
            // service's answers, and replays of them, as they are.
            Ok(match resp.extensions().get::<Problem>() {
                Some(problem) if grpc => problem.clone().into_grpc(),
                _ => resp,
            })
        })
    }
}

fn problem<B>(e: &Error) -> Response<GuardBody<B>> {
    Problem::from_error(e).into_http()
}

/// Who a guarded request is, before its body is read.
enum Identity {
    /// Admitted by the guard: the key it read, the principal it found.
    Admitted { key: Key, principal: Option<String> },
    /// A completer's re-send ([`resend`]): the record's own identity.
    Resumed(Resumed),
}

/// A guarded request's identity and fingerprint, and the request a resumable route stores.
struct Call {
    scope: String,
    key: Key,
    fingerprint: Fingerprint,
    request: Option<StoredRequest>,
    /// How the scope is told again in the log of a record that cannot be read: rendered from
    /// the principal (`None`), or the record's own (a re-send's, `Some`).
    handed_scope: Option<String>,
    principal: Option<String>,
}

/// One request through the guard.
async fn handle<S, St, ReqB, ResB>(
    mut inner: S,
    store: St,
    config: Arc<Config>,
    req: Request<ReqB>,
) -> std::result::Result<Response<GuardBody<ResB>>, S::Error>
where
    S: tower_service::Service<Request<GuardBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    ReqB: Body + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    let (mut parts, req_body) = req.into_parts();
    // A completer's re-send carries the record it finishes: it was admitted when its client
    // sent it, and runs under that record's identity.
    let identity = match parts.extensions.remove::<Resumed>() {
        Some(resumed) => {
            resumed.take();
            Identity::Resumed(resumed)
        }
        None => match config.admit(&parts) {
            Admission::PassThrough => {
                let req = Request::from_parts(parts, GuardBody::inner(req_body));
                return Ok(inner.call(req).await?.map(GuardBody::inner));
            }
            Admission::Refuse(refusal) => return Ok(refusal.into_http()),
            Admission::Guard(key, principal) => Identity::Admitted { key, principal },
        },
    };

    // A guarded request runs to its end on a task of its own: a client that goes away once the
    // inner service may have acted must not cut it off between the effect and its answer's
    // record. The answer is stored, and the client's retry gets it. The task runs in the
    // caller's context (a completer's handed claim and claim watch) and tracing span (the
    // guard's events stay with the request they are about).
    let run = guarded(inner, store, config, parts, req_body, identity);
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let run = crate::context::Context::current().scope(run);
            match runtime
                .spawn(tracing::Instrument::in_current_span(run))
                .await
            {
                Ok(answer) => answer,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => Ok(problem(&Error::Unavailable(
                    "the runtime shut down while the request ran".into(),
                ))),
            }
        }
        Err(_) => run.await,
    }
}

/// A guarded request, from reading its body to its answer.
async fn guarded<S, St, ReqB, ResB>(
    inner: S,
    store: St,
    config: Arc<Config>,
    parts: Parts,
    req_body: ReqB,
    identity: Identity,
) -> std::result::Result<Response<GuardBody<ResB>>, S::Error>
where
    S: tower_service::Service<Request<GuardBody<ReqB>>, Response = Response<ResB>>,
    St: Store,
    ReqB: Body,
    ReqB::Error: Into<BoxError>,
    ResB: Body,
    ResB::Error: Into<BoxError>,
{
    let limit = config.body_limit;
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Ok(too_large(limit));
    }
    let storing = config.resumable.is_some() && matches!(identity, Identity::Admitted { .. });
    if let Some(len) = declared.filter(|_| storing) {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if let Err(too_large) = config.max_request.admit(len) {
            return Ok(problem(&too_large));
        }
    }
    let (bytes, req_trailers) = match body::read(req_body, Some(limit)).await {
        Ok(read) => read,
        Err(body::ReadError::TooLarge) => return Ok(too_large(limit)),
        Err(body::ReadError::Failed(e)) => {
            tracing::debug!(target: "idem", error = %e, "the request body could not be read");
            return Ok(Problem::new(
                StatusCode::BAD_REQUEST,
                "INVALID_REQUEST_BODY",
                "the request body could not be read",
            )
            .into_http());
        }
    };

    let call = match config.call(identity, &parts, &bytes) {
        Ok(call) => call,
        Err(e) => return Ok(problem(&e)),
    };
    let guard = match claim(&store, &config, &parts, call).await {
        Ok(guard) => guard,
        Err(answer) => return Ok(answer),
    };
    let req = Request::from_parts(parts, GuardBody::buffered(bytes, req_trailers));
    run_inner(inner, &config, guard, req).await
}

/// Begins the call's record: its guard, or the answer that ends the request (a replay, a
/// refusal).
async fn claim<'s, St: Store, B>(
    store: &'s St,
    config: &Config,
    parts: &Parts,
    call: Call,
) -> std::result::Result<Guard<'s, St>, Response<GuardBody<B>>> {
    let Call {
        scope,
        key,
        fingerprint,
        request,
        handed_scope,
        principal,
    } = call;
    let policy = match config.wait {
        Some(wait) => config.policy.wait(wait),
        None => config.policy,
    };
    let begun = match &request {
        Some(request) => begin_resumable(store, scope, key, fingerprint, policy, request).await,
        None => begin(store, scope, key, fingerprint, policy).await,
    };
    match begun {
        Ok(Begun::Claimed(guard)) => Ok(guard),
        // The request ran, but its answer was not kept (a stream, or too large).
        Ok(Begun::Replay(stored)) if let Some(not_kept) = stored.not_kept() => {
            Err(problem(&not_kept))
        }
        Ok(Begun::Replay(stored)) => Err(match StoredHttpResponse::decode(&stored) {
            Ok(answer) => replay(answer),
            Err(e) => {
                // Which record cannot be read, for the log; the client is told no more than
                // that the guard failed.
                let scope = handed_scope
                    .or_else(|| config.scope(parts, principal.as_deref()).ok())
                    .unwrap_or_default();
                let key = parts.headers.get(&config.header);
                let what = match e {
                    Error::Decode(what) => what,
                    other => other.to_string(),
                };
                problem(&Error::Decode(format!(
                    "record (scope {scope:?}, key {key:?}): {what}"
                )))
            }
        }),
        Err(e) => Err(problem(&e)),
    }
}

/// The claimed request through the inner service, once, with the claim in its extensions; its
/// answer stored, the claim released, or kept with its outcome unknown.
async fn run_inner<S, St, ReqB, ResB>(
    mut inner: S,
    config: &Config,
    mut guard: Guard<'_, St>,
    mut req: Request<GuardBody<ReqB>>,
) -> std::result::Result<Response<GuardBody<ResB>>, S::Error>
where
    S: tower_service::Service<Request<GuardBody<ReqB>>, Response = Response<ResB>>,
    St: Store,
    ResB: Body,
    ResB::Error: Into<BoxError>,
{
    // From here on the inner service may act at any moment, so the outcome is unknown until an
    // answer says otherwise: a guard dropped before then (a panic, a runtime shutting down)
    // suspends the claim rather than releasing it.
    let info = guard.info();
    info.outcome_unknown(NO_ANSWER);
    req.extensions_mut().insert(info.clone());
    let resp = match inner.call(req).await {
        Ok(resp) => resp,
        Err(e) => {
            info.outcome_unknown("the inner service failed");
            guard.fail_or_log().await;
            return Err(e);
        }
    };
    let (head, res_body) = resp.into_parts();
    let seen = Answer {
        status: head.status,
        headers: &head.headers,
        trailers: None,
    };
    let read = if (config.stream_if)(&seen) {
        Ok(body::Answered::Over(Bytes::new(), Box::pin(res_body)))
    } else {
        body::read_answer(res_body, config.policy.max_answer).await
    };
    let (data, trailers) = match read {
        Ok(body::Answered::Whole(data, trailers)) => (data, trailers),
        Ok(body::Answered::Over(read, rest)) => {
            // A stream, or more than the policy keeps: it goes on to the client as it comes.
            if (config.store_if)(&seen) {
                let not_kept =
                    crate::record::StoredResponse::answer_not_kept(None, config.policy.max_answer);
                if let Recorded::Lost(e) = guard.record(Ok(not_kept)).await {
                    return Ok(problem(&e));
                }
            } else {
                end_unstored(config, &info, &mut guard, &seen).await;
            }
            return Ok(Response::from_parts(head, GuardBody::rest(read, rest)));
        }
        Err(e) => {
            // The answer broke off: what it would have said is unknown. Keep the claim, and
            // fail the body for the client.
            info.outcome_unknown("the answer's body broke off");
            guard.fail_or_log().await;
            return Ok(Response::from_parts(
                head,
                GuardBody::failed(e.into_error()),
            ));
        }
    };
    let answer = Answer {
        status: head.status,
        headers: &head.headers,
        trailers: trailers.as_ref(),
    };
    if !(config.store_if)(&answer) {
        end_unstored(config, &info, &mut guard, &answer).await;
        return Ok(Response::from_parts(
            head,
            GuardBody::buffered(data, trailers),
        ));
    }
    let mut kept = HeaderMap::new();
    for name in &config.stored_headers {
        for value in head.headers.get_all(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    let stored = StoredHttpResponse {
        status: head.status,
        headers: kept,
        trailers,
        body: data,
    };
    // The completion policy decides what becomes of the answer and of the claim.
    if let Recorded::Lost(e) = guard.record(stored.encode()).await {
        return Ok(problem(&e));
    }
    let StoredHttpResponse { trailers, body, .. } = stored;
    Ok(Response::from_parts(
        head,
        GuardBody::buffered(body, trailers),
    ))
}

/// The end of a claim whose answer is not stored: released when the answer says nothing
/// happened (and the inner service did not say otherwise on it), else kept, its outcome unknown.
async fn end_unstored<St: Store>(
    config: &Config,
    info: &crate::ClaimInfo,
    guard: &mut Guard<'_, St>,
    answer: &Answer<'_>,
) {
    let said_unknown = info.unknown_outcome().is_some_and(|why| why != NO_ANSWER);
    if (config.release_if)(answer) && !said_unknown {
        guard.give_up_or_log().await;
    } else {
        if !said_unknown {
            info.outcome_unknown(format!("the answer was {}", answer.status));
        }
        guard.fail_or_log().await;
    }
}

/// A stored answer as the client gets it again: its status, stored headers, trailers and
/// bytes, marked as replayed.
fn replay<B>(stored: StoredHttpResponse) -> Response<GuardBody<B>> {
    let StoredHttpResponse {
        status,
        headers,
        trailers,
        body,
    } = stored;
    let mut resp = Response::new(GuardBody::buffered(body, trailers));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    http_api::mark_replayed(resp.headers_mut());
    resp
}

fn too_large<B>(limit: usize) -> Response<GuardBody<B>> {
    Problem::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "REQUEST_BODY_TOO_LARGE",
        format!("the request body is longer than {limit} bytes"),
    )
    .into_http()
}
