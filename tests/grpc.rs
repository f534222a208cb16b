//! The `tower` guard in front of a real tonic server, called by a real tonic client: the key in
//! the `idempotency-key` metadata, a retry answered with the first response and its metadata,
//! and each of the guard's refusals a distinct gRPC status the client reads.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::HeaderName;
use http::header::CONTENT_TYPE;
use http::uri::PathAndQuery;
use idem::MemoryStore;
use idem::tower::GuardLayer;
use tonic::client::Grpc;
use tonic::transport::Channel;
use tonic::{Code, Status};

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

/// `shop.Orders`, written by hand as tonic generates it: one unary method, `Create`, which
/// numbers the orders it creates and waits at a gate while it runs.
#[derive(Clone)]
struct Orders {
    created: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::Semaphore>,
}

const GATE: u32 = 1 << 20;

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
        let create = Create(self.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(create, req).await)
        })
    }
}

struct Create(Orders);

impl tonic::server::UnaryService<OrderRequest> for Create {
    type Response = Receipt;
    type Future = BoxFuture<Result<tonic::Response<Receipt>, Status>>;

    fn call(&mut self, req: tonic::Request<OrderRequest>) -> Self::Future {
        let orders = self.0.clone();
        Box::pin(async move {
            let n = orders.created.fetch_add(1, Ordering::SeqCst) + 1;
            let _running = orders.gate.acquire().await;
            let mut resp = tonic::Response::new(Receipt {
                order: n as u64,
                sku: req.into_inner().sku,
            });
            resp.metadata_mut()
                .insert("x-order", n.to_string().parse().unwrap());
            Ok(resp)
        })
    }
}

/// The guarded server on an ephemeral port, and a client connected to it.
async fn serve(orders: Orders) -> Grpc<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let guard = GuardLayer::new(MemoryStore::new())
        .allow_anonymous()
        .stored_headers([CONTENT_TYPE, HeaderName::from_static("x-order")]);
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(guard)
            .add_service(orders)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Grpc::new(channel)
}

async fn create(
    client: &mut Grpc<Channel>,
    key: Option<&str>,
    sku: &str,
) -> Result<tonic::Response<Receipt>, Status> {
    client.ready().await.unwrap();
    let mut req = tonic::Request::new(OrderRequest {
        sku: sku.into(),
        qty: 1,
    });
    if let Some(key) = key {
        req.metadata_mut()
            .insert("idempotency-key", key.parse().unwrap());
    }
    client
        .unary(
            req,
            PathAndQuery::from_static("/shop.Orders/Create"),
            tonic_prost::ProstCodec::default(),
        )
        .await
}

/// The refusal `result` must be: its code, and its problem code in `idempotency-error`.
fn refused(result: Result<tonic::Response<Receipt>, Status>, code: Code, problem: &str) -> Status {
    let status = result.expect_err("the guard refuses this call");
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(status.metadata().get("idempotency-error").unwrap(), problem);
    assert!(status.message().starts_with(problem), "{status:?}");
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tonic_client_gets_the_first_answer_once_and_each_refusal_as_its_own_status() {
    let orders = Orders {
        created: Arc::new(AtomicUsize::new(0)),
        gate: Arc::new(tokio::sync::Semaphore::new(GATE as usize)),
    };
    let mut client = serve(orders.clone()).await;

    let first = create(&mut client, Some("order-key-1"), "sku-1")
        .await
        .unwrap();
    assert_eq!(first.get_ref().order, 1);
    assert!(first.metadata().get("idempotent-replayed").is_none());
    // A retry: the first receipt and its metadata, marked as a replay; nothing created.
    let again = create(&mut client, Some("order-key-1"), "sku-1")
        .await
        .unwrap();
    assert_eq!(again.get_ref(), first.get_ref());
    assert_eq!(again.metadata().get("x-order").unwrap(), "1");
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");

    refused(
        create(&mut client, Some("order-key-1"), "sku-2").await,
        Code::FailedPrecondition,
        "KEY_REUSED_WITH_DIFFERENT_BODY",
    );
    refused(
        create(&mut client, None, "sku-1").await,
        Code::InvalidArgument,
        "INVALID_IDEMPOTENCY_KEY",
    );
    refused(
        create(&mut client, Some("bad key"), "sku-1").await,
        Code::InvalidArgument,
        "INVALID_IDEMPOTENCY_KEY",
    );

    // While a call runs, its duplicate is ABORTED with gRPC's retry hint.
    let all = orders.gate.acquire_many(GATE).await.unwrap();
    let running = tokio::spawn({
        let mut client = client.clone();
        async move { create(&mut client, Some("order-key-2"), "sku-3").await }
    });
    while orders.created.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let busy = refused(
        create(&mut client, Some("order-key-2"), "sku-3").await,
        Code::Aborted,
        "REQUEST_IN_PROGRESS",
    );
    let pushback: u64 = busy
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(pushback >= 1000, "{pushback}");
    drop(all);
    assert_eq!(running.await.unwrap().unwrap().get_ref().order, 2);
    assert_eq!(
        create(&mut client, Some("order-key-2"), "sku-3")
            .await
            .unwrap()
            .get_ref()
            .order,
        2
    );
    assert_eq!(
        orders.created.load(Ordering::SeqCst),
        2,
        "two orders, each once"
    );
}
