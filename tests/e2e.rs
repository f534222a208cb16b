//! The refund service over real HTTP: a server on an ephemeral port and a real client, on
//! SQLite, on PostgreSQL, and with its idempotency records in Redis (orders in SQLite); and two
//! server processes sharing PostgreSQL.

mod common;

#[allow(dead_code)]
#[path = "../examples/refund_service/app.rs"]
mod app;
#[allow(dead_code)]
#[path = "../examples/refund_service/db.rs"]
mod db;
#[allow(dead_code)]
#[path = "../examples/refund_service/events.rs"]
mod events;
#[allow(dead_code)]
#[path = "../examples/refund_service/gateway.rs"]
mod gateway;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

struct Server {
    base: String,
    /// A query that counts orders, through the database the server uses.
    db_url: String,
    _pg: Option<common::PgSchema>,
    _file: Option<common::SqliteFile>,
    _redis: Option<common::RedisKeys>,
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn count_orders(&self) -> i64 {
        if self.db_url.starts_with("postgres") {
            let pool = sqlx::PgPool::connect(&self.db_url).await.unwrap();
            let n = sqlx::query_scalar("SELECT count(*) FROM orders")
                .fetch_one(&pool)
                .await
                .unwrap();
            pool.close().await;
            n
        } else {
            let pool = sqlx::SqlitePool::connect(&self.db_url).await.unwrap();
            let n = sqlx::query_scalar("SELECT count(*) FROM orders")
                .fetch_one(&pool)
                .await
                .unwrap();
            pool.close().await;
            n
        }
    }
}

async fn serve(url: &str) -> String {
    let (router, _) = app::build(url, None, None)
        .await
        .expect("build the service");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    base
}

async fn sqlite() -> Server {
    let file = common::SqliteFile::new();
    let base = serve(&file.url).await;
    Server {
        base,
        db_url: file.url.clone(),
        _pg: None,
        _file: Some(file),
        _redis: None,
    }
}

/// Orders in a SQLite file, idempotency records in Redis under a prefix of the test's own.
async fn redis() -> Server {
    let url = common::redis_url();
    let keys = common::RedisKeys::new(std::slice::from_ref(&url));
    let store = idem::RedisStore::builder()
        .prefix(keys.prefix.clone())
        .connect(&url)
        .await
        .expect("connect to Redis");
    let file = common::SqliteFile::new();
    let (router, _) = app::build(&file.url, Some(store), None)
        .await
        .expect("build the service");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    Server {
        base,
        db_url: file.url.clone(),
        _pg: None,
        _file: Some(file),
        _redis: Some(keys),
    }
}

/// `DATABASE_URL` with the test's own schema as the search path.
fn pg_url_in(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{schema}")
}

async fn postgres() -> Server {
    let url = common::pg_url();
    let schema = common::PgSchema::create(&url, 2).await;
    let db_url = pg_url_in(&url, &schema.name);
    let base = serve(&db_url).await;
    Server {
        base,
        db_url,
        _pg: Some(schema),
        _file: None,
        _redis: None,
    }
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

async fn post_order(
    c: &Client,
    s: &Server,
    key: &str,
    body: &str,
) -> (StatusCode, reqwest::header::HeaderMap, String) {
    let r = c
        .post(s.url("/api/orders"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    (r.status(), r.headers().clone(), r.text().await.unwrap())
}

/// The problem's `code`, or what the body was when it is not a problem.
fn code(body: &str) -> String {
    match serde_json::from_str::<Value>(body) {
        Ok(v) => v["code"].as_str().unwrap_or("<no code>").to_owned(),
        Err(_) => format!("<not JSON: {body}>"),
    }
}

macro_rules! e2e {
    ($name:ident, $start:ident $(, #[$attr:meta])*) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn the_three_calls_and_the_lookup() {
                let s = $start().await;
                let c = client();
                let key = "0b2c1c6e-1f7b-4f0f-9d3a-8f2f6f0a1111";
                let (st, h, first) = post_order(&c, &s, key, r#"{"skuId": 9001, "qty": 2}"#).await;
                assert_eq!(st, StatusCode::CREATED, "{first}");
                assert!(h.get("idempotent-replayed").is_none());
                let order: Value = serde_json::from_str(&first).unwrap();
                assert_eq!(order["status"], "PENDING");

                let (st, h, again) = post_order(&c, &s, key, r#"{"skuId": 9001, "qty": 2}"#).await;
                assert_eq!(st, StatusCode::OK);
                assert_eq!(h["idempotent-replayed"], "true");
                assert_eq!(again, first, "the replay is byte-identical");

                // Same key and body, other spacing and key order: the same request.
                let (st, _, spaced) = post_order(&c, &s, key, r#"{ "qty" : 2, "skuId":9001 }"#).await;
                assert_eq!((st, spaced.as_str()), (StatusCode::OK, first.as_str()));

                let (st, h, body) = post_order(&c, &s, key, r#"{"skuId": 9002, "qty": 2}"#).await;
                assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
                assert_eq!(h["content-type"], "application/problem+json");
                assert_eq!(code(&body), "KEY_REUSED_WITH_DIFFERENT_BODY");
                assert_eq!(s.count_orders().await, 1);

                let r = c.get(s.url(&format!("/api/orders/by-key/{key}"))).send().await.unwrap();
                assert_eq!(r.status(), StatusCode::CREATED, "the status it was first answered with");
                assert_eq!(r.headers()["cache-control"], "no-store");
                assert_eq!(r.text().await.unwrap(), first);
                let r = c.get(s.url("/api/orders/by-key/never-sent")).send().await.unwrap();
                assert_eq!(r.status(), StatusCode::NOT_FOUND);
                assert_eq!(code(&r.text().await.unwrap()), "IDEMPOTENCY_KEY_NOT_FOUND");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn in_progress_is_409_with_retry_after() {
                let s = $start().await;
                let c = client();
                let slow = {
                    let (c, url) = (c.clone(), s.url("/api/orders"));
                    tokio::spawn(async move {
                        c.post(url)
                            .header("Idempotency-Key", "slow")
                            .header("X-Demo-Delay-Ms", "1500")
                            .header("Content-Type", "application/json")
                            .body(r#"{"skuId": 1, "qty": 1}"#)
                            .send()
                            .await
                            .unwrap()
                            .status()
                    })
                };
                tokio::time::sleep(Duration::from_millis(400)).await;
                let (st, h, body) = post_order(&c, &s, "slow", r#"{"skuId": 1, "qty": 1}"#).await;
                assert_eq!(st, StatusCode::CONFLICT, "{body}");
                assert_eq!(code(&body), "REQUEST_IN_PROGRESS");
                let after: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
                assert!((1..=30).contains(&after), "{after}");
                let r = c.get(s.url("/api/orders/by-key/slow")).send().await.unwrap();
                assert_eq!(r.status(), StatusCode::CONFLICT);
                assert_eq!(slow.await.unwrap(), StatusCode::CREATED);
                let (st, _, _) = post_order(&c, &s, "slow", r#"{"skuId": 1, "qty": 1}"#).await;
                assert_eq!(st, StatusCode::OK);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn keys_are_scoped_per_user() {
                let s = $start().await;
                let c = client();
                let send = |user: &'static str| {
                    c.post(s.url("/api/orders"))
                        .header("Idempotency-Key", "shared-key")
                        .header("X-User-Id", user)
                        .header("Content-Type", "application/json")
                        .body(r#"{"skuId": 7, "qty": 1}"#)
                        .send()
                };
                let a = send("2").await.unwrap();
                assert_eq!(a.status(), StatusCode::CREATED);
                let a: Value = a.json().await.unwrap();
                let b = send("3").await.unwrap();
                assert_eq!(b.status(), StatusCode::CREATED, "another user's key never replays");
                let b: Value = b.json().await.unwrap();
                assert_ne!(a["orderNo"], b["orderNo"]);
                assert_eq!((a["userId"].as_i64(), b["userId"].as_i64()), (Some(2), Some(3)));
                let r = c.get(s.url("/api/orders/by-key/shared-key")).header("X-User-Id", "4").send().await.unwrap();
                assert_eq!(r.status(), StatusCode::NOT_FOUND);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn a_hundred_concurrent_posts_make_one_order() {
                let s = $start().await;
                let c = client();
                let mut tasks = Vec::new();
                for _ in 0..100 {
                    let (c, url) = (c.clone(), s.url("/api/orders"));
                    tasks.push(tokio::spawn(async move {
                        let r = c
                            .post(url)
                            .header("Idempotency-Key", "storm")
                            .header("Content-Type", "application/json")
                            .body(r#"{"skuId": 9001, "qty": 2}"#)
                            .send()
                            .await
                            .unwrap();
                        (r.status(), r.text().await.unwrap())
                    }));
                }
                let mut bodies = std::collections::HashSet::new();
                for t in tasks {
                    let (st, body) = t.await.unwrap();
                    match st {
                        StatusCode::CREATED | StatusCode::OK => {
                            bodies.insert(body);
                        }
                        StatusCode::CONFLICT => assert_eq!(code(&body), "REQUEST_IN_PROGRESS"),
                        other => panic!("{other}: {body}"),
                    }
                }
                assert_eq!(s.count_orders().await, 1);
                assert_eq!(bodies.len(), 1, "every answer is the first answer");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn payment_callback_statuses() {
                let s = $start().await;
                let c = client();
                let (_, _, body) = post_order(&c, &s, "k-pay", r#"{"skuId": 9001, "qty": 2}"#).await;
                let order: Value = serde_json::from_str(&body).unwrap();
                let (no, amount) = (order["orderNo"].as_str().unwrap(), order["amountCents"].as_i64().unwrap());
                let callback = |amount: i64, no: &str| {
                    c.post(s.url("/api/payments/callback"))
                        .json(&json!({ "orderNo": no, "amountCents": amount }))
                        .send()
                };
                let r = callback(amount + 1, no).await.unwrap();
                assert_eq!(r.status(), StatusCode::CONFLICT);
                assert_eq!(code(&r.text().await.unwrap()), "AMOUNT_MISMATCH");
                let r = callback(amount, no).await.unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                let v: Value = r.json().await.unwrap();
                assert_eq!((v["duplicated"].as_bool(), v["order"]["status"].as_str()), (Some(false), Some("PAID")));
                let r = callback(amount, no).await.unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                assert_eq!(r.json::<Value>().await.unwrap()["duplicated"], true);
                // Ship, then a late callback is an illegal transition; then confirm.
                let r = c.post(s.url(&format!("/api/orders/{no}/ship"))).send().await.unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                let r = callback(amount, no).await.unwrap();
                assert_eq!(r.status(), StatusCode::CONFLICT);
                assert_eq!(code(&r.text().await.unwrap()), "ILLEGAL_TRANSITION");
                let r = c.post(s.url(&format!("/api/orders/{no}/confirm"))).send().await.unwrap();
                assert_eq!(r.json::<Value>().await.unwrap()["order"]["status"], "DONE");
                let r = callback(1, "ORD-NOPE").await.unwrap();
                assert_eq!(r.status(), StatusCode::NOT_FOUND);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn fifty_duplicate_refunds_move_money_once() {
                let s = $start().await;
                let c = client();
                let (_, _, body) = post_order(&c, &s, "k-refund", r#"{"skuId": 42, "qty": 3}"#).await;
                let order: Value = serde_json::from_str(&body).unwrap();
                let no = order["orderNo"].as_str().unwrap().to_owned();
                let r = c
                    .post(s.url("/api/payments/callback"))
                    .json(&json!({ "orderNo": no, "amountCents": order["amountCents"] }))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                let mut tasks = Vec::new();
                for _ in 0..50 {
                    let (c, url) = (c.clone(), s.url(&format!("/api/orders/{no}/refunds")));
                    tasks.push(tokio::spawn(async move {
                        let r = c.post(url).header("Idempotency-Key", "refund-once").send().await.unwrap();
                        (r.status(), r.text().await.unwrap())
                    }));
                }
                let mut answers = std::collections::HashSet::new();
                for t in tasks {
                    let (st, body) = t.await.unwrap();
                    match st {
                        StatusCode::CREATED | StatusCode::OK => {
                            answers.insert(body);
                        }
                        StatusCode::CONFLICT => assert_eq!(code(&body), "REQUEST_IN_PROGRESS"),
                        other => panic!("{other}: {body}"),
                    }
                }
                let ledger: Value = c.get(s.url("/api/gateway/ledger")).send().await.unwrap().json().await.unwrap();
                assert_eq!(ledger["count"], 1, "one money move: {ledger}");
                assert_eq!(answers.len(), 1);
                // A replay afterwards gives the first answer; another key finds it refunded.
                let r = c.post(s.url(&format!("/api/orders/{no}/refunds"))).header("Idempotency-Key", "refund-once").send().await.unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                assert!(answers.contains(&r.text().await.unwrap()));
                let r = c.post(s.url(&format!("/api/orders/{no}/refunds"))).header("Idempotency-Key", "refund-again").send().await.unwrap();
                assert_eq!(r.status(), StatusCode::CONFLICT);
                // Another user, the same order and key: not their order, so no replay of the refund.
                let r = c
                    .post(s.url(&format!("/api/orders/{no}/refunds")))
                    .header("Idempotency-Key", "refund-once")
                    .header("X-User-Id", "2")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::NOT_FOUND);
                assert_eq!(code(&r.text().await.unwrap()), "ORDER_NOT_FOUND");
                let ledger: Value = c.get(s.url("/api/gateway/ledger")).send().await.unwrap().json().await.unwrap();
                assert_eq!(ledger["count"], 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn profile_updates_are_optimistic() {
                let s = $start().await;
                let c = client();
                let url = s.url("/api/users/2/profile");
                let p: Value = c.get(&url).send().await.unwrap().json().await.unwrap();
                assert_eq!(p["version"], 0);
                let r = c.patch(&url).json(&json!({ "nickname": "a2", "version": 0 })).send().await.unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                assert_eq!(r.json::<Value>().await.unwrap()["version"], 1);
                let r = c.patch(&url).json(&json!({ "nickname": "late", "version": 0 })).send().await.unwrap();
                assert_eq!(r.status(), StatusCode::CONFLICT);
                let v: Value = r.json().await.unwrap();
                assert_eq!((v["code"].as_str(), v["currentVersion"].as_i64()), (Some("STALE_VERSION"), Some(1)));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn malformed_input_is_never_a_500() {
                let s = $start().await;
                let c = client();
                let long = "k".repeat(300);
                let json = |b: reqwest::RequestBuilder| b.header("Content-Type", "application/json");
                let order = |key: &str| json(c.post(s.url("/api/orders")).header("Idempotency-Key", key));
                let non_ascii = reqwest::header::HeaderValue::from_bytes("clé".as_bytes()).unwrap();
                let cases: Vec<(&str, u16, &str, reqwest::RequestBuilder)> = vec![
                    ("no key", 400, "INVALID_IDEMPOTENCY_KEY", json(c.post(s.url("/api/orders"))).body(r#"{"skuId":1,"qty":1}"#)),
                    ("300-byte key", 400, "INVALID_IDEMPOTENCY_KEY", order(&long).body(r#"{"skuId":1,"qty":1}"#)),
                    ("non-ASCII key", 400, "INVALID_IDEMPOTENCY_KEY", json(c.post(s.url("/api/orders")).header("Idempotency-Key", non_ascii)).body(r#"{"skuId":1,"qty":1}"#)),
                    ("empty key", 400, "INVALID_IDEMPOTENCY_KEY", order("").body(r#"{"skuId":1,"qty":1}"#)),
                    ("bad JSON", 400, "INVALID_BODY", order("k1").body(r#"{"skuId": 1, "qty": "#)),
                    ("unknown field", 422, "INVALID_BODY", order("k2").body(r#"{"skuId":1,"qty":1,"x":1}"#)),
                    ("bad qty", 422, "INVALID_ORDER", order("k3").body(r#"{"skuId":1,"qty":0}"#)),
                    ("no content type", 415, "INVALID_BODY", c.post(s.url("/api/orders")).header("Idempotency-Key", "k4").body(r#"{"skuId":1,"qty":1}"#)),
                    ("bad user", 400, "INVALID_USER", order("k5").header("X-User-Id", "root").body(r#"{"skuId":1,"qty":1}"#)),
                    ("bad delay", 400, "INVALID_DELAY", order("k6").header("X-Demo-Delay-Ms", "-1").body(r#"{"skuId":1,"qty":1}"#)),
                    ("long order number", 404, "ORDER_NOT_FOUND", c.post(s.url(&format!("/api/orders/{}/refunds", "9".repeat(3000)))).header("Idempotency-Key", "k7")),
                    ("unknown order refund", 404, "ORDER_NOT_FOUND", c.post(s.url("/api/orders/ORD-NONE/refunds")).header("Idempotency-Key", "k8")),
                    ("unknown order ship", 404, "ORDER_NOT_FOUND", c.post(s.url("/api/orders/ORD-NONE/ship"))),
                    ("callback bad JSON", 400, "INVALID_BODY", json(c.post(s.url("/api/payments/callback"))).body("{")),
                    ("lookup bad key", 400, "INVALID_IDEMPOTENCY_KEY", c.get(s.url("/api/orders/by-key/%20bad%20"))),
                    ("profile of nobody", 404, "USER_NOT_FOUND", c.get(s.url("/api/users/999/profile"))),
                    ("profile bad id", 400, "INVALID_PATH", c.get(s.url("/api/users/abc/profile"))),
                ];
                for (what, status, want, req) in cases {
                    let r = req.send().await.unwrap();
                    let st = r.status();
                    let content_type = r.headers().get("content-type").cloned();
                    let body = r.text().await.unwrap();
                    assert_eq!((st.as_u16(), code(&body).as_str()), (status, want), "{what}: {body}");
                    assert_eq!(content_type.unwrap(), "application/problem+json", "{what}");
                }
                assert_eq!(s.count_orders().await, 0, "nothing was created by malformed requests");
            }
        }
    };
}

e2e!(on_sqlite, sqlite);
e2e!(on_postgres, postgres, #[cfg_attr(not(idem_postgres), ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…")]);
e2e!(on_redis, redis, #[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]);

/// The example's binary, built by `cargo test` (or built here when only this test is run).
fn example_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir
        .join("examples")
        .join(format!("refund_service{}", std::env::consts::EXE_SUFFIX));
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--example", "refund_service"])
            .status()
            .unwrap();
        assert!(status.success(), "could not build the example");
    }
    bin
}

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_server(database_url: &str) -> (Process, String) {
    spawn_server_with(database_url, &[])
}

/// The example's binary on `database_url`, with more environment (`IDEM_STORE_URL`, …).
fn spawn_server_with(database_url: &str, env: &[(&str, &str)]) -> (Process, String) {
    let mut child = Command::new(example_binary())
        .env("IDEM_ADDR", "127.0.0.1:0")
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "warn")
        // Only what the test asks for: no relay to a broker, no Redis, from CI's environment.
        .env_remove("NATS_URL")
        .env_remove("IDEM_STORE_URL")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the example");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    (Process(child), base)
}

#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_server_processes_share_postgres() {
    let url = common::pg_url();
    let schema = common::PgSchema::create(&url, 2).await;
    let db_url = pg_url_in(&url, &schema.name);
    let (_a, base_a) = spawn_server(&db_url);
    let (_b, base_b) = spawn_server(&db_url);
    sixty_posts_make_one_order(&schema, &base_a, &base_b).await;
}

/// The example run as documented, `IDEM_STORE_URL` naming the cluster's nodes: two processes,
/// orders in PostgreSQL, idempotency records in Redis Cluster.
#[cfg_attr(
    not(all(idem_postgres, idem_redis_cluster)),
    ignore = "needs PostgreSQL and a Redis Cluster: set DATABASE_URL=postgres://… and IDEM_REDIS_CLUSTER=redis://host:port,…"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_server_processes_share_a_redis_cluster() {
    let (url, nodes) = (common::pg_url(), common::redis_cluster());
    let keys = common::RedisKeys::new(&nodes);
    let schema = common::PgSchema::create(&url, 2).await;
    let db_url = pg_url_in(&url, &schema.name);
    let env = [
        ("IDEM_STORE_URL", &nodes.join(",")[..]),
        ("IDEM_STORE_PREFIX", &keys.prefix[..]),
    ];
    let (_a, base_a) = spawn_server_with(&db_url, &env);
    let (_b, base_b) = spawn_server_with(&db_url, &env);
    sixty_posts_make_one_order(&schema, &base_a, &base_b).await;
    assert_eq!(keys.count().await, 1, "the one record is in the cluster");
}

async fn sixty_posts_make_one_order(schema: &common::PgSchema, base_a: &str, base_b: &str) {
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..60 {
        let base = if i % 2 == 0 { base_a } else { base_b };
        let (c, url) = (c.clone(), format!("{base}/api/orders"));
        tasks.push(tokio::spawn(async move {
            let r = c
                .post(url)
                .header("Idempotency-Key", "two-processes")
                .header("Content-Type", "application/json")
                .body(r#"{"skuId": 5, "qty": 5}"#)
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap())
        }));
    }
    let mut bodies = std::collections::HashSet::new();
    for t in tasks {
        let (st, body) = t.await.unwrap();
        match st {
            StatusCode::CREATED | StatusCode::OK => {
                bodies.insert(body);
            }
            StatusCode::CONFLICT => assert_eq!(code(&body), "REQUEST_IN_PROGRESS"),
            other => panic!("{other}: {body}"),
        }
    }
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&schema.pool)
        .await
        .unwrap();
    assert_eq!(n, 1, "one order across both processes");
    assert_eq!(bodies.len(), 1);
    // Each process replays the same bytes.
    for base in [base_a, base_b] {
        let r = c
            .post(format!("{base}/api/orders"))
            .header("Idempotency-Key", "two-processes")
            .header("Content-Type", "application/json")
            .body(r#"{"skuId": 5, "qty": 5}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert!(bodies.contains(&r.text().await.unwrap()));
    }
}

/// The walkthrough holds after a restart: the gateway's ledger lives in the database with the
/// records, so a refund replayed by a new process still finds its one money move.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_keeps_the_ledger_with_the_replays() {
    let file = common::SqliteFile::new();
    let c = client();
    let refund = |base: String| {
        let c = c.clone();
        async move {
            let r = c
                .post(format!("{base}/api/orders"))
                .header("Idempotency-Key", "restart-order")
                .header("Content-Type", "application/json")
                .body(r#"{"skuId": 7, "qty": 1}"#)
                .send()
                .await
                .unwrap();
            let order: Value = r.json().await.unwrap();
            let no = order["orderNo"].as_str().unwrap().to_owned();
            c.post(format!("{base}/api/payments/callback"))
                .json(&json!({ "orderNo": no, "amountCents": order["amountCents"] }))
                .send()
                .await
                .unwrap();
            let r = c
                .post(format!("{base}/api/orders/{no}/refunds"))
                .header("Idempotency-Key", "restart-refund")
                .send()
                .await
                .unwrap();
            let status = r.status();
            let body = r.text().await.unwrap();
            let ledger: Value = c
                .get(format!("{base}/api/gateway/ledger"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (status, body, ledger)
        }
    };
    let (first, base) = spawn_server(&file.url);
    let (st, body, ledger) = refund(base).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    assert_eq!(ledger["count"], 1, "{ledger}");
    drop(first);

    let (_second, base) = spawn_server(&file.url);
    let (st, again, ledger) = refund(base).await;
    assert_eq!(
        st,
        StatusCode::OK,
        "the refund replays after the restart: {again}"
    );
    assert_eq!(again, body);
    assert_eq!(ledger["count"], 1, "still one money move: {ledger}");
    let refund_id: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ledger["moves"][0]["id"], refund_id["refundId"]);
}

/// The service's log, written to a pipe, is plain text with a message on each line: no colour
/// codes, and a key reuse says what happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_to_a_pipe_are_plain_text_with_messages() {
    use std::io::Read;

    let file = common::SqliteFile::new();
    let mut child = Command::new(example_binary())
        .env("IDEM_ADDR", "127.0.0.1:0")
        .env("DATABASE_URL", &file.url)
        .env("RUST_LOG", "info")
        .env_remove("NATS_URL")
        .env_remove("IDEM_STORE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the example");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let base = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("unexpected first line: {first:?}"))
        .to_owned();
    let c = client();
    for body in [r#"{"skuId": 1, "qty": 1}"#, r#"{"skuId": 2, "qty": 1}"#] {
        c.post(format!("{base}/api/orders"))
            .header("Idempotency-Key", "log-key")
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
    }
    let _ = child.kill();
    let _ = child.wait();
    let mut log = String::new();
    out.read_to_string(&mut log).unwrap();
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a piped log:\n{log}"
    );
    let reuse = log
        .lines()
        .find(|l| l.contains("key_reused"))
        .unwrap_or_else(|| panic!("no key reuse logged:\n{log}"));
    assert!(reuse.contains("different fingerprint"), "{reuse}");
}
