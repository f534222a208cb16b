//! The refund service's events over real HTTP: the payment callback and the refund enqueue
//! `order.paid` and `order.refunded` with their transitions, once each however often they are
//! called, and `GET /api/outbox` shows them while no relay runs.

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

use reqwest::Client;
use serde_json::{Value, json};

async fn serve(url: &str) -> String {
    let (router, _, completer) = app::build(url, None, None)
        .await
        .expect("build the service");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    // The completer runs as long as the server does.
    tokio::spawn(async move {
        let _completer = completer;
        axum::serve(listener, router).await.unwrap()
    });
    base
}

async fn outbox(c: &Client, base: &str) -> Value {
    c.get(format!("{base}/api/outbox"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn transitions_announce_themselves_once(base: String) {
    let c = Client::new();
    let order: Value = c
        .post(format!("{base}/api/orders"))
        .header("Idempotency-Key", "k-events")
        .json(&json!({ "skuId": 7, "qty": 2 }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let no = order["orderNo"].as_str().unwrap().to_owned();
    let amount = order["amountCents"].as_i64().unwrap();
    assert!(
        outbox(&c, &base).await["pending"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // A wrong amount changes nothing and announces nothing; the right one, twice, announces once.
    for cents in [amount + 1, amount, amount] {
        let body = json!({ "orderNo": no, "amountCents": cents }).to_string();
        c.post(format!("{base}/api/payments/callback"))
            .header("Content-Type", "application/json")
            .header(
                "X-Gateway-Signature",
                common::gateway_signature(app::DEV_WEBHOOK_SECRET.as_bytes(), &body),
            )
            .body(body)
            .send()
            .await
            .unwrap();
    }
    let o = outbox(&c, &base).await;
    assert_eq!(o["relay"], "off: set NATS_URL to publish the events");
    let pending = o["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{o}");
    assert_eq!(pending[0]["topic"], "order.paid");
    assert_eq!(pending[0]["partitionKey"], no.as_str());
    assert_eq!(
        pending[0]["payload"],
        json!({ "orderNo": no, "amountCents": amount })
    );
    assert_eq!(
        pending[0]["id"],
        idem::outbox::event_id("order", &no, "paid").as_str()
    );

    // The refund, and its retry: one order.refunded, its id from the order (refunded once).
    for _ in 0..2 {
        let r = c
            .post(format!("{base}/api/orders/{no}/refunds"))
            .header("Idempotency-Key", "refund-events")
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }
    let o = outbox(&c, &base).await;
    let pending = o["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 2, "{o}");
    assert_eq!(pending[1]["topic"], "order.refunded");
    assert_eq!(
        pending[1]["id"],
        idem::outbox::event_id("order", &no, "refunded").as_str()
    );
    assert_eq!(pending[1]["payload"]["refundId"], "re_000001");
}

#[tokio::test]
async fn on_sqlite() {
    let file = common::SqliteFile::new();
    transitions_announce_themselves_once(serve(&file.url).await).await;
}

#[tokio::test]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn on_postgres() {
    let schema = common::PgSchema::create(&common::pg_url(), 4).await;
    transitions_announce_themselves_once(serve(&schema.scoped_url()).await).await;
}

#[tokio::test]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn on_mysql() {
    let database = common::MyDatabase::create(&common::mysql_url(), 1).await;
    transitions_announce_themselves_once(serve(&database.url).await).await;
}
