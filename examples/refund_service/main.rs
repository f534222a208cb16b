//! The refund service: idem's flows end to end over HTTP.
//!
//! ```text
//! cargo run --example refund_service                       # SQLite file refund_service.db
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run --example refund_service
//! IDEM_ADDR=127.0.0.1:8080 cargo run --example refund_service
//! NATS_URL=nats://127.0.0.1:4222 cargo run --example refund_service    # publishes its events
//! ```
//!
//! See the README for a walkthrough with curl.

mod app;
mod db;
mod events;
mod gateway;

use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,async_nats=warn")),
        )
        .init();
    let addr = std::env::var("IDEM_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://refund_service.db".into());
    let nats = std::env::var("NATS_URL").ok();
    let (router, database) = app::build(&url, nats.as_deref()).await?;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let events = match &nats {
        Some(nats) => format!("order events published to NATS JetStream at {nats}"),
        None => "order events kept in the outbox, GET /api/outbox; set NATS_URL to publish them"
            .to_owned(),
    };
    // Tests read this one line to find the port when IDEM_ADDR asks for port 0: print nothing
    // else to stdout.
    println!(
        "refund_service listening on http://{} ({database}); {events}",
        listener.local_addr()?
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
