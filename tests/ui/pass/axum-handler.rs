//! An axum handler keeps its signature: it still routes.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use idem::{idempotent, Error, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Clone)]
struct App {
    idem: MemoryStore,
}

#[derive(Deserialize, Serialize)]
struct RefundReq {
    cents: u64,
}

#[derive(Deserialize, Serialize)]
struct Refund {
    order_no: String,
    cents: u64,
}

#[idempotent(scope = "refund:<order_no>", key = key, store = app.idem, skip(app))]
async fn refund(
    State(app): State<App>,
    Path(order_no): Path<String>,
    key: String,
    Json(req): Json<RefundReq>,
) -> Result<(StatusCode, Json<Refund>), Error> {
    Ok((StatusCode::CREATED, Json(Refund { order_no, cents: req.cents })))
}

async fn handler(
    state: State<App>,
    path: Path<String>,
    Json(req): Json<RefundReq>,
) -> Result<(StatusCode, Json<Refund>), StatusCode> {
    refund(state, path, "k".into(), Json(req)).await.map_err(|_| StatusCode::CONFLICT)
}

fn main() {
    let _app: Router = Router::new()
        .route("/orders/{order_no}/refunds", post(handler))
        .with_state(App { idem: MemoryStore::new() });
}
