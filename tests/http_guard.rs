//! The guard for any `http` service (`idem::tower`, feature `tower`): over a plain tower
//! service called directly, over a hyper server and over an axum router; and the storm of 100
//! concurrent duplicates on every store.

mod common;

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use idem::lifecycle::State;
use idem::store::{RecordQuery, StoreAdmin};
use idem::tower::{GuardBody, GuardLayer, GuardService, StoredHttpResponse};
use idem::{
    Begun, ClaimInfo, Fingerprint, Key, KeyPolicy, MemoryStore, PgStore, Policy, SqliteStore,
    Store, StoredResponse,
};
use serde_json::Value;
use std::future::Future;
use tower::{Layer, ServiceExt, service_fn};

// ---------------------------------------------------------------------------------------------
// A body made of chunks, that can fail, with trailers: for requests and answers alike.

#[derive(Default)]
struct TestBody {
    chunks: VecDeque<Result<Bytes, io::Error>>,
    trailers: Option<HeaderMap>,
    /// Whether the length is announced (as a buffered body would).
    exact: bool,
    /// After the chunks, what the test sends, as it sends it; the body ends when it hangs up.
    live: Option<tokio::sync::mpsc::UnboundedReceiver<Bytes>>,
}

impl TestBody {
    fn full(data: impl Into<Bytes>) -> Self {
        TestBody {
            chunks: VecDeque::from([Ok(data.into())]),
            trailers: None,
            exact: true,
            live: None,
        }
    }

    /// Chunks, with no length announced.
    fn chunks(parts: &[&'static str]) -> Self {
        TestBody {
            chunks: parts
                .iter()
                .map(|p| Ok(Bytes::from_static(p.as_bytes())))
                .collect(),
            trailers: None,
            exact: false,
            live: None,
        }
    }

    /// One chunk, then a failure.
    fn failing_after(first: &'static str) -> Self {
        TestBody {
            chunks: VecDeque::from([
                Ok(Bytes::from_static(first.as_bytes())),
                Err(io::Error::other("the answer broke off")),
            ]),
            trailers: None,
            exact: false,
            live: None,
        }
    }

    /// These chunks, with no length announced.
    fn parts(parts: Vec<Bytes>) -> Self {
        TestBody {
            chunks: parts.into_iter().map(Ok).collect(),
            ..TestBody::default()
        }
    }

    /// What the test sends on the channel, as it sends it.
    fn live(rx: tokio::sync::mpsc::UnboundedReceiver<Bytes>) -> Self {
        TestBody {
            live: Some(rx),
            ..TestBody::default()
        }
    }

    fn with_trailers(mut self, trailers: HeaderMap) -> Self {
        self.trailers = Some(trailers);
        self
    }
}

impl Body for TestBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if self.chunks.is_empty()
            && let Some(live) = self.live.as_mut()
        {
            return live
                .poll_recv(cx)
                .map(|chunk| chunk.map(|c| Ok(Frame::data(c))));
        }
        Poll::Ready(match self.chunks.pop_front() {
            Some(chunk) => Some(chunk.map(Frame::data)),
            None => self.trailers.take().map(|t| Ok(Frame::trailers(t))),
        })
    }

    fn size_hint(&self) -> SizeHint {
        if self.exact {
            let len = self.chunks.iter().flatten().map(|c| c.len() as u64).sum();
            SizeHint::with_exact(len)
        } else {
            SizeHint::default()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The inner service: counts its calls, and answers as the test says.

/// What the inner service does on its n-th call (from 1).
type Behaviour =
    Arc<dyn Fn(usize, Bytes) -> Result<Response<TestBody>, io::Error> + Send + Sync + 'static>;

/// The gate's permits: a test that takes them all holds every call inside the inner service.
const GATE: u32 = 1 << 20;

#[derive(Clone)]
struct Inner {
    calls: Arc<AtomicUsize>,
    /// Held by a call while it runs, when the test wants a slow inner service.
    gate: Arc<tokio::sync::Semaphore>,
    behaviour: Behaviour,
}

impl Inner {
    fn new(
        behaviour: impl Fn(usize, Bytes) -> Result<Response<TestBody>, io::Error>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Inner {
            calls: Arc::new(AtomicUsize::new(0)),
            gate: Arc::new(tokio::sync::Semaphore::new(GATE as usize)),
            behaviour: Arc::new(behaviour),
        }
    }

    /// Creates an order: 201, JSON, a `Location`, and a header that is not stored.
    fn orders() -> Self {
        Inner::new(|n, body| Ok(created(n, &body)))
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// A plain tower service: counts its calls, reads the request, waits at the gate, answers.
impl tower::Service<Request<GuardBody<TestBody>>> for Inner {
    type Response = Response<TestBody>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<TestBody>, io::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<GuardBody<TestBody>>) -> Self::Future {
        let inner = self.clone();
        Box::pin(async move {
            let n = inner.calls.fetch_add(1, Ordering::SeqCst) + 1;
            let body = req
                .into_body()
                .collect()
                .await
                .map_err(io::Error::other)?
                .to_bytes();
            let _running = inner.gate.acquire().await;
            (inner.behaviour)(n, body)
        })
    }
}

fn created(n: usize, body: &[u8]) -> Response<TestBody> {
    Response::builder()
        .status(StatusCode::CREATED)
        .header(CONTENT_TYPE, "application/json")
        .header(LOCATION, format!("/orders/{n}"))
        .header("x-trace", format!("trace-{n}"))
        .body(TestBody::full(format!(
            r#"{{"order":{n},"request":{:?}}}"#,
            String::from_utf8_lossy(body)
        )))
        .unwrap()
}

type Guarded<St> = GuardService<Inner, St>;

/// `layer` around the inner service, called directly (no network).
fn guarded<St: Store + Clone>(layer: GuardLayer<St>, inner: &Inner) -> Guarded<St> {
    layer.layer(inner.clone())
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// The problem's code, after checking it is a problem.
    fn code(&self) -> String {
        assert_eq!(
            self.headers[CONTENT_TYPE], "application/problem+json",
            "{:?}",
            self.body
        );
        let p = self.json();
        assert_eq!(p["status"], self.status.as_u16());
        p["code"].as_str().unwrap().to_owned()
    }

    fn replayed(&self) -> bool {
        match self.headers.get("idempotent-replayed") {
            None => false,
            Some(v) => {
                assert_eq!(v, "true");
                true
            }
        }
    }
}

async fn send<St: Store + Clone>(svc: &Guarded<St>, req: Request<TestBody>) -> Answer {
    let resp = svc
        .clone()
        .oneshot(req)
        .await
        .expect("the inner service did not fail");
    let (head, body) = resp.into_parts();
    let collected = body.collect().await.expect("the body reads whole");
    Answer {
        status: head.status,
        headers: head.headers,
        trailers: collected.trailers().cloned(),
        body: collected.to_bytes(),
    }
}

fn post(uri: &str, key: Option<&str>, body: &'static str) -> Request<TestBody> {
    let mut b = Request::post(uri);
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(TestBody::full(body)).unwrap()
}

const KEY: &str = "0b2c1c6e-1f7b-4f0f-9d3a-8f2f6f0a1111";

// ---------------------------------------------------------------------------------------------
// Over a plain tower service.

#[tokio::test]
async fn the_first_call_runs_and_the_retry_replays_status_chosen_headers_and_bytes() {
    let inner = Inner::orders();
    let svc = guarded(
        GuardLayer::new(MemoryStore::new()).allow_anonymous(),
        &inner,
    );
    let first = send(&svc, post("/orders", Some(KEY), r#"{"sku":9001}"#)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(
        first.headers["x-trace"], "trace-1",
        "a first answer keeps every header"
    );
    assert!(first.headers.get(CACHE_CONTROL).is_none());
    assert_eq!(first.json()["order"], 1);

    for _ in 0..3 {
        let again = send(&svc, post("/orders", Some(KEY), r#"{"sku":9001}"#)).await;
        assert_eq!(again.status, StatusCode::CREATED, "the original status");
        assert!(again.replayed());
        assert_eq!(again.body, first.body, "byte for byte");
        assert_eq!(again.headers[CONTENT_TYPE], "application/json");
        assert_eq!(again.headers[LOCATION], "/orders/1");
        assert_eq!(
            again.headers[CACHE_CONTROL], "no-store",
            "one caller's answer, for no cache to share"
        );
        assert!(
            again.headers.get("x-trace").is_none(),
            "only the chosen headers are stored"
        );
    }
    assert_eq!(inner.calls(), 1);
}

#[tokio::test]
async fn stored_headers_are_configurable_and_every_value_is_kept() {
    let inner = Inner::new(|n, _| {
        Ok(Response::builder()
            .status(StatusCode::ACCEPTED)
            .header("set-cookie", format!("a={n}"))
            .header("set-cookie", "b=2")
            .header(LOCATION, "/elsewhere")
            .body(TestBody::full("queued"))
            .unwrap())
    });
    let layer = GuardLayer::new(MemoryStore::new())
        .allow_anonymous()
        .stored_headers([http::header::SET_COOKIE]);
    let svc = guarded(layer, &inner);
    send(&svc, post("/jobs", Some(KEY), "x")).await;
    let again = send(&svc, post("/jobs", Some(KEY), "x")).await;
    assert_eq!(again.status, StatusCode::ACCEPTED);
    let cookies: Vec<_> = again.headers.get_all("set-cookie").iter().collect();
    assert_eq!(cookies, ["a=1", "b=2"]);
    assert!(again.headers.get(LOCATION).is_none());
    assert_eq!(&again.body[..], b"queued");
    assert_eq!(inner.calls(), 1);
}

/// A stored `Cache-Control` gives way to `no-store` on a replay: a cache may keep the first
/// answer as the service said, never a replay.
#[tokio::test]
async fn a_replay_is_never_cacheable() {
    let inner = Inner::new(|_, _| {
        Ok(Response::builder()
            .status(StatusCode::OK)
            .header(CACHE_CONTROL, "public, max-age=600")
            .body(TestBody::full("done"))
            .unwrap())
    });
    let layer = GuardLayer::new(MemoryStore::new())
        .allow_anonymous()
        .stored_headers([CACHE_CONTROL]);
    let svc = guarded(layer, &inner);
    let first = send(&svc, post("/jobs", Some(KEY), "x")).await;
    assert_eq!(first.headers[CACHE_CONTROL], "public, max-age=600");
    let again = send(&svc, post("/jobs", Some(KEY), "x")).await;
    assert!(again.replayed());
    let values: Vec<_> = again.headers.get_all(CACHE_CONTROL).iter().collect();
    assert_eq!(values, ["no-store"]);
}

#[tokio::test]
async fn a_key_reused_with_another_body_or_query_is_422() {
    let inner = Inner::orders();
    let svc = guarded(
        GuardLayer::new(MemoryStore::new()).allow_anonymous(),
        &inner,
    );
    let first = send(&svc, post("/orders", Some(KEY), r#"{"sku":1}"#)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    for req in [
        post("/orders", Some(KEY), r#"{"sku":2}"#),
        post("/orders?coupon=1", Some(KEY), r#"{"sku":1}"#),
    ] {
        let r = send(&svc, req).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(r.code(), "KEY_REUSED_WITH_DIFFERENT_BODY");
    }
    assert_eq!(inner.calls(), 1);
}

#[tokio::test]
async fn a_guarded_method_without_a_good_key_is_400_and_the_inner_service_never_runs() {
    let inner = Inner::orders();
    let svc = guarded(
        GuardLayer::new(MemoryStore::new()).allow_anonymous(),
        &inner,
    );
    let missing = send(&svc, post("/orders", None, "{}")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.code(), "INVALID_IDEMPOTENCY_KEY");
    let patch = Request::patch("/orders/1")
        .body(TestBody::full("{}"))
        .unwrap();
    assert_eq!(send(&svc, patch).await.status, StatusCode::BAD_REQUEST);
    let long = "k".repeat(256);
    for bad in ["", "a b", long.as_str()] {
        let req = Request::post("/orders")
            .header("idempotency-key", bad)
            .body(TestBody::full("{}"))
            .unwrap();
        let r = send(&svc, req).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(r.code(), "INVALID_IDEMPOTENCY_KEY");
    }
    let non_ascii = Request::post("/orders")
        .header(
            "idempotency-key",
            HeaderValue::from_bytes(b"cl\xe9").unwrap(),
        )
        .body(TestBody::full("{}"))
        .unwrap();
    assert_eq!(send(&svc, non_ascii).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(inner.calls(), 0);
}

#[tokio::test]
async fn the_key_header_and_policy_are_configurable() {
    let inner = Inner::orders();
    let layer = GuardLayer::new(MemoryStore::new())
        .allow_anonymous()
        .header(http::HeaderName::from_static("x-request-key"))
        .key_policy(KeyPolicy::Uuid);
    let svc = guarded(layer, &inner);
    let with = |name: &str, key: &str| {
        Request::post("/orders")
            .header(name, key)
            .body(TestBody::full("{}"))
            .unwrap()
    };
    let r = send(&svc, with("idempotency-key", KEY)).await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "not the configured header"
    );
    let r = send(&svc, with("x-request-key", "order-17")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "not a UUID");
    assert_eq!(inner.calls(), 0);
    let r = send(&svc, with("x-request-key", KEY)).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(inner.calls(), 1);
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_and_the_inner_service_never_runs() {
    let inner = Inner::orders();
    let svc = guarded(
        GuardLayer::new(MemoryStore::new())
            .allow_anonymous()
            .body_limit(16),
        &inner,
    );
    // Announced too long: refused before reading.
    let declared = Request::post("/orders")
        .header("idempotency-key", KEY)
        .header(CONTENT_LENGTH, "17")
        .body(TestBody::full("01234567890123456"))
        .unwrap();
    // Not announced: refused once the bytes read pass the limit.
    let streamed = Request::post("/orders")
        .header("idempotency-key", "k-2")
        .body(TestBody::chunks(&["0123456789", "0123456"]))
        .unwrap();
    for req in [declared, streamed] {
        let r = send(&svc, req).await;
        assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(r.code(), "REQUEST_BODY_TOO_LARGE");
    }
    assert_eq!(inner.calls(), 0);
    // Exactly the limit, in two chunks, is read whole and handed on.
    let at_limit = Request::post("/orders")
        .header("idempotency-key", "k-3")
        .body(TestBody::chunks(&["01234567", "89abcdef"]))
        .unwrap();
    let r = send(&svc, at_limit).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.json()["request"], "0123456789abcdef");
    assert_eq!(inner.calls(), 1);
}

/// The one record of a store the tests use, as an operator sees it.
async fn only_record(store: &MemoryStore) -> idem::store::RecordInfo {
    let mut all = store.list(&RecordQuery::new()).await.unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    all.pop().unwrap()
}

#[tokio::test]
async fn an_inner_error_keeps_the_claim_and_the_retry_resumes_it() {
    let inner = Inner::new(|n, body| match n {
        1 => Err(io::Error::other("the database went away")),
        _ => Ok(created(n, &body)),
    });
    let store = MemoryStore::new();
    let svc = guarded(GuardLayer::new(store.clone()).allow_anonymous(), &inner);
    let err = svc
        .clone()
        .oneshot(post("/orders", Some(KEY), "{}"))
        .await
        .expect_err("the inner service's error is handed on");
    assert_eq!(err.to_string(), "the database went away");
    // The inner service may have acted before it failed: the claim is kept, unfinished and
    // visible, never released.
    let kept = only_record(&store).await;
    assert_eq!(kept.state, State::InProgress);
    assert_eq!(kept.note.as_deref(), Some("the inner service failed"));
    assert!(kept.holds_work(), "{kept:?}");
    let retry = send(&svc, post("/orders", Some(KEY), "{}")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed(), "the retry ran");
    assert_eq!(retry.json()["order"], 2);
    assert_eq!(only_record(&store).await.attempt, 2, "the retry resumed it");
    let again = send(&svc, post("/orders", Some(KEY), "{}")).await;
    assert!(again.replayed());
    assert_eq!(again.body, retry.body);
    assert_eq!(inner.calls(), 2);
}

#[tokio::test]
async fn only_stored_answers_replay_and_the_rule_is_configurable() {
    let inner = Inner::new(|n, body| match n {
        1 => Ok(Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .body(TestBody::full("try later"))
            .unwrap()),
        2 => Ok(Response::builder()
            .status(StatusCode::CONFLICT)
            .body(TestBody::full("sold out"))
            .unwrap()),
        _ => Ok(created(n, &body)),
    });
    // By default only 2xx is stored: the 503 keeps the claim as an unknown outcome (its
    // retry resumes it), the 409 releases it.
    let svc = guarded(
        GuardLayer::new(MemoryStore::new()).allow_anonymous(),
        &inner,
    );
    let statuses = [
        send(&svc, post("/orders", Some(KEY), "{}")).await.status,
        send(&svc, post("/orders", Some(KEY), "{}")).await.status,
        send(&svc, post("/orders", Some(KEY), "{}")).await.status,
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::CONFLICT,
            StatusCode::CREATED
        ]
    );
    assert_eq!(inner.calls(), 3);

    // Storing final 409s too: the second answer is replayed.
    let inner = Inner::new(|n, _| {
        Ok(Response::builder()
            .status(if n == 1 {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::CONFLICT
            })
            .body(TestBody::full(format!("answer {n}")))
            .unwrap())
    });
    let layer = GuardLayer::new(MemoryStore::new())
        .allow_anonymous()
        .store_if(|a| a.is_success() || a.status() == StatusCode::CONFLICT);
    let svc = guarded(layer, &inner);
    assert_eq!(
        send(&svc, post("/orders", Some(KEY), "{}")).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let stored = send(&svc, post("/orders", Some(KEY), "{}")).await;
    assert_eq!(stored.status, StatusCode::CONFLICT);
    let replay = send(&svc, post("/orders", Some(KEY), "{}")).await;
    assert!(replay.replayed());
    assert_eq!(replay.status, StatusCode::CONFLICT);
    assert_eq!(&replay.body[..], b"answer 2");
    assert_eq!(inner.calls(), 2);
}

#[tokio::test]
async fn an_answer_body_that_fails_mid_stream_keeps_the_claim_for_the_retry_to_resume() {
    let inner = Inner::new(|n, body| match n {
        1 => Ok(Response::builder()
            .status(StatusCode::CREATED)
            .body(TestBody::failing_after(r#"{"order":"#))
            .unwrap()),
        _ => Ok(created(n, &body)),
    });
    let store = MemoryStore::new();
    let svc = guarded(GuardLayer::new(store.clone()).allow_anonymous(), &inner);
    let resp = svc
        .clone()
        .oneshot(post("/orders", Some(KEY), "{}"))
        .await
        .unwrap();
    let err = resp
        .into_body()
        .collect()
        .await
        .expect_err("the client sees the body fail");
    assert_eq!(err.to_string(), "the answer broke off");
    // The inner service answered 201 before its body broke off: it acted, and its answer is
    // lost. The claim is kept in progress with its outcome unknown, never released, and nothing
    // runs the inner service again by itself.
    let kept = only_record(&store).await;
    assert_eq!(kept.state, State::InProgress, "{kept:?}");
    assert!(kept.note.is_some(), "its outcome is unknown: {kept:?}");
    assert!(kept.holds_work(), "{kept:?}");
    assert_eq!(kept.attempt, 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(inner.calls(), 1, "not run again until a retry resumes it");
    // The same key's retry resumes it as the second attempt of the same request, not as a
    // new request: the inner service gets the claim's next attempt, with the same downstream
    // key, and its answer is stored.
    let retry = send(&svc, post("/orders", Some(KEY), "{}")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(inner.calls(), 2);
    let done = only_record(&store).await;
    assert_eq!(
        (done.state, done.attempt),
        (State::Completed, 2),
        "{done:?}"
    );
    let again = send(&svc, post("/orders", Some(KEY), "{}")).await;
    assert!(again.replayed());
    assert_eq!(again.body, retry.body);
    assert_eq!(inner.calls(), 2);
}

#[tokio::test]
async fn a_client_that_hangs_up_does_not_cut_the_call_off() {
    let inner = Inner::orders();
    let store = MemoryStore::new();
    let svc = guarded(GuardLayer::new(store.clone()).allow_anonymous(), &inner);
    // The first call hangs inside the inner service; the client gives up.
    let all = inner.gate.acquire_many(GATE).await.unwrap();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        svc.clone().oneshot(post("/orders", Some(KEY), "{}")),
    )
    .await;
    assert!(gave_up.is_err(), "the call was still running");
    assert_eq!(inner.calls(), 1);
    // Meanwhile the claim is held: a retry is told to wait, not run alongside.
    let during = send(&svc, post("/orders", Some(KEY), "{}")).await;
    assert_eq!(during.status, StatusCode::CONFLICT);
    drop(all);
    // The call ran to its end without its client, and its answer was stored.
    let mut retry = send(&svc, post("/orders", Some(KEY), "{}")).await;
    for _ in 0..100 {
        if retry.status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        retry = send(&svc, post("/orders", Some(KEY), "{}")).await;
    }
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed(), "the first call's answer");
    assert_eq!(retry.json()["order"], 1);
    assert_eq!(inner.calls(), 1);
    assert_eq!(only_record(&store).await.state, State::Completed);
}

#[tokio::test]
async fn refusals_release_and_other_failures_stay_unknown() {
    // Each answer once, then 201: which of them free the key, and which keep the claim.
    let cases: [(StatusCode, Option<&'static str>, bool); 7] = [
        (StatusCode::BAD_REQUEST, None, true),
        (StatusCode::CONFLICT, None, true),
        (StatusCode::TOO_MANY_REQUESTS, None, true),
        (StatusCode::INTERNAL_SERVER_ERROR, None, false),
        (StatusCode::BAD_GATEWAY, None, false),
        (StatusCode::OK, Some("5"), true),
        (StatusCode::OK, Some("4"), false),
    ];
    for (status, grpc, releases) in cases {
        let inner = Inner::new(move |n, body| {
            if n > 1 {
                return Ok(created(n, &body));
            }
            let mut b = Response::builder().status(status);
            if let Some(code) = grpc {
                b = b.header("grpc-status", code);
            }
            Ok(b.body(TestBody::full("no")).unwrap())
        });
        let store = MemoryStore::new();
        let svc = guarded(GuardLayer::new(store.clone()).allow_anonymous(), &inner);
        let first = send(&svc, post("/orders", Some(KEY), "{}")).await;
        assert_eq!(first.status, status);
        let record = only_record(&store).await;
        let what = format!("{status} grpc {grpc:?}: {record:?}");
        if releases {
            assert_eq!(record.state, State::Released, "{what}");
            assert!(!record.holds_work(), "{what}");
        } else {
            assert_eq!(record.state, State::InProgress, "{what}");
            assert!(record.holds_work(), "{what}");
            assert!(record.note.unwrap().contains("the answer was"), "{status}");
        }
        let retry = send(&svc, post("/orders", Some(KEY), "{}")).await;
        assert_eq!(retry.status, StatusCode::CREATED, "{status}");
        assert_eq!(inner.calls(), 2);
    }
}

#[tokio::test]
async fn the_inner_service_gets_its_claim_and_can_say_the_outcome_is_unknown() {
    // A proxy in front of an upstream that moves money once per downstream key: the upstream
    // commits, and the proxy answers 409 (it read the upstream's answer wrong) after saying the
    // outcome is unknown. The retry resumes the same claim, with the same downstream key.
    let moved = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(u32, bool, String)>::new()));
    let svc = {
        let (moved, seen) = (moved.clone(), seen.clone());
        GuardLayer::new(MemoryStore::new())
            .allow_anonymous()
            .layer(service_fn(move |req: Request<GuardBody<TestBody>>| {
                let (moved, seen) = (moved.clone(), seen.clone());
                async move {
                    let claim = req
                        .extensions()
                        .get::<ClaimInfo>()
                        .expect("the claim is in the request's extensions")
                        .clone();
                    let downstream = claim.downstream_key("charge");
                    seen.lock().unwrap().push((
                        claim.attempt(),
                        claim.is_reclaim(),
                        downstream.clone(),
                    ));
                    let mut moved = moved.lock().unwrap();
                    if !moved.contains(&downstream) {
                        moved.push(downstream);
                    }
                    let first = claim.attempt() == 1;
                    if first {
                        claim.outcome_unknown("the upstream's answer was lost");
                    }
                    Ok::<_, io::Error>(
                        Response::builder()
                            .status(if first {
                                StatusCode::CONFLICT
                            } else {
                                StatusCode::CREATED
                            })
                            .body(TestBody::full("answer"))
                            .unwrap(),
                    )
                }
            }))
    };
    let call = || async {
        let resp = svc
            .clone()
            .oneshot(post("/refunds", Some(KEY), "{}"))
            .await
            .unwrap();
        resp.status()
    };
    assert_eq!(call().await, StatusCode::CONFLICT);
    assert_eq!(call().await, StatusCode::CREATED);
    assert_eq!(call().await, StatusCode::CREATED, "replayed");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!((seen[0].0, seen[0].1), (1, false));
    assert_eq!((seen[1].0, seen[1].1), (2, true), "a resumption");
    assert_eq!(seen[0].2, seen[1].2, "one downstream key for every attempt");
    assert_eq!(moved.lock().unwrap().len(), 1, "the money moved once");
}

#[tokio::test]
async fn a_concurrent_duplicate_is_409_with_retry_after_then_replays() {
    let inner = Inner::orders();
    let svc = guarded(
        GuardLayer::new(MemoryStore::new()).allow_anonymous(),
        &inner,
    );
    let all = inner.gate.acquire_many(GATE).await.unwrap();
    let first = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, post("/orders", Some(KEY), "{}")).await }
    });
    while inner.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let dup = send(&svc, post("/orders", Some(KEY), "{}")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.code(), "REQUEST_IN_PROGRESS");
    let after: u64 = dup.headers[RETRY_AFTER].to_str().unwrap().parse().unwrap();
    assert!(after >= 1, "{after}");
    drop(all);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let again = send(&svc, post("/orders", Some(KEY), "{}")).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(inner.calls(), 1);
}

#[tokio::test]
async fn with_a_wait_concurrent_duplicates_replay_the_first_answer_not_409() {
    let inner = Inner::orders();
    let svc = guarded(
        GuardLayer::new(MemoryStore::new())
            .allow_anonymous()
            .wait(Duration::from_secs(20)),
        &inner,
    );
    let all = inner.gate.acquire_many(GATE).await.unwrap();
    let first = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, post("/orders", Some(KEY), "{}")).await }
    });
    while inner.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let dups: Vec<_> = (0..8)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { send(&svc, post("/orders", Some(KEY), "{}")).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        dups.iter().all(|d| !d.is_finished()),
        "a duplicate was answered while the first request ran"
    );
    drop(all);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    for dup in dups {
        let dup = dup.await.unwrap();
        assert_eq!(dup.status, StatusCode::CREATED, "{:?}", dup.body);
        assert!(dup.replayed());
        assert_eq!(dup.body, first.body);
    }
    assert_eq!(inner.calls(), 1);

    // The wait is a bound: past it, the duplicate is told 409 with `Retry-After`, as without.
    let svc = guarded(
        GuardLayer::new(MemoryStore::new())
            .allow_anonymous()
            .wait(Duration::from_millis(200)),
        &inner,
    );
    let all = inner.gate.acquire_many(GATE).await.unwrap();
    let first = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, post("/orders", Some(KEY), "{}")).await }
    });
    while inner.calls() == 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = std::time::Instant::now();
    let dup = send(&svc, post("/orders", Some(KEY), "{}")).await;
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.code(), "REQUEST_IN_PROGRESS");
    assert!(dup.headers.contains_key(RETRY_AFTER));
    drop(all);
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(inner.calls(), 2);
}

#[tokio::test]
async fn methods_that_are_not_guarded_pass_through() {
    let inner = Inner::new(|n, _| {
        Ok(Response::builder()
            .header("x-call", n.to_string())
            .body(TestBody::full(format!("call {n}")))
            .unwrap())
    });
    let layer = GuardLayer::new(MemoryStore::new())
        .allow_anonymous()
        .guard_when_keyed([Method::DELETE]);
    let svc = guarded(layer, &inner);
    let req = |method: Method, key: Option<&str>| {
        let mut b = Request::builder().method(method).uri("/orders/1");
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
        b.body(TestBody::full("")).unwrap()
    };
    // GET and PUT are not guarded: without a key or with one, each call runs.
    for (i, (method, key)) in [
        (Method::GET, None),
        (Method::GET, Some(KEY)),
        (Method::GET, Some(KEY)),
        (Method::PUT, None),
        (Method::PUT, Some(KEY)),
        (Method::PUT, Some(KEY)),
        (Method::DELETE, None),
        (Method::DELETE, None),
    ]
    .into_iter()
    .enumerate()
    {
        let r = send(&svc, req(method.clone(), key)).await;
        assert_eq!(r.status, StatusCode::OK, "{method} {key:?}");
        assert_eq!(
            std::str::from_utf8(&r.body).unwrap(),
            format!("call {}", i + 1)
        );
        assert!(!r.replayed());
    }
    // DELETE with a key is guarded: the second is a replay.
    let first = send(&svc, req(Method::DELETE, Some(KEY))).await;
    let again = send(&svc, req(Method::DELETE, Some(KEY))).await;
    assert!(!first.replayed());
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(inner.calls(), 9);
    // The required methods can be changed too: POST without a key now passes.
    let layer = GuardLayer::new(MemoryStore::new())
        .allow_anonymous()
        .require_key([Method::PUT]);
    let svc = guarded(layer, &inner);
    assert_eq!(
        send(&svc, post("/x", None, "")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&svc, req(Method::PUT, None)).await.status,
        StatusCode::BAD_REQUEST
    );
}

fn user_of(parts: &http::request::Parts) -> Option<String> {
    Some(parts.headers.get("x-user")?.to_str().ok()?.to_owned())
}

#[tokio::test]
async fn two_principals_with_one_key_do_not_share_a_record() {
    let inner = Inner::orders();
    let svc = guarded(
        GuardLayer::new(MemoryStore::new()).principal(user_of),
        &inner,
    );
    let as_user = |user: &str| {
        Request::post("/orders")
            .header("idempotency-key", KEY)
            .header("x-user", user)
            .body(TestBody::full(r#"{"sku":7}"#))
            .unwrap()
    };
    let a = send(&svc, as_user("alice")).await;
    let b = send(&svc, as_user("bob")).await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!b.replayed(), "another principal's key never replays");
    assert_ne!(a.body, b.body);
    let a_again = send(&svc, as_user("alice")).await;
    assert!(a_again.replayed());
    assert_eq!(a_again.body, a.body);
    // A principal whose name holds the delimiter cannot reach another's record either.
    let c = send(&svc, as_user("alice:x")).await;
    assert!(!c.replayed());
    assert_eq!(inner.calls(), 3);
}

/// Without a principal the guard fails closed: 401 problem+json, before the store is read and
/// without calling the inner service, whether the layer has no principal function or its
/// function finds none. Unguarded requests pass as before.
#[tokio::test]
async fn a_guarded_request_without_a_principal_is_refused() {
    let inner = Inner::orders();
    let store = MemoryStore::new();
    let no_function = guarded(GuardLayer::new(store.clone()), &inner);
    let finds_none = guarded(GuardLayer::new(store.clone()).principal(user_of), &inner);
    for svc in [&no_function, &finds_none] {
        let r = send(svc, post("/orders", Some(KEY), r#"{"sku":7}"#)).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(r.code(), "MISSING_PRINCIPAL");
        assert!(!r.replayed());
    }
    assert_eq!(inner.calls(), 0, "the inner service never ran");
    assert!(store.is_empty(), "nothing was claimed");

    let get = Request::get("/orders").body(TestBody::full("")).unwrap();
    assert_eq!(send(&no_function, get).await.status, StatusCode::CREATED);
    assert_eq!(inner.calls(), 1, "an unguarded method passes through");
}

/// Built as anonymous, the guard serves callers without a principal in one key space shared
/// by all of them; a caller with a principal keeps a key space of its own.
#[tokio::test]
async fn an_anonymous_layer_guards_callers_without_a_principal_together() {
    let inner = Inner::orders();
    let svc = guarded(
        GuardLayer::new(MemoryStore::new())
            .principal(user_of)
            .allow_anonymous(),
        &inner,
    );
    let anonymous = || post("/orders", Some(KEY), r#"{"sku":7}"#);
    let as_alice = || {
        Request::post("/orders")
            .header("idempotency-key", KEY)
            .header("x-user", "alice")
            .body(TestBody::full(r#"{"sku":7}"#))
            .unwrap()
    };
    let first = send(&svc, anonymous()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = send(&svc, anonymous()).await;
    assert!(again.replayed(), "anonymous callers share one key space");
    assert_eq!(again.body, first.body);
    let alice = send(&svc, as_alice()).await;
    assert_eq!(alice.status, StatusCode::CREATED);
    assert!(!alice.replayed(), "a principal's key space is its own");
    assert!(send(&svc, as_alice()).await.replayed());
    assert_eq!(inner.calls(), 2);
}

#[tokio::test]
async fn the_scope_is_namespace_method_route_and_principal_each_encoded() {
    let store = MemoryStore::new();
    let inner = Inner::orders();
    let layer = GuardLayer::new(store.clone())
        .principal(user_of)
        .namespace("shop");
    let svc = guarded(layer, &inner);
    let req = Request::post("/orders/a:b?x=1")
        .header("idempotency-key", KEY)
        .header("x-user", "u:1")
        .body(TestBody::full("{}"))
        .unwrap();
    assert_eq!(send(&svc, req).await.status, StatusCode::CREATED);
    let record = store
        .lookup("shop:POST:%2Forders%2Fa%3Ab:u%3A1", KEY)
        .await
        .unwrap()
        .expect("the record under the documented scope");
    let stored = StoredHttpResponse::decode(record.response.as_ref().unwrap()).unwrap();
    assert_eq!(stored.status, StatusCode::CREATED);
    assert_eq!(stored.headers[LOCATION], "/orders/1");
    // Without a principal the scope has one part fewer.
    let svc = guarded(GuardLayer::new(store.clone()).allow_anonymous(), &inner);
    assert_eq!(
        send(&svc, post("/orders", Some(KEY), "{}")).await.status,
        StatusCode::CREATED
    );
    assert!(
        store
            .lookup("http:POST:%2Forders", KEY)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn a_stored_answer_that_cannot_be_decoded_is_500_never_garbage() {
    let store = MemoryStore::new();
    // A record under the guard's scope whose answer is not an envelope (written by something
    // else, or damaged).
    let fp = {
        let mut f = idem::Fingerprinter::new();
        f.add("POST").unwrap();
        f.add("/orders").unwrap();
        f.add(&serde_bytes_like(b"{}")).unwrap();
        f.finish()
    };
    let key = Key::parse(KEY).unwrap();
    match idem::begin(
        &store,
        "http:POST:%2Forders".into(),
        key,
        fp,
        Policy::DEFAULT,
    )
    .await
    .unwrap()
    {
        Begun::Claimed(g) => g
            .complete(&StoredResponse {
                status: Some(201),
                is_error: false,
                body: Bytes::from_static(b"{\"order\":1}"),
            })
            .await
            .unwrap(),
        Begun::Replay(_) => unreachable!("a new store"),
    }
    let log = Log::default();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer({
                let log = log.clone();
                move || log.clone()
            })
            .with_ansi(false)
            .finish(),
    );
    let inner = Inner::orders();
    let svc = guarded(GuardLayer::new(store).allow_anonymous(), &inner);
    let r = send(&svc, post("/orders", Some(KEY), "{}")).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.code(), "IDEMPOTENCY_INTERNAL_ERROR");
    // The log names the record; the client is told no more than that the guard failed.
    let logged = log.text();
    assert!(
        logged.contains("http:POST:%2Forders") && logged.contains(KEY),
        "{logged}"
    );
    assert_eq!(r.json()["detail"], "the idempotency guard failed");
    assert_eq!(
        inner.calls(),
        0,
        "nothing runs on a record that cannot be read"
    );
}

/// The body's bytes as the guard fingerprints them: one byte string.
/// A captured log.
#[derive(Clone, Default)]
struct Log(Arc<std::sync::Mutex<Vec<u8>>>);

impl io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn serde_bytes_like(b: &'static [u8]) -> impl serde::Serialize {
    struct B(&'static [u8]);
    impl serde::Serialize for B {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }
    B(b)
}

#[tokio::test]
async fn the_fingerprint_is_method_path_with_query_and_body() {
    // Pinned: records written by one release must match the requests of the next. The digest
    // was computed from the documented layout: the fingerprint domain, then STR "POST", STR
    // "/orders?x=1", BYTES "{}".
    let fp = {
        let mut f = idem::Fingerprinter::new();
        f.add("POST").unwrap();
        f.add("/orders?x=1").unwrap();
        f.add(&serde_bytes_like(b"{}")).unwrap();
        f.finish()
    };
    assert_eq!(fp, expected_fingerprint());
    let store = MemoryStore::new();
    let inner = Inner::orders();
    let svc = guarded(GuardLayer::new(store.clone()).allow_anonymous(), &inner);
    send(&svc, post("/orders?x=1", Some(KEY), "{}")).await;
    let record = store
        .lookup("http:POST:%2Forders", KEY)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.fingerprint, fp);
}

fn expected_fingerprint() -> Fingerprint {
    use sha2_free::digest;
    // Encoding version 2: the domain "idem" and the version byte; each part a tag, its length
    // (one byte of varint: every part is shorter than 128) and its bytes.
    let mut input = b"idem\x02".to_vec();
    for (tag, bytes) in [
        (0x09u8, &b"POST"[..]),
        (0x09, &b"/orders?x=1"[..]),
        (0x0A, &b"{}"[..]),
    ] {
        input.push(tag);
        input.push(u8::try_from(bytes.len()).unwrap());
        input.extend_from_slice(bytes);
    }
    // The version byte, then the first 31 bytes of the digest.
    let mut fp = [2; 32];
    fp[1..].copy_from_slice(&digest(&input)[..31]);
    Fingerprint::from_bytes(fp)
}

/// sha256 written out (FIPS 180-4), so the pinned fingerprint does not come from the code it
/// checks.
mod sha2_free {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];

    pub(super) fn digest(msg: &[u8]) -> [u8; 32] {
        let mut h: [u32; 8] = [
            0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
            0x5be0cd19,
        ];
        let mut m = msg.to_vec();
        m.push(0x80);
        while m.len() % 64 != 56 {
            m.push(0);
        }
        m.extend_from_slice(&((msg.len() as u64) * 8).to_be_bytes());
        for block in m.chunks(64) {
            let mut w = [0u32; 64];
            for i in 0..16 {
                w[i] = u32::from_be_bytes(block[i * 4..i * 4 + 4].try_into().unwrap());
            }
            for i in 16..64 {
                let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
                let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
                w[i] = w[i - 16]
                    .wrapping_add(s0)
                    .wrapping_add(w[i - 7])
                    .wrapping_add(s1);
            }
            let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
            for i in 0..64 {
                let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
                let ch = (e & f) ^ (!e & g);
                let t1 = hh
                    .wrapping_add(s1)
                    .wrapping_add(ch)
                    .wrapping_add(K[i])
                    .wrapping_add(w[i]);
                let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
                let maj = (a & b) ^ (a & c) ^ (b & c);
                let t2 = s0.wrapping_add(maj);
                hh = g;
                g = f;
                f = e;
                e = d.wrapping_add(t1);
                d = c;
                c = b;
                b = a;
                a = t1.wrapping_add(t2);
            }
            for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
                *x = x.wrapping_add(y);
            }
        }
        let mut out = [0u8; 32];
        for (i, word) in h.iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&word.to_be_bytes());
        }
        out
    }

    #[test]
    fn known_answer() {
        // FIPS 180-4's example: sha256("abc").
        let d = digest(b"abc");
        assert_eq!(
            d[..4],
            [0xba, 0x78, 0x16, 0xbf],
            "sha256(abc) starts ba7816bf"
        );
        assert_eq!(d[28..], [0xf2, 0x00, 0x15, 0xad]);
    }
}

#[tokio::test]
async fn trailers_are_stored_and_a_failed_grpc_status_is_not() {
    let trailers = |status: &'static str| {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static(status));
        t
    };
    let inner = Inner::new(move |n, _| {
        let status = if n == 1 { "13" } else { "0" };
        Ok(Response::builder()
            .header(CONTENT_TYPE, "application/grpc")
            .body(TestBody::full(format!("\0\0\0\0\x01{n}")).with_trailers(trailers(status)))
            .unwrap())
    });
    let svc = guarded(
        GuardLayer::new(MemoryStore::new()).allow_anonymous(),
        &inner,
    );
    let call = || post("/shop.Orders/Create", Some(KEY), "\0\0\0\0\x01x");
    let failed = send(&svc, call()).await;
    assert_eq!(failed.trailers.as_ref().unwrap()["grpc-status"], "13");
    let ok = send(&svc, call()).await;
    assert_eq!(ok.trailers.as_ref().unwrap()["grpc-status"], "0");
    assert!(!ok.replayed(), "grpc-status 13 released the key");
    let again = send(&svc, call()).await;
    assert!(again.replayed());
    assert_eq!(again.body, ok.body);
    assert_eq!(again.trailers, ok.trailers);
    assert_eq!(again.headers[CONTENT_TYPE], "application/grpc");
    assert_eq!(inner.calls(), 2);
}

/// The guard's own refusals of a gRPC call are gRPC statuses a gRPC client reads (a
/// trailers-only answer), each its own code; the problem code in `idempotency-error`, the wait in
/// `grpc-retry-pushback-ms`. The same refusals of a plain HTTP request stay problem details.
#[tokio::test]
async fn the_guards_refusals_reach_a_grpc_client_as_grpc_statuses() {
    let inner = Inner::new(|n, _| {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        Ok(Response::builder()
            .header(CONTENT_TYPE, "application/grpc")
            .body(TestBody::full(format!("\0\0\0\0\x01{n}")).with_trailers(trailers))
            .unwrap())
    });
    let svc = guarded(
        GuardLayer::new(MemoryStore::new()).allow_anonymous(),
        &inner,
    );
    let grpc = |key: Option<&str>, message: &'static str| {
        let mut req = post("/shop.Orders/Create", key, message);
        req.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        req
    };
    let refused = |a: &Answer, status: &str, code: &str| {
        assert_eq!(a.status, StatusCode::OK, "gRPC answers travel as HTTP 200");
        assert_eq!(a.headers[CONTENT_TYPE], "application/grpc");
        assert_eq!(a.headers["grpc-status"], status, "{:?}", a.headers);
        assert_eq!(a.headers["idempotency-error"], code);
        let message = a.headers["grpc-message"].to_str().unwrap();
        assert!(message.starts_with(&format!("{code}: ")), "{message}");
        assert!(a.body.is_empty(), "a trailers-only answer has no message");
    };

    let missing = send(&svc, grpc(None, "\0\0\0\0\x01x")).await;
    refused(&missing, "3", "INVALID_IDEMPOTENCY_KEY");
    let malformed = send(&svc, grpc(Some("bad key"), "\0\0\0\0\x01x")).await;
    refused(&malformed, "3", "INVALID_IDEMPOTENCY_KEY");
    assert_eq!(inner.calls(), 0);

    let all = inner.gate.acquire_many(GATE).await.unwrap();
    let first = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, grpc(Some(KEY), "\0\0\0\0\x01x")).await }
    });
    while inner.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let running = send(&svc, grpc(Some(KEY), "\0\0\0\0\x01x")).await;
    refused(&running, "10", "REQUEST_IN_PROGRESS");
    let pushback: u64 = running.headers["grpc-retry-pushback-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(pushback >= 1000, "{pushback}");
    drop(all);
    let first = first.await.unwrap();
    assert_eq!(first.trailers.as_ref().unwrap()["grpc-status"], "0");

    let replay = send(&svc, grpc(Some(KEY), "\0\0\0\0\x01x")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    let reused = send(&svc, grpc(Some(KEY), "\0\0\0\0\x01y")).await;
    refused(&reused, "9", "KEY_REUSED_WITH_DIFFERENT_BODY");
    assert_eq!(inner.calls(), 1);

    // The same refusal of a plain HTTP request stays a problem detail.
    let http = send(
        &svc,
        post("/shop.Orders/Create", Some(KEY), "\0\0\0\0\x01y"),
    )
    .await;
    assert_eq!(http.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(http.code(), "KEY_REUSED_WITH_DIFFERENT_BODY");
}

#[tokio::test]
async fn an_unreachable_store_is_503_with_retry_after() {
    // Nothing listens on port 1.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://postgres@127.0.0.1:1/test")
        .unwrap();
    let inner = Inner::orders();
    let svc = guarded(
        GuardLayer::new(PgStore::new(pool)).allow_anonymous(),
        &inner,
    );
    let r = send(&svc, post("/orders", Some(KEY), "{}")).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers[RETRY_AFTER], "1");
    assert_eq!(r.code(), "IDEMPOTENCY_STORE_UNAVAILABLE");
    assert_eq!(inner.calls(), 0);
}

// ---------------------------------------------------------------------------------------------
// Over hyper: a real server, a real client.

/// The order service on hyper, guarded by `layer`, on an ephemeral port.
async fn serve_hyper<St: Store + Clone>(layer: GuardLayer<St>, inner: Inner) -> String {
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let svc = layer.layer(service_fn(move |req: Request<GuardBody<Incoming>>| {
        let inner = inner.clone();
        async move {
            let n = inner.calls.fetch_add(1, Ordering::SeqCst) + 1;
            let body = req
                .into_body()
                .collect()
                .await
                .map_err(io::Error::other)?
                .to_bytes();
            // Long enough for every duplicate of a storm to arrive while it runs.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let resp = created(n, &body);
            let (head, body) = resp.into_parts();
            let bytes = body.collect().await?.to_bytes();
            Ok::<_, io::Error>(Response::from_parts(head, Full::new(bytes)))
        }
    }));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    base
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_hyper_first_call_replay_and_413() {
    let inner = Inner::orders();
    let base = serve_hyper(
        GuardLayer::new(MemoryStore::new())
            .allow_anonymous()
            .body_limit(64),
        inner.clone(),
    )
    .await;
    let c = reqwest::Client::new();
    let order = || {
        c.post(format!("{base}/orders"))
            .header("idempotency-key", KEY)
            .body(r#"{"sku":9001}"#)
            .send()
    };
    let first = order().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(first.headers()["x-trace"], "trace-1");
    let first = first.bytes().await.unwrap();
    let again = order().await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()[LOCATION], "/orders/1");
    assert_eq!(
        again.headers()[CONTENT_LENGTH],
        first.len().to_string().as_str()
    );
    assert_eq!(again.bytes().await.unwrap(), first);
    let big = c
        .post(format!("{base}/orders"))
        .header("idempotency-key", "big")
        .body("x".repeat(65))
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(big.headers()[CONTENT_TYPE], "application/problem+json");
    assert_eq!(inner.calls(), 1);
}

// ---------------------------------------------------------------------------------------------
// The storm: 100 concurrent duplicates over HTTP, on every store (memory, SQLite, PostgreSQL,
// Redis).

async fn storm<St: Store + Clone>(store: St) {
    let inner = Inner::orders();
    let base = serve_hyper(GuardLayer::new(store).allow_anonymous(), inner.clone()).await;
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (c, url) = (c.clone(), format!("{base}/orders"));
        tasks.push(tokio::spawn(async move {
            let r = c
                .post(url)
                .header("idempotency-key", "storm")
                .body(r#"{"sku":9001,"qty":2}"#)
                .send()
                .await
                .unwrap();
            let status = r.status();
            let replayed = r.headers().contains_key("idempotent-replayed");
            (status, replayed, r.bytes().await.unwrap())
        }));
    }
    let (mut answers, mut in_progress) = (Vec::new(), 0);
    for t in tasks {
        let (status, replayed, body) = t.await.unwrap();
        match status {
            StatusCode::CREATED => answers.push((replayed, body)),
            StatusCode::CONFLICT => {
                let p: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(p["code"], "REQUEST_IN_PROGRESS");
                in_progress += 1;
            }
            other => panic!("storm: {other} {body:?}"),
        }
    }
    assert_eq!(inner.calls(), 1, "one of 100 duplicates ran");
    assert_eq!(answers.iter().filter(|(replayed, _)| !replayed).count(), 1);
    assert_eq!(answers.len() + in_progress, 100);
    // Every answer is the first one, and so is the answer after the storm.
    let after = c
        .post(format!("{base}/orders"))
        .header("idempotency-key", "storm")
        .body(r#"{"sku":9001,"qty":2}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(after.headers()["idempotent-replayed"], "true");
    let after = after.bytes().await.unwrap();
    assert!(answers.iter().all(|(_, body)| *body == after));
    assert_eq!(inner.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storm_memory() {
    storm(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storm_sqlite() {
    let file = common::SqliteFile::new();
    storm(SqliteStore::connect(&file.url).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn storm_postgres() {
    let schema = common::PgSchema::create(&common::pg_url(), 16).await;
    let store = PgStore::builder()
        .build(schema.pool.clone())
        .await
        .expect("create the table");
    storm(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
async fn storm_redis() {
    let (_keys, store) = common::redis_store().await;
    storm(store).await;
}

// ---------------------------------------------------------------------------------------------
// Over an axum router.

mod over_axum {
    use axum::Router;
    use axum::routing::post;

    use super::*;

    async fn serve(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        base
    }

    fn router(layer: GuardLayer<MemoryStore>, calls: Arc<AtomicUsize>) -> Router {
        let refund = {
            let calls = calls.clone();
            move |axum::extract::Path(order): axum::extract::Path<String>, body: Bytes| {
                let calls = calls.clone();
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    (
                        StatusCode::CREATED,
                        [(LOCATION, format!("/refunds/{n}"))],
                        axum::Json(serde_json::json!({
                            "refund": n,
                            "order": order,
                            "cents": String::from_utf8_lossy(&body),
                        })),
                    )
                }
            }
        };
        let status = {
            let calls = calls.clone();
            move || {
                let calls = calls.clone();
                async move { calls.fetch_add(1, Ordering::SeqCst).to_string() }
            }
        };
        Router::new()
            .route("/orders/{order}/refunds", post(refund).get(status))
            .layer(layer)
    }

    #[tokio::test]
    async fn the_matched_route_scopes_the_key_and_replays_are_exact() {
        let calls = Arc::new(AtomicUsize::new(0));
        let layer = GuardLayer::new(MemoryStore::new())
            .allow_anonymous()
            .route(idem::tower::axum_matched_path);
        let base = serve(router(layer, calls.clone())).await;
        let c = reqwest::Client::new();
        let refund = |order: &str| {
            c.post(format!("{base}/orders/{order}/refunds"))
                .header("idempotency-key", KEY)
                .body("250")
                .send()
        };
        let first = refund("ORD-1").await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        let first = first.bytes().await.unwrap();
        let again = refund("ORD-1").await.unwrap();
        assert_eq!(again.status(), StatusCode::CREATED);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(again.headers()[LOCATION], "/refunds/1");
        assert_eq!(again.bytes().await.unwrap(), first);
        // The same key on another order of the same route is key reuse.
        let other = refund("ORD-2").await.unwrap();
        assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let p: Value = other.json().await.unwrap();
        assert_eq!(p["code"], "KEY_REUSED_WITH_DIFFERENT_BODY");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // GET passes through, without a key.
        let got = c
            .get(format!("{base}/orders/ORD-1/refunds"))
            .send()
            .await
            .unwrap();
        assert_eq!(got.status(), StatusCode::OK);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn without_a_route_function_the_path_scopes_the_key() {
        let calls = Arc::new(AtomicUsize::new(0));
        let base = serve(router(
            GuardLayer::new(MemoryStore::new()).allow_anonymous(),
            calls.clone(),
        ))
        .await;
        let c = reqwest::Client::new();
        for order in ["ORD-1", "ORD-2"] {
            let r = c
                .post(format!("{base}/orders/{order}/refunds"))
                .header("idempotency-key", KEY)
                .body("250")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::CREATED, "{order}");
            assert!(r.headers().get("idempotent-replayed").is_none());
        }
        let missing = c
            .post(format!("{base}/orders/ORD-3/refunds"))
            .body("250")
            .send()
            .await
            .unwrap();
        assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_router_called_directly_replays_too() {
        let calls = Arc::new(AtomicUsize::new(0));
        let app = router(
            GuardLayer::new(MemoryStore::new()).allow_anonymous(),
            calls.clone(),
        );
        let req = || {
            Request::post("/orders/ORD-9/refunds")
                .header("idempotency-key", KEY)
                .body(axum::body::Body::from("100"))
                .unwrap()
        };
        let first = app.clone().oneshot(req()).await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        let first = first.into_body().collect().await.unwrap().to_bytes();
        let again = app.clone().oneshot(req()).await.unwrap();
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.into_body().collect().await.unwrap().to_bytes(), first);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

/// What a test's subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_guards_events_stay_in_the_requests_span() {
    use tracing::Instrument as _;
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("idem=trace,http_guard=trace")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let inner = Inner::orders();
    let svc = guarded(
        GuardLayer::new(MemoryStore::new()).allow_anonymous(),
        &inner,
    );
    let span = tracing::info_span!("request", id = 7);
    let resp = svc
        .clone()
        .oneshot(post("/orders", Some(KEY), "{}"))
        .instrument(span)
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let events: Vec<&str> = text.lines().filter(|l| l.contains("idem")).collect();
    assert!(!events.is_empty(), "the guard said nothing: {text}");
    for line in events {
        assert!(
            line.contains("request{id=7}"),
            "an event outside the request's span: {line}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Answers the guard does not keep: streams, and answers larger than the policy keeps.

/// A server-sent-events answer streams through as the inner service writes it, never
/// buffered: the client reads its first event while the stream goes on. The request ran, so
/// its record is completed without the answer, and a retry is told so (409 `ANSWER_NOT_KEPT`)
/// instead of running it again.
#[tokio::test]
async fn a_stream_passes_through_as_it_comes_and_its_retry_is_told_the_answer_was_not_kept() {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let rx = std::sync::Mutex::new(Some(rx));
    let inner = Inner::new(move |_, _| {
        let rx = rx
            .lock()
            .unwrap()
            .take()
            .expect("the stream is asked for once");
        Ok(Response::builder()
            .status(StatusCode::OK)
            .header(CONTENT_TYPE, "text/event-stream; charset=utf-8")
            .body(TestBody::live(rx))
            .unwrap())
    });
    let store = MemoryStore::new();
    let svc = guarded(GuardLayer::new(store.clone()).allow_anonymous(), &inner);
    let resp = tokio::time::timeout(
        Duration::from_secs(5),
        svc.clone().oneshot(post("/events", Some(KEY), "{}")),
    )
    .await
    .expect("the answer's head comes before its stream ends")
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    tx.send(Bytes::from_static(b"data: 1\n\n")).unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("the first event arrives while the stream goes on")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert_eq!(first, "data: 1\n\n");

    let retry = send(&svc, post("/events", Some(KEY), "{}")).await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert_eq!(retry.code(), "ANSWER_NOT_KEPT");
    assert!(
        retry.headers.get(RETRY_AFTER).is_none(),
        "retrying does not help"
    );
    assert_eq!(inner.calls(), 1, "the retry did not run the request again");
    assert_eq!(only_record(&store).await.state, State::Completed);

    tx.send(Bytes::from_static(b"data: 2\n\n")).unwrap();
    drop(tx);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "data: 2\n\n");
}

/// 3 MiB in 64 KiB chunks.
fn big_answer() -> (Vec<Bytes>, Bytes) {
    let chunks: Vec<Bytes> = (0..48u8)
        .map(|i| Bytes::from(vec![b'a' + i % 26; 64 * 1024]))
        .collect();
    let whole: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    (chunks, Bytes::from(whole))
}

/// An answer larger than the policy keeps (1 MiB by default) goes on to the client whole, from
/// the point the guard stopped reading it; its record is completed without it and the retry is
/// told 409 `ANSWER_NOT_KEPT`. A policy that keeps more stores and replays it byte for byte; a
/// large refusal (4xx) still frees the key.
#[tokio::test]
async fn an_answer_larger_than_the_policy_keeps_streams_through_and_is_not_kept() {
    let (chunks, whole) = big_answer();
    let answer = {
        let chunks = chunks.clone();
        move |status: StatusCode| {
            Response::builder()
                .status(status)
                .header(CONTENT_TYPE, "application/octet-stream")
                .body(TestBody::parts(chunks.clone()))
                .unwrap()
        }
    };

    let inner = Inner::new({
        let answer = answer.clone();
        move |_, _| Ok(answer(StatusCode::CREATED))
    });
    let svc = guarded(
        GuardLayer::new(MemoryStore::new()).allow_anonymous(),
        &inner,
    );
    let first = send(&svc, post("/files", Some(KEY), "{}")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body, whole, "the first caller gets every byte");
    let retry = send(&svc, post("/files", Some(KEY), "{}")).await;
    assert_eq!(
        (retry.status, retry.code().as_str()),
        (StatusCode::CONFLICT, "ANSWER_NOT_KEPT")
    );
    assert_eq!(inner.calls(), 1);

    // Kept when the policy allows it.
    let inner = Inner::new({
        let answer = answer.clone();
        move |_, _| Ok(answer(StatusCode::CREATED))
    });
    let roomy = GuardLayer::new(MemoryStore::new())
        .allow_anonymous()
        .policy(Policy::DEFAULT.max_answer(8 << 20));
    let svc = guarded(roomy, &inner);
    let first = send(&svc, post("/files", Some(KEY), "{}")).await;
    let replay = send(&svc, post("/files", Some(KEY), "{}")).await;
    assert!(replay.replayed());
    assert_eq!(
        (first.body.clone(), replay.body),
        (whole.clone(), whole.clone())
    );
    assert_eq!(inner.calls(), 1);

    // A large refusal frees the key: the retry runs afresh.
    let inner = Inner::new(move |_, _| Ok(answer(StatusCode::BAD_REQUEST)));
    let svc = guarded(
        GuardLayer::new(MemoryStore::new()).allow_anonymous(),
        &inner,
    );
    for _ in 0..2 {
        let refused = send(&svc, post("/files", Some(KEY), "{}")).await;
        assert_eq!(
            (refused.status, refused.body),
            (StatusCode::BAD_REQUEST, whole.clone())
        );
    }
    assert_eq!(inner.calls(), 2);
}
