//! The client middleware, `idem::client`, against the refund service's binary, with faults: the
//! server killed (SIGKILL) mid-request and started again, a handler slower than the client's
//! timeout, answers dropped on their way back by a proxy; on SQLite and on PostgreSQL. In each,
//! checkouts driven at once end with one order per checkout, counted in the database, and each
//! caller holds the first answer, byte for byte. Besides: a refusal is never retried, a 409's
//! `Retry-After` is waited out, a call that gives up keeps its operation's key, a key outlives a
//! restart of the client; and the backoff and `Retry-After` readings on their own.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::Extensions;
use idem::client::reqwest_middleware::{
    self, ClientBuilder, ClientWithMiddleware, Middleware, Next,
};
use idem::client::{
    Answer, Attempt, Attempts, Error, FileKeys, Idempotency, Last, Lookup, Operation, Outcome,
    PendingKeys, Retry, retry_after,
};
use idem::error::codes;
use idem::{KeyError, KeyPolicy};
use reqwest::header::HeaderValue;
use reqwest::{Request, Response, StatusCode};
use tokio::time::Instant;

use common::proxy::{Fault, Proxy, Rule, Wire};
use common::service::{Service, free_port};

// ---- backoff and Retry-After ---------------------------------------------------------------

#[test]
fn backoff_doubles_up_to_its_cap_with_full_jitter() {
    let retry = Retry::DEFAULT
        .first_delay(Duration::from_millis(100))
        .max_delay(Duration::from_secs(3));
    let ceilings: Vec<u128> = (0..7).map(|n| retry.ceiling(n).as_millis()).collect();
    assert_eq!(ceilings, [100, 200, 400, 800, 1600, 3000, 3000]);
    assert_eq!(
        retry.ceiling(u32::MAX),
        Duration::from_secs(3),
        "no overflow"
    );
    // Full jitter: anywhere from zero to the ceiling, not the ceiling itself.
    let ceiling = retry.ceiling(3);
    let draws: Vec<Duration> = (0..400).map(|_| retry.delay(3)).collect();
    assert!(draws.iter().all(|d| *d <= ceiling), "{draws:?}");
    assert!(draws.iter().any(|d| *d < ceiling / 4), "{draws:?}");
    assert!(draws.iter().any(|d| *d > ceiling * 3 / 4), "{draws:?}");
    assert_eq!(
        Retry::DEFAULT.max_attempts(0).attempts(),
        1,
        "one request at least"
    );
}

#[test]
fn retry_after_reads_seconds_and_every_http_date_form() {
    // Sun, 06 Nov 1994 08:49:37 GMT, RFC 9110's example.
    let now = UNIX_EPOCH + Duration::from_secs(784_111_777);
    let read = |v: &'static str| retry_after(&HeaderValue::from_static(v), now);
    assert_eq!(read("0"), Some(Duration::ZERO));
    assert_eq!(read("120"), Some(Duration::from_secs(120)));
    assert_eq!(read(" 7 "), Some(Duration::from_secs(7)));
    assert_eq!(
        read("99999999999999999999999"),
        Some(Duration::from_secs(u64::MAX)),
        "too many digits is still later than anyone waits"
    );
    let in_ten = Some(Duration::from_secs(10));
    assert_eq!(read("Sun, 06 Nov 1994 08:49:47 GMT"), in_ten, "IMF-fixdate");
    assert_eq!(read("Sunday, 06-Nov-94 08:49:47 GMT"), in_ten, "RFC 850");
    assert_eq!(read("Sun Nov  6 08:49:47 1994"), in_ten, "asctime");
    assert_eq!(
        read("Sun, 06 Nov 1994 08:49:30 GMT"),
        Some(Duration::ZERO),
        "a date past is now"
    );
    for bad in ["", "-1", "1.5", "soon", "Sun, 06 Nov 1994"] {
        assert_eq!(read(bad), None, "{bad:?}");
    }
}

// ---- the service, its databases, and checkouts -----------------------------------------------

/// A database the service runs on, of one test's own.
trait Database: Sized {
    async fn create() -> Self;
    /// The service's `DATABASE_URL`.
    fn url(&self) -> String;
}

struct Sqlite(common::SqliteFile);

impl Database for Sqlite {
    async fn create() -> Self {
        Sqlite(common::SqliteFile::new())
    }
    fn url(&self) -> String {
        self.0.url.clone()
    }
}

struct Postgres(common::PgSchema);

impl Database for Postgres {
    async fn create() -> Self {
        Postgres(common::PgSchema::create(&common::pg_url(), 2).await)
    }
    fn url(&self) -> String {
        self.0.scoped_url()
    }
}

/// Every order in the database at `url`, counted there.
async fn orders(url: &str) -> i64 {
    let count = "SELECT count(*) FROM orders";
    if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        let n = sqlx::query_scalar(count).fetch_one(&pool).await.unwrap();
        pool.close().await;
        n
    } else {
        let pool = sqlx::SqlitePool::connect(url).await.unwrap();
        let n = sqlx::query_scalar(count).fetch_one(&pool).await.unwrap();
        pool.close().await;
        n
    }
}

/// A client with the middleware, and `inner` after it (closer to the network).
fn guarded(idempotency: Idempotency, inner: Option<Arc<dyn Middleware>>) -> ClientWithMiddleware {
    let builder = ClientBuilder::new(reqwest::Client::new()).with(idempotency);
    match inner {
        Some(inner) => builder.with_arc(inner).build(),
        None => builder.build(),
    }
}

/// The lookup of the refund service's orders.
fn by_key() -> Lookup {
    Lookup::new("/api/orders/by-key/{key}").unwrap()
}

/// Checkout `i`'s request body: each checkout buys a product of its own.
fn cart(i: usize) -> String {
    format!(r#"{{"skuId": {}, "qty": 1}}"#, 100 + i)
}

/// A checkout that ended with an answer.
#[derive(Debug)]
struct Done {
    body: String,
    answer: Answer,
    status: StatusCode,
    bytes: Bytes,
    attempts: Attempts,
}

/// The answer of `sent`, read; a panic naming what else it was.
async fn answered(body: String, result: reqwest_middleware::Result<Response>) -> Done {
    let sent = idem::client::Sent::from_result(result).expect("an outcome");
    let (answer, response) = match sent.outcome {
        Outcome::First(r) => (Answer::First, r),
        Outcome::Replayed(r) => (Answer::Replayed, r),
        other => panic!("{body}: {other:?} after {:?}", sent.attempts),
    };
    let status = response.status();
    let bytes = response
        .bytes()
        .await
        .expect("an answer's body is read whole");
    Done {
        body,
        answer,
        status,
        bytes,
        attempts: sent.attempts,
    }
}

/// `n` checkouts at once, a task each, through `client` to `url`, each request given `timeout`:
/// their keys the middleware's (or `keys`), each with `headers` besides.
async fn checkouts(
    client: &ClientWithMiddleware,
    url: &str,
    n: usize,
    timeout: Duration,
    keys: Option<&[String]>,
    headers: &[(&'static str, &'static str)],
) -> Vec<Done> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let body = cart(i);
            let mut request = client
                .post(url)
                .header("Content-Type", "application/json")
                .body(body.clone())
                .timeout(timeout);
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            if let Some(keys) = keys {
                request = request.header("Idempotency-Key", &keys[i]);
            }
            tokio::spawn(async move { answered(body, request.send().await).await })
        })
        .collect();
    let mut done = Vec::new();
    for task in tasks {
        done.push(task.await.unwrap());
    }
    done
}

/// One order per checkout in the database, and each checkout's caller holds the first answer:
/// the bytes the service replays for its key, naming an order of its own.
async fn one_order_each(db_url: &str, service: &Service, done: &[Done]) {
    assert_eq!(
        orders(db_url).await,
        done.len() as i64,
        "one order per checkout: {done:#?}"
    );
    let plain = reqwest::Client::new();
    let mut numbers = std::collections::BTreeSet::new();
    for d in done {
        // The first answer is 201; the service replays it as 200, its lookup as 201.
        assert!(d.status.is_success(), "{d:?}");
        if d.answer == Answer::First {
            assert_eq!(d.status, StatusCode::CREATED, "{d:?}");
        }
        let replay = plain
            .post(service.url("/api/orders"))
            .header("Idempotency-Key", d.attempts.key().as_str())
            .header("Content-Type", "application/json")
            .body(d.body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(replay.status(), StatusCode::OK);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(
            replay.bytes().await.unwrap(),
            d.bytes,
            "the caller holds the first answer"
        );
        let order: serde_json::Value = serde_json::from_slice(&d.bytes).unwrap();
        numbers.insert(order["orderNo"].as_str().unwrap().to_owned());
    }
    assert_eq!(numbers.len(), done.len(), "an order of its own each");
}

/// How many checkouts each fault drives at once.
const CHECKOUTS: usize = 6;

/// A checkout's timeout, where the fault is not a timeout.
const TIMEOUT: Duration = Duration::from_secs(10);

// ---- faults, on each database ----------------------------------------------------------------

/// The service is killed while every checkout is in its handler (each asks for 1.5 s), and
/// started again on the same address a second later. The checkouts' connections drop, their
/// lookups find nothing listening and back off; once it is back, each claim the dead process
/// left is reported running (409) until its lease runs out, when the checkout's next send takes
/// it over and creates the order, once.
async fn killed_mid_request_and_started_again<D: Database>() {
    let db = D::create().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let service = Service::start(&db.url(), &addr, &[]);
    let url = service.url("/api/orders");
    let retry = Retry::DEFAULT
        .first_delay(Duration::from_millis(100))
        .max_delay(Duration::from_secs(1))
        .max_attempts(300)
        .max_elapsed(Duration::from_secs(120));
    let client = guarded(Idempotency::new().retry(retry).lookup(by_key()), None);
    let driving = tokio::spawn(async move {
        let delay = [("X-Demo-Delay-Ms", "1500")];
        checkouts(&client, &url, CHECKOUTS, TIMEOUT, None, &delay).await
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    drop(service);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let service = Service::start(&db.url(), &addr, &[]);
    let done = driving.await.unwrap();
    for d in &done {
        assert!(
            d.attempts.sent() >= 2 && d.attempts.lookups() >= 1,
            "the kill cut every checkout, which asked by key and sent again: {d:?}"
        );
    }
    one_order_each(&db.url(), &service, &done).await;
}

/// Below the middleware (closer to the network): records each request it makes, and, when
/// `slow_first`, asks the service to be slow (1 s) on the first send of each call only; a
/// handler that a timed-out request cut off would otherwise be as slow on every retry, and
/// never finish.
#[derive(Debug, Default)]
struct Below {
    slow_first: bool,
    seen: Mutex<Vec<(Instant, Attempt)>>,
}

#[async_trait::async_trait]
impl Middleware for Below {
    async fn handle(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let attempt = extensions
            .get::<Attempt>()
            .cloned()
            .expect("the middleware's");
        if self.slow_first && attempt.number() == 1 {
            req.headers_mut()
                .insert("x-demo-delay-ms", HeaderValue::from_static("1000"));
        }
        self.seen.lock().unwrap().push((Instant::now(), attempt));
        next.run(req, extensions).await
    }
}

/// The first send of each checkout takes longer than the client waits (1 s against 300 ms):
/// the client hangs up, the service drops the request and releases its claim, and the
/// checkout asks by key (404, or 409 while the release is on its way), then sends again with
/// its key.
async fn a_handler_slower_than_the_client_waits<D: Database>() {
    let db = D::create().await;
    let service = Service::start(&db.url(), "127.0.0.1:0", &[]);
    let below = Arc::new(Below {
        slow_first: true,
        ..Below::default()
    });
    let client = guarded(
        Idempotency::new()
            .retry(Retry::DEFAULT.max_elapsed(Duration::from_secs(30)))
            .lookup(by_key()),
        Some(below.clone()),
    );
    let url = service.url("/api/orders");
    let short = Duration::from_millis(300);
    let done = checkouts(&client, &url, CHECKOUTS, short, None, &[]).await;
    for d in &done {
        assert!(
            d.attempts.sent() >= 2 && d.attempts.lookups() >= 1,
            "the first send timed out, and was asked after: {d:?}"
        );
    }
    one_order_each(&db.url(), &service, &done).await;
}

/// A proxy between the client and the service drops each checkout's first answer on its way
/// back (the service created the order), and for every other checkout the answer of its first
/// lookup too. Each checkout asks by key (again, after a backoff, when the lookup's answer was
/// dropped) and takes the stored answer: a replay of the first.
async fn answers_dropped_on_the_way_back<D: Database>() {
    let db = D::create().await;
    let service = Service::start(&db.url(), "127.0.0.1:0", &[]);
    let proxy = Proxy::start(service.addr(), Wire::Http).await;
    let run = common::unique("drop");
    let keys: Vec<String> = (0..CHECKOUTS).map(|i| format!("{run}-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let header = format!("idempotency-key: {key}\r\n");
        proxy.inject(Rule::first(
            &[b"POST /api/orders ", header.as_bytes()],
            Fault::CutAfterReply,
        ));
        if i % 2 == 0 {
            let lookup = format!("GET /api/orders/by-key/{key} ");
            proxy.inject(Rule::first(&[lookup.as_bytes()], Fault::CutAfterReply));
        }
    }
    let client = guarded(Idempotency::new().lookup(by_key()), None);
    let url = format!("http://{}/api/orders", proxy.addr);
    let done = checkouts(&client, &url, CHECKOUTS, TIMEOUT, Some(&keys), &[]).await;
    assert_eq!(
        proxy.fired().len(),
        CHECKOUTS + CHECKOUTS.div_ceil(2),
        "every fault was injected: {:?}",
        proxy.fired()
    );
    for d in &done {
        assert_eq!(
            d.answer,
            Answer::Replayed,
            "the first answer was dropped: {d:?}"
        );
        assert_eq!(d.attempts.sent(), 1, "asked, never sent again: {d:?}");
    }
    one_order_each(&db.url(), &service, &done).await;
}

mod sqlite {
    crate::backend_tests!(
        crate::Sqlite:
        killed_mid_request_and_started_again(flavor = "multi_thread", worker_threads = 4),
        a_handler_slower_than_the_client_waits(flavor = "multi_thread", worker_threads = 4),
        answers_dropped_on_the_way_back(flavor = "multi_thread", worker_threads = 4),
    );
}

mod postgres {
    crate::backend_tests!(
        #[cfg_attr(not(idem_postgres), ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…")]
        crate::Postgres:
        killed_mid_request_and_started_again(flavor = "multi_thread", worker_threads = 4),
        a_handler_slower_than_the_client_waits(flavor = "multi_thread", worker_threads = 4),
        answers_dropped_on_the_way_back(flavor = "multi_thread", worker_threads = 4),
    );
}

// ---- refusals, waits, and keys that outlive a call ---------------------------------------------

/// A key reused with another body (422), and a request the service refuses on its own (400),
/// are sent once and come back typed with their problem code; a key the policy refuses, and a
/// body that cannot be sent twice, are never sent at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_never_retried() {
    let db = Sqlite::create().await;
    let service = Service::start(&db.url(), "127.0.0.1:0", &[]);
    let url = service.url("/api/orders");
    let client = guarded(Idempotency::new().lookup(by_key()), None);
    let post = |body: String| {
        client
            .post(&url)
            .header("Content-Type", "application/json")
            .body(body)
    };

    let first = post(cart(1)).header("Idempotency-Key", "reused");
    let first = answered(cart(1), first.send().await).await;
    assert_eq!(first.answer, Answer::First);

    // Each refusal: its status and code, after one request and no lookup.
    let refused = async |request: reqwest_middleware::RequestBuilder| {
        let sent = idem::client::send(request).await.unwrap();
        let Outcome::Refused(refusal) = sent.outcome else {
            panic!("{sent:?}")
        };
        assert_eq!((sent.attempts.sent(), sent.attempts.lookups()), (1, 0));
        (refusal.status(), refusal.code().map(str::to_owned))
    };
    let reuse = refused(post(cart(2)).header("Idempotency-Key", "reused")).await;
    let reused = Some(codes::KEY_REUSED_WITH_DIFFERENT_BODY.to_owned());
    assert_eq!(reuse, (StatusCode::UNPROCESSABLE_ENTITY, reused));
    let own = refused(post(cart(3)).header("X-User-Id", "nobody")).await;
    assert_eq!(
        own,
        (StatusCode::BAD_REQUEST, Some("INVALID_USER".to_owned()))
    );

    let strict = guarded(Idempotency::new().key_policy(KeyPolicy::Uuid), None);
    let bad = strict
        .post(&url)
        .header("Idempotency-Key", "order-7")
        .body(cart(4));
    assert!(matches!(
        idem::client::send(bad).await,
        Err(Error::InvalidKey(KeyError::NotUuid))
    ));
    let stream = client
        .post(&url)
        .header("Content-Type", "application/json")
        .body(reqwest::Body::wrap(cart(5)));
    assert!(matches!(
        idem::client::send(stream).await,
        Err(Error::NotReplayable)
    ));
    assert_eq!(
        orders(&db.url()).await,
        1,
        "nothing else reached the service"
    );
}

/// While the first request with a key runs (2.5 s), a second send of it is answered 409 with
/// `Retry-After: 1`; the call waits that out each time (its own backoff is a millisecond, and
/// five requests are all it may make) and takes the replay once the first is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_with_retry_after_is_waited_out() {
    let db = Sqlite::create().await;
    let service = Service::start(&db.url(), "127.0.0.1:0", &[]);
    let url = service.url("/api/orders");
    let first = {
        let url = url.clone();
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .header("Idempotency-Key", "waited")
                .header("X-Demo-Delay-Ms", "2500")
                .header("Content-Type", "application/json")
                .body(cart(1))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let below = Arc::new(Below::default());
    let retry = Retry::DEFAULT
        .first_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(1))
        .max_attempts(5);
    let client = guarded(Idempotency::new().retry(retry), Some(below.clone()));
    let request = client
        .post(&url)
        .header("Idempotency-Key", "waited")
        .header("Content-Type", "application/json")
        .body(cart(1));
    let done = answered(cart(1), request.send().await).await;
    assert_eq!(first.await.unwrap(), StatusCode::CREATED);
    assert_eq!(done.answer, Answer::Replayed);
    assert!(done.attempts.sent() >= 2, "{done:?}");
    let seen = std::mem::take(&mut *below.seen.lock().unwrap());
    assert_eq!(seen.len() as u32, done.attempts.sent(), "{seen:?}");
    for pair in seen.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(
            gap >= Duration::from_millis(950),
            "Retry-After: 1 is waited out, not a millisecond's backoff: {gap:?}"
        );
    }
    assert_eq!(orders(&db.url()).await, 1);
}

/// Two sends of one operation share its key: the second, bounded to 1.5 s while the first runs
/// for 2.5 s, gives up still running, with the first's key. Once the first has its answer the
/// key is forgotten: the operation sent again is a new checkout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_of_one_operation_share_its_key_until_it_has_an_answer() {
    let db = Sqlite::create().await;
    let service = Service::start(&db.url(), "127.0.0.1:0", &[]);
    let url = service.url("/api/orders");
    let client = guarded(Idempotency::new().lookup(by_key()), None);
    let send = |delay: &'static str, retry: Retry| {
        client
            .post(&url)
            .header("Content-Type", "application/json")
            .header("X-Demo-Delay-Ms", delay)
            .body(cart(1))
            .with_extension(Operation::new("cart-1"))
            .with_extension(retry)
    };
    let first = send("2500", Retry::DEFAULT);
    let first = tokio::spawn(async move { answered(cart(1), first.send().await).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = idem::client::send(send(
        "0",
        Retry::DEFAULT.max_elapsed(Duration::from_millis(1500)),
    ))
    .await
    .unwrap();
    assert!(
        matches!(
            second.outcome,
            Outcome::StillRunning {
                retry_after: Some(_)
            }
        ),
        "{second:?}"
    );
    let first = first.await.unwrap();
    assert_eq!(first.answer, Answer::First);
    assert_eq!(first.attempts.key(), second.attempts.key(), "one key");
    let third = answered(cart(1), send("0", Retry::DEFAULT).send().await).await;
    assert_eq!(third.answer, Answer::First);
    assert_ne!(third.attempts.key(), first.attempts.key(), "a new checkout");
    assert_eq!(orders(&db.url()).await, 2);
}

/// The first send's answer is dropped and the client, allowed one request, gives up: its key
/// stays in its file. A client started afresh on the same directory sends the operation with
/// that key and gets the first answer replayed; the key is then forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_outlives_a_restart_of_the_client() {
    let db = Sqlite::create().await;
    let service = Service::start(&db.url(), "127.0.0.1:0", &[]);
    let proxy = Proxy::start(service.addr(), Wire::Http).await;
    proxy.inject(Rule::first(&[b"POST /api/orders "], Fault::CutAfterReply));
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://{}/api/orders", proxy.addr);
    let send = |client: &ClientWithMiddleware| {
        client
            .post(&url)
            .header("Content-Type", "application/json")
            .body(cart(1))
            .with_extension(Operation::new("cart-1"))
    };

    let before = guarded(
        Idempotency::new()
            .retry(Retry::DEFAULT.max_attempts(1))
            .pending_keys(FileKeys::open(dir.path()).unwrap()),
        None,
    );
    let gave_up = idem::client::send(send(&before)).await;
    let Err(Error::GaveUp {
        last: Last::Transport(_),
        attempts,
    }) = gave_up
    else {
        panic!("{gave_up:?}")
    };
    assert_eq!(proxy.fired().len(), 1);
    drop(before);
    let kept = FileKeys::open(dir.path()).unwrap();
    assert_eq!(
        kept.pending().unwrap(),
        vec![("cart-1".to_owned(), attempts.key().clone())]
    );

    let after = guarded(Idempotency::new().pending_keys(kept.clone()), None);
    let done = answered(cart(1), send(&after).send().await).await;
    assert_eq!(done.answer, Answer::Replayed);
    assert_eq!(done.attempts.key(), attempts.key());
    assert!(
        kept.pending().unwrap().is_empty(),
        "forgotten once answered"
    );
    one_order_each(&db.url(), &service, &[done]).await;
}
