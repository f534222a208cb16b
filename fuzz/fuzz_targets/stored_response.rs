//! Stored-response decoding: whatever bytes a store hands back as a completed record's answer,
//! the replay built from them.
//!
//! A store that answers every `begin` with `Replay(<the fuzzed StoredResponse>)` and every
//! `lookup` with a completed record holding it sits behind:
//! - the tower guard (`idem::tower::GuardLayer`): a valid HTTP envelope replays its status,
//!   headers, trailers and bytes with `Idempotent-Replayed: true`; anything else is a 500
//!   problem+json, `IDEMPOTENCY_INTERNAL_ERROR`;
//! - axum handlers under `#[idempotent]` returning `Json<T>`, `(StatusCode, Json<T>)` and a
//!   serde type, behind `IdempotencyLayer`: a body that decodes replays the stored bytes exactly
//!   (when the stored status is the one the handler answers); one that does not is a 500;
//! - `idem::axum::lookup`: an envelope of the tower guard as the guard replays it (a 500 when
//!   it does not decode); any other answer the stored bytes with the stored status (200 without
//!   one, 422 for a final error without one), labelled `application/json` when they are JSON
//!   and `application/octet-stream` when not, a 500 problem+json for a stored status that is
//!   not one; every answer `Cache-Control: no-store` and `X-Content-Type-Options: nosniff`.
//!
//! And directly: `StoredHttpResponse::decode` never panics, its result re-encodes to bytes that
//! decode to the same answer, and an arbitrary answer round-trips through `encode`/`decode`;
//! an envelope head claiming any header count (the fuzzed status as the count) in front of the
//! fuzzed bytes decodes or is `Error::Decode`, never a panic or an abort; `Replay::decode` of
//! the HTTP types re-encodes to an equal value.

#![no_main]

use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};

use arbitrary::Arbitrary;
use axum::body::Body;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem::axum::{IdempotencyKey, IdempotencyLayer};
use idem::record::{BeginOutcome, Record, RecordState};
use idem::store::{Operation, Reply};
use idem::tower::{GuardBody, GuardLayer, StoredHttpResponse};
use idem::{Error, Fingerprint, Key, Replay, Store, StoredResponse, idempotent};
use libfuzzer_sys::fuzz_target;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tower::{Layer, ServiceExt};

/// A store whose records all hold one canned answer.
#[derive(Clone, Default)]
struct Canned(Arc<Mutex<Option<StoredResponse>>>);

impl Canned {
    fn get(&self) -> StoredResponse {
        self.0.lock().unwrap().clone().expect("an answer is set")
    }
}

impl Store for Canned {
    async fn call(&self, op: Operation<'_>) -> idem::Result<Reply> {
        match op {
            Operation::Begin(_) => Ok(Reply::Begun(BeginOutcome::Replay(self.get()))),
            Operation::Lookup { .. } => Ok(Reply::Found(Some(Record {
                fingerprint: Fingerprint::from_bytes([0; 32]),
                state: RecordState::Completed,
                fence: 1,
                response: Some(self.get()),
                lease_remaining: None,
            }))),
            Operation::PurgeExpired => Ok(Reply::Purged(0)),
            other => panic!("a replay reached the store with `{}`", other.name()),
        }
    }
    fn defer(&self, _: idem::store::Deferred) {
        panic!("a replay released a record")
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Order {
    order_no: String,
    qty: u32,
    note: Option<String>,
}

#[derive(Clone)]
struct App {
    store: Canned,
}

#[derive(Debug)]
struct AppError(Error);

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError(e)
    }
}

impl axum::response::IntoResponse for AppError {
    fn into_response(self) -> axum::response::Response {
        self.0.into_response()
    }
}

#[idempotent(scope = "json", key = key, store = app.store, skip(app))]
async fn json(
    axum::extract::State(app): axum::extract::State<App>,
    key: IdempotencyKey,
    Json(req): Json<Value>,
) -> Result<Json<Value>, AppError> {
    unreachable!("every request is a replay")
}

#[idempotent(scope = "created", key = key, store = app.store, skip(app))]
async fn created(
    axum::extract::State(app): axum::extract::State<App>,
    key: IdempotencyKey,
    Json(req): Json<Value>,
) -> Result<(StatusCode, Json<Order>), AppError> {
    unreachable!("every request is a replay")
}

#[idempotent(scope = "typed", key = key, store = app.store, skip(app))]
async fn typed(
    axum::extract::State(app): axum::extract::State<App>,
    key: IdempotencyKey,
    Json(req): Json<Value>,
) -> Result<Json<Order>, AppError> {
    unreachable!("every request is a replay")
}

struct World {
    rt: tokio::runtime::Runtime,
    store: Canned,
    router: Router,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let store = Canned::default();
        let router = Router::new()
            .route("/json", post(json))
            .route("/created", post(created))
            .route("/typed", post(typed))
            .route(
                "/lookup",
                get({
                    let store = store.clone();
                    move || async move {
                        let key = Key::parse("k").unwrap();
                        idem::axum::lookup(&store, "s", &key).await
                    }
                }),
            )
            .layer(IdempotencyLayer::new())
            .with_state(App {
                store: store.clone(),
            });
        World {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            store,
            router,
        }
    })
}

#[derive(Arbitrary, Debug)]
struct FuzzAnswer {
    status: u16,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    trailers: Option<Vec<(Vec<u8>, Vec<u8>)>>,
    body: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// What the store returns, raw.
    status: Option<u16>,
    is_error: bool,
    body: Vec<u8>,
    /// An answer to encode as an envelope and round-trip, and to replay when `use_answer`.
    answer: FuzzAnswer,
    use_answer: bool,
}

fn header_map(entries: &[(Vec<u8>, Vec<u8>)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (n, v) in entries {
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(n), HeaderValue::from_bytes(v)) {
            map.append(n, v);
        }
    }
    map
}

async fn read<B: http_body::Body>(
    resp: Response<B>,
) -> (http::response::Parts, Bytes, Option<HeaderMap>)
where
    B::Error: std::fmt::Debug,
{
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.expect("a replayed body reads");
    let trailers = collected.trailers().cloned();
    (parts, collected.to_bytes(), trailers)
}

fn assert_internal_error(parts: &http::response::Parts, body: &[u8]) {
    assert_eq!(parts.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(parts.headers["content-type"], "application/problem+json");
    let v: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(v["code"], "IDEMPOTENCY_INTERNAL_ERROR");
    assert!(!parts.headers.contains_key("idempotent-replayed"));
}

fn post_req(path: &str) -> Request<Body> {
    Request::post(path)
        .header("idempotency-key", "k-1")
        .header("content-type", "application/json")
        .body(Body::from("{}"))
        .unwrap()
}

fuzz_target!(|input: Input| {
    // An arbitrary answer round-trips through the envelope.
    let answer = StoredHttpResponse {
        status: StatusCode::from_u16(input.answer.status.clamp(100, 999)).unwrap(),
        headers: header_map(&input.answer.headers),
        trailers: input.answer.trailers.as_deref().map(header_map),
        body: Bytes::from(input.answer.body.clone()),
    };
    let encoded = answer.encode().expect("a small answer encodes");
    assert_eq!(encoded.status, Some(answer.status.as_u16()));
    assert_eq!(encoded.is_error, !answer.status.is_success());
    assert_eq!(
        StoredHttpResponse::decode(&encoded).ok().as_ref(),
        Some(&answer)
    );

    let stored = if input.use_answer {
        encoded
    } else {
        StoredResponse {
            status: input.status,
            is_error: input.is_error,
            body: Bytes::from(input.body.clone()),
        }
    };

    // Any header count, however large, in front of any bytes: an answer or a decoding error.
    if let Some(count) = input.status {
        let mut forged = b"idem/http\x01".to_vec();
        forged.extend_from_slice(&count.to_be_bytes());
        forged.extend_from_slice(&input.body);
        let forged = StoredResponse {
            status: Some(200),
            is_error: false,
            body: Bytes::from(forged),
        };
        match StoredHttpResponse::decode(&forged) {
            Ok(d) => assert!(d.headers.len() <= usize::from(count)),
            Err(Error::Decode(_)) => {}
            Err(other) => panic!("decode gave {other:?}"),
        }
    }

    // Decoding is strict and total; what it accepts re-encodes to the same answer.
    let decoded = StoredHttpResponse::decode(&stored);
    match &decoded {
        Ok(d) => {
            assert_eq!(Some(d.status.as_u16()), stored.status);
            assert!(stored.body.ends_with(&d.body));
            let again = d.encode().expect("a decoded answer encodes");
            assert_eq!(StoredHttpResponse::decode(&again).ok().as_ref(), Some(d));
        }
        Err(Error::Decode(_)) => {}
        Err(other) => panic!("decode gave {other:?}"),
    }

    // The HTTP replay types: what decodes, encodes to an equal value.
    if let Ok(Json(v)) = <Json<Value> as Replay<_>>::decode(stored.clone()) {
        let again = Json(v.clone()).encode().unwrap();
        assert_eq!(again.status, Some(200));
        let Json(back) = <Json<Value> as Replay<_>>::decode(again).unwrap();
        assert_eq!(back, v);
    }
    if let Ok((status, Json(order))) =
        <(StatusCode, Json<Order>) as Replay<_>>::decode(stored.clone())
    {
        let want = stored
            .status
            .and_then(|s| StatusCode::from_u16(s).ok())
            .unwrap_or(StatusCode::OK);
        assert_eq!(status, want);
        let again = (status, Json(order.clone())).encode().unwrap();
        assert_eq!(again.status, Some(status.as_u16()));
        let (_, Json(back)) = <(StatusCode, Json<Order>) as Replay<_>>::decode(again).unwrap();
        assert_eq!(back, order);
    }
    if let Ok(order) = <Order as Replay<_>>::decode(stored.clone()) {
        let again = order.encode().unwrap();
        assert_eq!(<Order as Replay<_>>::decode(again).unwrap(), order);
    }

    let w = world();
    *w.store.0.lock().unwrap() = Some(stored.clone());
    w.rt.block_on(async {
        // The tower guard.
        let svc = GuardLayer::new(w.store.clone())
            .allow_anonymous()
            .layer(tower::service_fn(
                |_: Request<GuardBody<Full<Bytes>>>| async {
                    panic!("the inner service ran on a replay");
                    #[allow(unreachable_code)]
                    Ok::<Response<Full<Bytes>>, Infallible>(Response::new(Full::default()))
                },
            ));
        let req = Request::post("/orders")
            .header("idempotency-key", "k-1")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let (parts, body, trailers) = read(svc.oneshot(req).await.unwrap()).await;
        match &decoded {
            Ok(d) => {
                assert_eq!(parts.status, d.status);
                assert_eq!(parts.headers["idempotent-replayed"], "true");
                assert_eq!(parts.headers["cache-control"], "no-store");
                for (name, value) in &d.headers {
                    if name != "idempotent-replayed" && name != "cache-control" {
                        assert!(parts.headers.get_all(name).iter().any(|v| v == value));
                    }
                }
                assert_eq!(body, d.body);
                assert_eq!(trailers.as_ref(), d.trailers.as_ref());
            }
            Err(_) => assert_internal_error(&parts, &body),
        }

        // `#[idempotent]` axum handlers behind the layer.
        let replay_of = |path: &str| w.router.clone().oneshot(post_req(path));
        let json_value = serde_json::from_slice::<Value>(&stored.body);
        let (parts, body, _) = read(replay_of("/json").await.unwrap()).await;
        match (&json_value, stored.is_error) {
            (Ok(v), false) => {
                assert_eq!(parts.status, StatusCode::OK);
                if stored.status == Some(200) {
                    assert_eq!(parts.headers["idempotent-replayed"], "true");
                    assert_eq!(body, stored.body, "not the stored bytes");
                } else {
                    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), *v);
                }
            }
            _ => assert_internal_error(&parts, &body),
        }

        let order = serde_json::from_slice::<Order>(&stored.body);
        for path in ["/created", "/typed"] {
            let (parts, body, _) = read(replay_of(path).await.unwrap()).await;
            match (&order, stored.is_error) {
                (Ok(o), false) => {
                    let status = if path == "/created" {
                        stored
                            .status
                            .and_then(|s| StatusCode::from_u16(s).ok())
                            .unwrap_or(StatusCode::OK)
                    } else {
                        StatusCode::OK
                    };
                    assert_eq!(parts.status, status, "{path}");
                    if stored.status == Some(status.as_u16()) {
                        // The handler answered the replayed value: the layer sent the stored
                        // bytes, marked.
                        assert_eq!(parts.headers["idempotent-replayed"], "true", "{path}");
                    }
                    if parts.headers.contains_key("idempotent-replayed") {
                        assert_eq!(body, stored.body, "{path}: not the stored bytes");
                    } else {
                        assert_eq!(serde_json::from_slice::<Order>(&body).unwrap(), *o);
                    }
                }
                _ => assert_internal_error(&parts, &body),
            }
        }

        // The lookup by key: an answer of the tower guard as the guard replays it; any other
        // the stored bytes as they are, with the stored status, labelled JSON when they are.
        let req = Request::get("/lookup").body(Body::empty()).unwrap();
        let (parts, body, _) = read(w.router.clone().oneshot(req).await.unwrap()).await;
        assert_eq!(parts.headers["cache-control"], "no-store");
        assert_eq!(parts.headers["x-content-type-options"], "nosniff");
        if stored.status.is_some() && stored.body.starts_with(b"idem/http") {
            match StoredHttpResponse::decode(&stored) {
                Ok(answer) => {
                    assert_eq!(parts.status, answer.status);
                    assert_eq!(parts.headers["idempotent-replayed"], "true");
                    assert_eq!(body, answer.body);
                    assert_eq!(
                        parts.headers.get("content-type"),
                        answer.headers.get("content-type")
                    );
                }
                Err(_) => assert_internal_error(&parts, &body),
            }
            return;
        }
        let status = match stored.status {
            Some(s) => StatusCode::from_u16(s).ok(),
            None if stored.is_error => Some(StatusCode::UNPROCESSABLE_ENTITY),
            None => Some(StatusCode::OK),
        };
        match status {
            Some(status) => {
                assert_eq!(parts.status, status);
                assert_eq!(parts.headers["idempotent-replayed"], "true");
                assert_eq!(body, stored.body);
                let json = serde_json::from_slice::<serde::de::IgnoredAny>(&stored.body).is_ok();
                assert_eq!(
                    parts.headers["content-type"],
                    if json { "application/json" } else { "application/octet-stream" }
                );
            }
            None => assert_internal_error(&parts, &body),
        }
    });
});
