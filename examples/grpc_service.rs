//! A gRPC service made idempotent by the `tower` guard, with no annotation: `shop.Orders/Create`
//! on tonic, its records in SQLite (`grpc_service.db`).
//!
//! ```text
//! cargo run --example grpc_service            # serves 127.0.0.1:50051
//! cargo run --example grpc_service -- client  # in another terminal
//! ```
//!
//! The client sends one order twice under one `idempotency-key` (a retry: the same receipt,
//! marked `idempotent-replayed`), then another order under the same key (refused:
//! `FAILED_PRECONDITION`, `KEY_REUSED_WITH_DIFFERENT_BODY`), then one without a key
//! (`INVALID_ARGUMENT`). The service is written by hand as tonic would generate it from:
//!
//! ```proto
//! syntax = "proto3";
//! package shop;
//! service Orders { rpc Create(OrderRequest) returns (Receipt); }
//! message OrderRequest { string sku = 1; uint32 qty = 2; }
//! message Receipt { uint64 order = 1; string sku = 2; }
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::HeaderName;
use http::header::CONTENT_TYPE;
use http::uri::PathAndQuery;
use idem::SqliteStore;
use idem::tower::GuardLayer;
use sqlx::SqlitePool;
use tonic::Status;
use tonic::client::Grpc;

const ADDR: &str = "127.0.0.1:50051";

#[derive(Clone, PartialEq, prost::Message)]
struct OrderRequest {
    #[prost(string, tag = "1")]
    sku: String,
    #[prost(uint32, tag = "2")]
    qty: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Receipt {
    #[prost(uint64, tag = "1")]
    order: u64,
    #[prost(string, tag = "2")]
    sku: String,
}

/// `shop.Orders`: writes the orders it creates to its database, which numbers them. Behind
/// the guard, a retry never reaches it.
#[derive(Clone)]
struct Orders {
    db: SqlitePool,
}

impl tonic::server::NamedService for Orders {
    const NAME: &'static str = "shop.Orders";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for Orders {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let orders = self.clone();
        Box::pin(async move {
            if req.uri().path() != "/shop.Orders/Create" {
                let unknown = Status::unimplemented(format!("no method {}", req.uri().path()));
                return Ok(unknown.into_http());
            }
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(Create(orders), req).await)
        })
    }
}

struct Create(Orders);

impl tonic::server::UnaryService<OrderRequest> for Create {
    type Response = Receipt;
    type Future = BoxFuture<Result<tonic::Response<Receipt>, Status>>;

    fn call(&mut self, req: tonic::Request<OrderRequest>) -> Self::Future {
        let db = self.0.db.clone();
        Box::pin(async move {
            let req = req.into_inner();
            if req.qty == 0 {
                // A refusal: not stored, so the same key can be sent again with a valid order.
                return Err(Status::invalid_argument("qty must be at least 1"));
            }
            // Numbered by the database, so numbers never repeat across restarts, as the
            // receipts the guard replays never change.
            let order: i64 =
                sqlx::query_scalar("INSERT INTO orders (sku, qty) VALUES (?, ?) RETURNING id")
                    .bind(&req.sku)
                    .bind(req.qty)
                    .fetch_one(&db)
                    .await
                    .map_err(|e| Status::unavailable(format!("the orders database: {e}")))?;
            let order = order as u64;
            tracing::info!(order, sku = %req.sku, "order created");
            let mut resp = tonic::Response::new(Receipt {
                order,
                sku: req.sku,
            });
            resp.metadata_mut()
                .insert("x-order", order.to_string().parse().expect("digits"));
            Ok(resp)
        })
    }
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let store = SqliteStore::connect("sqlite://grpc_service.db").await?;
    // The orders live beside the records, in the same file.
    let db = store.pool().clone();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY AUTOINCREMENT, sku TEXT NOT NULL, qty INTEGER NOT NULL)",
    )
    .execute(&db)
    .await?;
    // The key is the `idempotency-key` metadata; the receipt's `x-order` metadata is replayed
    // with it. Its refusals reach gRPC clients as gRPC statuses.
    let guard = GuardLayer::new(store)
        .allow_anonymous()
        .stored_headers([CONTENT_TYPE, HeaderName::from_static("x-order")]);
    println!("shop.Orders on {ADDR}; try `cargo run --example grpc_service -- client`");
    tonic::transport::Server::builder()
        .layer(guard)
        .add_service(Orders { db })
        .serve(ADDR.parse()?)
        .await?;
    Ok(())
}

async fn create(
    client: &mut Grpc<tonic::transport::Channel>,
    key: Option<&str>,
    sku: &str,
) -> Result<tonic::Response<Receipt>, Status> {
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let mut req = tonic::Request::new(OrderRequest {
        sku: sku.into(),
        qty: 1,
    });
    if let Some(key) = key {
        let key = key
            .parse()
            .map_err(|_| Status::invalid_argument("a key is visible ASCII"))?;
        req.metadata_mut().insert("idempotency-key", key);
    }
    client
        .unary(
            req,
            PathAndQuery::from_static("/shop.Orders/Create"),
            tonic_prost::ProstCodec::default(),
        )
        .await
}

fn show(what: &str, answer: Result<tonic::Response<Receipt>, Status>) {
    match answer {
        Ok(resp) => {
            let replayed = resp.metadata().get("idempotent-replayed").is_some();
            let r = resp.into_inner();
            println!(
                "{what}: order {} of {} (replayed: {replayed})",
                r.order, r.sku
            );
        }
        Err(status) => {
            let code = status
                .metadata()
                .get("idempotency-error")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-");
            println!("{what}: {:?} ({code})", status.code());
        }
    }
}

async fn client() -> Result<(), Box<dyn std::error::Error>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{ADDR}"))?
        .connect()
        .await?;
    let mut client = Grpc::new(channel);
    // One key per logical operation, kept across its retries.
    let key = format!("checkout-{}", std::process::id());
    show("first", create(&mut client, Some(&key), "sku-7").await);
    show("retry", create(&mut client, Some(&key), "sku-7").await);
    show(
        "same key, other order",
        create(&mut client, Some(&key), "sku-8").await,
    );
    show("no key", create(&mut client, None, "sku-7").await);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_target(false).init();
    match std::env::args().nth(1).as_deref() {
        Some("client") => client().await,
        None => serve().await,
        Some(other) => {
            Err(format!("unknown mode {other:?}: run with no argument, or `client`").into())
        }
    }
}
