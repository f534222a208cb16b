//! The admin view (`idem::admin`): its pages and JSON through the router, and in a real headless
//! Chromium driven through ChromeDriver, where a stuck claim is released by clicking its button.

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use idem::admin::Admin;
use idem::{
    BeginOutcome, BeginRequest, ClaimRef, Claimed, Error, Fingerprint, Key, MemoryStore,
    MySqlStore, PgStore, Policy, SqliteStore, Store, StoredResponse,
};
use serde_json::{Value, json};
use tower::ServiceExt;

async fn claim<S: Store>(store: &S, scope: &str, key: &str) -> Claimed {
    let k = Key::parse(key).unwrap();
    let fp = Fingerprint::of(key).unwrap();
    let req = BeginRequest {
        scope,
        key: k.as_str(),
        fingerprint: &fp,
        policy: &Policy::DEFAULT,
        request: None,
    };
    match store.begin(req).await.unwrap() {
        BeginOutcome::Claimed(c) => c,
        other => panic!("a fresh key is claimed: {other:?}"),
    }
}

/// A claim left in progress (its owner "crashed"), a completed record and a scope that would
/// break a page that did not escape it.
async fn records<S: Store>(store: &S) -> Claimed {
    let stuck = claim(store, "refund:ORD-1", "k-stuck").await;
    let done = claim(store, "refund:ORD-2", "k-done").await;
    let answer = StoredResponse {
        status: Some(201),
        ..StoredResponse::ok(&br#"{"refundId":"R-2"}"#[..])
    };
    store
        .complete(
            ClaimRef {
                scope: "refund:ORD-2",
                key: "k-done",
                fence: done.fence,
            },
            &answer,
        )
        .await
        .unwrap();
    claim(store, "order:<script>alert(1)</script>", "k-x").await;
    stuck
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, String, Option<String>) {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let location = resp
        .headers()
        .get(header::LOCATION)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap(), location)
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn the_json_api_lists_inspects_counts_and_releases() {
    json_api_lists_inspects_counts_and_releases(MemoryStore::new()).await;
}

#[tokio::test]
async fn the_json_api_lists_inspects_counts_and_releases_on_sqlite() {
    let (_file, store) = sqlite_store().await;
    json_api_lists_inspects_counts_and_releases(store).await;
}

#[tokio::test]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn the_json_api_lists_inspects_counts_and_releases_on_postgres() {
    let (_schema, store) = pg_store().await;
    json_api_lists_inspects_counts_and_releases(store).await;
}

#[tokio::test]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn the_json_api_lists_inspects_counts_and_releases_on_mysql() {
    let (_database, store) = mysql_store().await;
    json_api_lists_inspects_counts_and_releases(store).await;
}

/// A SQLite store in a file of its own.
async fn sqlite_store() -> (common::SqliteFile, SqliteStore) {
    let file = common::SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.unwrap();
    (file, store)
}

/// A PostgreSQL store in a schema of its own.
async fn pg_store() -> (common::PgSchema, PgStore) {
    let schema = common::PgSchema::create(&common::pg_url(), 4).await;
    let store = PgStore::builder().build(schema.pool.clone()).await.unwrap();
    (schema, store)
}

/// A MySQL store in a database of its own.
async fn mysql_store() -> (common::MyDatabase, MySqlStore) {
    let database = common::MyDatabase::create(&common::mysql_url(), 4).await;
    let store = database.store().await;
    (database, store)
}

/// The JSON API of the view of `store`, and the overview page beside it.
async fn json_api_lists_inspects_counts_and_releases<S: Store + Clone>(store: S) {
    let stuck = records(&store).await;
    let app = Router::new().nest(
        "/admin",
        Admin::new(store.clone()).allow_release(true).router(),
    );

    let (status, body, _) = send(
        &app,
        get("/admin/api/records?state=in_progress&prefix=refund:"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    let keys: Vec<&str> = listed["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["k-stuck"]);

    let (status, body, _) =
        send(&app, get("/admin/api/record?scope=refund:ORD-2&key=k-done")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let record: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(record["state"], "completed");
    assert_eq!(
        record["response"],
        json!({"status": 201, "is_error": false, "body": r#"{"refundId":"R-2"}"#})
    );

    let (status, body, _) = send(&app, get("/admin/api/stats")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let stats: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        stats["states"],
        json!({"in_progress": 2, "completed": 1, "released": 0, "parked": 0})
    );
    let (status, page, _) = send(&app, get("/admin?state=in_progress&prefix=refund:")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("k-stuck") && !page.contains("k-done"),
        "the page lists what the query asks: {page}"
    );

    let release = Request::post("/admin/api/release")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"scope":"refund:ORD-1","key":"k-stuck"}"#))
        .unwrap();
    let (status, body, _) = send(&app, release).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let released: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(released["released"], true);
    assert!(released["fence"].as_u64().unwrap() > stuck.fence);
    let late = store
        .complete(
            ClaimRef {
                scope: "refund:ORD-1",
                key: "k-stuck",
                fence: stuck.fence,
            },
            &StoredResponse::ok(&b"late"[..]),
        )
        .await;
    assert!(matches!(late, Err(Error::FenceLost { .. })), "{late:?}");

    // Releasing again changes nothing and says why.
    let again = Request::post("/admin/api/release")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"scope":"refund:ORD-1","key":"k-stuck"}"#))
        .unwrap();
    let (_, body, _) = send(&app, again).await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"released": false, "reason": "not_in_progress", "state": "released"})
    );
}

/// The overview lists unfinished work on its own (`work=1`), and says when a listing examined
/// only part of the store: on a store of 10,050 records, a filter no record passes reads the
/// first 10,000 and answers "not complete", never the whole store.
#[tokio::test]
async fn the_overview_lists_unfinished_work_and_says_what_it_did_not_examine() {
    let store = MemoryStore::new();
    let stuck = records(&store).await;
    store
        .suspend(
            ClaimRef {
                scope: "refund:ORD-1",
                key: "k-stuck",
                fence: stuck.fence,
            },
            "the bank timed out",
            Duration::ZERO,
        )
        .await
        .unwrap();
    let app = Router::new().nest("/admin", Admin::new(store.clone()).router());
    let (status, body, _) = send(&app, get("/admin/api/records?work=1")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed["records"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(listed["records"][0]["key"], "k-stuck");
    assert_eq!(listed["complete"], true);
    let (status, body, _) = send(&app, get("/admin?work=1")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("k-stuck") && !body.contains("k-done"),
        "{body}"
    );
    assert!(body.contains("name=\"work\" value=\"1\" checked"), "{body}");
    let (status, _, _) = send(&app, get("/admin/api/records?work=maybe")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    for i in 0..10_050 {
        claim(&store, "bulk", &format!("k-{i}")).await;
    }
    let (_, body, _) = send(&app, get("/admin/api/records?state=released")).await;
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed["records"], json!([]));
    assert_eq!(listed["complete"], false, "10,000 of 10,053 were examined");
    let (_, body, _) = send(&app, get("/admin?state=released")).await;
    assert!(body.contains("id=\"examined\""), "{body}");
    let (_, body, _) = send(
        &app,
        get("/admin/api/records?state=released&prefix=refund:"),
    )
    .await;
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        listed["complete"], true,
        "the prefix holds two records: {body}"
    );
    let (_, body, _) = send(&app, get("/admin/api/stats")).await;
    let stats: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(stats["unfinished"], 1, "{body}");
    assert_eq!(stats["counted"], 10_053, "{body}");
}

#[tokio::test]
async fn bad_queries_are_400_unknown_records_404_and_a_read_only_view_refuses_to_release() {
    let store = MemoryStore::new();
    records(&store).await;
    let app = Router::new().nest("/ops", Admin::new(store).router());
    for uri in [
        "/ops/api/records?state=done",
        "/ops/api/records?older_than=5%20minutes",
        "/ops/api/records?limit=0",
        "/ops/api/record?scope=refund:ORD-1",
        "/ops?older_than=-1",
    ] {
        let (status, body, _) = send(&app, get(uri)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
    }
    let (status, _, _) = send(&app, get("/ops/api/record?scope=refund:ORD-9&key=k")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = send(&app, get("/ops/record?scope=refund:ORD-9&key=k")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let form = Request::post("/ops/release")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("scope=refund%3AORD-1&key=k-stuck"))
        .unwrap();
    let (status, body, _) = send(&app, form).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("read-only"), "{body}");
    // The page of a claim in progress says so instead of offering the button.
    let (_, page, _) = send(&app, get("/ops/record?scope=refund:ORD-1&key=k-stuck")).await;
    assert!(
        page.contains("read-only") && !page.contains("id=\"release\""),
        "{page}"
    );
}

#[tokio::test]
async fn pages_escape_what_they_show_and_link_where_they_are_mounted() {
    let store = MemoryStore::new();
    records(&store).await;
    let app = Router::new().nest("/ops/idem", Admin::new(store).allow_release(true).router());
    for uri in ["/ops/idem", "/ops/idem?state=in_progress"] {
        let (status, page, _) = send(&app, get(uri)).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        assert!(
            !page.contains("<script>"),
            "a scope is shown as text: {page}"
        );
        assert!(
            page.contains("order:&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{page}"
        );
        assert!(
            page.contains("href=\"/ops/idem/record?scope=refund%3AORD-1&amp;key=k-stuck\""),
            "links follow the mount point: {page}"
        );
    }
    let (_, page, _) = send(&app, get("/ops/idem/record?scope=refund:ORD-2&key=k-done")).await;
    assert!(
        page.contains("{&quot;refundId&quot;:&quot;R-2&quot;}"),
        "{page}"
    );

    let (_, page, _) = send(&app, get("/ops/idem/record?scope=refund:ORD-1&key=k-stuck")).await;
    let form = post_form("/ops/idem/release", release_form_of(&page), &[]);
    let (status, _, location) = send(&app, form).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "after a POST, a GET");
    let location = location.unwrap();
    assert!(
        location.starts_with("/ops/idem/record?scope=refund%3AORD-1&key=k-stuck&released="),
        "{location}"
    );
    let (_, page, _) = send(&app, get(&location)).await;
    assert!(
        page.contains("<td id=\"state\" class=\"released\">released</td>"),
        "{page}"
    );
}

/// The value of the form field `name` on `page` (empty when the page has none).
fn field(page: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    page.find(&marker)
        .map(|at| {
            let rest = &page[at + marker.len()..];
            rest[..rest.find('"').unwrap()].replace("&amp;", "&")
        })
        .unwrap_or_default()
}

/// The release form of `page`, its fields as the page wrote them, URL-encoded.
fn release_form_of(page: &str) -> String {
    ["scope", "key", "fence", "token"]
        .iter()
        .map(|name| {
            let value: String = field(page, name)
                .bytes()
                .map(|b| match b {
                    b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect();
            format!("{name}={value}")
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn post_form(uri: &str, body: String, headers: &[(&str, &str)]) -> Request<Body> {
    let mut req =
        Request::post(uri).header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Body::from(body)).unwrap()
}

/// The admin view of a store holding [`records`], releases allowed, under `/admin`.
async fn releasing_view() -> (MemoryStore, Claimed, Router) {
    let store = MemoryStore::new();
    let stuck = records(&store).await;
    let app = Router::new().nest(
        "/admin",
        Admin::new(store.clone()).allow_release(true).router(),
    );
    (store, stuck, app)
}

async fn still_in_progress(store: &MemoryStore, fence: u64) {
    let info = idem::store::StoreAdmin::inspect(store, "refund:ORD-1", "k-stuck")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (info.state, info.fence),
        (idem::lifecycle::State::InProgress, fence),
        "nothing was released"
    );
}

const STUCK_PAGE: &str = "/admin/record?scope=refund:ORD-1&key=k-stuck";

#[tokio::test]
async fn every_answer_forbids_framing_sniffing_and_referrers() {
    let (_, _, app) = releasing_view().await;
    let form = post_form("/admin/release", "scope=a&key=b".into(), &[]);
    for req in [
        get("/admin"),
        get(STUCK_PAGE),
        get("/admin/record?scope=refund:ORD-9&key=k"),
        get("/admin/api/stats"),
        get("/admin/api/records?state=done"),
        form,
    ] {
        let uri = req.uri().clone();
        let resp = app.clone().oneshot(req).await.unwrap();
        let h = resp.headers();
        let value = |name: &str| {
            h.get(name)
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_else(|| panic!("{uri}: no {name} ({})", resp.status()))
        };
        assert_eq!(value("x-frame-options"), "DENY", "{uri}");
        let csp = value("content-security-policy");
        for directive in [
            "frame-ancestors 'none'",
            "default-src 'none'",
            "form-action 'self'",
        ] {
            assert!(csp.contains(directive), "{uri}: {csp}");
        }
        assert_eq!(value("x-content-type-options"), "nosniff", "{uri}");
        assert_eq!(value("referrer-policy"), "no-referrer", "{uri}");
        assert_eq!(value("cache-control"), "no-store", "{uri}");
    }
}

#[tokio::test]
async fn a_release_from_another_site_is_refused_even_with_the_pages_token() {
    let (store, stuck, app) = releasing_view().await;
    let (_, page, _) = send(&app, get(STUCK_PAGE)).await;
    let form = release_form_of(&page);
    for headers in [
        &[("sec-fetch-site", "cross-site")][..],
        &[("sec-fetch-site", "same-site")],
        &[
            ("origin", "https://attacker.example"),
            ("host", "ops.example"),
        ],
        &[("origin", "null"), ("host", "ops.example")],
        // A browser that sends both: the fetch metadata decides.
        &[
            ("sec-fetch-site", "cross-site"),
            ("origin", "http://ops.example"),
            ("host", "ops.example"),
        ],
    ] {
        let (status, body, location) =
            send(&app, post_form("/admin/release", form.clone(), headers)).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{headers:?}: {body} {location:?}"
        );
        assert!(body.contains("another site"), "{headers:?}: {body}");
        assert!(body.contains("Nothing was released"), "{body}");
        still_in_progress(&store, stuck.fence).await;
    }
    // The JSON API refuses a browser's cross-site request too.
    let api = Request::post("/admin/api/release")
        .header(header::CONTENT_TYPE, "application/json")
        .header("sec-fetch-site", "cross-site")
        .body(Body::from(r#"{"scope":"refund:ORD-1","key":"k-stuck"}"#))
        .unwrap();
    let (status, body, _) = send(&app, api).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["code"],
        "ADMIN_CROSS_SITE"
    );
    still_in_progress(&store, stuck.fence).await;

    // The same form from the page's own origin releases.
    for headers in [&[
        ("sec-fetch-site", "same-origin"),
        ("origin", "http://ops.example"),
    ][..]]
    {
        let (status, body, _) =
            send(&app, post_form("/admin/release", form.clone(), headers)).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    }
}

#[tokio::test]
async fn a_release_form_without_the_pages_token_is_refused() {
    let (store, stuck, app) = releasing_view().await;
    let (_, page, _) = send(&app, get(STUCK_PAGE)).await;
    let token = field(&page, "token");
    assert_eq!(token.len(), 64, "the page's form carries a token: {page}");
    let fence = stuck.fence;
    // Another instance's page: its own secret, so its tokens are not this one's.
    let other = Router::new().nest(
        "/admin",
        Admin::new(store.clone()).allow_release(true).router(),
    );
    let (_, other_page, _) = send(&other, get(STUCK_PAGE)).await;
    let forged = [
        format!("scope=refund%3AORD-1&key=k-stuck&fence={fence}"),
        format!("scope=refund%3AORD-1&key=k-stuck&fence={fence}&token="),
        format!(
            "scope=refund%3AORD-1&key=k-stuck&fence={fence}&token={}",
            "0".repeat(64)
        ),
        format!("scope=refund%3AORD-1&key=k-stuck&fence={fence}&token=not-hex"),
        // The token of another record, or of another fence.
        format!(
            "scope=refund%3AORD-1&key=k-stuck&fence={}&token={token}",
            fence + 1
        ),
        format!("scope=refund%3AORD-2&key=k-done&fence={fence}&token={token}"),
        format!("scope=refund%3AORD-1&key=k-stuck&token={token}"),
        release_form_of(&other_page),
    ];
    for form in forged {
        let (status, body, _) = send(&app, post_form("/admin/release", form.clone(), &[])).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{form}: {body}");
        assert!(body.contains("Nothing was released"), "{form}: {body}");
        still_in_progress(&store, fence).await;
    }
    // The page's own form releases; a script without a browser (no fetch metadata) may send it.
    let (status, _, _) = send(
        &app,
        post_form("/admin/release", release_form_of(&page), &[]),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn a_page_left_open_does_not_release_the_claim_taken_since() {
    let (store, stuck, app) = releasing_view().await;
    let (_, page, _) = send(&app, get(STUCK_PAGE)).await;
    assert_eq!(field(&page, "fence"), stuck.fence.to_string());
    // Meanwhile the claim the page shows was released and the retry claimed the key.
    idem::store::StoreAdmin::force_release(&store, "refund:ORD-1", "k-stuck")
        .await
        .unwrap();
    let retry = claim(&store, "refund:ORD-1", "k-stuck").await;

    let (status, body, _) = send(
        &app,
        post_form("/admin/release", release_form_of(&page), &[]),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body.contains(&format!("fence is now {}", retry.fence)) && body.contains("in_progress"),
        "the refusal says what the record is now: {body}"
    );
    still_in_progress(&store, retry.fence).await;

    // The JSON API takes the fence too.
    let api = |fence: u64| {
        Request::post("/admin/api/release")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(
                json!({"scope": "refund:ORD-1", "key": "k-stuck", "fence": fence}).to_string(),
            ))
            .unwrap()
    };
    let (status, body, _) = send(&app, api(stuck.fence)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"released": false, "reason": "fence_moved", "fence": retry.fence, "state": "in_progress"})
    );
    still_in_progress(&store, retry.fence).await;
    let (status, body, _) = send(&app, api(retry.fence)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["released"],
        true
    );
}

// ---- in a browser -------------------------------------------------------------------------------

/// A ChromeDriver on a port of its own, stopped when dropped.
struct Driver {
    child: Child,
    url: String,
    http: reqwest::Client,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    async fn start() -> Driver {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        for _ in 0..100 {
            if let Ok(r) = driver
                .http
                .get(format!("{}/status", driver.url))
                .send()
                .await
                && r.status().is_success()
            {
                return driver;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not come up");
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        match self.try_call(method, path, body).await {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        }
    }

    /// A command's value, or what went wrong (the status and the driver's answer).
    async fn try_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let mut req = self.http.request(method, format!("{}{path}", self.url));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let v: Value = resp.json().await.unwrap();
        if !status.is_success() {
            return Err(format!("{path}: {status} {v}"));
        }
        Ok(v["value"].clone())
    }
}

/// A headless Chromium session.
struct Browser<'d> {
    driver: &'d Driver,
    session: String,
    _profile: tempfile::TempDir,
}

impl<'d> Browser<'d> {
    async fn open(driver: &'d Driver) -> Browser<'d> {
        let profile = tempfile::tempdir().unwrap();
        let binary = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("chromium");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": binary,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let v = driver
            .call(reqwest::Method::POST, "/session", Some(caps))
            .await;
        Browser {
            driver,
            session: v["sessionId"].as_str().unwrap().to_owned(),
            _profile: profile,
        }
    }

    async fn go(&self, url: &str) {
        self.driver
            .call(
                reqwest::Method::POST,
                &format!("/session/{}/url", self.session),
                Some(json!({"url": url})),
            )
            .await;
    }

    async fn find(&self, css: &str) -> String {
        match self.try_find(css).await {
            Ok(el) => el,
            Err(e) => panic!("{e}"),
        }
    }

    async fn try_find(&self, css: &str) -> Result<String, String> {
        let v = self
            .driver
            .try_call(
                reqwest::Method::POST,
                &format!("/session/{}/element", self.session),
                Some(json!({"using": "css selector", "value": css})),
            )
            .await?;
        Ok(v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap()
            .to_owned())
    }

    /// Clicks `css`, which loads another page (a link, a form's button), and waits until the
    /// new page has replaced the old one, so that what is read next is read from it.
    async fn click_to_load(&self, css: &str) {
        let before = self.find("html").await;
        self.click(css).await;
        for _ in 0..100 {
            if self.try_find("html").await.is_ok_and(|now| now != before) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("clicking {css} loaded no new page");
    }

    async fn click(&self, css: &str) {
        let el = self.find(css).await;
        self.driver
            .call(
                reqwest::Method::POST,
                &format!("/session/{}/element/{el}/click", self.session),
                Some(json!({})),
            )
            .await;
    }

    async fn text(&self, css: &str) -> String {
        let el = self.find(css).await;
        let v = self
            .driver
            .call(
                reqwest::Method::GET,
                &format!("/session/{}/element/{el}/text", self.session),
                None,
            )
            .await;
        v.as_str().unwrap().to_owned()
    }

    async fn title(&self) -> String {
        let v = self
            .driver
            .call(
                reqwest::Method::GET,
                &format!("/session/{}/title", self.session),
                None,
            )
            .await;
        v.as_str().unwrap().to_owned()
    }

    /// Moves into the page's first frame.
    async fn enter_first_frame(&self) {
        self.driver
            .call(
                reqwest::Method::POST,
                &format!("/session/{}/frame", self.session),
                Some(json!({"id": 0})),
            )
            .await;
    }

    async fn close(self) {
        self.driver
            .call(
                reqwest::Method::DELETE,
                &format!("/session/{}", self.session),
                None,
            )
            .await;
    }
}

#[tokio::test]
#[cfg_attr(
    not(idem_chromium),
    ignore = "needs chromium and chromedriver (apt-get install chromium chromium-driver)"
)]
async fn an_operator_releases_a_stuck_claim_in_a_browser_and_the_retry_runs_once() {
    let (_file, store) = sqlite_store().await;
    an_operator_releases_a_stuck_claim_in_a_browser(store).await;
}

#[tokio::test]
#[cfg_attr(
    not(all(idem_chromium, idem_mysql)),
    ignore = "needs chromium and chromedriver (apt-get install chromium chromium-driver), and MySQL or MariaDB (IDEM_MYSQL_URL=mysql://…)"
)]
async fn an_operator_releases_a_stuck_claim_in_a_browser_on_mysql() {
    let (_database, store) = mysql_store().await;
    an_operator_releases_a_stuck_claim_in_a_browser(store).await;
}

/// The view of `store` in a browser: the stuck claim found, opened and released by its button;
/// the retry runs at once, and the owner presumed gone cannot complete over it.
async fn an_operator_releases_a_stuck_claim_in_a_browser<S: Store + Clone>(store: S) {
    let stuck = records(&store).await;
    let app = Router::new().nest(
        "/admin",
        Admin::new(store.clone()).allow_release(true).router(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let driver = Driver::start().await;
    let browser = Browser::open(&driver).await;
    browser.go(&format!("http://{addr}/admin")).await;
    assert_eq!(browser.title().await, "Idempotency records · idem admin");
    let stats = browser.text("#stats").await;
    assert!(
        stats.contains("2 1 0 0"),
        "in progress, completed, released, expired: {stats}"
    );
    let listed = browser.text("#records").await;
    assert!(
        listed.contains("k-stuck") && listed.contains("k-done"),
        "{listed}"
    );

    // Narrow to the claims in progress through the form, then open the stuck one.
    browser
        .go(&format!(
            "http://{addr}/admin?state=in_progress&prefix=refund:"
        ))
        .await;
    let listed = browser.text("#records").await;
    assert!(
        listed.contains("k-stuck") && !listed.contains("k-done"),
        "{listed}"
    );
    browser.click_to_load("#records a[href*='k-stuck']").await;
    assert_eq!(browser.text("#state").await, "in_progress");
    assert_eq!(browser.text("#fence").await, stuck.fence.to_string());

    browser.click_to_load("#release").await;
    assert_eq!(browser.text("#state").await, "released");
    let notice = browser.text("#notice").await;
    let fence: u64 = browser.text("#fence").await.parse().unwrap();
    assert!(fence > stuck.fence, "the fence moved on: {fence}");
    assert_eq!(notice, format!("Released; the fence is now {fence}."));
    browser.close().await;

    // The retry runs at once; the owner presumed gone cannot complete over it.
    let retry = claim(&store, "refund:ORD-1", "k-stuck").await;
    assert!(retry.fence > fence);
    let late = store
        .complete(
            ClaimRef {
                scope: "refund:ORD-1",
                key: "k-stuck",
                fence: stuck.fence,
            },
            &StoredResponse::ok(&b"late"[..]),
        )
        .await;
    assert!(matches!(late, Err(Error::FenceLost { .. })), "{late:?}");
    store
        .complete(
            ClaimRef {
                scope: "refund:ORD-1",
                key: "k-stuck",
                fence: retry.fence,
            },
            &StoredResponse::ok(&b"retry"[..]),
        )
        .await
        .unwrap();
}

/// The admin view of `store` on a port of its own (releases allowed), and its address.
async fn serve_admin(store: SqliteStore) -> SocketAddr {
    let app = Router::new().nest("/admin", Admin::new(store).allow_release(true).router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Another site: `page` at `http://localhost:<port>/`, while the admin view is at
/// `127.0.0.1` (another host, so another site to the browser).
async fn serve_other_site(page: String) -> String {
    let app = Router::new().route(
        "/",
        axum::routing::get(move || async move { axum::response::Html(page) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://localhost:{port}/")
}

async fn sqlite_records() -> (common::SqliteFile, SqliteStore, Claimed) {
    let (file, store) = sqlite_store().await;
    let stuck = records(&store).await;
    (file, store, stuck)
}

async fn in_progress_at(store: &SqliteStore, fence: u64) {
    let info = idem::store::StoreAdmin::inspect(store, "refund:ORD-1", "k-stuck")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (info.state, info.fence),
        (idem::lifecycle::State::InProgress, fence),
        "nothing was released"
    );
}

/// A page on another site posts the release form, with the token the view wrote (taken from
/// its page), when the operator clicks its button: the view refuses it, and says so.
#[tokio::test]
#[cfg_attr(
    not(idem_chromium),
    ignore = "needs chromium and chromedriver (apt-get install chromium chromium-driver)"
)]
async fn a_release_posted_by_another_site_in_a_browser_is_refused() {
    let (_file, store, stuck) = sqlite_records().await;
    let addr = serve_admin(store.clone()).await;
    let page = reqwest::get(format!("http://{addr}{STUCK_PAGE}"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let hidden: String = ["scope", "key", "fence", "token"]
        .iter()
        .map(|n| {
            format!(
                "<input type=\"hidden\" name=\"{n}\" value=\"{}\">",
                field(&page, n)
            )
        })
        .collect();
    let other = serve_other_site(format!(
        "<!doctype html><title>win a prize</title><form method=\"post\" \
         action=\"http://{addr}/admin/release\">{hidden}<button id=\"prize\">Claim your prize</button></form>"
    ))
    .await;

    let driver = Driver::start().await;
    let browser = Browser::open(&driver).await;
    browser.go(&other).await;
    browser.click_to_load("#prize").await;
    assert_eq!(browser.title().await, "Release refused · idem admin");
    let refusal = browser.text("#refused").await;
    assert!(
        refusal.contains("another site") && refusal.contains("Nothing was released"),
        "{refusal}"
    );
    browser.close().await;
    in_progress_at(&store, stuck.fence).await;
}

/// Another site frames the record's page to have the operator click its button unknowingly:
/// the browser shows nothing of it.
#[tokio::test]
#[cfg_attr(
    not(idem_chromium),
    ignore = "needs chromium and chromedriver (apt-get install chromium chromium-driver)"
)]
async fn another_site_cannot_frame_the_view_in_a_browser() {
    let (_file, store, _) = sqlite_records().await;
    let addr = serve_admin(store).await;
    let other = serve_other_site(format!(
        "<!doctype html><title>framed</title><iframe id=\"f\" src=\"http://{addr}{STUCK_PAGE}\"></iframe>"
    ))
    .await;
    let driver = Driver::start().await;
    let browser = Browser::open(&driver).await;
    browser.go(&other).await;
    // Give the frame time to load, were it allowed to.
    tokio::time::sleep(Duration::from_millis(500)).await;
    browser.enter_first_frame().await;
    let button = browser.try_find("#release").await;
    assert!(
        button.is_err(),
        "the record's page loaded inside another site's frame"
    );
    browser.close().await;
}

/// The operator opens the record's page; before they click, its claim is released elsewhere
/// and the retry claims the key. Their click releases nothing, and the page says what the
/// record is now.
#[tokio::test]
#[cfg_attr(
    not(idem_chromium),
    ignore = "needs chromium and chromedriver (apt-get install chromium chromium-driver)"
)]
async fn a_page_left_open_in_a_browser_does_not_release_the_next_claim() {
    let (_file, store, stuck) = sqlite_records().await;
    let addr = serve_admin(store.clone()).await;
    let driver = Driver::start().await;
    let browser = Browser::open(&driver).await;
    browser.go(&format!("http://{addr}{STUCK_PAGE}")).await;
    assert_eq!(browser.text("#fence").await, stuck.fence.to_string());

    idem::store::StoreAdmin::force_release(&store, "refund:ORD-1", "k-stuck")
        .await
        .unwrap();
    let retry = claim(&store, "refund:ORD-1", "k-stuck").await;

    browser.click_to_load("#release").await;
    assert_eq!(browser.title().await, "Nothing released · idem admin");
    let refusal = browser.text("#refused").await;
    assert!(
        refusal.contains(&format!("fence is now {} (in_progress)", retry.fence)),
        "{refusal}"
    );
    browser.click_to_load("#record-link").await;
    assert_eq!(browser.text("#fence").await, retry.fence.to_string());
    browser.close().await;
    in_progress_at(&store, retry.fence).await;
}

/// A resumable claim on `refund:ORD-5`, parked with `note`, in a view that may release.
async fn parked_view(note: &str) -> (MemoryStore, u64, Router) {
    let store = MemoryStore::new();
    records(&store).await;
    let request = idem::StoredRequest::new("refund:<order_no>", &br#"{"order_no":"ORD-5"}"#[..])
        .unwrap()
        .encode();
    let fp = Fingerprint::of("ORD-5").unwrap();
    let req = BeginRequest {
        request: Some(&request),
        ..BeginRequest::new("refund:ORD-5", "k-parked", &fp, &Policy::DEFAULT)
    };
    let BeginOutcome::Claimed(c) = store.begin(req).await.unwrap() else {
        panic!("claimed before")
    };
    let claim = ClaimRef {
        scope: "refund:ORD-5",
        key: "k-parked",
        fence: c.fence,
    };
    // Its last attempt's outcome was unknown, then the completer gave up on it.
    store
        .suspend(claim, "the bank timed out", Duration::ZERO)
        .await
        .unwrap();
    store.park(claim, note).await.unwrap();
    let app = Router::new().nest(
        "/admin",
        Admin::new(store.clone()).allow_release(true).router(),
    );
    (store, c.fence, app)
}

async fn state_of(store: &MemoryStore, scope: &str, key: &str) -> idem::lifecycle::State {
    idem::store::StoreAdmin::inspect(store, scope, key)
        .await
        .unwrap()
        .unwrap()
        .state
}

#[tokio::test]
async fn parked_work_is_counted_shown_and_retried_from_its_page() {
    use idem::lifecycle::State;
    let (store, _fence, app) = parked_view("gave up after 8 attempts; last: <b>timeout</b>").await;
    let (status, overview, _) = send(&app, get("/admin")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(overview.contains("<td id=\"parked\">1</td>"), "{overview}");
    // Parked work is counted apart from the unfinished work a completer still resumes.
    assert!(
        overview.contains("<td id=\"unfinished\">0</td>"),
        "{overview}"
    );
    let (_, listed, _) = send(&app, get("/admin?state=parked")).await;
    assert!(
        listed.contains("k-parked") && !listed.contains("k-stuck"),
        "{listed}"
    );

    const PAGE: &str = "/admin/record?scope=refund:ORD-5&key=k-parked";
    let (status, page, _) = send(&app, get(PAGE)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("Parked: its attempts ran out"), "{page}");
    assert!(page.contains("a completer can resume it"), "{page}");
    assert!(
        page.contains("&lt;b&gt;timeout&lt;/b&gt;") && !page.contains("<b>timeout"),
        "the note is escaped: {page}"
    );
    assert!(
        page.contains("id=\"retry\"") && page.contains("id=\"release\""),
        "{page}"
    );
    let at = page.find("<h2>Release</h2>").expect("a release form too");
    let (retry_part, release_part) = page.split_at(at);
    let retry_form = release_form_of(retry_part);
    let release_form = release_form_of(release_part);
    assert_ne!(field(retry_part, "token"), field(release_part, "token"));

    // Each form's token does only its own action.
    let (status, body, _) = send(&app, post_form("/admin/release", retry_form.clone(), &[])).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body, _) = send(&app, post_form("/admin/retry", release_form, &[])).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body.contains("This retry was not sent by the record"),
        "{body}"
    );
    assert!(body.contains("Nothing was retried"), "{body}");
    assert_eq!(
        state_of(&store, "refund:ORD-5", "k-parked").await,
        State::Parked
    );
    // Another site's post of the page's own retry form is refused.
    let cross = [("sec-fetch-site", "cross-site")];
    let (status, _, _) = send(&app, post_form("/admin/retry", retry_form.clone(), &cross)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        state_of(&store, "refund:ORD-5", "k-parked").await,
        State::Parked
    );

    // The page's retry: in progress again, and due to a completer at once.
    let (status, _, location) = send(&app, post_form("/admin/retry", retry_form, &[])).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(location.unwrap().contains("retried="));
    assert_eq!(
        state_of(&store, "refund:ORD-5", "k-parked").await,
        State::InProgress
    );
    assert_eq!(store.due(10).await.unwrap().len(), 1);
    let (_, overview, _) = send(&app, get("/admin")).await;
    assert!(overview.contains("<td id=\"parked\">0</td>"), "{overview}");
    assert!(
        overview.contains("<td id=\"unfinished\">1</td>"),
        "{overview}"
    );

    // Through the JSON API, what is not parked is not retried.
    let retry = Request::post("/admin/api/retry")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"scope":"refund:ORD-5","key":"k-parked"}"#))
        .unwrap();
    let (status, body, _) = send(&app, retry).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["reason"],
        "not_parked"
    );
}
