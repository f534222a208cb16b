//! The axum integration on its own: the extractor's header and key policy, the replay layer's
//! exact bytes, problem details for an unreachable store, and `Idempotent<T>` as a response.

use std::collections::HashMap;
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router, extract::State, http::StatusCode};
use idem::axum::{IdempotencyKey, IdempotencyLayer};
use idem::{Idempotent, KeyPolicy, MemoryStore, PgStore, idempotent};
use reqwest::header::HeaderName;

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    base
}

/// A response whose serialization order changes from one map to the next.
#[idempotent(scope = "tally", key = key, store = store, skip(store))]
async fn tally(
    State(store): State<MemoryStore>,
    key: IdempotencyKey,
    Json(words): Json<Vec<String>>,
) -> Result<(StatusCode, Json<HashMap<String, usize>>), idem::Error> {
    let mut counts = HashMap::new();
    for w in words {
        *counts.entry(w).or_insert(0) += 1;
    }
    Ok((StatusCode::CREATED, Json(counts)))
}

#[tokio::test]
async fn header_name_and_key_policy_come_from_the_layer() {
    let app = Router::new()
        .route("/tally", post(tally))
        .layer(
            IdempotencyLayer::new()
                .header(HeaderName::from_static("x-request-key"))
                .key_policy(KeyPolicy::Uuid),
        )
        .with_state(MemoryStore::new());
    let base = serve(app).await;
    let c = reqwest::Client::new();
    let send = |header: &'static str, key: &'static str| {
        c.post(format!("{base}/tally"))
            .header(header, key)
            .header("Content-Type", "application/json")
            .body(r#"["a","b","a"]"#)
            .send()
    };
    let uuid = "0b2c1c6e-1f7b-4f0f-9d3a-8f2f6f0a1111";
    // The default header is not the configured one: the key is missing.
    let r = send("idempotency-key", uuid).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "INVALID_IDEMPOTENCY_KEY");
    assert_eq!(body["status"], 400);
    // Not a UUID.
    let r = send("x-request-key", "order-17").await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = send("x-request-key", uuid).await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn the_layer_replays_the_first_bytes_and_status() {
    let app = Router::new()
        .route("/tally", post(tally))
        .layer(IdempotencyLayer::new())
        .with_state(MemoryStore::new());
    let base = serve(app).await;
    let c = reqwest::Client::new();
    // Many distinct words: a new HashMap serializes them in another order almost surely.
    let words: Vec<String> = (0..64).map(|i| format!("w{i}")).collect();
    let send = || {
        c.post(format!("{base}/tally"))
            .header("Idempotency-Key", "k")
            .json(&words)
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first = first.bytes().await.unwrap();
    for _ in 0..5 {
        let again = send().await.unwrap();
        assert_eq!(
            again.status(),
            StatusCode::CREATED,
            "the original status by default"
        );
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.bytes().await.unwrap(), first);
    }
}

#[derive(Clone)]
struct Down(PgStore);

#[idempotent(scope = "down", key = key, store = app.0, skip(app))]
async fn needs_the_store(
    State(app): State<Down>,
    key: IdempotencyKey,
) -> Result<Json<u32>, idem::Error> {
    Ok(Json(1))
}

#[tokio::test]
async fn an_unreachable_store_is_503_with_retry_after() {
    // Nothing listens on port 1.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://postgres@127.0.0.1:1/test")
        .unwrap();
    let app = Router::new()
        .route("/down", post(needs_the_store))
        .layer(IdempotencyLayer::new())
        .with_state(Down(PgStore::new(pool)));
    let base = serve(app).await;
    let r = reqwest::Client::new()
        .post(format!("{base}/down"))
        .header("Idempotency-Key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "IDEMPOTENCY_STORE_UNAVAILABLE");
    assert!(
        !body["detail"].as_str().unwrap().contains("127.0.0.1"),
        "the problem detail does not leak the driver's error"
    );
}

#[idempotent(scope = "tracked", key = key, store = store, skip(store))]
async fn tracked(
    State(store): State<MemoryStore>,
    key: IdempotencyKey,
) -> Result<Idempotent<Json<u32>>, idem::Error> {
    Ok(Idempotent::Fresh(Json(7)))
}

#[tokio::test]
async fn idempotent_responses_say_replayed_even_without_the_layer() {
    let app = Router::new()
        .route("/t", post(tracked))
        .with_state(MemoryStore::new());
    let base = serve(app).await;
    let c = reqwest::Client::new();
    let first = c
        .post(format!("{base}/t"))
        .header("Idempotency-Key", "k")
        .send()
        .await
        .unwrap();
    assert!(first.headers().get("idempotent-replayed").is_none());
    let again = c
        .post(format!("{base}/t"))
        .header("Idempotency-Key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["cache-control"], "no-store");
    assert_eq!(again.text().await.unwrap(), "7");
}

/// A replay and every answer of the lookup are `Cache-Control: no-store`; the lookup answers a
/// completed record with the status it was first answered with.
#[tokio::test]
async fn replays_and_lookups_are_not_cached_and_lookups_keep_the_stored_status() {
    let store = MemoryStore::new();
    let lookup = {
        let store = store.clone();
        move |axum::extract::Path((scope, key)): axum::extract::Path<(String, String)>| async move {
            idem::axum::lookup(&store, &scope, &idem::Key::parse(&key).unwrap()).await
        }
    };
    let app = Router::new()
        .route("/tally", post(tally))
        .route("/lookup/{scope}/{key}", axum::routing::get(lookup))
        .layer(IdempotencyLayer::new())
        .with_state(store.clone());
    let base = serve(app).await;
    let c = reqwest::Client::new();
    let send = || {
        c.post(format!("{base}/tally"))
            .header("Idempotency-Key", "k")
            .json(&["a", "b", "a"])
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("cache-control").is_none());
    let first = first.bytes().await.unwrap();
    let again = send().await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["cache-control"], "no-store");

    // Records completed with a status, with a final error's status, with none, and with one
    // that is not a status.
    let fp = idem::Fingerprint::of("x").unwrap();
    for (key, status, is_error) in [
        ("conflict", Some(409), true),
        ("plain", None, false),
        ("final", None, true),
        ("corrupt", Some(1000), false),
    ] {
        let idem::Begun::Claimed(guard) = idem::begin(
            &store,
            "s".into(),
            idem::Key::parse(key).unwrap(),
            fp,
            idem::Policy::DEFAULT,
        )
        .await
        .unwrap() else {
            panic!("{key} was not claimed")
        };
        let answer = idem::StoredResponse {
            status,
            is_error,
            body: bytes::Bytes::from_static(br#"{"answer":1}"#),
        };
        guard.complete(&answer).await.unwrap();
    }
    let _running = idem::begin(
        &store,
        "s".into(),
        idem::Key::parse("running").unwrap(),
        fp,
        idem::Policy::DEFAULT,
    )
    .await
    .unwrap();

    for (path, status, body) in [
        ("tally/k", StatusCode::CREATED, Some(&first[..])),
        ("s/conflict", StatusCode::CONFLICT, Some(br#"{"answer":1}"#)),
        ("s/plain", StatusCode::OK, Some(br#"{"answer":1}"#)),
        (
            "s/final",
            StatusCode::UNPROCESSABLE_ENTITY,
            Some(br#"{"answer":1}"#),
        ),
        ("s/corrupt", StatusCode::INTERNAL_SERVER_ERROR, None),
        ("s/running", StatusCode::CONFLICT, None),
        ("s/never-sent", StatusCode::NOT_FOUND, None),
    ] {
        let r = c.get(format!("{base}/lookup/{path}")).send().await.unwrap();
        assert_eq!(r.status(), status, "{path}");
        assert_eq!(r.headers()["cache-control"], "no-store", "{path}");
        match body {
            Some(body) => {
                assert_eq!(r.headers()["idempotent-replayed"], "true", "{path}");
                assert_eq!(&r.bytes().await.unwrap()[..], body, "{path}");
            }
            None => {
                assert_eq!(
                    r.headers()["content-type"],
                    "application/problem+json",
                    "{path}"
                );
            }
        }
    }
}

/// A guarded step inside a bigger handler: reserving stock for an order.
#[idempotent(scope = "reserve:<sku>", key = key, store = store, skip(store))]
async fn reserve(
    store: &MemoryStore,
    key: &str,
    sku: u32,
) -> Result<(StatusCode, Json<serde_json::Value>), idem::Error> {
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "reserved": sku })),
    ))
}

/// Calls the guarded step, then answers with a document of its own, or fails in a later step.
async fn checkout(
    State(store): State<MemoryStore>,
    key: IdempotencyKey,
    Json(fail_later): Json<bool>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let reserved = match reserve(&store, key.as_str(), 9).await {
        Ok((_, Json(r))) => r,
        Err(e) => return e.into_response(),
    };
    if fail_later {
        return idem::axum::problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "PAYMENT_PROVIDER_DOWN",
            "the payment step failed",
        );
    }
    (
        StatusCode::OK,
        Json(serde_json::json!({ "checkout": "done", "step": reserved })),
    )
        .into_response()
}

#[tokio::test]
async fn the_layer_leaves_a_response_that_is_not_the_replayed_value_alone() {
    let app = Router::new()
        .route("/checkout", post(checkout))
        .layer(IdempotencyLayer::new())
        .with_state(MemoryStore::new());
    let base = serve(app).await;
    let c = reqwest::Client::new();
    let send = |fail_later: bool| {
        c.post(format!("{base}/checkout"))
            .header("Idempotency-Key", "k")
            .json(&fail_later)
            .send()
    };
    let expected = serde_json::json!({ "checkout": "done", "step": { "reserved": 9 } });
    for attempt in 0..3 {
        // From the second attempt on, the guarded step replays; the handler still answers its
        // own document.
        let r = send(false).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "attempt {attempt}");
        assert!(
            r.headers().get("idempotent-replayed").is_none(),
            "attempt {attempt}: the response is the handler's, not a replay"
        );
        assert_eq!(
            r.json::<serde_json::Value>().await.unwrap(),
            expected,
            "attempt {attempt}"
        );
    }
    // A later step fails after the guarded step replayed: the failure is what the client gets.
    let r = send(true).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().get("idempotent-replayed").is_none());
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "PAYMENT_PROVIDER_DOWN");
}

/// Calls the guarded step, then streams events that never end (server-sent events): the
/// first one at once.
async fn events(State(store): State<MemoryStore>, key: IdempotencyKey) -> axum::response::Response {
    use axum::response::IntoResponse;
    if let Err(e) = reserve(&store, key.as_str(), 9).await {
        return e.into_response();
    }
    let first = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(
        b"data: reserved\n\n",
    ))]);
    let never = futures_util::stream::pending();
    (
        [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
        axum::body::Body::from_stream(futures_util::StreamExt::chain(first, never)),
    )
        .into_response()
}

/// Calls the guarded step, then answers with `mib` MiB in chunks of 64 KiB.
async fn download(
    State(store): State<MemoryStore>,
    key: IdempotencyKey,
    Json(mib): Json<usize>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if let Err(e) = reserve(&store, key.as_str(), 9).await {
        return e.into_response();
    }
    let chunks = (0..mib * 16).map(|i| {
        Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'a' + (i % 26) as u8; 64 << 10]))
    });
    axum::body::Body::from_stream(futures_util::stream::iter(chunks)).into_response()
}

/// A handler whose guarded step replayed, but whose own answer is a stream: the layer reads no
/// more of it than a replayed answer could be, and passes the rest through as it comes. An
/// endless stream reaches the client at once (the layer read it to its end, which never came);
/// a long one arrives whole, byte for byte, unmarked.
#[tokio::test]
async fn the_layer_never_buffers_a_stream_after_a_replay() {
    let app = Router::new()
        .route("/events", post(events))
        .route("/download", post(download))
        .layer(IdempotencyLayer::new())
        .with_state(MemoryStore::new());
    let base = serve(app).await;
    let c = reqwest::Client::new();
    for attempt in 0..2 {
        // The second attempt replays the guarded step.
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            c.post(format!("{base}/events"))
                .header("Idempotency-Key", "k-events")
                .send(),
        )
        .await
        .unwrap_or_else(|_| panic!("attempt {attempt}: no answer while the stream runs"))
        .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "attempt {attempt}");
        assert!(r.headers().get("idempotent-replayed").is_none());
        let mut r = r;
        let chunk = tokio::time::timeout(Duration::from_secs(5), r.chunk())
            .await
            .unwrap_or_else(|_| panic!("attempt {attempt}: the first event was held back"))
            .unwrap()
            .unwrap();
        assert_eq!(&chunk[..], b"data: reserved\n\n", "attempt {attempt}");
    }
    for attempt in 0..2 {
        let r = c
            .post(format!("{base}/download"))
            .header("Idempotency-Key", "k-download")
            .json(&8)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "attempt {attempt}");
        assert!(r.headers().get("idempotent-replayed").is_none());
        let body = r.bytes().await.unwrap();
        assert_eq!(body.len(), 8 << 20, "attempt {attempt}");
        assert!(
            body.chunks(64 << 10)
                .enumerate()
                .all(|(i, c)| c.iter().all(|&b| b == b'a' + (i % 26) as u8)),
            "attempt {attempt}: the stream arrives as it was sent"
        );
    }
}

/// Handlers that take as long as they are told: 409s while they run say how long to wait.
macro_rules! sleeper {
    ($name:ident, $scope:tt) => {
        #[idempotent(scope = $scope, key = key, store = store, skip(store, millis))]
        async fn $name(
            State(store): State<MemoryStore>,
            key: IdempotencyKey,
            Json(millis): Json<u64>,
        ) -> Result<Json<u64>, idem::Error> {
            tokio::time::sleep(Duration::from_millis(millis)).await;
            Ok(Json(millis))
        }
    };
}
sleeper!(quick, "quick");
sleeper!(slow, "slow");

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_after_is_how_long_the_operation_takes_not_the_lease() {
    let app = Router::new()
        .route("/quick", post(quick))
        .route("/slow", post(slow))
        .layer(IdempotencyLayer::new())
        .with_state(MemoryStore::new());
    let base = serve(app).await;
    let c = reqwest::Client::new();
    let send = |path: &'static str, key: &'static str, millis: u64| {
        c.post(format!("{base}/{path}"))
            .header("Idempotency-Key", key)
            .json(&millis)
            .send()
    };
    // A 300 ms body under a five-minute lease: the hint is one second, before any call of the
    // operation completed and after.
    for key in ["q-1", "q-2"] {
        let first = tokio::spawn(send("quick", key, 300));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = send("quick", key, 300).await.unwrap();
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()["retry-after"], "1");
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    }

    // Once its calls are seen to take 2.5 s, a duplicate is told to come back in about that
    // long.
    send("slow", "s-1", 2500).await.unwrap();
    let second = tokio::spawn(send("slow", "s-2", 2500));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = send("slow", "s-2", 2500).await.unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let hint: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (2..=3).contains(&hint),
        "Retry-After {hint} for a 2.5 s operation"
    );
    assert_eq!(second.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// A receipt with an encoding of its own: eight bytes, not JSON.
#[derive(Debug, PartialEq)]
struct Receipt(u64);

impl idem::replay::ReplayBytes for Receipt {
    fn to_replay_bytes(&self) -> Result<Vec<u8>, idem::Error> {
        Ok(self.0.to_be_bytes().to_vec())
    }
    fn from_replay_bytes(bytes: &[u8]) -> Result<Self, idem::Error> {
        let b: [u8; 8] = bytes
            .try_into()
            .map_err(|_| idem::Error::Decode("8 bytes expected".into()))?;
        Ok(Receipt(u64::from_be_bytes(b)))
    }
}

/// The lookup labels a stored answer by what was stored: a `Json<T>` answer and a serde value
/// are JSON, bytes of an encoding of their own are `application/octet-stream`, and an answer
/// the tower guard stored is sent as the guard replays it (its own content type and headers,
/// its body without the envelope).
#[tokio::test]
async fn the_lookup_labels_each_stored_answer_by_what_was_stored() {
    use idem::replay::Replay;
    use idem::tower::StoredHttpResponse;

    let store = MemoryStore::new();
    let mut tower_headers = axum::http::HeaderMap::new();
    tower_headers.insert("content-type", "text/csv".parse().unwrap());
    tower_headers.insert("location", "/reports/7".parse().unwrap());
    let answers = [
        (
            "json",
            Replay::encode(&(
                StatusCode::CREATED,
                Json(serde_json::json!({"refundId": "R-1"})),
            ))
            .unwrap(),
        ),
        ("serde", Replay::encode(&vec![1u32, 2, 3]).unwrap()),
        (
            "bytes",
            Replay::encode(&Receipt(0xdead_beef_0000_ffff)).unwrap(),
        ),
        (
            "tower",
            StoredHttpResponse {
                status: StatusCode::ACCEPTED,
                headers: tower_headers,
                trailers: None,
                body: bytes::Bytes::from_static(b"id,total\n7,42\n"),
            }
            .encode()
            .unwrap(),
        ),
    ];
    let fp = idem::Fingerprint::of("x").unwrap();
    for (key, answer) in &answers {
        let idem::Begun::Claimed(guard) = idem::begin(
            &store,
            "s".into(),
            idem::Key::parse(key).unwrap(),
            fp,
            idem::Policy::DEFAULT,
        )
        .await
        .unwrap() else {
            panic!("{key} was not claimed")
        };
        guard.complete(answer).await.unwrap();
    }

    for (key, status, content_type, body) in [
        (
            "json",
            StatusCode::CREATED,
            "application/json",
            &br#"{"refundId":"R-1"}"#[..],
        ),
        ("serde", StatusCode::OK, "application/json", b"[1,2,3]"),
        (
            "bytes",
            StatusCode::OK,
            "application/octet-stream",
            &0xdead_beef_0000_ffff_u64.to_be_bytes(),
        ),
        (
            "tower",
            StatusCode::ACCEPTED,
            "text/csv",
            b"id,total\n7,42\n",
        ),
    ] {
        let resp = idem::axum::lookup(&store, "s", &idem::Key::parse(key).unwrap()).await;
        assert_eq!(resp.status(), status, "{key}");
        let headers = resp.headers().clone();
        assert_eq!(headers["content-type"], content_type, "{key}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{key}");
        assert_eq!(headers["cache-control"], "no-store", "{key}");
        assert_eq!(headers["idempotent-replayed"], "true", "{key}");
        let got = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        assert_eq!(&got[..], body, "{key}");
        if key == "tower" {
            assert_eq!(headers["location"], "/reports/7");
        }
    }
}

/// Slow, and counts its runs.
#[idempotent(scope = "slow-order", key = key, store = app.0, skip(app))]
async fn slow_order(
    State(app): State<(MemoryStore, std::sync::Arc<std::sync::atomic::AtomicUsize>)>,
    key: IdempotencyKey,
    Json(sku): Json<String>,
) -> Result<(StatusCode, Json<serde_json::Value>), idem::Error> {
    let run = app.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "sku": sku, "run": run })),
    ))
}

#[tokio::test]
async fn with_the_layers_wait_duplicates_get_the_first_answer_marked_as_a_replay() {
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = Router::new()
        .route("/orders", post(slow_order))
        .layer(IdempotencyLayer::new().wait(Duration::from_secs(10)))
        .with_state((MemoryStore::new(), runs.clone()));
    let base = serve(app).await;
    let c = reqwest::Client::new();
    let sends: Vec<_> = (0..8)
        .map(|_| {
            let req = c
                .post(format!("{base}/orders"))
                .header("Idempotency-Key", "k-wait")
                .header("Content-Type", "application/json")
                .body(r#""sku-1""#);
            tokio::spawn(async move {
                let r = req.send().await.unwrap();
                let replayed = r.headers().contains_key("idempotent-replayed");
                (r.status(), replayed, r.text().await.unwrap())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for s in sends {
        answers.push(s.await.unwrap());
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(
        answers.iter().all(|(s, _, _)| *s == StatusCode::CREATED),
        "{answers:?}"
    );
    assert!(
        answers.iter().all(|(_, _, b)| b == &answers[0].2),
        "{answers:?}"
    );
    assert_eq!(
        answers.iter().filter(|(_, replayed, _)| *replayed).count(),
        7,
        "every duplicate is a replay of the first answer: {answers:?}"
    );
}

/// Documented: its operation carries the idempotency contract its attribute declares.
#[utoipa::path(post, path = "/orders/{order_no}/refund", responses((status = 201, description = "refunded")))]
#[idempotent(scope = "refund:<order_no>", key = key, store = store, skip(store), lease = "30s", retain = "48h", wait = "2s")]
async fn documented_refund(
    State(store): State<MemoryStore>,
    axum::extract::Path(order_no): axum::extract::Path<String>,
    key: IdempotencyKey,
) -> Result<(StatusCode, Json<String>), idem::Error> {
    Ok((StatusCode::CREATED, Json(order_no)))
}

/// Documented, not guarded: left as it is. Never served: the test reads its operation only.
#[allow(dead_code)]
#[utoipa::path(get, path = "/health", responses((status = 200, description = "up")))]
async fn health() -> &'static str {
    "up"
}

#[test]
fn the_openapi_document_states_each_guarded_operations_contract_from_its_attribute() {
    use idem::openapi::{Idempotency, contract};
    use utoipa::{Modify as _, OpenApi};

    #[derive(OpenApi)]
    #[openapi(paths(documented_refund, health))]
    struct Api;

    let declared =
        contract("documented_refund").expect("the guarded function registered its contract");
    assert_eq!(declared.scope, "refund:<order_no>");
    assert_eq!(declared.module, module_path!());
    assert_eq!(declared.lease, Some(Duration::from_secs(30)));
    assert_eq!(declared.retain, Some(Duration::from_secs(48 * 3600)));
    assert_eq!(declared.wait, Some(Duration::from_secs(2)));
    assert!(!declared.transactional);
    assert!(contract("health").is_none());

    for (layer, header, accepts) in [
        (Idempotency::new(), "Idempotency-Key", "1 to 255 bytes"),
        (
            Idempotency::new()
                .header(HeaderName::from_static("x-request-key"))
                .key_policy(KeyPolicy::Uuid),
            "X-Request-Key",
            "UUID",
        ),
    ] {
        let mut doc = Api::openapi();
        layer.modify(&mut doc);
        let doc = serde_json::to_value(&doc).unwrap();
        let op = &doc["paths"]["/orders/{order_no}/refund"]["post"];
        let key = op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["in"] == "header")
            .unwrap_or_else(|| panic!("no key header in {op:#}"));
        assert_eq!(key["name"], header);
        assert_eq!(key["required"], true);
        assert!(
            key["description"].as_str().unwrap().contains(accepts),
            "{key:#}"
        );
        let codes = |status: &str| -> Vec<String> {
            let schema = &op["responses"][status]["content"]["application/problem+json"]["schema"];
            schema["properties"]["code"]["enum"]
                .as_array()
                .unwrap_or_else(|| panic!("no codes for {status} in {op:#}"))
                .iter()
                .map(|c| c.as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(codes("400"), [idem::error::codes::INVALID_IDEMPOTENCY_KEY]);
        assert!(codes("409").contains(&idem::error::codes::REQUEST_IN_PROGRESS.to_owned()));
        assert_eq!(
            codes("422"),
            [idem::error::codes::KEY_REUSED_WITH_DIFFERENT_BODY]
        );
        assert!(
            op["responses"]["409"]["headers"]["Retry-After"].is_object(),
            "{op:#}"
        );
        assert!(
            op["responses"]["201"]["headers"]["Idempotent-Replayed"].is_object(),
            "the success answer says it may be a replay: {op:#}"
        );
        let contract = &op["x-idempotency"];
        assert_eq!(contract["header"], header);
        assert_eq!(contract["scope"], "refund:<order_no>");
        assert_eq!(contract["leaseSeconds"], 30);
        assert_eq!(contract["retentionSeconds"], 48 * 3600);
        assert_eq!(contract["waitSeconds"], 2);

        let health = &doc["paths"]["/health"]["get"];
        assert!(
            health.get("parameters").is_none_or(|p| p.is_null()),
            "{health:#}"
        );
        assert!(health["responses"].get("409").is_none(), "{health:#}");
        assert!(health.get("x-idempotency").is_none(), "{health:#}");
    }
}

/// Two guarded functions of one name, in two modules: an operation of that id is not given
/// either's contract (which one it serves is not known), and both are listed with their modules.
mod twins {
    pub mod a {
        #[idem::idempotent(scope = "twin-a", key = key, store = store, lease = "10s")]
        pub async fn twin(store: &idem::MemoryStore, key: &str) -> Result<u64, idem::Error> {
            Ok(1)
        }
    }
    pub mod b {
        #[idem::idempotent(scope = "twin-b", key = key, store = store, lease = "20s")]
        pub async fn twin(store: &idem::MemoryStore, key: &str) -> Result<u64, idem::Error> {
            Ok(2)
        }
    }
}

#[test]
fn an_operation_id_two_guarded_functions_share_gets_neither_contract() {
    use idem::openapi::{Idempotency, contract, contracts};
    use utoipa::Modify as _;
    use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
    use utoipa::openapi::{OpenApiBuilder, PathsBuilder};

    // Referenced, so that both are linked in.
    let _ = (twins::a::twin, twins::b::twin);
    let mut modules: Vec<_> = contracts()
        .filter(|c| c.function == "twin")
        .map(|c| (c.module, c.scope))
        .collect();
    modules.sort();
    assert_eq!(
        modules,
        [("http::twins::a", "twin-a"), ("http::twins::b", "twin-b")]
    );
    assert!(contract("twin").is_none());
    let mut doc = OpenApiBuilder::new()
        .paths(PathsBuilder::new().path(
            "/twin",
            PathItem::new(
                HttpMethod::Post,
                OperationBuilder::new().operation_id(Some("twin")).build(),
            ),
        ))
        .build();
    Idempotency::new().modify(&mut doc);
    let op = doc.paths.paths["/twin"].post.as_ref().unwrap();
    assert!(
        op.extensions.is_none() && op.parameters.is_none(),
        "{}",
        serde_json::to_string(op).unwrap()
    );
}
