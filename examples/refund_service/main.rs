//! The refund service: idem's flows end to end over HTTP.
//!
//! ```text
//! cargo run --example refund_service                       # SQLite file refund_service.db
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run --example refund_service
//! DATABASE_URL=mysql://root@127.0.0.1:3306/refund_demo cargo run --example refund_service
//! IDEM_STORE_URL=redis://127.0.0.1:6379 cargo run --example refund_service   # records in Redis
//! IDEM_STORE_URL=redis://127.0.0.1:7101,redis://127.0.0.1:7102 cargo run --example refund_service
//! IDEM_STORE_PREFIX=staging:idem: …                        # another key prefix (default idem:)
//! IDEM_ADDR=127.0.0.1:8080 cargo run --example refund_service
//! NATS_URL=nats://127.0.0.1:4222 cargo run --example refund_service    # publishes its events
//! PAYMENT_WEBHOOK_SECRET=… cargo run --example refund_service    # the gateway's callback secret
//! ```
//!
//! On the loopback (the default) it starts with published development secrets when
//! `PAYMENT_WEBHOOK_SECRET` and `ADMIN_TOKEN` are unset; on an address other machines reach it
//! refuses to (exit code 2, naming what to set) unless `ALLOW_DEV_SECRETS=1`.
//!
//! See the guide (`src/guide/walkthrough.md`) for a walkthrough with curl. `GET /metrics`
//! serves idem's counters in the Prometheus text format; `/admin` is idem's admin view of the records, for operators with the
//! `ADMIN_TOKEN` (`Authorization: Bearer …`).

mod admin;
mod app;
mod db;
mod events;
mod gateway;
mod metrics;

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

const USAGE: &str = "\
refund_service: the idem example service (orders, payments, refunds) on 127.0.0.1:3000

usage: cargo run --example refund_service

Configured by the environment:
  DATABASE_URL            sqlite://FILE (default sqlite://refund_service.db), postgres://…,
                          or mysql://… (MySQL or MariaDB)
  IDEM_STORE_URL          redis://… (several, comma-separated, for a cluster): keep the
                          idempotency records in Redis instead of the database
  IDEM_STORE_PREFIX       the Redis key prefix (default idem:)
  IDEM_ADDR               the address to listen on (default 127.0.0.1:3000)
  NATS_URL                nats://…: publish the outbox's events to JetStream
  PAYMENT_WEBHOOK_SECRET  the secret the payment gateway signs its callbacks with
                          (default: the development secret dev-webhook-secret)
  ADMIN_TOKEN             the token operators send to /admin (Authorization: Bearer …)
                          (default: the development token dev-admin-token)
  ALLOW_DEV_SECRETS       1: start with the development secret or token on an address other
                          machines reach (refused otherwise; the loopback needs neither)
  RUST_LOG                the log filter (default info)
";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Some(arg) = std::env::args().nth(1) {
        if arg == "--help" || arg == "-h" {
            print!("{USAGE}");
            return Ok(());
        }
        eprint!("refund_service takes no arguments, not {arg:?}\n\n{USAGE}");
        std::process::exit(2);
    }
    tracing_subscriber::fmt()
        // Colour only a terminal: logs written to a file or a pipe stay plain text.
        .with_ansi(std::io::stdout().is_terminal())
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,async_nats=warn")),
        )
        .init();
    let addr = std::env::var("IDEM_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host(&addr)
        .await
        .map_err(|e| format!("IDEM_ADDR {addr:?} is not an address to listen on: {e}"))?
        .collect();
    // Before anything is connected or created: the published secrets never serve others.
    if let Some(why) = app::refuse_dev_secrets(&addr, &addrs) {
        eprintln!("refund_service: {why}");
        std::process::exit(2);
    }
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://refund_service.db".into());
    // Idempotency records live with the orders unless IDEM_STORE_URL names a Redis server or
    // cluster (comma-separated nodes); orders stay in DATABASE_URL's database either way.
    let redis = match std::env::var("IDEM_STORE_URL") {
        Ok(store) if store.starts_with("redis") => {
            let prefix = std::env::var("IDEM_STORE_PREFIX").ok();
            Some(app::connect_redis(&store, prefix.as_deref()).await?)
        }
        Ok(store) if !store.is_empty() => {
            return Err(format!(
                "IDEM_STORE_URL must be redis://… (or several, comma-separated), not {store:?}"
            )
            .into());
        }
        _ => None,
    };
    let nats = std::env::var("NATS_URL").ok();
    // Before the app: it counts from its first request (and its outbox relay from the start).
    let metrics = metrics::router()?;
    // The completer runs as long as the service: it finishes refunds nobody came back for.
    let (router, database, _completer) = app::build(&url, redis, nats.as_deref()).await?;
    let router = router.merge(metrics);
    let listener = tokio::net::TcpListener::bind(&addrs[..]).await?;
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
    if app::WebhookSecret::from_env().is_dev() {
        tracing::warn!(
            "payment callbacks are checked against the development secret {:?}: set {} to the gateway's secret",
            app::DEV_WEBHOOK_SECRET,
            app::WEBHOOK_SECRET_VAR
        );
    }
    if admin::AdminToken::from_env().is_dev() {
        tracing::warn!(
            "the admin view /admin admits the development token {:?}: set {} to an operators' secret",
            admin::DEV_ADMIN_TOKEN,
            admin::ADMIN_TOKEN_VAR
        );
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
