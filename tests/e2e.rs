//! The refund service over real HTTP: a server on an ephemeral port and a real client, on
//! SQLite, on PostgreSQL, on MySQL (MariaDB), and with its idempotency records in Redis (orders
//! in SQLite); and two server processes sharing PostgreSQL, or MySQL.

mod common;

#[allow(dead_code)]
#[path = "../examples/refund_service/admin.rs"]
mod admin;
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
    _my: Option<common::MyDatabase>,
    _file: Option<common::SqliteFile>,
    _redis: Option<common::RedisKeys>,
    /// The service's completer; `None` stops it.
    completer: Option<idem::completer::Running>,
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The server's database at `db_url`, to look at (it owns nothing).
    fn observing(base: String, db_url: &str) -> Server {
        Server {
            base,
            db_url: db_url.to_owned(),
            _pg: None,
            _my: None,
            _file: None,
            _redis: None,
            completer: None,
        }
    }

    /// One text column of one row, through the database the server uses.
    async fn query_text(&self, sql: &'static str, arg: &str) -> String {
        crate::scalar_at!(self.db_url, sql, arg)
    }

    async fn count_orders(&self) -> i64 {
        crate::scalar_at!(self.db_url, "SELECT count(*) FROM orders")
    }
}

async fn serve(url: &str) -> (String, Option<idem::completer::Running>) {
    let (router, _, completer) = app::build(url, None, None)
        .await
        .expect("build the service");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (base, completer)
}

async fn sqlite() -> Server {
    let file = common::SqliteFile::new();
    let (base, completer) = serve(&file.url).await;
    Server {
        base,
        db_url: file.url.clone(),
        _pg: None,
        _my: None,
        _file: Some(file),
        _redis: None,
        completer,
    }
}

/// Orders in a SQLite file, idempotency records in Redis under a prefix of the test's own.
async fn redis() -> Server {
    let (keys, store) = common::redis_store().await;
    let file = common::SqliteFile::new();
    let (router, _, completer) = app::build(&file.url, Some(store), None)
        .await
        .expect("build the service");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    Server {
        base,
        db_url: file.url.clone(),
        _pg: None,
        _my: None,
        _file: Some(file),
        _redis: Some(keys),
        completer,
    }
}

async fn postgres() -> Server {
    let url = common::pg_url();
    let schema = common::PgSchema::create(&url, 2).await;
    let db_url = schema.scoped_url();
    let (base, completer) = serve(&db_url).await;
    Server {
        base,
        db_url,
        _pg: Some(schema),
        _my: None,
        _file: None,
        _redis: None,
        completer,
    }
}

/// The service on a MySQL (or MariaDB) database of its own.
async fn mysql() -> Server {
    let database = common::MyDatabase::create(&common::mysql_url(), 2).await;
    let db_url = database.url.clone();
    let (base, completer) = serve(&db_url).await;
    Server {
        base,
        db_url,
        _pg: None,
        _my: Some(database),
        _file: None,
        _redis: None,
        completer,
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

/// `X-Gateway-Signature` for `body`, as the payment gateway signs its callbacks with the
/// service's development secret.
fn signature(body: &str) -> String {
    common::gateway_signature(app::DEV_WEBHOOK_SECRET.as_bytes(), body)
}

/// A payment callback for `order_no`, signed as the gateway signs it.
async fn pay(c: &Client, s: &Server, order_no: &str, amount_cents: i64) -> reqwest::Response {
    let body = json!({ "orderNo": order_no, "amountCents": amount_cents }).to_string();
    c.post(s.url("/api/payments/callback"))
        .header("Content-Type", "application/json")
        .header("X-Gateway-Signature", signature(&body))
        .body(body)
        .send()
        .await
        .unwrap()
}

/// A new order of `user`, paid: its number and amount.
async fn paid_order(c: &Client, s: &Server, key: &str) -> (String, i64) {
    let (st, _, body) = post_order(c, s, key, r#"{"skuId": 42, "qty": 3}"#).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let order: Value = serde_json::from_str(&body).unwrap();
    let no = order["orderNo"].as_str().unwrap().to_owned();
    let amount = order["amountCents"].as_i64().unwrap();
    let r = pay(c, s, &no, amount).await;
    assert_eq!(r.status(), StatusCode::OK);
    (no, amount)
}

async fn refund(
    c: &Client,
    s: &Server,
    no: &str,
    key: &str,
    gateway: Option<&str>,
) -> (StatusCode, String) {
    let mut req = c
        .post(s.url(&format!("/api/orders/{no}/refunds")))
        .header("Idempotency-Key", key);
    if let Some(mode) = gateway {
        req = req.header("X-Demo-Gateway", mode);
    }
    let r = req.send().await.unwrap();
    (r.status(), r.text().await.unwrap())
}

/// `GET path` on the server, read as JSON.
async fn get_json(c: &Client, s: &Server, path: &str) -> Value {
    c.get(s.url(path))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The money moves of the gateway's ledger for `order_no`.
async fn moves(c: &Client, s: &Server, order_no: &str) -> usize {
    let ledger = get_json(c, s, "/api/gateway/ledger").await;
    ledger["moves"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["orderNo"] == order_no)
        .count()
}

async fn status_of(s: &Server, order_no: &str) -> String {
    s.query_text("SELECT status FROM orders WHERE order_no = $1", order_no)
        .await
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
                // Unsigned, signed with another secret, or a signature of another body: 401, and
                // the order stays PENDING.
                let right = json!({ "orderNo": no, "amountCents": amount }).to_string();
                let unsigned = c.post(s.url("/api/payments/callback")).header("Content-Type", "application/json").body(right.clone());
                let forged = c
                    .post(s.url("/api/payments/callback"))
                    .header("X-Gateway-Signature", common::gateway_signature(b"guessed", &right))
                    .body(right.clone());
                let other_body = c
                    .post(s.url("/api/payments/callback"))
                    .header("X-Gateway-Signature", signature(&json!({ "orderNo": no, "amountCents": 1 }).to_string()))
                    .body(right.clone());
                let garbage = c.post(s.url("/api/payments/callback")).header("X-Gateway-Signature", "sha256=zz").body(right.clone());
                for (what, req) in [("unsigned", unsigned), ("forged", forged), ("other body", other_body), ("garbage", garbage)] {
                    let r = req.send().await.unwrap();
                    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{what}");
                    assert!(r.headers().contains_key("www-authenticate"), "{what}");
                    assert_eq!(code(&r.text().await.unwrap()), "INVALID_SIGNATURE", "{what}");
                }
                assert_eq!(status_of(&s, no).await, "PENDING");
                // A wrong amount is refused without saying what the right one is.
                let r = pay(&c, &s, no, amount + 1).await;
                assert_eq!(r.status(), StatusCode::CONFLICT);
                let text = r.text().await.unwrap();
                assert_eq!(code(&text), "AMOUNT_MISMATCH");
                assert!(!text.contains(&amount.to_string()), "the expected amount is not revealed: {text}");
                let r = pay(&c, &s, no, amount).await;
                assert_eq!(r.status(), StatusCode::OK);
                let v: Value = r.json().await.unwrap();
                assert_eq!((v["duplicated"].as_bool(), v["order"]["status"].as_str()), (Some(false), Some("PAID")));
                let r = pay(&c, &s, no, amount).await;
                assert_eq!(r.status(), StatusCode::OK);
                assert_eq!(r.json::<Value>().await.unwrap()["duplicated"], true);
                // Another user cannot ship or confirm the order.
                let r = c.post(s.url(&format!("/api/orders/{no}/ship"))).header("X-User-Id", "2").send().await.unwrap();
                assert_eq!(r.status(), StatusCode::NOT_FOUND);
                assert_eq!(status_of(&s, no).await, "PAID");
                // Ship, then a late callback is an illegal transition; then confirm.
                let r = c.post(s.url(&format!("/api/orders/{no}/ship"))).send().await.unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                let r = pay(&c, &s, no, amount).await;
                assert_eq!(r.status(), StatusCode::CONFLICT);
                assert_eq!(code(&r.text().await.unwrap()), "ILLEGAL_TRANSITION");
                let r = c.post(s.url(&format!("/api/orders/{no}/confirm"))).header("X-User-Id", "3").send().await.unwrap();
                assert_eq!(r.status(), StatusCode::NOT_FOUND);
                let r = c.post(s.url(&format!("/api/orders/{no}/confirm"))).send().await.unwrap();
                assert_eq!(r.json::<Value>().await.unwrap()["order"]["status"], "DONE");
                let r = pay(&c, &s, "ORD-NOPE", 1).await;
                assert_eq!(r.status(), StatusCode::NOT_FOUND);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn fifty_duplicate_refunds_move_money_once() {
                let s = $start().await;
                let c = client();
                let (no, _) = paid_order(&c, &s, "k-refund").await;
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
                let ledger = get_json(&c, &s, "/api/gateway/ledger").await;
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
                let ledger = get_json(&c, &s, "/api/gateway/ledger").await;
                assert_eq!(ledger["count"], 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn thirty_refunds_under_thirty_keys_move_money_once() {
                let s = $start().await;
                let c = client();
                for round in 0..3 {
                    let (no, amount) = paid_order(&c, &s, &format!("k-race-{round}")).await;
                    let mut tasks = Vec::new();
                    for i in 0..30 {
                        let (c, url) = (c.clone(), s.url(&format!("/api/orders/{no}/refunds")));
                        tasks.push(tokio::spawn(async move {
                            let r = c.post(url).header("Idempotency-Key", format!("tab-{round}-{i}")).send().await.unwrap();
                            (r.status(), r.text().await.unwrap())
                        }));
                    }
                    let mut created = Vec::new();
                    for t in tasks {
                        let (st, body) = t.await.unwrap();
                        match st {
                            StatusCode::CREATED => created.push(body),
                            StatusCode::CONFLICT => {
                                let v: Value = serde_json::from_str(&body).unwrap();
                                let (code, current) = (v["code"].as_str().unwrap(), v["currentStatus"].as_str().unwrap());
                                assert!(
                                    matches!((code, current), ("REFUND_IN_PROGRESS", "REFUNDING") | ("ORDER_NOT_REFUNDABLE", "CANCELLED")),
                                    "a loser is told the order's state: {body}"
                                );
                            }
                            other => panic!("{other}: {body}"),
                        }
                    }
                    assert_eq!(created.len(), 1, "one 201 among thirty keys: {created:?}");
                    let answer: Value = serde_json::from_str(&created[0]).unwrap();
                    assert_eq!((answer["amountCents"].as_i64(), answer["status"].as_str()), (Some(amount), Some("CANCELLED")));
                    assert_eq!(moves(&c, &s, &no).await, 1, "one money move");
                    assert_eq!(status_of(&s, &no).await, "CANCELLED");
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn a_refund_racing_the_shipment_moves_money_only_when_it_cancels() {
                let s = $start().await;
                let c = client();
                let (mut shipped, mut cancelled) = (0, 0);
                for round in 0..12 {
                    let (no, _) = paid_order(&c, &s, &format!("k-ship-{round}")).await;
                    let mut tasks = Vec::new();
                    for i in 0..6 {
                        let (c, base, no) = (c.clone(), s.base.clone(), no.clone());
                        tasks.push(tokio::spawn(async move {
                            let r = if i % 2 == 0 {
                                c.post(format!("{base}/api/orders/{no}/ship")).send().await.unwrap()
                            } else {
                                c.post(format!("{base}/api/orders/{no}/refunds")).header("Idempotency-Key", format!("r-{i}")).send().await.unwrap()
                            };
                            r.status()
                        }));
                    }
                    for t in tasks {
                        let st = t.await.unwrap();
                        assert!(matches!(st, StatusCode::OK | StatusCode::CREATED | StatusCode::CONFLICT), "{st}");
                    }
                    let (status, moved) = (status_of(&s, &no).await, moves(&c, &s, &no).await);
                    match status.as_str() {
                        "SHIPPED" => {
                            assert_eq!(moved, 0, "a shipped order was not refunded");
                            shipped += 1;
                        }
                        "CANCELLED" => {
                            assert_eq!(moved, 1, "a cancelled order was refunded once");
                            cancelled += 1;
                        }
                        other => panic!("the order ended {other} with {moved} money moves"),
                    }
                }
                assert_eq!(shipped + cancelled, 12);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn a_lost_gateway_answer_is_finished_by_the_same_request() {
                let mut s = $start().await;
                // The client comes back before any completer would: stop it, to watch the retry.
                s.completer = None;
                let c = client();
                let (no, _) = paid_order(&c, &s, "k-lost").await;
                let (st, body) = refund(&c, &s, &no, "lost-1", Some("lose-answer")).await;
                assert_eq!((st, code(&body).as_str()), (StatusCode::BAD_GATEWAY, "GATEWAY_NO_ANSWER"));
                assert_eq!(moves(&c, &s, &no).await, 1, "the money moved; the answer was lost");
                assert_eq!(status_of(&s, &no).await, "REFUNDING");
                // Nobody else takes over the refund, and the order cannot ship meanwhile.
                let (st, body) = refund(&c, &s, &no, "lost-2", None).await;
                assert_eq!((st, code(&body).as_str()), (StatusCode::CONFLICT, "REFUND_IN_PROGRESS"));
                let r = c.post(s.url(&format!("/api/orders/{no}/ship"))).send().await.unwrap();
                assert_eq!(r.status(), StatusCode::CONFLICT);
                // The same request, retried with its key, finishes it without moving money again.
                let (st, first) = refund(&c, &s, &no, "lost-1", None).await;
                assert_eq!(st, StatusCode::CREATED, "{first}");
                assert_eq!(moves(&c, &s, &no).await, 1);
                assert_eq!(status_of(&s, &no).await, "CANCELLED");
                let (st, again) = refund(&c, &s, &no, "lost-1", None).await;
                assert_eq!((st, again), (StatusCode::OK, first));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn a_declined_refund_gives_the_order_back() {
                let s = $start().await;
                let c = client();
                let (no, _) = paid_order(&c, &s, "k-decline").await;
                let (st, body) = refund(&c, &s, &no, "dec-1", Some("decline")).await;
                assert_eq!((st, code(&body).as_str()), (StatusCode::PAYMENT_REQUIRED, "REFUND_DECLINED"));
                assert_eq!((moves(&c, &s, &no).await, status_of(&s, &no).await.as_str()), (0, "PAID"));
                let (st, body) = refund(&c, &s, &no, "dec-1", Some("maybe")).await;
                assert_eq!((st, code(&body).as_str()), (StatusCode::BAD_REQUEST, "INVALID_DEMO_GATEWAY"));
                // Another request may refund it now, once.
                let (st, body) = refund(&c, &s, &no, "dec-2", None).await;
                assert_eq!(st, StatusCode::CREATED, "{body}");
                let (st, body) = refund(&c, &s, &no, "dec-1", None).await;
                assert_eq!((st, code(&body).as_str()), (StatusCode::CONFLICT, "ORDER_NOT_REFUNDABLE"));
                assert_eq!((moves(&c, &s, &no).await, status_of(&s, &no).await.as_str()), (1, "CANCELLED"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn profile_updates_are_optimistic() {
                let s = $start().await;
                let c = client();
                let url = s.url("/api/users/2/profile");
                let p: Value = c.get(&url).header("X-User-Id", "2").send().await.unwrap().json().await.unwrap();
                assert_eq!(p["version"], 0);
                // A profile is its owner's alone: another user neither reads nor writes it.
                let r = c.get(&url).header("X-User-Id", "3").send().await.unwrap();
                assert_eq!(r.status(), StatusCode::NOT_FOUND);
                let r = c.patch(&url).json(&json!({ "nickname": "mallory", "version": 0 })).send().await.unwrap();
                assert_eq!(r.status(), StatusCode::NOT_FOUND);
                assert_eq!(code(&r.text().await.unwrap()), "USER_NOT_FOUND");
                let r = c.patch(&url).header("X-User-Id", "2").json(&json!({ "nickname": "a2", "version": 0 })).send().await.unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                assert_eq!(r.json::<Value>().await.unwrap()["version"], 1);
                let r = c.patch(&url).header("X-User-Id", "2").json(&json!({ "nickname": "late", "version": 0 })).send().await.unwrap();
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
                    ("callback unsigned", 401, "INVALID_SIGNATURE", json(c.post(s.url("/api/payments/callback"))).body("{")),
                    ("callback bad JSON", 400, "INVALID_BODY", json(c.post(s.url("/api/payments/callback"))).header("X-Gateway-Signature", signature("{")).body("{")),
                    ("callback other JSON", 422, "INVALID_BODY", c.post(s.url("/api/payments/callback")).header("X-Gateway-Signature", signature("[1]")).body("[1]")),
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

/// The order's status once it is `want`, or as it is after 30 seconds.
async fn status_within(s: &Server, order_no: &str, want: &str) -> String {
    let mut status = String::new();
    for _ in 0..300 {
        status = status_of(s, order_no).await;
        if status == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    status
}

/// How many `order.refunded` events of `order_no` the outbox holds, and the outbox.
async fn refunded_events(c: &Client, s: &Server, order_no: &str) -> (usize, Value) {
    let outbox: Value = c
        .get(s.url("/api/outbox"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let n = outbox["pending"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["topic"] == "order.refunded" && e["partitionKey"] == order_no)
        .count();
    (n, outbox)
}

/// A refund whose gateway answer is lost and that nobody retries: the completer finishes it
/// (one money move, the order CANCELLED, one `order.refunded` event), and the client's late
/// retry gets the completer's answer.
async fn a_lost_answer_nobody_retries_is_finished_by_the_completer(s: Server) {
    assert!(s.completer.is_some(), "the service runs a completer");
    let c = client();
    let (no, _) = paid_order(&c, &s, "k-abandoned").await;
    let (st, body) = refund(&c, &s, &no, "gone-1", Some("lose-answer")).await;
    assert_eq!(
        (st, code(&body).as_str()),
        (StatusCode::BAD_GATEWAY, "GATEWAY_NO_ANSWER")
    );
    assert_eq!(status_of(&s, &no).await, "REFUNDING");
    // The client never comes back. Within its resume delay and a round or two, the refund is done.
    let status = status_within(&s, &no, "CANCELLED").await;
    assert_eq!(status, "CANCELLED", "the completer finished the refund");
    assert_eq!(moves(&c, &s, &no).await, 1, "the money moved once");
    let (refunded, outbox) = refunded_events(&c, &s, &no).await;
    assert_eq!(refunded, 1, "one order.refunded event: {outbox}");
    // The client's late retry is answered with the completer's refund, and moves nothing.
    let (st, late) = refund(&c, &s, &no, "gone-1", None).await;
    assert_eq!(st, StatusCode::OK, "{late}");
    let late: Value = serde_json::from_str(&late).unwrap();
    assert_eq!(
        (late["orderNo"].as_str(), late["status"].as_str()),
        (Some(no.as_str()), Some("CANCELLED"))
    );
    assert_eq!(moves(&c, &s, &no).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_answer_nobody_retries_is_finished_by_the_completer_on_sqlite() {
    a_lost_answer_nobody_retries_is_finished_by_the_completer(sqlite().await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn a_lost_answer_nobody_retries_is_finished_by_the_completer_on_postgres() {
    a_lost_answer_nobody_retries_is_finished_by_the_completer(postgres().await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn a_lost_answer_nobody_retries_is_finished_by_the_completer_on_mysql() {
    a_lost_answer_nobody_retries_is_finished_by_the_completer(mysql().await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
async fn a_lost_answer_nobody_retries_is_finished_by_the_completer_on_redis() {
    a_lost_answer_nobody_retries_is_finished_by_the_completer(redis().await).await
}

e2e!(on_sqlite, sqlite);
e2e!(on_postgres, postgres, #[cfg_attr(not(idem_postgres), ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…")]);
e2e!(on_mysql, mysql, #[cfg_attr(not(idem_mysql), ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…")]);
e2e!(on_redis, redis, #[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]);

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_server(database_url: &str) -> (common::service::Service, String) {
    spawn_server_with(database_url, &[])
}

/// The payment gateway's secret of the example processes: set, as in production.
const PROCESS_SECRET: &str = "e2e-webhook-secret";

/// The example's binary on `database_url`, with more environment (`IDEM_STORE_URL`, …).
fn spawn_server_with(
    database_url: &str,
    env: &[(&str, &str)],
) -> (common::service::Service, String) {
    let env: Vec<(&str, &str)> = [(app::WEBHOOK_SECRET_VAR, PROCESS_SECRET)]
        .into_iter()
        .chain(env.iter().copied())
        .collect();
    let service = common::service::Service::start(database_url, "127.0.0.1:0", &env);
    let base = service.base.clone();
    (service, base)
}

#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_server_processes_share_postgres() {
    let url = common::pg_url();
    let schema = common::PgSchema::create(&url, 2).await;
    let db_url = schema.scoped_url();
    let (_a, base_a) = spawn_server(&db_url);
    let (_b, base_b) = spawn_server(&db_url);
    sixty_posts_make_one_order(&db_url, &base_a, &base_b).await;
}

#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_server_processes_share_mysql() {
    let database = common::MyDatabase::create(&common::mysql_url(), 2).await;
    let (_a, base_a) = spawn_server(&database.url);
    let (_b, base_b) = spawn_server(&database.url);
    sixty_posts_make_one_order(&database.url, &base_a, &base_b).await;
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
    let db_url = schema.scoped_url();
    let env = [
        ("IDEM_STORE_URL", &nodes.join(",")[..]),
        ("IDEM_STORE_PREFIX", &keys.prefix[..]),
    ];
    let (_a, base_a) = spawn_server_with(&db_url, &env);
    let (_b, base_b) = spawn_server_with(&db_url, &env);
    sixty_posts_make_one_order(&db_url, &base_a, &base_b).await;
    assert_eq!(keys.count().await, 1, "the one record is in the cluster");
}

/// Sixty first requests of one key, half to each process, on the database at `db_url`.
async fn sixty_posts_make_one_order(db_url: &str, base_a: &str, base_b: &str) {
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
    let n = Server::observing(base_a.to_owned(), db_url)
        .count_orders()
        .await;
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
            let callback =
                json!({ "orderNo": no, "amountCents": order["amountCents"] }).to_string();
            // PAYMENT_WEBHOOK_SECRET replaces the development secret: a callback signed with
            // that one is refused.
            let r = c
                .post(format!("{base}/api/payments/callback"))
                .header("Content-Type", "application/json")
                .header("X-Gateway-Signature", signature(&callback))
                .body(callback.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
            let r = c
                .post(format!("{base}/api/payments/callback"))
                .header("Content-Type", "application/json")
                .header(
                    "X-Gateway-Signature",
                    common::gateway_signature(PROCESS_SECRET.as_bytes(), &callback),
                )
                .body(callback)
                .send()
                .await
                .unwrap();
            // Paid now, or (after the restart) long since refunded: signed either way.
            assert_ne!(
                r.status(),
                StatusCode::UNAUTHORIZED,
                "{}",
                r.text().await.unwrap()
            );
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
    let mut child = Command::new(common::example_binary("refund_service"))
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

/// `--help` prints the settings and serves nothing; an unknown argument is an error, exit 2.
#[test]
fn help_prints_the_settings_instead_of_serving() {
    let bin = common::example_binary("refund_service");
    let out = Command::new(&bin)
        .arg("--help")
        .env("IDEM_ADDR", "127.0.0.1:0")
        .output()
        .expect("run the example");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for setting in [
        "DATABASE_URL",
        "IDEM_STORE_URL",
        "IDEM_ADDR",
        "NATS_URL",
        "PAYMENT_WEBHOOK_SECRET",
    ] {
        assert!(text.contains(setting), "--help names {setting}: {text}");
    }
    assert!(!text.contains("listening"), "--help does not serve: {text}");
    let out = Command::new(&bin)
        .arg("--port=80")
        .env("IDEM_ADDR", "127.0.0.1:0")
        .output()
        .expect("run the example");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("takes no arguments"));
}

/// The example on `addr` with only the environment given (no secrets from CI's): its exit
/// status and what it wrote to stderr when it stopped at once, or its address when it serves.
fn start_on(addr: &str, env: &[(&str, &str)]) -> Result<(Process, String), (Option<i32>, String)> {
    let file = common::SqliteFile::new();
    let mut child = Command::new(common::example_binary("refund_service"))
        .env("IDEM_ADDR", addr)
        .env("DATABASE_URL", &file.url)
        .env("RUST_LOG", "warn")
        .env_remove(app::WEBHOOK_SECRET_VAR)
        .env_remove(admin::ADMIN_TOKEN_VAR)
        .env_remove(app::ALLOW_DEV_SECRETS_VAR)
        .env_remove("NATS_URL")
        .env_remove("IDEM_STORE_URL")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the example");
    if let Ok(base) = common::service::listening_on(&mut child) {
        return Ok((Process(child), base));
    }
    let out = child.wait_with_output().unwrap();
    Err((
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Bound to an address others can reach, the example refuses to start with the published
/// development secrets (the webhook secret anyone can sign a payment callback with, the admin
/// token anyone can release claims with), and says what to set; on the loopback it starts
/// without them, and an explicit opt-in lets it start anyway.
#[test]
fn the_example_refuses_development_secrets_on_an_address_others_reach() {
    let webhook = (app::WEBHOOK_SECRET_VAR, "a-real-webhook-secret");
    let token = (admin::ADMIN_TOKEN_VAR, "a-real-admin-token");
    for (env, missing) in [
        (
            &[][..],
            &[app::WEBHOOK_SECRET_VAR, admin::ADMIN_TOKEN_VAR][..],
        ),
        (&[webhook][..], &[admin::ADMIN_TOKEN_VAR][..]),
        (&[token][..], &[app::WEBHOOK_SECRET_VAR][..]),
        // Set, but to the published value: still the development secret.
        (
            &[(app::WEBHOOK_SECRET_VAR, app::DEV_WEBHOOK_SECRET), token][..],
            &[app::WEBHOOK_SECRET_VAR][..],
        ),
    ] {
        let Err((code, stderr)) = start_on("0.0.0.0:0", env) else {
            panic!("served on 0.0.0.0 with {env:?}")
        };
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("0.0.0.0"), "names the address: {stderr}");
        for var in missing {
            assert!(stderr.contains(var), "names {var}: {stderr}");
        }
        assert!(
            stderr.contains(app::ALLOW_DEV_SECRETS_VAR),
            "names the opt-in: {stderr}"
        );
    }
    // Both set: it serves on 0.0.0.0.
    let (_served, base) = start_on("0.0.0.0:0", &[webhook, token]).expect("serves");
    assert!(base.starts_with("http://0.0.0.0:"), "{base}");
    // The opt-in, said out loud: it serves with them.
    let (_served, _) = start_on("0.0.0.0:0", &[(app::ALLOW_DEV_SECRETS_VAR, "1")]).expect("serves");
    // The loopback needs nothing, by address or by name.
    for addr in ["127.0.0.1:0", "[::1]:0", "localhost:0"] {
        if addr == "[::1]:0" && std::net::TcpListener::bind("[::1]:0").is_err() {
            continue;
        }
        let (_served, _) = start_on(addr, &[]).unwrap_or_else(|e| panic!("{addr}: {e:?}"));
    }
}

/// The service is killed (SIGKILL) right after a refund's gateway answer was lost, before its
/// completer's first try; nobody retries. The restarted service's completer finishes the refund
/// from the record the killed one left: one money move, one `order.refunded` event.
async fn a_refund_left_by_a_killed_service_is_finished_after_its_restart(mut s: Server) {
    // The in-process server only made the database (its completer stopped, so that only the
    // service's processes can finish the refund); the service runs as its own processes.
    s.completer = None;
    let db_url = s.db_url.clone();
    let env = [(app::WEBHOOK_SECRET_VAR, app::DEV_WEBHOOK_SECRET)];
    let (first, base) = spawn_server_with(&db_url, &env);
    let at = |base: String| Server::observing(base, &db_url);
    let c = client();
    let one = at(base);
    let (no, _) = paid_order(&c, &one, "k-killed").await;
    let (st, body) = refund(&c, &one, &no, "killed-1", Some("lose-answer")).await;
    assert_eq!(
        (st, code(&body).as_str()),
        (StatusCode::BAD_GATEWAY, "GATEWAY_NO_ANSWER")
    );
    drop(first); // SIGKILL, within the claim's one-second resume delay
    assert_eq!(
        status_of(&one, &no).await,
        "REFUNDING",
        "killed before anything finished it"
    );
    let (_second, base) = spawn_server_with(&db_url, &env);
    let two = at(base);
    let status = status_within(&two, &no, "CANCELLED").await;
    assert_eq!(
        status, "CANCELLED",
        "the restarted service's completer finished it"
    );
    assert_eq!(moves(&c, &two, &no).await, 1, "the money moved once");
    let (refunded, outbox) = refunded_events(&c, &two, &no).await;
    assert_eq!(refunded, 1, "{outbox}");
    let (st, late) = refund(&c, &two, &no, "killed-1", None).await;
    assert_eq!(st, StatusCode::OK, "{late}");
    drop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_left_by_a_killed_service_is_finished_after_its_restart_on_sqlite() {
    a_refund_left_by_a_killed_service_is_finished_after_its_restart(sqlite().await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn a_refund_left_by_a_killed_service_is_finished_after_its_restart_on_postgres() {
    a_refund_left_by_a_killed_service_is_finished_after_its_restart(postgres().await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn a_refund_left_by_a_killed_service_is_finished_after_its_restart_on_mysql() {
    a_refund_left_by_a_killed_service_is_finished_after_its_restart(mysql().await).await
}

/// The service serves its OpenAPI document, and each guarded operation in it states what the
/// handler's `#[idempotent]` declares: `create_order` (`lease = "30s"`, scope
/// `order:<user.id>`) and `refund` (`lease = "20s"`, scope `refund:<order_no>`), the key header,
/// the refusals with their codes; the lookup by key, which is not guarded, states none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_service_serves_its_idempotency_contract_as_openapi() {
    let server = sqlite().await;
    let doc = get_json(&Client::new(), &server, "/api/openapi.json").await;
    for (path, scope, lease) in [
        ("/api/orders", "order:<user.id>", 30),
        ("/api/orders/{order_no}/refunds", "refund:<order_no>", 20),
    ] {
        let op = &doc["paths"][path]["post"];
        let contract = &op["x-idempotency"];
        assert_eq!(contract["scope"], scope, "{op:#}");
        assert_eq!(contract["leaseSeconds"], lease, "{op:#}");
        assert_eq!(contract["header"], "Idempotency-Key");
        assert!(
            op["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "Idempotency-Key"
                    && p["in"] == "header"
                    && p["required"] == true),
            "{op:#}"
        );
        for status in ["400", "409", "422"] {
            assert!(
                op["responses"][status]["content"]["application/problem+json"].is_object(),
                "{status} in {op:#}"
            );
        }
        for status in ["200", "201"] {
            assert!(
                op["responses"][status]["headers"]["Idempotent-Replayed"].is_object(),
                "{status} in {op:#}"
            );
        }
    }
    let lookup = &doc["paths"]["/api/orders/by-key/{key}"]["get"];
    assert!(lookup.is_object(), "{doc:#}");
    assert!(lookup.get("x-idempotency").is_none(), "{lookup:#}");
}
