//! What only the Redis store has to prove: values under its keys that are not its records,
//! servers that may evict, connections that drop, servers that restart between a claim and its
//! completion, retention on the server's clock, and records spread over a cluster.
//!
//! The shared server (`IDEM_REDIS_URL`) and cluster (`IDEM_REDIS_CLUSTER`) are only written
//! under per-test key prefixes; restarts and configurations happen on private `redis-server`
//! processes on ports of their own.

mod common;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::lifecycle::{Decision, Seen, State, decide};
use idem::store::StoreAdmin;
use idem::{
    BeginOutcome, BeginRequest, ClaimRef, Error, ExpiredLease, Fingerprint, Policy, RedisStore,
    Store, StoredResponse, idempotent,
};
use redis::AsyncCommands;

use common::RedisKeys;

// ---- helpers -----------------------------------------------------------------------------------

/// A `redis-server` of this test's own on a free port, killed on drop.
struct PrivateRedis {
    bin: &'static str,
    port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
    child: Option<Child>,
}

impl PrivateRedis {
    fn start(bin: &'static str, args: &[&str]) -> PrivateRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = PrivateRedis {
            bin,
            port,
            dir: tempfile::tempdir().unwrap(),
            args: args.iter().map(|a| a.to_string()).collect(),
            child: None,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new(self.bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ready = redis::Client::open(self.url().as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            match ready {
                Ok(_) => return,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!(
                    "the private redis-server on {} did not start: {e}",
                    self.port
                ),
            }
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server as a crash would (SIGKILL): nothing is flushed on the way out.
    fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A crash, then the same server started again on the same port and directory.
    fn restart(&mut self) {
        self.crash();
        self.spawn();
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.crash();
    }
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn fp(v: &str) -> Fingerprint {
    Fingerprint::of(v).unwrap()
}

fn req<'a>(scope: &'a str, key: &'a str, fp: &'a Fingerprint, p: &'a Policy) -> BeginRequest<'a> {
    BeginRequest {
        scope,
        key,
        fingerprint: fp,
        policy: p,
        request: None,
    }
}

fn claimed(outcome: BeginOutcome) -> idem::Claimed {
    match outcome {
        BeginOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn claim<'a>(scope: &'a str, key: &'a str, fence: u64) -> ClaimRef<'a> {
    ClaimRef { scope, key, fence }
}

/// A record's value as the store writes it when it holds no unfinished work (format 2,
/// described in the store's `record.lua`): state `i`, `c` or `r`.
#[allow(clippy::too_many_arguments)]
fn record_value(
    state: &str,
    fence: u64,
    lease_until: i64,
    (status, error): (&str, &str),
    (scope, key): (&str, &str),
    fp: &Fingerprint,
    recovery: Option<&[u8]>,
    body: &[u8],
) -> Vec<u8> {
    let ident = format!("{} {scope}{key}", scope.len());
    let rlen = recovery.map_or_else(|| "-".to_owned(), |r| r.len().to_string());
    let mut v = format!(
        "idem2 {state} {fence} {lease_until} 1 {status} {error} {} {rlen} {}\n{ident}",
        ident.len(),
        body.len()
    )
    .into_bytes();
    v.extend_from_slice(fp.as_bytes());
    v.extend_from_slice(recovery.unwrap_or_default());
    v.extend_from_slice(body);
    v
}

/// A record's value as the store writes it when it holds unfinished work (format 3, described
/// in the store's `record.lua`): state `i` or `p`, with its stored request and note, resume
/// time and end of retention (`"-"` for none).
#[allow(clippy::too_many_arguments)]
fn work_value(
    state: &str,
    fence: u64,
    lease_until: i64,
    (scope, key): (&str, &str),
    fp: &Fingerprint,
    recovery: Option<&[u8]>,
    (request, note): (Option<&[u8]>, Option<&str>),
    (resume_at, expires_at): (&str, &str),
) -> Vec<u8> {
    let ident = format!("{} {scope}{key}", scope.len());
    let len = |n: Option<usize>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    let mut v = format!(
        "idem3 {state} {fence} {lease_until} 1 - - {} {} 0 {} {} {resume_at} {expires_at}\n{ident}",
        ident.len(),
        len(recovery.map(<[u8]>::len)),
        len(request.map(<[u8]>::len)),
        len(note.map(str::len)),
    )
    .into_bytes();
    v.extend_from_slice(fp.as_bytes());
    v.extend_from_slice(recovery.unwrap_or_default());
    v.extend_from_slice(request.unwrap_or_default());
    v.extend_from_slice(note.unwrap_or_default().as_bytes());
    v
}

/// The fields of a record's first line.
fn first_line(value: &[u8]) -> Vec<String> {
    let end = value.iter().position(|&b| b == b'\n').unwrap();
    String::from_utf8(value[..end].to_vec())
        .unwrap()
        .split(' ')
        .map(str::to_owned)
        .collect()
}

/// Retries `f` until it stops answering `Unavailable` (a connection coming back), or 10 s.
async fn until_available<T, F, Fut>(mut f: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match f().await {
            Err(Error::Unavailable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => return other,
        }
    }
}

// ---- what is not ours --------------------------------------------------------------------------

static FOREIGN_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(scope = "foreign:<order>", key = key, store = store)]
async fn guarded(store: &RedisStore, order: &str, key: &str) -> Result<u32, Error> {
    FOREIGN_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(7)
}

#[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_that_are_not_our_records_are_store_errors_and_never_run_the_body() {
    // Through the begin script alone, and with a `GET` first, which answers only a completed
    // record of this identity and leaves everything else to the script.
    for read_first in [false, true] {
        values_that_are_not_our_records(read_first).await;
    }
}

async fn values_that_are_not_our_records(read_first: bool) {
    let url = common::redis_url();
    let keys = RedisKeys::new(std::slice::from_ref(&url));
    let store = RedisStore::builder()
        .prefix(keys.prefix.clone())
        .read_first(read_first)
        .connect(&url)
        .await
        .unwrap();
    let mut conn = raw(&url).await;
    let order = "A1";
    let scope = idem::scope!("foreign:<order>").unwrap();

    // A genuine record, to copy and break part by part.
    let good_key = "k-genuine";
    assert_eq!(guarded(&store, order, good_key).await.unwrap(), 7);
    let genuine: Vec<u8> = conn.get(store.record_key(&scope, good_key)).await.unwrap();
    let runs_before = FOREIGN_RUNS.load(Ordering::SeqCst);

    // `value` under the key of `key`.
    let record = |key: &str, value: Vec<u8>| {
        let mut cmd = redis::cmd("SET");
        cmd.arg(store.record_key(&scope, key)).arg(value);
        cmd
    };
    let plain = |name: &str, key: &str, args: &[&str]| {
        let mut cmd = redis::cmd(name);
        cmd.arg(store.record_key(&scope, key)).arg(args);
        cmd
    };
    // The genuine record with one part of its first line replaced.
    let header = first_line(&genuine);
    let rest = &genuine[genuine.iter().position(|&b| b == b'\n').unwrap()..];
    let with = |part: usize, value: &str| {
        let mut parts = header.clone();
        parts[part] = value.to_owned();
        let mut v = parts.join(" ").into_bytes();
        v.extend_from_slice(rest);
        v
    };
    let truncated = genuine[..genuine.len() - 1].to_vec();
    // Unfinished work of `key`'s own identity, its request's length said to be `qlen` (its real
    // one when `None`).
    let work = |key: &str, qlen: Option<usize>, resume_at: &str, expires_at: &str| {
        let request = b"idemreq1 1000 2000 foreign\n{}";
        let v = work_value(
            "i",
            1_000,
            1,
            (&scope, key),
            &fp("x"),
            None,
            (Some(&request[..]), Some("unknown")),
            (resume_at, expires_at),
        );
        match qlen {
            None => v,
            Some(n) => {
                // The first line is text: only it changes.
                let end = v.iter().position(|&b| b == b'\n').unwrap();
                let head = String::from_utf8(v[..end].to_vec()).unwrap().replacen(
                    &format!(" {} 7 ", request.len()),
                    &format!(" {n} 7 "),
                    1,
                );
                [head.as_bytes(), &v[end..]].concat()
            }
        }
    };
    // Ten bytes of the fingerprint gone.
    let fp_at =
        genuine.iter().position(|&b| b == b'\n').unwrap() + 1 + header[7].parse::<usize>().unwrap();
    let short_fp = [&genuine[..fp_at], &genuine[fp_at + 10..]].concat();
    let cases: Vec<(&str, &str, redis::Cmd)> = vec![
        ("a string", "k-string", plain("SET", "k-string", &["hello"])),
        ("a list", "k-list", plain("RPUSH", "k-list", &["a"])),
        (
            "someone else's hash",
            "k-hash",
            plain("HSET", "k-hash", &["name", "x"]),
        ),
        (
            "an unknown format version",
            "k-version-9",
            record("k-version-9", with(0, "idem9")),
        ),
        (
            "a format 2 record with the fields of format 3",
            "k-version-3",
            record("k-version-3", with(0, "idem3")),
        ),
        (
            "another identity's record",
            "k-other-identity",
            record("k-other-identity", genuine.clone()),
        ),
        (
            "a fence that is not a number",
            "k-bad-fence",
            record("k-bad-fence", with(2, "12ab")),
        ),
        (
            "a fence out of range",
            "k-huge-fence",
            record("k-huge-fence", with(2, "123456789012345678")),
        ),
        (
            "an unknown state",
            "k-bad-state",
            record("k-bad-state", with(1, "x")),
        ),
        (
            "a parked record in format 2, which has no note",
            "k-parked-2",
            record("k-parked-2", with(1, "p")),
        ),
        (
            "unfinished work whose request is longer than the value",
            "k-long-request",
            record(
                "k-long-request",
                work("k-long-request", Some(999), "-", "-"),
            ),
        ),
        (
            "unfinished work whose resume time is not a number",
            "k-bad-resume",
            record("k-bad-resume", work("k-bad-resume", None, "12x", "-")),
        ),
        (
            "unfinished work whose end of retention is out of range",
            "k-huge-expiry",
            record(
                "k-huge-expiry",
                work("k-huge-expiry", None, "-", "1234567890123456789"),
            ),
        ),
        (
            "a record shorter than its first line says",
            "k-truncated",
            record("k-truncated", truncated),
        ),
        (
            "a short fingerprint",
            "k-short-fp",
            record("k-short-fp", short_fp),
        ),
        (
            "a completed record with a bad error flag",
            "k-bad-flag",
            record("k-bad-flag", with(6, "y")),
        ),
        (
            "a completed record without its error flag",
            "k-no-flag",
            record("k-no-flag", with(6, "-")),
        ),
    ];
    for (what, key, cmd) in cases {
        let _: redis::Value = cmd.query_async(&mut conn).await.unwrap();
        let name = store.record_key(&scope, key);
        let before: redis::Value = redis::cmd("DUMP")
            .arg(&name)
            .query_async(&mut conn)
            .await
            .unwrap();

        let err = guarded(&store, order, key).await.unwrap_err();
        match &err {
            Error::Store(e) => assert!(
                e.to_string().contains(&name),
                "{what}: the error names the key: {e}"
            ),
            other => {
                panic!("{what} (read first: {read_first}): expected a store error, got {other:?}")
            }
        }
        assert_eq!(err.status(), 500, "{what}");
        let f = fp("x");
        let p = Policy::DEFAULT;
        for result in [
            store.begin(req(&scope, key, &f, &p)).await.map(drop),
            store
                .complete(claim(&scope, key, 1), &StoredResponse::ok(b"x".to_vec()))
                .await,
            store.release(claim(&scope, key, 1)).await,
            store.checkpoint(claim(&scope, key, 1), b"p", p.lease).await,
            store.lookup(&scope, key).await.map(drop),
        ] {
            assert!(matches!(result, Err(Error::Store(_))), "{what}: {result:?}");
        }
        let after: redis::Value = redis::cmd("DUMP")
            .arg(&name)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(before, after, "{what}: the value is left as it was");
    }
    assert_eq!(
        FOREIGN_RUNS.load(Ordering::SeqCst),
        runs_before,
        "no body ran over a value that is not a record"
    );
    // The genuine record still replays.
    assert_eq!(guarded(&store, order, good_key).await.unwrap(), 7);
    assert_eq!(FOREIGN_RUNS.load(Ordering::SeqCst), runs_before);
}

// ---- eviction ----------------------------------------------------------------------------------

#[cfg_attr(
    not(idem_redis_server),
    ignore = "needs a redis-server binary to start private servers"
)]
#[tokio::test]
async fn an_evicting_server_is_refused_unless_allowed() {
    let bin = common::redis_server();
    let server = PrivateRedis::start(bin, &["--maxmemory-policy", "allkeys-lru"]);
    let url = server.url();
    let mut conn = raw(&url).await;
    for policy in [
        "allkeys-lru",
        "volatile-lru",
        "volatile-ttl",
        "allkeys-random",
    ] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .query_async(&mut conn)
            .await
            .unwrap();
        match RedisStore::connect(&url).await {
            Err(Error::Config(msg)) => {
                assert!(msg.contains(policy), "{msg}");
                assert!(msg.contains("noeviction"), "{msg}");
            }
            other => panic!("{policy}: expected a configuration error, got {other:?}"),
        }
        let store = RedisStore::builder()
            .allow_eviction(true)
            .connect(&url)
            .await
            .unwrap();
        claimed(
            store
                .begin(req("s", policy, &fp("a"), &Policy::DEFAULT))
                .await
                .unwrap(),
        );
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(&mut conn)
        .await
        .unwrap();
    RedisStore::connect(&url).await.unwrap();
}

/// A `MakeWriter` that keeps what was logged.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg_attr(
    not(idem_redis_server),
    ignore = "needs a redis-server binary to start private servers"
)]
#[tokio::test]
async fn a_server_that_hides_its_configuration_is_trusted_with_a_warning() {
    let bin = common::redis_server();
    // As on managed services: CONFIG renamed away, or denied to the service's user by an ACL.
    let renamed = PrivateRedis::start(bin, &["--rename-command", "CONFIG", ""]);
    let acl = PrivateRedis::start(bin, &[]);
    let mut conn = raw(&acl.url()).await;
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "svc", "on", ">pw", "~*", "+@all", "-config"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let acl_url = format!("redis://svc:pw@127.0.0.1:{}", acl.port);

    for url in [renamed.url(), acl_url] {
        let logs = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer({
                let logs = logs.clone();
                move || logs.clone()
            })
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let store = RedisStore::connect(&url).await.unwrap();
        claimed(
            store
                .begin(req("s", "k", &fp("a"), &Policy::DEFAULT))
                .await
                .unwrap(),
        );
        let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        assert!(logged.contains("WARN"), "{url}: {logged}");
        assert!(logged.contains("maxmemory-policy"), "{url}: {logged}");
    }
}

// ---- connections and restarts ------------------------------------------------------------------

#[cfg_attr(
    not(idem_redis_server),
    ignore = "needs a redis-server binary to start private servers"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_is_unavailable() {
    let _ = common::redis_server();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    match RedisStore::connect(&format!("redis://127.0.0.1:{port}")).await {
        Err(e @ Error::Unavailable(_)) => assert_eq!(e.status(), 503),
        other => panic!("expected unavailable, got {other:?}"),
    }
    assert!(matches!(
        RedisStore::connect("not a url").await,
        Err(Error::Config(_))
    ));
    assert!(matches!(
        RedisStore::builder()
            .prefix("has{brace")
            .connect("redis://127.0.0.1")
            .await,
        Err(Error::Config(_))
    ));
}

#[cfg_attr(
    not(idem_redis_server),
    ignore = "needs a redis-server binary to start private servers"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_is_unavailable_then_recovers() {
    let bin = common::redis_server();
    let mut server = PrivateRedis::start(bin, &[]);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let f = fp("a");
    let p = Policy::DEFAULT;
    let c = claimed(store.begin(req("s", "k1", &f, &p)).await.unwrap());

    server.crash();
    for result in [
        store.begin(req("s", "k2", &f, &p)).await.map(drop),
        store
            .complete(
                claim("s", "k1", c.fence),
                &StoredResponse::ok(b"x".to_vec()),
            )
            .await,
        store.release(claim("s", "k1", c.fence)).await,
        store
            .checkpoint(claim("s", "k1", c.fence), b"p", p.lease)
            .await,
        store.lookup("s", "k1").await.map(drop),
    ] {
        match result {
            Err(e @ Error::Unavailable(_)) => {
                assert_eq!(e.status(), 503);
                assert!(e.is_retryable());
            }
            other => panic!("expected unavailable, got {other:?}"),
        }
    }

    // The server comes back empty (no persistence) and without the scripts: the store
    // reconnects by itself and loads them again.
    server.spawn();
    let again = until_available(|| store.begin(req("s", "k2", &f, &p)))
        .await
        .unwrap();
    claimed(again);
}

/// A claim, then the server crashes and restarts before the completion. Without persistence the
/// record is gone: the late completion is refused, a retry claims afresh with a higher fence, and
/// the late completion is still refused after it. With every write on disk the record survives:
/// the late completion lands once, and a second one is refused.
#[cfg_attr(
    not(idem_redis_server),
    ignore = "needs a redis-server binary to start private servers"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_between_claim_and_complete_never_completes_twice() {
    let bin = common::redis_server();
    let f = fp("a");
    let p = Policy::DEFAULT;
    let late_answer = StoredResponse::ok(b"late".to_vec());
    let done = |b: &str| StoredResponse::ok(b.as_bytes().to_vec());

    // No persistence: everything is lost.
    let mut server = PrivateRedis::start(bin, &[]);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let first = claimed(store.begin(req("s", "k", &f, &p)).await.unwrap());
    server.restart();
    let late = until_available(|| store.complete(claim("s", "k", first.fence), &late_answer)).await;
    assert!(
        matches!(late, Err(Error::FenceLost { .. })),
        "the late completion over a lost record must be refused: {late:?}"
    );
    let retry = claimed(store.begin(req("s", "k", &f, &p)).await.unwrap());
    assert!(
        retry.fence > first.fence,
        "{} > {}",
        retry.fence,
        first.fence
    );
    let late = store
        .complete(claim("s", "k", first.fence), &done("late"))
        .await;
    assert!(matches!(late, Err(Error::FenceLost { .. })), "{late:?}");
    store
        .complete(claim("s", "k", retry.fence), &done("retry"))
        .await
        .unwrap();
    match store.begin(req("s", "k", &f, &p)).await.unwrap() {
        BeginOutcome::Replay(r) => assert_eq!(r.body, &b"retry"[..]),
        other => panic!("{other:?}"),
    }
    drop(server);

    // Every write on disk: the claim survives the crash.
    let mut server = PrivateRedis::start(bin, &["--appendonly", "yes", "--appendfsync", "always"]);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let first = claimed(store.begin(req("s", "k", &f, &p)).await.unwrap());
    server.restart();
    until_available(|| store.complete(claim("s", "k", first.fence), &late_answer))
        .await
        .unwrap();
    let twice = store
        .complete(claim("s", "k", first.fence), &done("twice"))
        .await;
    assert!(matches!(twice, Err(Error::FenceLost { .. })), "{twice:?}");
    match store.begin(req("s", "k", &f, &p)).await.unwrap() {
        BeginOutcome::Replay(r) => assert_eq!(r.body, &b"late"[..], "landed once"),
        other => panic!("{other:?}"),
    }
}

/// The owner of a claim dies with the server; the server comes back with the claim (it was on
/// disk). The record is in progress until its lease ends on the server's clock, then a retry
/// takes it over, and the dead owner's late writes are refused.
#[cfg_attr(
    not(idem_redis_server),
    ignore = "needs a redis-server binary to start private servers"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_survives_a_restart_is_never_stuck_past_its_lease() {
    let bin = common::redis_server();
    let mut server = PrivateRedis::start(bin, &["--appendonly", "yes", "--appendfsync", "always"]);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let f = fp("a");
    let p = Policy::DEFAULT.lease(Duration::from_millis(1500));
    let first = claimed(store.begin(req("s", "k", &f, &p)).await.unwrap());
    let claimed_at = Instant::now();
    server.restart();

    let outcome = until_available(|| store.begin(req("s", "k", &f, &p)))
        .await
        .unwrap();
    if claimed_at.elapsed() < Duration::from_millis(1300) {
        match outcome {
            BeginOutcome::InProgress { retry_after } => {
                assert!(
                    retry_after <= Duration::from_millis(1500),
                    "{retry_after:?}"
                )
            }
            other => panic!("the lease is still live: expected in progress, got {other:?}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(1600).saturating_sub(claimed_at.elapsed())).await;
    let retry = claimed(store.begin(req("s", "k", &f, &p)).await.unwrap());
    assert!(retry.reclaimed);
    assert_eq!(retry.fence, first.fence + 1);
    let late = store
        .complete(
            claim("s", "k", first.fence),
            &StoredResponse::ok(b"late".to_vec()),
        )
        .await;
    assert!(matches!(late, Err(Error::FenceLost { .. })), "{late:?}");
}

#[cfg_attr(
    not(idem_redis_server),
    ignore = "needs a redis-server binary to start private servers"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_is_reloaded() {
    let bin = common::redis_server();
    let server = PrivateRedis::start(bin, &[]);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let f = fp("a");
    let p = Policy::DEFAULT;
    let c = claimed(store.begin(req("s", "k", &f, &p)).await.unwrap());
    let mut conn = raw(&server.url()).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    store
        .complete(claim("s", "k", c.fence), &StoredResponse::ok(b"1".to_vec()))
        .await
        .unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(matches!(
        store.begin(req("s", "k", &f, &p)).await.unwrap(),
        BeginOutcome::Replay(_)
    ));
}

// ---- reads first ---------------------------------------------------------------------------------

/// How many `GET`s and scripts the server ran since its counters were last reset, which this
/// resets again. The server counts the commands a script runs too: the begin script reads the
/// record with one `GET` of its own on these paths.
async fn gets_and_scripts(conn: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let calls = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
            .unwrap_or(0)
    };
    let counted = (calls("get"), calls("evalsha") + calls("eval"));
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
    counted
}

/// A replay read first is one `GET` and no script; a claim the read does not answer goes on to
/// the script. Fixed on or off by the builder, or chosen as the store goes: on once replays are
/// common, off again after a run of new keys.
#[cfg_attr(
    not(idem_redis_server),
    ignore = "needs a redis-server binary to start private servers"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_are_read_with_a_get_while_replays_are_common() {
    let bin = common::redis_server();
    let server = PrivateRedis::start(bin, &[]);
    let mut conn = raw(&server.url()).await;
    let (f, other) = (fp("a"), fp("b"));
    let p = Policy::DEFAULT;
    for mode in [Some(true), Some(false), None] {
        let mut builder = RedisStore::builder().prefix(format!("rf-{mode:?}:"));
        if let Some(on) = mode {
            builder = builder.read_first(on);
        }
        let store = builder.connect(&server.url()).await.unwrap();
        let c = claimed(store.begin(req("s", "done", &f, &p)).await.unwrap());
        let answer = StoredResponse::ok(b"first".to_vec());
        store
            .complete(claim("s", "done", c.fence), &answer)
            .await
            .unwrap();
        let running = claimed(store.begin(req("s", "running", &f, &p)).await.unwrap());
        gets_and_scripts(&mut conn).await;

        for _ in 0..10 {
            match store.begin(req("s", "done", &f, &p)).await.unwrap() {
                BeginOutcome::Replay(r) => assert_eq!(r, answer, "{mode:?}"),
                other => panic!("{mode:?}: expected the replay, got {other:?}"),
            }
        }
        let replays = gets_and_scripts(&mut conn).await;
        assert!(matches!(
            store.begin(req("s", "done", &other, &p)).await.unwrap(),
            BeginOutcome::KeyReused
        ));
        let reused = gets_and_scripts(&mut conn).await;
        assert!(matches!(
            store.begin(req("s", "running", &f, &p)).await.unwrap(),
            BeginOutcome::InProgress { .. }
        ));
        let in_progress = gets_and_scripts(&mut conn).await;
        match mode {
            Some(true) => {
                assert_eq!(replays, (10, 0), "each replay one GET, no script");
                assert_eq!(reused, (1, 0), "another body refused from the GET");
                assert_eq!(
                    in_progress,
                    (2, 1),
                    "a claim in progress: the GET, then the script"
                );
            }
            Some(false) => {
                assert_eq!(replays, (10, 10), "the script's own GETs only");
                assert_eq!(reused, (1, 1));
                assert_eq!(in_progress, (1, 1));
            }
            None => {
                // Two new keys before: the first replay runs the script, and finding a
                // completed record turns reads on for the rest.
                assert_eq!(replays, (1 + 9, 1), "reads turn on once replays come");
                assert_eq!(reused, (1, 0));
                assert_eq!(in_progress, (2, 1));
                // A run of new keys turns them off again.
                for i in 0..100 {
                    claimed(
                        store
                            .begin(req("s", &format!("new-{i}"), &f, &p))
                            .await
                            .unwrap(),
                    );
                }
                gets_and_scripts(&mut conn).await;
                for i in 100..110 {
                    claimed(
                        store
                            .begin(req("s", &format!("new-{i}"), &f, &p))
                            .await
                            .unwrap(),
                    );
                }
                assert_eq!(
                    gets_and_scripts(&mut conn).await,
                    (10, 10),
                    "new keys go straight to the script"
                );
            }
        }
        store
            .release(claim("s", "running", running.fence))
            .await
            .unwrap();
    }
}

// ---- time --------------------------------------------------------------------------------------

#[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_is_the_keys_expiry_on_the_servers_clock() {
    let url = common::redis_url();
    let keys = RedisKeys::new(std::slice::from_ref(&url));
    let store = RedisStore::builder()
        .prefix(keys.prefix.clone())
        .connect(&url)
        .await
        .unwrap();
    let mut conn = raw(&url).await;
    let p = Policy::DEFAULT
        .lease(Duration::from_secs(10))
        .retain(Duration::from_secs(20));
    let c = claimed(store.begin(req("s", "k", &fp("a"), &p)).await.unwrap());
    let name = store.record_key("s", "k");

    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let server_now = secs * 1000 + micros / 1000;
    let expire_at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    let left = expire_at - server_now;
    assert!((19_000..=20_000).contains(&left), "{left} ms of retention");
    let value: Vec<u8> = conn.get(&name).await.unwrap();
    let parts = first_line(&value);
    assert_eq!(&parts[..2], ["idem2", "i"], "{parts:?}");
    assert_eq!(parts[2], c.fence.to_string());
    let lease_left = parts[3].parse::<i64>().unwrap() - server_now;
    assert!(
        (9_000..=10_000).contains(&lease_left),
        "{lease_left} ms of lease"
    );
    // The first fence is the server's clock in milliseconds.
    assert!(
        (server_now - 5_000..=server_now).contains(&(c.fence as i64)),
        "{}",
        c.fence
    );

    // Completion keeps the retention counted from the claim.
    store
        .complete(claim("s", "k", c.fence), &StoredResponse::ok(b"1".to_vec()))
        .await
        .unwrap();
    let after: i64 = redis::cmd("PEXPIRETIME")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(after, expire_at);
    assert_eq!(store.purge_expired().await.unwrap(), 0);
}

// ---- resumable work ----------------------------------------------------------------------------

/// A score of the completer's index, in whole ms.
async fn index_ms(
    conn: &mut redis::aio::MultiplexedConnection,
    store: &RedisStore,
    name: &str,
) -> Option<i64> {
    let score: Option<f64> = conn.zscore(store.due_key(), name).await.unwrap();
    score.map(|s| s.floor() as i64)
}

#[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumable_work_has_no_expiry_and_an_index_entry_until_it_is_finished() {
    let url = common::redis_url();
    let keys = RedisKeys::new(std::slice::from_ref(&url));
    let store = RedisStore::builder()
        .prefix(keys.prefix.clone())
        .connect(&url)
        .await
        .unwrap();
    let mut conn = raw(&url).await;
    let p = Policy::DEFAULT
        .lease(Duration::from_secs(10))
        .retain(Duration::from_secs(20));
    let request = idem::StoredRequest::new("pay", &b"{}"[..])
        .unwrap()
        .encode();

    // A claim that stores no request writes no index entry and keeps its expiry.
    let plain = claimed(store.begin(req("s", "plain", &fp("a"), &p)).await.unwrap());
    let exists: bool = conn.exists(store.due_key()).await.unwrap();
    assert!(!exists, "only resumable claims pay for the index");
    let ttl: i64 = conn.pttl(store.record_key("s", "plain")).await.unwrap();
    assert!(ttl > 15_000, "{ttl}");

    let c = claimed(
        store
            .begin(req("s", "k", &fp("a"), &p).resumable(&request))
            .await
            .unwrap(),
    );
    let name = store.record_key("s", "k");
    let now = server_now_ms(&mut conn).await;
    let ttl: i64 = conn.pttl(&name).await.unwrap();
    assert_eq!(ttl, -1, "resumable work has no expiry");
    let value: Vec<u8> = conn.get(&name).await.unwrap();
    let parts = first_line(&value);
    assert_eq!(parts.len(), 14, "{parts:?}");
    assert_eq!(&parts[..3], ["idem3", "i", &c.fence.to_string()]);
    assert_eq!(parts[10], request.len().to_string());
    assert_eq!(parts[11], "-", "no note yet");
    let lease_until: i64 = parts[3].parse().unwrap();
    let expires_at: i64 = parts[13].parse().unwrap();
    assert!((19_000..=20_000).contains(&(expires_at - now)), "{parts:?}");
    assert!(value.ends_with(&request), "the request is stored");
    assert_eq!(
        index_ms(&mut conn, &store, &name).await,
        Some(lease_until),
        "its entry says when its lease ends"
    );

    // Suspended: the note is kept, the entry moves to the resume time.
    store
        .suspend(
            claim("s", "k", c.fence),
            "no answer",
            Duration::from_secs(3),
        )
        .await
        .unwrap();
    let value: Vec<u8> = conn.get(&name).await.unwrap();
    let parts = first_line(&value);
    assert_eq!(parts[11], "9");
    let resume_at: i64 = parts[12].parse().unwrap();
    assert_eq!(index_ms(&mut conn, &store, &name).await, Some(resume_at));
    assert!(value.ends_with(b"no answer"));
    let ttl: i64 = conn.pttl(&name).await.unwrap();
    assert_eq!(ttl, -1);

    // Finished: format 2 again, its expiry what is left of the retention counted from the
    // claim; its entry goes once `due` reads it.
    store
        .complete(claim("s", "k", c.fence), &StoredResponse::ok(b"1".to_vec()))
        .await
        .unwrap();
    let value: Vec<u8> = conn.get(&name).await.unwrap();
    assert_eq!(&first_line(&value)[..2], ["idem2", "c"]);
    let expire_at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        (expire_at - expires_at).abs() <= 5,
        "{expire_at} {expires_at}"
    );
    let _: () = conn.zadd(store.due_key(), &name, 0).await.unwrap();
    assert!(store.due(10).await.unwrap().is_empty());
    assert_eq!(index_ms(&mut conn, &store, &name).await, None);

    // A claim in progress written in format 2 (by an earlier version) is read, and taken over
    // by a resumable claim as the next attempt.
    let old = store.record_key("s", "old");
    let value = record_value(
        "i",
        1_000,
        now - 1,
        ("-", "-"),
        ("s", "old"),
        &fp("a"),
        Some(b"step-1"),
        b"",
    );
    let _: () = conn.pset_ex(&old, value, 60_000).await.unwrap();
    let taken = claimed(
        store
            .begin(req("s", "old", &fp("a"), &p).resumable(&request))
            .await
            .unwrap(),
    );
    assert_eq!((taken.fence, taken.attempt), (1_001, 2));
    assert_eq!(taken.recovery_point.as_deref(), Some(&b"step-1"[..]));
    let ttl: i64 = conn.pttl(&old).await.unwrap();
    assert_eq!(ttl, -1);
    let _ = plain;
}

/// The score of an index entry whose record holds work the completer cannot take: 2^45 ms.
const NEVER: i64 = 1 << 45;

/// Unfinished work the completer cannot take: `work`/`unknown` claimed, then suspended with no
/// request stored.
async fn suspended_work(store: &RedisStore) {
    let c = claimed(
        store
            .begin(req("work", "unknown", &fp("a"), &Policy::DEFAULT))
            .await
            .unwrap(),
    );
    store
        .suspend(
            claim("work", "unknown", c.fence),
            "no answer",
            Duration::ZERO,
        )
        .await
        .unwrap();
}

/// Unfinished work the completer cannot take, a claim suspended without a stored request, has
/// an entry in the completer's index too, scored never to be due, so that operators list and
/// count it from there; the entry goes once an operator's listing finds the work finished.
#[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_work_the_completer_cannot_take_is_indexed_for_operators() {
    use idem::store::RecordQuery;

    let url = common::redis_url();
    let keys = RedisKeys::new(std::slice::from_ref(&url));
    let store = RedisStore::builder()
        .prefix(keys.prefix.clone())
        .connect(&url)
        .await
        .unwrap();
    let mut conn = raw(&url).await;
    suspended_work(&store).await;
    let name = store.record_key("work", "unknown");
    assert_eq!(index_ms(&mut conn, &store, &name).await, Some(NEVER));
    assert!(store.due(10).await.unwrap().is_empty(), "never due");
    assert_eq!(index_ms(&mut conn, &store, &name).await, Some(NEVER));
    let work = store
        .listing(&RecordQuery::new().holding_work(true))
        .await
        .unwrap();
    assert_eq!(
        work.records
            .iter()
            .map(|r| r.key.as_str())
            .collect::<Vec<_>>(),
        ["unknown"]
    );

    // Its retry finishes it: the next listing finds the entry stale and removes it.
    let retry = claimed(
        store
            .begin(req("work", "unknown", &fp("a"), &Policy::DEFAULT))
            .await
            .unwrap(),
    );
    store
        .complete(
            claim("work", "unknown", retry.fence),
            &StoredResponse::ok(b"1".to_vec()),
        )
        .await
        .unwrap();
    let work = store
        .listing(&RecordQuery::new().holding_work(true))
        .await
        .unwrap();
    assert!(work.records.is_empty() && work.complete);
    assert_eq!(index_ms(&mut conn, &store, &name).await, None);
}

/// An operator's page (the counts, the records, the unfinished work) sends no more commands
/// to a store of 30,000 records than a bound that holds for one of 15,000 too: the scans
/// stop after the keys they may examine, a record read per key found, and the work comes from
/// the completer's index. (Both scanned every key and read every record: over 90,000 commands
/// for the larger store.)
#[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_page_sends_a_bounded_number_of_commands() {
    use idem::store::{RecordQuery, StoreStats};

    let url = common::redis_url();
    let keys = RedisKeys::new(std::slice::from_ref(&url));
    let proxy = common::proxy::Proxy::redis(&url).await;
    let store = RedisStore::builder()
        .prefix(keys.prefix.clone())
        .connect(&proxy.url(&url))
        .await
        .unwrap();
    let mut conn = raw(&url).await;
    suspended_work(&store).await;
    let now = server_now_ms(&mut conn).await;
    let f = fp("a");
    let mut filled = 0;
    let mut fill = async |to: usize| {
        while filled < to {
            let mut pipe = redis::pipe();
            for i in filled..(filled + 1000).min(to) {
                let key = format!("k-{i}");
                let value = record_value(
                    "c",
                    1_000 + i as u64,
                    now,
                    ("201", "0"),
                    ("order:1", &key),
                    &f,
                    None,
                    b"{}",
                );
                pipe.cmd("SET")
                    .arg(store.record_key("order:1", &key))
                    .arg(value)
                    .arg("PX")
                    .arg(600_000)
                    .ignore();
            }
            let () = pipe.query_async(&mut conn).await.unwrap();
            filled = (filled + 1000).min(to);
        }
    };
    let page = async || {
        let before = proxy.commands();
        let stats = store.stats(Duration::from_secs(3600)).await.unwrap();
        let listed = store.listing(&RecordQuery::new()).await.unwrap();
        let work = store
            .listing(&RecordQuery::new().holding_work(true))
            .await
            .unwrap();
        assert!(!stats.complete && !listed.complete);
        assert_eq!((stats.unfinished, work.records.len()), (1, 1));
        assert!(work.complete);
        proxy.commands() - before
    };
    // Every record a scan finds is one read; the pages of a scan and the index add a few.
    let most = RecordQuery::EXAMINE + StoreStats::BOUND as usize + 100;
    fill(15_000).await;
    let smaller = page().await;
    fill(30_000).await;
    let larger = page().await;
    eprintln!("an operator's page: {smaller} commands for 15,000 records, {larger} for 30,000");
    assert!(
        smaller <= most && larger <= most,
        "{smaller} then {larger} commands, more than {most}"
    );
    assert!(
        larger < 30_000,
        "{larger} commands for 30,000 records: one read each at least"
    );
}

#[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_index_entry_or_index_is_a_store_error() {
    let url = common::redis_url();
    let keys = RedisKeys::new(std::slice::from_ref(&url));
    let store = RedisStore::builder()
        .prefix(keys.prefix.clone())
        .connect(&url)
        .await
        .unwrap();
    let mut conn = raw(&url).await;
    let index = store.due_key();
    let is_store_error = |r: Result<Vec<idem::Unfinished>, Error>, what: &str| match r {
        Err(Error::Store(e)) => e.to_string(),
        other => panic!("{what}: expected a store error, got {other:?}"),
    };

    let _: () = conn.zadd(&index, "not a record", 0).await.unwrap();
    let e = is_store_error(store.due(10).await, "a member that names no record");
    assert!(e.contains("not a record"), "{e}");
    let _: () = conn.del(&index).await.unwrap();

    let name = store.record_key("s", "k-foreign");
    let _: () = conn.set(&name, "hello").await.unwrap();
    let _: () = conn.zadd(&index, &name, 0).await.unwrap();
    let e = is_store_error(store.due(10).await, "a member whose value is no record");
    assert!(e.contains(&name), "{e}");
    let _: () = conn.del(&[&index, &name]).await.unwrap();

    // The index itself is not a sorted set: due and a resumable claim are refused, and the
    // claim is not made.
    let _: () = conn.set(&index, "hello").await.unwrap();
    is_store_error(store.due(10).await, "an index that is a string");
    let request = idem::StoredRequest::new("pay", &b"{}"[..])
        .unwrap()
        .encode();
    let p = Policy::DEFAULT;
    let begun = store
        .begin(req("s", "k-1", &fp("a"), &p).resumable(&request))
        .await;
    assert!(matches!(begun, Err(Error::Store(_))), "{begun:?}");
    assert!(store.lookup("s", "k-1").await.unwrap().is_none());
    // Claims that store no request never touch it.
    claimed(store.begin(req("s", "k-2", &fp("a"), &p)).await.unwrap());
    // Listing skips the index: it is the one key under the prefix that is not a record.
    let listed = store.list(&idem::store::RecordQuery::new()).await.unwrap();
    assert_eq!(listed.len(), 1);
}

// ---- cluster -----------------------------------------------------------------------------------

/// A 3-primary cluster of this test's own (`.ci/redis-cluster`), stopped on drop.
struct PrivateCluster {
    dir: tempfile::TempDir,
    first: u16,
}

impl PrivateCluster {
    fn start() -> PrivateCluster {
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        // Three client ports and their cluster-bus ports (+10000), all free.
        let seed = (std::process::id() % 1000) as u16 * 10;
        let first = (0..100)
            .map(|i| 20_000 + (seed + i * 10) % 10_000)
            .find(|&p| (p..p + 3).all(|q| free(q) && free(q + 10_000)))
            .expect("three free ports for a private cluster");
        let cluster = PrivateCluster {
            dir: tempfile::tempdir().unwrap(),
            first,
        };
        let status = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/redis-cluster"))
            .arg("start")
            .arg(cluster.dir.path())
            .arg(first.to_string())
            .status()
            .expect("run .ci/redis-cluster");
        assert!(status.success(), "the private cluster did not start");
        cluster
    }

    fn nodes(&self) -> Vec<String> {
        (self.first..self.first + 3)
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/redis-cluster"))
            .arg("stop")
            .arg(self.dir.path())
            .arg(self.first.to_string())
            .status();
    }
}

#[cfg_attr(
    not(idem_redis_server),
    ignore = "needs a redis-server binary to start private servers"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_evicting_primary_of_a_cluster_is_refused() {
    let _ = common::redis_server();
    let cluster = PrivateCluster::start();
    let nodes = cluster.nodes();
    RedisStore::connect_cluster(&nodes).await.unwrap();
    // Only the last primary evicts: the check must ask every primary, not one at random.
    let mut conn = raw(&nodes[2]).await;
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory-policy", "volatile-lfu"])
        .query_async(&mut conn)
        .await
        .unwrap();
    for _ in 0..5 {
        match RedisStore::connect_cluster(&nodes).await {
            Err(Error::Config(msg)) => assert!(msg.contains("volatile-lfu"), "{msg}"),
            other => panic!("expected a configuration error, got {other:?}"),
        }
    }
    let store = RedisStore::builder()
        .allow_eviction(true)
        .connect_cluster(&nodes)
        .await
        .unwrap();
    claimed(
        store
            .begin(req("s", "k", &fp("a"), &Policy::DEFAULT))
            .await
            .unwrap(),
    );
}

#[cfg_attr(
    not(idem_redis_cluster),
    ignore = "needs a Redis Cluster: set IDEM_REDIS_CLUSTER=redis://host:port,…"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_spread_over_every_primary_of_a_cluster() {
    let nodes = common::redis_cluster();
    let keys = RedisKeys::new(&nodes);
    let store = RedisStore::builder()
        .prefix(keys.prefix.clone())
        .connect_cluster(&nodes)
        .await
        .unwrap();
    let f = fp("a");
    let p = Policy::DEFAULT;
    for i in 0..60 {
        let k = format!("k-{i}");
        let c = claimed(store.begin(req("s", &k, &f, &p)).await.unwrap());
        store
            .complete(
                claim("s", &k, c.fence),
                &StoredResponse::ok(k.clone().into_bytes()),
            )
            .await
            .unwrap();
    }
    for node in &nodes {
        let mut conn = raw(node).await;
        let mut cursor = 0u64;
        let mut here = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{}*", keys.prefix))
                .query_async(&mut conn)
                .await
                .unwrap();
            here += batch.len();
            if next == 0 {
                break;
            }
            cursor = next;
        }
        assert!(here > 0, "no record on {node}");
    }
    assert_eq!(keys.count().await, 60);
    for i in 0..60 {
        let k = format!("k-{i}");
        match store.begin(req("s", &k, &f, &p)).await.unwrap() {
            BeginOutcome::Replay(r) => assert_eq!(r.body, k.as_bytes()),
            other => panic!("{other:?}"),
        }
    }
}

fn decide_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("idem-unit:{}:{nanos}:", std::process::id())
}

async fn server_now_ms(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1000 + us / 1000
}

/// What the script answered, as a decision of the rule.
fn as_decision(outcome: &BeginOutcome) -> Decision {
    match outcome {
        BeginOutcome::Claimed(c) => Decision::Claim {
            reclaim: c.reclaimed,
            continues: c.recovery_point.as_deref() == Some(&b"step-2"[..]),
        },
        BeginOutcome::Replay(_) => Decision::Replay,
        BeginOutcome::InProgress { retry_after } => Decision::InProgress(*retry_after),
        BeginOutcome::KeyReused => Decision::KeyReused,
        BeginOutcome::Parked => Decision::Parked,
    }
}

/// The begin script against `lifecycle::decide`: every combination of what an existing record
/// can hold is written into Redis, begun through the script, and the script's answer must be the
/// rule's answer (the script restates the rule in Lua; this keeps the two the same).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
async fn begin_script_decides_every_row_as_lifecycle_decide() {
    let url = common::redis_url();
    let store = RedisStore::builder()
        .prefix(decide_prefix())
        .connect(&url)
        .await
        .unwrap();
    let mut raw = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mine = Fingerprint::of("the request").unwrap();
    let other = Fingerprint::of("another request").unwrap();
    // A short retention: a failed run leaves nothing behind for long.
    let reclaim = Policy::DEFAULT
        .lease(Duration::from_secs(30))
        .retain(Duration::from_secs(60));
    let fail_closed = reclaim.expired_lease(ExpiredLease::FailClosed);

    let mut rows = 0;
    let mut names = Vec::new();
    for state in [
        State::InProgress,
        State::Completed,
        State::Released,
        State::Parked,
    ] {
        for same_fingerprint in [true, false] {
            // Parked work has no expiry: it never reaches the end of its retention.
            for expired in [false, true]
                .into_iter()
                .filter(|&e| !e || state != State::Parked)
            {
                for lease_left_ms in [1500i64, 0, -5] {
                    for policy in [&reclaim, &fail_closed] {
                        rows += 1;
                        let key = format!("k-{rows}");
                        let name = store.record_key("decide", &key);
                        names.push(name.clone());
                        let now = server_now_ms(&mut raw).await;
                        let state_text = match state {
                            State::InProgress => "i",
                            State::Completed => "c",
                            State::Released => "r",
                            State::Parked => "p",
                        };
                        let fence = 1_000u64;
                        let (status, error) = match state {
                            State::Completed => ("201", "0"),
                            _ => ("-", "-"),
                        };
                        // A completed record carries its answer; the others a recovery point.
                        let (recovery, body): (Option<&[u8]>, &[u8]) = match state {
                            State::Completed => (None, &b"{\"done\":1}"[..]),
                            _ => (Some(&b"step-2"[..]), &b""[..]),
                        };
                        let value = match state {
                            State::Parked => work_value(
                                state_text,
                                fence,
                                now + lease_left_ms,
                                ("decide", &key),
                                &mine,
                                recovery,
                                (Some(b"idemreq1 1000 2000 decide\n{}"), Some("gave up")),
                                ("-", "-"),
                            ),
                            _ => record_value(
                                state_text,
                                fence,
                                now + lease_left_ms,
                                (status, error),
                                ("decide", &key),
                                &mine,
                                recovery,
                                body,
                            ),
                        };
                        let _: () = raw.set(&name, value).await.unwrap();
                        if expired {
                            // Retention is the key's expiry: an expired record is a key that
                            // Redis no longer has.
                            let _: () = raw.pexpire(&name, 1).await.unwrap();
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        } else {
                            let _: () = raw.pexpire(&name, 30_000).await.unwrap();
                        }

                        let fp = if same_fingerprint { &mine } else { &other };
                        let outcome = store
                            .begin(BeginRequest {
                                scope: "decide",
                                key: &key,
                                fingerprint: fp,
                                policy,
                                request: None,
                            })
                            .await
                            .unwrap();
                        let seen = Seen {
                            state,
                            same_fingerprint,
                            expired,
                            lease_left_ms,
                        };
                        let expected = decide(seen, policy);
                        let got = as_decision(&outcome);
                        let what = format!("{seen:?} under {:?}", policy.expired_lease);
                        match (expected, got) {
                            // The script reads the clock a moment after the record was
                            // written: the remaining lease may be a little shorter.
                            (Decision::InProgress(want), Decision::InProgress(have)) => {
                                assert!(
                                    have <= want && want - have < Duration::from_millis(300),
                                    "{what}: in progress for {have:?}, the rule says {want:?}"
                                );
                            }
                            (want, have) => assert_eq!(have, want, "{what}"),
                        }
                        match outcome {
                            BeginOutcome::Claimed(c) if expired => {
                                assert!(c.fence > fence, "{what}: the fence still grows");
                            }
                            BeginOutcome::Claimed(c) => {
                                assert_eq!(c.fence, fence + 1, "{what}: a take-over adds one");
                                let written: Vec<u8> = raw.get(&name).await.unwrap();
                                let parts = first_line(&written);
                                assert_eq!(&parts[..3], ["idem2", "i", "1001"], "{what}");
                                assert_eq!(&parts[5..7], ["-", "-"], "{what}");
                                assert_eq!(parts[9], "0", "{what}: the old answer is gone");
                                let ident = format!("6 decide{key}");
                                let fp_at = written.len()
                                    - 32
                                    - c.recovery_point.as_ref().map_or(0, Vec::len);
                                assert_eq!(&written[fp_at - ident.len()..fp_at], ident.as_bytes());
                                assert_eq!(&written[fp_at..fp_at + 32], &fp.as_bytes()[..]);
                                let ttl: i64 = raw.pttl(&name).await.unwrap();
                                assert!(ttl > 50_000, "{what}: retention counts again ({ttl} ms)");
                            }
                            BeginOutcome::Replay(r) => {
                                assert_eq!(r.body, &b"{\"done\":1}"[..]);
                                assert_eq!(r.status, Some(201));
                                assert!(!r.is_error);
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    assert_eq!(rows, 84);
    let _: () = raw.del(&names).await.unwrap();
}
