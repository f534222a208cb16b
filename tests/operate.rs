//! Operating the refund service: a claim stuck since its process was killed mid-request (its
//! lease still running), found and released with the `idem` tool; the retry then runs once, and
//! the dead owner's late completion is refused, on SQLite, PostgreSQL and MySQL. And the admin
//! view under `/admin`, for operators only.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use idem::record::ClaimRef;
use idem::{Error, MySqlStore, PgStore, SqliteStore, Store, StoredResponse};
use serde_json::Value;

/// A service process, killed when dropped.
struct Service {
    child: Child,
    base: String,
}

impl Service {
    /// Starts the refund service on the database at `url`, on a port of its own.
    fn start(url: &str, env: &[(&str, &str)]) -> Service {
        let mut command = Command::new(common::example_binary("refund_service"));
        command
            .env("IDEM_ADDR", "127.0.0.1:0")
            .env("DATABASE_URL", url)
            .env("RUST_LOG", "warn")
            .env_remove("NATS_URL")
            .env_remove("IDEM_STORE_URL")
            .env_remove("ADMIN_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("start the example");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        // Keep reading what it logs, so that it never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while stdout.read_line(&mut sink).is_ok_and(|n| n > 0) {
                sink.clear();
            }
        });
        let base = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_owned();
        Service { child, base }
    }

    /// SIGKILL: no graceful shutdown, no release of the claims in flight.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `idem` binary, built from the current sources.
fn idem_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-q", "-p", "idem-cli", "--bin", "idem"])
        .status()
        .unwrap();
    assert!(status.success(), "could not build the idem tool");
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    dir.join(format!("idem{}", std::env::consts::EXE_SUFFIX))
}

/// `idem args… --store url`, which must succeed.
fn idem(bin: &PathBuf, url: &str, args: &[&str]) -> Output {
    let out = Command::new(bin)
        .args(args)
        .args(["--store", url])
        .env_remove("IDEM_STORE_URL")
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "idem {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap()
}

const KEY: &str = "op-kill-1";
const ORDER: &str = r#"{"skuId": 3, "qty": 2}"#;

async fn order(
    c: &reqwest::Client,
    base: &str,
    delay_ms: u64,
) -> reqwest::Result<reqwest::Response> {
    c.post(format!("{base}/api/orders"))
        .header("Idempotency-Key", KEY)
        .header("Content-Type", "application/json")
        .header("X-Demo-Delay-Ms", delay_ms.to_string())
        .body(ORDER)
        .send()
        .await
}

/// The completion of `claim` with `response`, as an owner presumed dead would send it, through
/// a store of its own on the database at `url`.
async fn complete_late(
    url: &str,
    claim: ClaimRef<'_>,
    response: &StoredResponse,
) -> idem::Result<()> {
    if url.starts_with("postgres") {
        let store = PgStore::builder().background_purge(false);
        store.connect(url).await?.complete(claim, response).await
    } else if url.starts_with("mysql") {
        let store = MySqlStore::builder().background_purge(false);
        store.connect(url).await?.complete(claim, response).await
    } else {
        let store = SqliteStore::builder().background_purge(false);
        store.connect(url).await?.complete(claim, response).await
    }
}

crate::on_every_database!(
    a_claim_stuck_by_a_killed_service_is_released_with_the_tool_and_the_retry_runs_once
);

/// A slow order creation on the database at `url`, its service killed while it runs.
async fn a_claim_stuck_by_a_killed_service_is_released_with_the_tool_and_the_retry_runs_once(
    url: &str,
) {
    let tool = idem_binary();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    // A slow order creation, and the service killed while it runs.
    let service = Service::start(url, &[]);
    let in_flight = tokio::spawn({
        let (c, base) = (c.clone(), service.base.clone());
        async move { order(&c, &base, 10_000).await }
    });
    let claimed = common::until(Duration::from_secs(10), || {
        let out = idem(
            &tool,
            url,
            &["records", "list", "--state", "in_progress", "--json"],
        );
        json(&out).as_array().is_some_and(|a| !a.is_empty())
    })
    .await;
    assert!(claimed, "the request never claimed its key");
    service.kill();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the killed service answered"
    );

    // The claim is stuck: in progress, its owner gone, its lease still running.
    let stuck = json(&idem(
        &tool,
        url,
        &["records", "list", "--state", "in_progress", "--json"],
    ));
    let stuck = stuck.as_array().unwrap();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0]["key"], KEY);
    let scope = stuck[0]["scope"].as_str().unwrap().to_owned();
    assert_eq!(scope, "order:1");
    let dead_fence = stuck[0]["fence"].as_u64().unwrap();
    assert!(
        stuck[0]["lease_remaining_ms"].as_u64().unwrap() > 10_000,
        "{stuck:?}"
    );

    // Restarted, the service answers a retry "in progress" until the lease runs out...
    let service = Service::start(url, &[]);
    let res = order(&c, &service.base, 0).await.unwrap();
    assert_eq!(res.status(), 409);

    // ...or until an operator releases the claim: the fence moves on.
    let released = json(&idem(
        &tool,
        url,
        &["records", "release", &scope, KEY, "--yes", "--json"],
    ));
    assert_eq!(released["released"], true, "{released}");
    assert!(
        released["fence"].as_u64().unwrap() > dead_fence,
        "{released}"
    );

    // The retry runs once: one order, and the next retry replays it.
    let res = order(&c, &service.base, 0).await.unwrap();
    assert_eq!(res.status(), 201);
    let first: Value = res.json().await.unwrap();
    let res = order(&c, &service.base, 0).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(res.json::<Value>().await.unwrap(), first);
    drop(service);
    let orders: i64 = crate::scalar_at!(
        url,
        "SELECT COUNT(*) FROM orders WHERE order_no = $1",
        first["orderNo"].as_str().unwrap()
    );
    assert_eq!(orders, 1);
    let record = json(&idem(
        &tool,
        url,
        &["records", "show", &scope, KEY, "--json"],
    ));
    assert_eq!(record["state"], "completed");
    assert_eq!(record["attempt"], 2, "{record}");

    // Had the killed owner woken up, its completion would have been refused, and the answer
    // stored by the retry kept.
    let late = complete_late(
        url,
        ClaimRef {
            scope: &scope,
            key: KEY,
            fence: dead_fence,
        },
        &StoredResponse::ok(b"late".to_vec()),
    )
    .await;
    assert!(matches!(late, Err(Error::FenceLost { .. })), "{late:?}");
    let record = json(&idem(
        &tool,
        url,
        &["records", "show", &scope, KEY, "--json"],
    ));
    assert_eq!(record["response"]["status"], 201, "{record}");
}

crate::on_every_database!(the_admin_view_is_for_operators_with_the_token_only);

/// The service on the database at `url`, its admin view on the records kept there.
async fn the_admin_view_is_for_operators_with_the_token_only(url: &str) {
    let service = Service::start(url, &[("ADMIN_TOKEN", "s3cret-operator-token")]);
    let c = reqwest::Client::new();
    let base = &service.base;
    let res = order(&c, base, 0).await.unwrap();
    assert_eq!(res.status(), 201);

    // No token, the demo user, a wrong token, the development token: 401 problem+json.
    for (name, value) in [
        ("x-user-id", "1"),
        ("authorization", "Bearer wrong"),
        ("authorization", "Bearer dev-admin-token"),
        ("authorization", "Basic czNjcmV0LW9wZXJhdG9yLXRva2Vu"),
    ] {
        for path in ["/admin", "/admin/api/records"] {
            let res = c
                .get(format!("{base}{path}"))
                .header(name, value)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 401, "{path} with {name}: {value}");
            assert_eq!(res.headers()["www-authenticate"], "Bearer realm=\"admin\"");
            assert_eq!(res.headers()["content-type"], "application/problem+json");
            let problem: Value = res.json().await.unwrap();
            assert_eq!(problem["code"], "ADMIN_TOKEN_REQUIRED");
        }
    }
    let res = c
        .post(format!("{base}/admin/api/release"))
        .json(&serde_json::json!({"scope": "order:1", "key": KEY}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);

    // The token: the overview, and the records as JSON.
    let auth = "Bearer s3cret-operator-token";
    let res = c
        .get(format!("{base}/admin"))
        .header("authorization", auth)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.text().await.unwrap().contains(KEY));
    let res = c
        .get(format!("{base}/admin/api/records"))
        .header("authorization", auth)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let records: Value = res.json().await.unwrap();
    assert!(records.to_string().contains(KEY), "{records}");
}
