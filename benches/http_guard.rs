//! The tower guard against the macro, on the same axum handler, side by side in one run:
//!
//! - `unguarded`: the handler alone;
//! - `macro`: the handler under `#[idempotent]`, with `IdempotencyLayer` for exact replays;
//! - `tower`: the handler unannotated, under `idem::tower::GuardLayer`;
//! - `macro_replay`, `tower_replay`: a request whose key is already completed.
//!
//! Each request goes through the axum router in process (`oneshot`, no network): parsing the
//! JSON body, the guard, the handler, and reading the answer's bytes. Rounds of each variant in
//! turn, the order rotated every round; the median round of each is reported.
//!
//! `cargo bench --bench http_guard`. BENCHMARKS.md holds the figures and what they mean.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use http_body_util::BodyExt;
use idem::axum::{IdempotencyKey, IdempotencyLayer};
use idem::tower::GuardLayer;
use idem::{ManualClock, MemoryStore, SqliteStore, Store, idempotent};
use serde::{Deserialize, Serialize};
use tower::ServiceExt;

#[derive(Serialize, Deserialize)]
struct OrderReq {
    sku: u64,
    qty: u32,
}

#[derive(Serialize, Deserialize)]
struct Order {
    order_no: u64,
    sku: u64,
    qty: u32,
}

#[derive(Clone)]
struct App<St> {
    store: St,
    orders: Arc<AtomicU64>,
}

impl<St> App<St> {
    /// The side effect: a new order number.
    fn create(&self, req: OrderReq) -> Order {
        Order {
            order_no: self.orders.fetch_add(1, Ordering::Relaxed),
            sku: req.sku,
            qty: req.qty,
        }
    }
}

/// The handler, unannotated: unguarded, or under the tower guard.
async fn create<St: Clone + Send + Sync + 'static>(
    State(app): State<App<St>>,
    Json(req): Json<OrderReq>,
) -> (StatusCode, Json<Order>) {
    (StatusCode::CREATED, Json(app.create(req)))
}

/// The same handler under the macro.
#[idempotent(scope = "orders", key = key, store = app.store, skip(app))]
async fn create_macro<St: Store + Clone>(
    State(app): State<App<St>>,
    key: IdempotencyKey,
    Json(req): Json<OrderReq>,
) -> Result<(StatusCode, Json<Order>), idem::Error> {
    Ok((StatusCode::CREATED, Json(app.create(req))))
}

fn routers<St: Store + Clone>(store: St) -> [Router; 3] {
    let app = App {
        store: store.clone(),
        orders: Arc::new(AtomicU64::new(0)),
    };
    [
        Router::new()
            .route("/orders", post(create::<St>))
            .with_state(app.clone()),
        Router::new()
            .route("/orders", post(create_macro::<St>))
            .layer(IdempotencyLayer::new())
            .with_state(app.clone()),
        Router::new()
            .route("/orders", post(create::<St>))
            .layer(GuardLayer::new(store).allow_anonymous())
            .with_state(app),
    ]
}

fn request(key: &str) -> Request<Body> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"sku":9001,"qty":2}"#))
        .unwrap()
}

/// One request through `router`: the answer's status and bytes.
async fn call(router: &Router, key: &str) -> (StatusCode, bytes::Bytes) {
    let resp = router.clone().oneshot(request(key)).await.unwrap();
    let status = resp.status();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

/// `n` first calls (fresh keys) through `router`.
async fn first_calls(router: &Router, keys: &[String]) -> Duration {
    let start = Instant::now();
    for k in keys {
        let (status, body) = call(router, k).await;
        assert_eq!(status, StatusCode::CREATED);
        black_box(body);
    }
    start.elapsed()
}

/// `n` replays of the completed key `done` through `router`.
async fn replays(router: &Router, n: usize) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        let (status, body) = call(router, "done").await;
        assert_eq!(status, StatusCode::CREATED);
        black_box(body);
    }
    start.elapsed()
}

const VARIANTS: [&str; 5] = [
    "unguarded",
    "macro",
    "tower",
    "macro_replay",
    "tower_replay",
];

/// Runs every variant `rounds` times, `n` calls each, and prints the median µs or ns per call.
fn side_by_side<St: Store + Clone>(
    rt: &tokio::runtime::Runtime,
    name: &str,
    store: St,
    clock: Option<ManualClock>,
    n: usize,
    rounds: usize,
) {
    let [unguarded, macro_, tower] = routers(store.clone());
    // The replayed key, completed once through each guard (each its own scope).
    rt.block_on(async {
        call(&macro_, "done").await;
        call(&tower, "done").await;
    });
    let mut runs: [Vec<f64>; 5] = Default::default();
    for round in 0..rounds {
        let keys: Vec<String> = (0..n).map(|i| format!("r{round}-k{i:08}")).collect();
        for turn in 0..VARIANTS.len() {
            // Rotate the order, so no variant always runs first.
            let v = (turn + round) % VARIANTS.len();
            let elapsed = rt.block_on(async {
                match v {
                    0 => first_calls(&unguarded, &keys).await,
                    1 => first_calls(&macro_, &keys).await,
                    2 => first_calls(&tower, &keys).await,
                    3 => replays(&macro_, n).await,
                    _ => replays(&tower, n).await,
                }
            });
            runs[v].push(elapsed.as_nanos() as f64 / n as f64);
        }
        // Keep a memory store at a steady size, as retention would (outside the timing).
        if let Some(clock) = &clock {
            clock.advance(Duration::from_secs(2 * 86_400));
            rt.block_on(store.purge_expired()).unwrap();
            rt.block_on(async {
                call(&macro_, "done").await;
                call(&tower, "done").await;
            });
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let [u, m, t, mr, tr] = runs.each_mut().map(median);
    println!(
        "SIDE_BY_SIDE {name} ns_per_request unguarded={u:.0} macro={m:.0} tower={t:.0} macro_replay={mr:.0} tower_replay={tr:.0}"
    );
    println!(
        "SIDE_BY_SIDE {name} macro_adds_ns={:.0} tower_adds_ns={:.0} tower_over_macro={:.3} tower_replay_over_macro_replay={:.3}",
        m - u,
        t - u,
        t / m,
        tr / mr
    );
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument is a filter on the store's name.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| name.contains(o.as_str()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    if wanted("memory") {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        side_by_side(&rt, "memory", store, Some(clock), 5_000, 31);
    }
    if wanted("sqlite") {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("bench.db").display());
        let store = rt.block_on(SqliteStore::connect(&url)).unwrap();
        side_by_side(&rt, "sqlite", store, None, 500, 11);
    }
}
