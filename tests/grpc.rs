//! The `tower` guard in front of a real tonic server, called by a real tonic client: the key in
//! the `idempotency-key` metadata, a retry answered with the first response and its metadata,
//! each of the guard's refusals a distinct gRPC status the client reads, and a server-streaming
//! method passed through unguarded, its messages arriving as they are sent.

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
    watched: Arc<AtomicUsize>,
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
        let orders = self.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(match req.uri().path() {
                "/shop.Orders/Watch" => grpc.server_streaming(Watch(orders), req).await,
                _ => grpc.unary(Create(orders), req).await,
            })
        })
    }
}

/// `Watch`, server-streaming: one receipt at once, another once the gate opens.
struct Watch(Orders);

type ReceiptStream = Pin<Box<dyn futures_util::Stream<Item = Result<Receipt, Status>> + Send>>;

impl tonic::server::ServerStreamingService<OrderRequest> for Watch {
    type Response = Receipt;
    type ResponseStream = ReceiptStream;
    type Future = BoxFuture<Result<tonic::Response<ReceiptStream>, Status>>;

    fn call(&mut self, req: tonic::Request<OrderRequest>) -> Self::Future {
        let orders = self.0.clone();
        let n = orders.watched.fetch_add(1, Ordering::SeqCst) as u64 + 1;
        let sku = req.into_inner().sku;
        Box::pin(async move {
            let stream = futures_util::stream::unfold(0, move |step| {
                let (orders, sku) = (orders.clone(), sku.clone());
                async move {
                    let order = match step {
                        0 => n * 100,
                        1 => {
                            let _open = orders.gate.acquire().await;
                            n * 100 + 1
                        }
                        _ => return None,
                    };
                    Some((Ok(Receipt { order, sku }), step + 1))
                }
            });
            Ok(tonic::Response::new(Box::pin(stream) as ReceiptStream))
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
        .stored_headers([CONTENT_TYPE, HeaderName::from_static("x-order")])
        .pass_through(|parts| parts.uri.path() == "/shop.Orders/Watch");
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
        watched: Arc::new(AtomicUsize::new(0)),
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

/// A server-streaming method the guard passes through: its first message reaches the client
/// while the method still runs (nothing buffered), and the same key runs it again (nothing
/// stored, nothing replayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_method_passed_through_streams_as_it_runs() {
    use futures_util::StreamExt as _;

    let orders = Orders {
        created: Arc::new(AtomicUsize::new(0)),
        watched: Arc::new(AtomicUsize::new(0)),
        gate: Arc::new(tokio::sync::Semaphore::new(GATE as usize)),
    };
    let mut client = serve(orders.clone()).await;
    for run in 1..=2u64 {
        let all = orders.gate.acquire_many(GATE).await.unwrap();
        client.ready().await.unwrap();
        let mut req = tonic::Request::new(OrderRequest {
            sku: "sku-1".into(),
            qty: 1,
        });
        req.metadata_mut()
            .insert("idempotency-key", "watch-key".parse().unwrap());
        let call = client.server_streaming(
            req,
            PathAndQuery::from_static("/shop.Orders/Watch"),
            tonic_prost::ProstCodec::<OrderRequest, Receipt>::default(),
        );
        let (mut stream, first) = tokio::time::timeout(Duration::from_secs(10), async {
            let resp = call.await.unwrap();
            assert!(resp.metadata().get("idempotent-replayed").is_none());
            let mut stream = resp.into_inner();
            let first = stream.next().await.unwrap().unwrap();
            (stream, first)
        })
        .await
        .expect("the answer and its first message arrive while the method still runs");
        assert_eq!(first.order, run * 100);
        drop(all);
        let second = stream.next().await.unwrap().unwrap();
        assert_eq!(second.order, run * 100 + 1);
        assert!(stream.next().await.is_none());
    }
    assert_eq!(
        orders.watched.load(Ordering::SeqCst),
        2,
        "unguarded: it ran twice"
    );
}
