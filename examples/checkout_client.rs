//! A checkout client that recovers from a timeout the safe way, on `idem::client`: one key per
//! checkout, and on a timeout it asks the server by key before sending anything again.
//!
//! ```text
//! cargo run --example refund_service     # in one terminal
//! cargo run --example checkout_client    # in another (IDEM_URL overrides http://127.0.0.1:3000)
//! ```
//!
//! The first send asks the demo server to be slow (`X-Demo-Delay-Ms`, set on the first attempt
//! only by a small middleware below the client's) and gives up after half a second, so the
//! recovery path runs. The outcome of a timeout is unknown, so the client asks
//! `GET /api/orders/by-key/{key}`: 200 means the order exists (take it), 409 that it is still
//! being created (wait `Retry-After`, then send it again with the same key, which the server
//! answers 409 until the first attempt ends and replays after), 404 that it does not exist (send
//! it again, with the same key). Here the answer is 404: when the client hung up, the server
//! dropped the unfinished request and idem released its claim at once, so nothing was created
//! and the same key is free for the retry.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idem::client::reqwest::header::HeaderValue;
use idem::client::reqwest::{Client, Request, Response};
use idem::client::reqwest_middleware::{self, ClientBuilder, Next};
use idem::client::{Attempt, Extensions, Idempotency, Lookup, Operation, Outcome, Retry};

/// What a middleware written as a function returns.
type Answer<'a> = Pin<Box<dyn Future<Output = reqwest_middleware::Result<Response>> + Send + 'a>>;

/// Below the idempotency middleware, once per request it makes: says what goes out and what
/// comes back, and asks the demo server to be slow on the call's first request.
fn show_and_slow_first<'a>(
    mut req: Request,
    extensions: &'a mut Extensions,
    next: Next<'a>,
) -> Answer<'a> {
    let attempt = extensions.get::<Attempt>().cloned();
    if let Some(attempt) = &attempt {
        if attempt.number() == 1 {
            req.headers_mut()
                .insert("x-demo-delay-ms", HeaderValue::from_static("1500"));
        }
        println!(
            "request {}: {} {}",
            attempt.number(),
            req.method(),
            req.url().path()
        );
    }
    Box::pin(async move {
        let result = next.run(req, extensions).await;
        match &result {
            Ok(r) => println!("  {}", r.status()),
            Err(e) if e.is_timeout() => println!("  timed out: the order may or may not exist"),
            Err(e) => println!("  {e}"),
        }
        result
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let base = std::env::var("IDEM_URL").unwrap_or_else(|_| "http://127.0.0.1:3000".into());
    let client = ClientBuilder::new(Client::new())
        .with(
            Idempotency::new()
                .retry(Retry::DEFAULT.max_elapsed(Duration::from_secs(30)))
                .lookup(Lookup::new("/api/orders/by-key/{key}")?),
        )
        .with(show_and_slow_first)
        .build();
    // One checkout, one key: the middleware makes it and keeps it until the checkout has a
    // definite answer, whatever the number of sends and lookups.
    let checkout = client
        .post(format!("{base}/api/orders"))
        .header("Content-Type", "application/json")
        .body(r#"{"skuId": 9001, "qty": 2}"#)
        .timeout(Duration::from_millis(500))
        .with_extension(Operation::new("checkout-9001"));
    let sent = idem::client::send(checkout).await?;
    let attempts = &sent.attempts;
    println!(
        "checkout key {}: {} sends, {} lookups",
        attempts.key(),
        attempts.sent(),
        attempts.lookups()
    );
    match sent.outcome {
        Outcome::First(r) => println!("created: {} {}", r.status(), r.text().await?),
        Outcome::Replayed(r) => println!("it had happened: {} {}", r.status(), r.text().await?),
        Outcome::StillRunning { retry_after } => {
            println!("still being created; ask again in {retry_after:?} with the same key")
        }
        Outcome::Refused(refusal) => return Err(format!("refused: {refusal}").into()),
        other => return Err(format!("unexpected: {other:?}").into()),
    }
    Ok(())
}
