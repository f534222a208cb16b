//! A checkout client that recovers from a timeout the safe way: one key per checkout, and on a
//! timeout it asks the server by key before sending anything again.
//!
//! ```text
//! cargo run --example refund_service     # in one terminal
//! cargo run --example checkout_client    # in another (IDEM_URL overrides http://127.0.0.1:3000)
//! ```
//!
//! The first attempt asks the demo server to be slow (`X-Demo-Delay-Ms`) and gives up after
//! half a second, so the recovery path runs. The outcome of a timeout is unknown, so the client
//! asks `GET /api/orders/by-key/{key}`: 200 means the order exists (take it), 409 that it is
//! still being created (wait `Retry-After`, ask again), 404 that it does not exist (send it
//! again, with the same key). Here the answer is 404: when the client hung up, the server
//! dropped the unfinished request and idem released its claim at once, so nothing was created
//! and the same key is free for the retry.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::{Client, StatusCode};

/// One key per checkout, generated when the checkout starts and kept until it has an answer.
fn checkout_key() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("checkout-{nanos:x}-{:x}", std::process::id())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let base = std::env::var("IDEM_URL").unwrap_or_else(|_| "http://127.0.0.1:3000".into());
    let client = Client::new();
    let key = checkout_key();
    let body = r#"{"skuId": 9001, "qty": 2}"#;
    println!("checkout key {key}");

    let submit = |delay_ms: u64, timeout: Duration| {
        client
            .post(format!("{base}/api/orders"))
            .header("Idempotency-Key", &key)
            .header("Content-Type", "application/json")
            .header("X-Demo-Delay-Ms", delay_ms.to_string())
            .body(body)
            .timeout(timeout)
            .send()
    };

    match submit(1500, Duration::from_millis(500)).await {
        Ok(r) => {
            println!("answered at once: {} {}", r.status(), r.text().await?);
            return Ok(());
        }
        Err(e) if e.is_timeout() => println!("timed out: the order may or may not exist"),
        Err(e) => return Err(e.into()),
    }

    loop {
        let r = client
            .get(format!("{base}/api/orders/by-key/{key}"))
            .send()
            .await?;
        match r.status() {
            StatusCode::OK => {
                println!("it happened: 200 {}", r.text().await?);
                return Ok(());
            }
            StatusCode::CONFLICT => {
                let wait = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1);
                println!("still running: 409, asking again in {wait} s");
                tokio::time::sleep(Duration::from_secs(wait)).await;
            }
            StatusCode::NOT_FOUND => {
                println!("never arrived: 404, sending it again with the same key");
                let r = submit(0, Duration::from_secs(10)).await?;
                println!("{} {}", r.status(), r.text().await?);
                return Ok(());
            }
            other => return Err(format!("unexpected {other}: {}", r.text().await?).into()),
        }
    }
}
