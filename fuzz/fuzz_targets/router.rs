//! The refund service example's router, in process: sequences of random methods, paths,
//! headers and bodies through `tower::ServiceExt::oneshot`, on an in-memory SQLite database
//! (orders and idempotency records), as `examples/refund_service` builds it.
//!
//! Properties:
//! - never a panic, never a 5xx other than 503 (and 502 `GATEWAY_NO_ANSWER`, the refund's
//!   simulated lost gateway answer);
//! - an error answer with a body is `application/problem+json` whose `status` member is the
//!   HTTP status;
//! - a guarded request (order creation, refund) that succeeded, sent again as it was, is a
//!   replay: 200, `Idempotent-Replayed: true`, the first body byte for byte.
//!
//! Order numbers from successful creations are remembered, so later requests of an input (and
//! later inputs) pay, ship, confirm and refund real orders.

#![no_main]

#[allow(dead_code)]
#[path = "../../examples/refund_service/admin.rs"]
mod admin;
#[allow(dead_code)]
#[path = "../../examples/refund_service/app.rs"]
mod app;
#[allow(dead_code)]
#[path = "../../examples/refund_service/db.rs"]
mod db;
#[allow(dead_code)]
#[path = "../../examples/refund_service/events.rs"]
mod events;
#[allow(dead_code)]
#[path = "../../examples/refund_service/gateway.rs"]
mod gateway;

use std::sync::{Mutex, OnceLock};

use arbitrary::Arbitrary;
use axum::Router;
use axum::body::Body;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use tower::ServiceExt;

struct World {
    rt: tokio::runtime::Runtime,
    router: Router,
    /// Order numbers the service created, newest last.
    orders: Mutex<Vec<String>>,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // No completer: each input is answered by the router alone, from start to end.
        let (router, _, completer) = rt
            .block_on(app::build("sqlite::memory:", None, None))
            .expect("the service starts on in-memory SQLite");
        drop(completer);
        World {
            rt,
            router,
            orders: Mutex::new(Vec::new()),
        }
    })
}

#[derive(Arbitrary, Debug)]
enum FuzzMethod {
    Get,
    Post,
    Patch,
    Put,
    Delete,
    Head,
    Options,
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum Segment {
    /// An order the service created (by index from the newest).
    Known(u8),
    /// Any text, percent-encoded into the path.
    Text(String),
    Int(i64),
}

#[derive(Arbitrary, Debug)]
enum FuzzPath {
    Orders,
    ByKey(Segment),
    Callback,
    Refunds(Segment),
    Ship(Segment),
    Confirm(Segment),
    Profile(Segment),
    Ledger,
    Outbox,
    /// Anything that parses as a URI.
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum FuzzHeader {
    /// One of a few keys, so requests meet each other's records.
    Key(u8),
    KeyRaw(Vec<u8>),
    User(u8),
    UserRaw(Vec<u8>),
    /// A small delay, or a value that is not a number.
    Delay(u8),
    DelayRaw(String),
    Json,
    ContentType(Vec<u8>),
    /// `X-Gateway-Signature` of the body under the development secret (a payment callback's),
    /// or of other bytes.
    Signature { right: bool },
    /// `X-Demo-Gateway`: `decline`, `lose-answer`, or something else.
    Gateway(u8),
    Other(String, Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum FuzzBody {
    Empty,
    Raw(Vec<u8>),
    CreateOrder {
        sku_id: i64,
        qty: i64,
    },
    SmallOrder {
        sku_id: u8,
        qty: u8,
    },
    Callback {
        order: Segment,
        amount_cents: i64,
        exact: bool,
    },
    Profile {
        nickname: String,
        version: i64,
    },
    Json(String, i64),
}

#[derive(Arbitrary, Debug)]
struct FuzzRequest {
    method: FuzzMethod,
    path: FuzzPath,
    query: Option<String>,
    headers: Vec<FuzzHeader>,
    body: FuzzBody,
}

fn encode_segment(text: &str) -> String {
    idem::scope::encode_value(text)
}

fn segment(w: &World, s: &Segment) -> String {
    match s {
        Segment::Known(i) => {
            let orders = w.orders.lock().unwrap();
            match orders.len() {
                0 => "ORD-NONE".into(),
                n => orders[n - 1 - usize::from(*i) % n].clone(),
            }
        }
        Segment::Text(t) => encode_segment(t),
        Segment::Int(i) => i.to_string(),
    }
}

fn build(w: &World, r: &FuzzRequest) -> Option<Request<Body>> {
    let method = match &r.method {
        FuzzMethod::Get => Method::GET,
        FuzzMethod::Post => Method::POST,
        FuzzMethod::Patch => Method::PATCH,
        FuzzMethod::Put => Method::PUT,
        FuzzMethod::Delete => Method::DELETE,
        FuzzMethod::Head => Method::HEAD,
        FuzzMethod::Options => Method::OPTIONS,
        FuzzMethod::Other(m) => Method::from_bytes(m.as_bytes()).ok()?,
    };
    let mut path = match &r.path {
        FuzzPath::Orders => "/api/orders".to_owned(),
        FuzzPath::ByKey(s) => format!("/api/orders/by-key/{}", segment(w, s)),
        FuzzPath::Callback => "/api/payments/callback".to_owned(),
        FuzzPath::Refunds(s) => format!("/api/orders/{}/refunds", segment(w, s)),
        FuzzPath::Ship(s) => format!("/api/orders/{}/ship", segment(w, s)),
        FuzzPath::Confirm(s) => format!("/api/orders/{}/confirm", segment(w, s)),
        FuzzPath::Profile(s) => format!("/api/users/{}/profile", segment(w, s)),
        FuzzPath::Ledger => "/api/gateway/ledger".to_owned(),
        FuzzPath::Outbox => "/api/outbox".to_owned(),
        FuzzPath::Raw(p) => p.clone(),
    };
    if let Some(q) = &r.query {
        path.push('?');
        path.push_str(q);
    }
    let mut req = Request::builder().method(method).uri(path.as_str());
    for h in r.headers.iter().take(8) {
        let (name, value): (HeaderName, Vec<u8>) = match h {
            FuzzHeader::Key(i) => (
                HeaderName::from_static("idempotency-key"),
                format!("key-{}", i % 4).into_bytes(),
            ),
            FuzzHeader::KeyRaw(v) => (HeaderName::from_static("idempotency-key"), v.clone()),
            FuzzHeader::User(i) => (
                HeaderName::from_static("x-user-id"),
                (1 + i % 3).to_string().into_bytes(),
            ),
            FuzzHeader::UserRaw(v) => (HeaderName::from_static("x-user-id"), v.clone()),
            FuzzHeader::Delay(ms) => (
                HeaderName::from_static("x-demo-delay-ms"),
                (ms % 3).to_string().into_bytes(),
            ),
            // A number would make the service sleep up to 10 s: only what does not parse.
            FuzzHeader::DelayRaw(v) if v.trim().parse::<u64>().is_ok() => continue,
            FuzzHeader::DelayRaw(v) => (
                HeaderName::from_static("x-demo-delay-ms"),
                v.clone().into_bytes(),
            ),
            FuzzHeader::Json => (
                HeaderName::from_static("content-type"),
                b"application/json".to_vec(),
            ),
            FuzzHeader::ContentType(v) => (HeaderName::from_static("content-type"), v.clone()),
            // Signed below, once the body is known.
            FuzzHeader::Signature { .. } => continue,
            FuzzHeader::Gateway(i) => (
                HeaderName::from_static("x-demo-gateway"),
                match i % 3 {
                    0 => b"decline".to_vec(),
                    1 => b"lose-answer".to_vec(),
                    _ => b"sometimes".to_vec(),
                },
            ),
            FuzzHeader::Other(n, v) => {
                let Ok(n) = HeaderName::from_bytes(n.as_bytes()) else {
                    continue;
                };
                if n == "x-demo-delay-ms" {
                    continue;
                }
                (n, v.clone())
            }
        };
        let Ok(value) = HeaderValue::from_bytes(&value) else {
            continue;
        };
        req = req.header(name, value);
    }
    let body = match &r.body {
        FuzzBody::Empty => Vec::new(),
        FuzzBody::Raw(b) => b.clone(),
        FuzzBody::CreateOrder { sku_id, qty } => {
            serde_json::to_vec(&json!({ "skuId": sku_id, "qty": qty })).unwrap()
        }
        FuzzBody::SmallOrder { sku_id, qty } => serde_json::to_vec(
            &json!({ "skuId": 1 + i64::from(*sku_id % 5), "qty": 1 + i64::from(*qty % 3) }),
        )
        .unwrap(),
        FuzzBody::Callback {
            order,
            amount_cents,
            exact,
        } => {
            let order_no = match order {
                Segment::Text(t) => t.clone(),
                other => segment(w, other),
            };
            // The exact amount of an order made by `SmallOrder` is often one of these.
            let amount = if *exact {
                (500 + (amount_cents.rem_euclid(5) + 1) * 25) * (1 + amount_cents.rem_euclid(3))
            } else {
                *amount_cents
            };
            serde_json::to_vec(&json!({ "orderNo": order_no, "amountCents": amount })).unwrap()
        }
        FuzzBody::Profile { nickname, version } => {
            serde_json::to_vec(&json!({ "nickname": nickname, "version": version })).unwrap()
        }
        FuzzBody::Json(k, v) => serde_json::to_vec(&json!({ k: v })).unwrap(),
    };
    if let Some(right) = r.headers.iter().take(8).find_map(|h| match h {
        FuzzHeader::Signature { right } => Some(*right),
        _ => None,
    }) {
        let signed: &[u8] = if right { &body } else { b"other bytes" };
        req = req.header("x-gateway-signature", signature(signed));
    }
    req.body(Body::from(body)).ok()
}

/// `sha256=<hex>` of `body` under the service's development secret.
fn signature(body: &[u8]) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(app::DEV_WEBHOOK_SECRET.as_bytes()).unwrap();
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    format!(
        "sha256={}",
        tag.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// A request again, for the replay check (a `Request` cannot be cloned).
fn clone_request(req: &Request<Body>, body: &[u8]) -> Request<Body> {
    let mut again = Request::builder()
        .method(req.method().clone())
        .uri(req.uri().clone());
    for (n, v) in req.headers() {
        again = again.header(n, v);
    }
    again.body(Body::from(body.to_vec())).unwrap()
}

struct Answer {
    status: StatusCode,
    replayed: bool,
    content_type: Option<Vec<u8>>,
    body: bytes::Bytes,
}

async fn send(router: &Router, req: Request<Body>) -> Answer {
    let resp = router
        .clone()
        .oneshot(req)
        .await
        .expect("the router is infallible");
    let status = resp.status();
    let replayed = resp.headers().get("idempotent-replayed").is_some();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.as_bytes().to_vec());
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("an answer's body reads");
    let a = Answer {
        status,
        replayed,
        content_type,
        body,
    };
    check(&a);
    a
}

fn check(a: &Answer) {
    let lost_gateway_answer = a.status == StatusCode::BAD_GATEWAY
        && serde_json::from_slice::<Value>(&a.body)
            .is_ok_and(|p| p["code"] == "GATEWAY_NO_ANSWER");
    assert!(
        !a.status.is_server_error()
            || a.status == StatusCode::SERVICE_UNAVAILABLE
            || lost_gateway_answer,
        "{}: {}",
        a.status,
        String::from_utf8_lossy(&a.body)
    );
    if a.replayed {
        assert_eq!(a.status, StatusCode::OK, "replays answer 200");
    }
    if (a.status.is_client_error() || a.status.is_server_error()) && !a.body.is_empty() {
        assert_eq!(
            a.content_type.as_deref(),
            Some(&b"application/problem+json"[..]),
            "{}: {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        );
        let problem: Value = serde_json::from_slice(&a.body).expect("a problem is JSON");
        assert_eq!(problem["status"], a.status.as_u16(), "{problem}");
        assert!(problem["code"].is_string(), "{problem}");
    }
}

fuzz_target!(|requests: Vec<FuzzRequest>| {
    let w = world();
    w.rt.block_on(async {
        for r in requests.iter().take(6) {
            let Some(req) = build(w, r) else { continue };
            let (head, body) = req.into_parts();
            let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
            let req = Request::from_parts(head, Body::from(body.clone()));
            let again = clone_request(&req, &body);
            let guarded = req.method() == Method::POST
                && req.headers().contains_key("idempotency-key")
                && (req.uri().path() == "/api/orders" || req.uri().path().ends_with("/refunds"));
            let first = send(&w.router, req).await;

            if first.status == StatusCode::CREATED && req_is_order(&again) {
                let order: Value = serde_json::from_slice(&first.body).unwrap();
                let order_no = order["orderNo"]
                    .as_str()
                    .expect("an order number")
                    .to_owned();
                let mut orders = w.orders.lock().unwrap();
                if !orders.contains(&order_no) {
                    orders.push(order_no);
                    if orders.len() > 32 {
                        orders.remove(0);
                    }
                }
            }

            // A guarded success, sent again, is its replay.
            if guarded && first.status.is_success() {
                let second = send(&w.router, again).await;
                if second.status == StatusCode::SERVICE_UNAVAILABLE {
                    continue;
                }
                assert_eq!(
                    second.status,
                    StatusCode::OK,
                    "{}",
                    String::from_utf8_lossy(&second.body)
                );
                assert!(second.replayed, "a repeat is marked as a replay");
                assert_eq!(
                    second.body, first.body,
                    "a replay is the first body, byte for byte"
                );
            }
        }
    });
});

fn req_is_order(req: &Request<Body>) -> bool {
    req.method() == Method::POST && req.uri().path() == "/api/orders"
}
