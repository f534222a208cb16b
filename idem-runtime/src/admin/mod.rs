//! An admin view for the person on call: the records a store holds, one record in full, counts,
//! and (when turned on) the safe manual release of a claim stuck in progress. A mountable axum
//! [`Router`]: server-rendered HTML pages (no front-end build, no script) and the same as JSON
//! under `api/`. Feature `axum`.
//!
//! ```no_run
//! # async fn f() -> idem::Result<()> {
//! use axum::Router;
//! use idem::admin::Admin;
//!
//! let store = idem::SqliteStore::connect("sqlite://idem.db").await?;
//! let admin = Admin::new(store).allow_release(true).router();
//! // Mount it behind the service's own authentication: it has none of its own.
//! let app: Router = Router::new().nest("/admin", admin);
//! # Ok(()) }
//! ```
//!
//! **It has no authentication of its own**: it shows every scope and key, stored answers
//! included, to whoever reaches it. Mount it behind the service's own check of who may operate
//! it (a middleware on the nested router), or on a port that only operators reach.
//!
//! | path | what |
//! |---|---|
//! | `GET /` | counts by state and scope prefix, and the records, filtered by `state`, `prefix`, `older_than` (`90s`, `5m`, `2h`, `1d`), `work` (`1`: only records that hold unfinished work) and `limit` |
//! | `GET /record?scope=…&key=…` | one record in full: fence, attempt, lease, fingerprint, recovery point, stored answer |
//! | `POST /release` (form: `scope`, `key`, `fence`, `token`, as the record's page writes them) | releases the claim the page showed; `403` unless [`Admin::allow_release`] |
//! | `GET /api/records`, `/api/record`, `/api/stats` | the same as JSON |
//! | `POST /api/release` (JSON: `scope`, `key`, optionally `fence`) | the same as JSON |
//!
//! A release is [`Operation::ForceRelease`](crate::store::Operation::ForceRelease): the fence
//! moves on, so an owner presumed gone that wakes up cannot complete over the retry.
//!
//! A page load does bounded work whatever the store holds: the listing examines at most
//! [`RecordQuery::EXAMINE`] records of the index that serves it, and the counts read every
//! record that holds unfinished work and at most [`StoreStats::BOUND`](crate::store::StoreStats::BOUND)
//! others (see [Bounded reads](crate::store::admin#bounded-reads) for the orders and what each
//! count covers). The page says when a listing or the counts did not cover the whole store.
//!
//! # What a release must prove
//!
//! Whoever reaches the view may look, but a release must come from the view's own page, for the
//! claim that page showed, whatever is in front of the view (a bearer token, a login proxy's
//! cookie, nothing but a private port):
//!
//! - a request a browser says another site sent (`Sec-Fetch-Site`, else `Origin`) is refused
//!   (`403`), on `/release` and `/api/release` alike;
//! - the form's `token` is an HMAC of its scope, key and fence under a secret of the view's own
//!   (random for each [`Admin`], or [`Admin::form_secret`] for instances that share one
//!   address): a form the view did not write is refused (`403`), and so is one written before
//!   a restart (the page says to open the record again);
//! - the release applies only while the record has the fence the page showed: a page left open
//!   does not release the claim taken since (`409`, with the record's fence and state now).
//!   `/api/release` takes the same condition as `fence`; without it, it releases whatever
//!   claim is in progress, for scripts that read nothing first;
//! - no page may be framed, and none loads anything but its own inline style (see
//!   `X-Frame-Options`, `Content-Security-Policy`, `Referrer-Policy`,
//!   `X-Content-Type-Options` on every answer).

mod protect;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, OriginalUri, Query, State as Shared};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::error::Error;
use crate::lifecycle::State;
pub use crate::store::admin::parse_age;
use crate::store::{ForcedRelease, RecordInfo, RecordQuery, Retried, Store, StoreAdmin};

/// The most bytes of a stored answer or recovery point a page shows.
const SHOWN_BYTES: usize = 4096;

/// What "expiring soon" means on the overview.
const EXPIRING_WITHIN: Duration = Duration::from_secs(60 * 60);

/// The admin view of a store; [`Admin::router`] makes it a router to mount.
#[derive(Debug, Clone)]
pub struct Admin<S> {
    store: S,
    allow_release: bool,
    forms: protect::FormKey,
}

impl<S: Store + Clone> Admin<S> {
    /// A read-only view of `store`, whose release forms (once allowed) are signed with a
    /// secret drawn at random for this view.
    pub fn new(store: S) -> Self {
        Admin {
            store,
            allow_release: false,
            forms: protect::FormKey::random(),
        }
    }

    /// Whether claims in progress may be released from the view (default `false`: read-only).
    pub fn allow_release(mut self, allow: bool) -> Self {
        self.allow_release = allow;
        self
    }

    /// The secret the release forms are signed with, instead of the random one: give every
    /// instance of a service behind one address the same (32 random bytes or more), so that a
    /// page one served may be released through another, and keep it as secret as a password.
    /// An empty secret turns releasing from the page off.
    pub fn form_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.forms = protect::FormKey::given(secret.as_ref());
        self
    }

    /// The router, to mount with `Router::nest`; its links follow where it is mounted.
    pub fn router(self) -> Router {
        let shared = Arc::new(self);
        Router::new()
            .route("/", get(overview::<S>))
            .route("/record", get(record_page::<S>))
            .route("/release", post(release_form::<S>))
            .route("/retry", post(retry_form::<S>))
            .route("/api/records", get(api_records::<S>))
            .route("/api/record", get(api_record::<S>))
            .route("/api/stats", get(api_stats::<S>))
            .route("/api/release", post(api_release::<S>))
            .route("/api/retry", post(api_retry::<S>))
            .with_state(shared)
            .layer(axum::middleware::map_response(protect::secure_headers))
    }
}

type Params = Query<HashMap<String, String>>;

/// Where the router is mounted: the original path less the part the router saw.
fn base(original: &Uri, seen: &Uri) -> String {
    let full = original.path();
    let tail = seen.path();
    let base = if tail == "/" {
        full.trim_end_matches('/')
    } else {
        full.strip_suffix(tail).unwrap_or("")
    };
    base.to_owned()
}

/// The query of the record list, from `state`, `prefix`, `older_than`, `work` and `limit`.
fn query_of(params: &HashMap<String, String>) -> Result<RecordQuery, String> {
    let mut query = RecordQuery::new();
    if let Some(state) = params.get("state").filter(|s| !s.is_empty()) {
        query = query.state(State::parse(state).map_err(|_| {
            format!("{state:?} is not a state: in_progress, completed, released or parked")
        })?);
    }
    if let Some(prefix) = params.get("prefix").filter(|s| !s.is_empty()) {
        query = query.scope_prefix(prefix.clone());
    }
    if let Some(age) = params.get("older_than").filter(|s| !s.is_empty()) {
        query = query.older_than(parse_age(age)?);
    }
    match params.get("work").map(String::as_str) {
        None | Some("" | "0" | "false") => {}
        Some("1" | "true" | "on") => query = query.holding_work(true),
        Some(other) => {
            return Err(format!(
                "{other:?} is not a choice for `work`: 1 lists only records that hold unfinished work"
            ));
        }
    }
    if let Some(limit) = params.get("limit").filter(|s| !s.is_empty()) {
        let limit: usize = limit
            .parse()
            .ok()
            .filter(|n| (1..=10_000).contains(n))
            .ok_or_else(|| format!("{limit:?} is not a limit between 1 and 10000"))?;
        query = query.limit(limit);
    }
    Ok(query)
}

fn identity(params: &HashMap<String, String>) -> Result<(&str, &str), String> {
    match (params.get("scope"), params.get("key")) {
        (Some(scope), Some(key)) => Ok((scope, key)),
        _ => Err("name the record with `scope` and `key`".to_owned()),
    }
}

// ---- JSON ---------------------------------------------------------------------------------------

fn record_json(r: &RecordInfo) -> Value {
    let mut v = r.summary_json();
    if let Some(point) = &r.recovery_point {
        v["recovery_point"] = text_or_hex(point);
    }
    if let Some(answer) = &r.response {
        v["response"] = json!({
            "status": answer.status,
            "is_error": answer.is_error,
            "body": text_or_hex(&answer.body),
        });
    }
    v
}

/// Bytes as text when they are UTF-8, else as `{"hex": …}`.
fn text_or_hex(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::String(text.to_owned()),
        Err(_) => json!({ "hex": hex(bytes) }),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// A JSON error: the store's errors with their status, a bad query as 400.
fn json_error(status: StatusCode, code: &str, detail: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        json!({"type": "about:blank", "status": status.as_u16(), "code": code, "detail": detail})
            .to_string(),
    )
        .into_response()
}

fn store_error_json(e: &Error) -> Response {
    json_error(store_status(e), e.code(), &e.to_string())
}

/// The status of a store's error, logged: the view could not do what it was asked.
fn store_status(e: &Error) -> StatusCode {
    tracing::warn!(target: "idem", error = %e, "the admin view could not read the store");
    StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn store_error_page(e: &Error, base: &str) -> Response {
    error_page(store_status(e), base, &e.to_string())
}

async fn api_records<S: Store + Clone>(
    Shared(admin): Shared<Arc<Admin<S>>>,
    Query(params): Params,
) -> Response {
    let query = match query_of(&params) {
        Ok(q) => q,
        Err(why) => return json_error(StatusCode::BAD_REQUEST, "INVALID_QUERY", &why),
    };
    match admin.store.listing(&query).await {
        Ok(listed) => axum::Json(json!({
            "records": listed.records.iter().map(record_json).collect::<Vec<_>>(),
            "complete": listed.complete,
        }))
        .into_response(),
        Err(e) => store_error_json(&e),
    }
}

async fn api_record<S: Store + Clone>(
    Shared(admin): Shared<Arc<Admin<S>>>,
    Query(params): Params,
) -> Response {
    let (scope, key) = match identity(&params) {
        Ok(id) => id,
        Err(why) => return json_error(StatusCode::BAD_REQUEST, "INVALID_QUERY", &why),
    };
    match admin.store.inspect(scope, key).await {
        Ok(Some(record)) => axum::Json(record_json(&record)).into_response(),
        Ok(None) => json_error(
            StatusCode::NOT_FOUND,
            "RECORD_NOT_FOUND",
            "no record with this scope and key",
        ),
        Err(e) => store_error_json(&e),
    }
}

async fn api_stats<S: Store + Clone>(
    Shared(admin): Shared<Arc<Admin<S>>>,
    Query(params): Params,
) -> Response {
    let within = match params
        .get("expiring_within")
        .map(|w| parse_age(w))
        .transpose()
    {
        Ok(w) => w.unwrap_or(EXPIRING_WITHIN),
        Err(why) => return json_error(StatusCode::BAD_REQUEST, "INVALID_QUERY", &why),
    };
    match admin.store.stats(within).await {
        Ok(stats) => axum::Json(stats.to_json()).into_response(),
        Err(e) => store_error_json(&e),
    }
}

/// The body of a release through the API: which record, and the fence it must still have.
#[derive(Debug, serde::Deserialize)]
struct ReleaseRequest {
    scope: String,
    key: String,
    fence: Option<u64>,
}

const READ_ONLY: &str =
    "this admin view is read-only: releasing is turned off (Admin::allow_release)";

/// Why the JSON API refuses an operator's `action` before the store is asked: the view is
/// read-only, or the request came from another site.
fn refuse_api<S>(
    admin: &Admin<S>,
    action: protect::Action,
    original: &Uri,
    headers: &HeaderMap,
) -> Option<Response> {
    if !admin.allow_release {
        return Some(json_error(
            StatusCode::FORBIDDEN,
            "ADMIN_READ_ONLY",
            READ_ONLY,
        ));
    }
    let why = protect::cross_site(headers, original)?;
    Some(json_error(
        StatusCode::FORBIDDEN,
        "ADMIN_CROSS_SITE",
        &format!("{why}: nothing was {}", action.done()),
    ))
}

async fn api_release<S: Store + Clone>(
    Shared(admin): Shared<Arc<Admin<S>>>,
    OriginalUri(original): OriginalUri,
    headers: HeaderMap,
    axum::Json(req): axum::Json<ReleaseRequest>,
) -> Response {
    if let Some(refusal) = refuse_api(&admin, protect::Action::Release, &original, &headers) {
        return refusal;
    }
    match release(&admin.store, &req.scope, &req.key, req.fence).await {
        Ok(done) => {
            let status = match done {
                ForcedRelease::FenceMoved { .. } => StatusCode::CONFLICT,
                _ => StatusCode::OK,
            };
            (status, axum::Json(done.to_json())).into_response()
        }
        Err(e) => store_error_json(&e),
    }
}

/// A release by hand, logged: of the claim at `fence` when one is given.
async fn release<S: Store>(
    store: &S,
    scope: &str,
    key: &str,
    fence: Option<u64>,
) -> crate::Result<ForcedRelease> {
    let done = match fence {
        Some(fence) => store.force_release_fenced(scope, key, fence).await?,
        None => store.force_release(scope, key).await?,
    };
    tracing::warn!(target: "idem", scope = %scope, key = %key, fence = ?fence, outcome = ?done, "a claim was released by hand from the admin view");
    Ok(done)
}

// ---- HTML ---------------------------------------------------------------------------------------

/// `text` escaped for HTML text and attribute values.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` escaped for a URL's query.
fn url(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn page(title: &str, base: &str, body: &str) -> Html<String> {
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title} · idem admin</title>\
         <style>body{{font:14px system-ui,sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}}\
         th{{background:#f4f4f4}}pre{{background:#f8f8f8;padding:8px;white-space:pre-wrap;word-break:break-all}}\
         .in_progress{{color:#a60}}.completed{{color:#070}}.released{{color:#777}}.parked{{color:#b00}}.note{{background:#efe;padding:8px}}\
         .error{{background:#fee;padding:8px}}</style></head><body>\
         <p><a href=\"{root}\">records</a> · <a href=\"{base}/api/stats\">stats (JSON)</a></p>\
         <h1>{title}</h1>{body}</body></html>",
        title = esc(title),
        root = esc(&root(base)),
        base = esc(base),
    ))
}

/// The overview's address: the mount point itself (axum's `nest` does not answer it with a
/// trailing slash).
fn root(base: &str) -> String {
    if base.is_empty() {
        "/".to_owned()
    } else {
        base.to_owned()
    }
}

fn error_page(status: StatusCode, base: &str, message: &str) -> Response {
    (
        status,
        page(
            "Error",
            base,
            &format!("<p class=\"error\">{}</p>", esc(message)),
        ),
    )
        .into_response()
}

/// A count bounded by [`StoreStats::BOUND`](crate::store::StoreStats::BOUND): `10000+` when it
/// reached it.
fn bounded(n: u64) -> String {
    if n >= crate::store::StoreStats::BOUND {
        format!("{n}+")
    } else {
        n.to_string()
    }
}

fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Stored bytes as a page shows them: text when the whole is UTF-8 (cut between two
/// characters), else hex; at most [`SHOWN_BYTES`] of them, and how many more there are.
fn shown(bytes: &[u8]) -> String {
    let (head, cut) = match std::str::from_utf8(bytes) {
        Ok(text) => {
            let end = text.floor_char_boundary(SHOWN_BYTES);
            (esc(&text[..end]), end)
        }
        Err(_) => {
            let end = bytes.len().min(SHOWN_BYTES);
            (format!("hex: {}", hex(&bytes[..end])), end)
        }
    };
    if cut < bytes.len() {
        let more = format!(
            "\n… {} more bytes (the whole answer: api/record)",
            bytes.len() - cut
        );
        format!("{head}{}", esc(&more))
    } else {
        head
    }
}

fn record_link(base: &str, r: &RecordInfo) -> String {
    format!(
        "{}/record?scope={}&amp;key={}",
        esc(base),
        url(&r.scope),
        url(&r.key)
    )
}

async fn overview<S: Store + Clone>(
    Shared(admin): Shared<Arc<Admin<S>>>,
    OriginalUri(original): OriginalUri,
    seen: Uri,
    Query(params): Params,
) -> Response {
    let base = base(&original, &seen);
    let query = match query_of(&params) {
        Ok(q) => q,
        Err(why) => return error_page(StatusCode::BAD_REQUEST, &base, &why),
    };
    let (stats, listed) = match (
        admin.store.stats(EXPIRING_WITHIN).await,
        admin.store.listing(&query).await,
    ) {
        (Ok(s), Ok(l)) => (s, l),
        (Err(e), _) | (_, Err(e)) => {
            return store_error_page(&e, &base);
        }
    };
    let found = &listed.records;
    let mut body = String::new();
    let _ = write!(
        body,
        "<table id=\"stats\"><tr><th>in progress</th><th>completed</th><th>released</th><th>parked</th>\
         <th>unfinished</th><th>oldest unfinished</th><th>expired, to purge</th>\
         <th>oldest claim in progress</th><th>expiring within an hour</th></tr>\
         <tr><td>{}</td><td>{}</td><td>{}</td><td id=\"parked\">{}</td><td id=\"unfinished\">{}</td><td>{}</td>\
         <td>{}</td><td>{}</td><td>{}</td></tr></table>",
        stats.states.in_progress,
        stats.states.completed,
        stats.states.released,
        stats.states.parked,
        stats.unfinished,
        stats
            .oldest_unfinished
            .map(age)
            .unwrap_or_else(|| "none".into()),
        bounded(stats.expired),
        stats
            .oldest_in_progress
            .map(age)
            .unwrap_or_else(|| "none".into()),
        bounded(stats.expiring_soon),
    );
    if !stats.complete {
        let _ = write!(
            body,
            "<p id=\"counted\">Counted: the {} records read, every one that holds unfinished work \
             and the newest others; the store holds more. Unfinished and parked work is counted \
             whole; the other states and prefixes are those of the records read.</p>",
            stats.counted
        );
    }
    body.push_str("<h2>By scope prefix</h2><table id=\"prefixes\"><tr><th>prefix</th><th>in progress</th><th>completed</th><th>released</th><th>parked</th></tr>");
    for (prefix, c) in &stats.by_prefix {
        let _ = write!(
            body,
            "<tr><td><a href=\"{root}?prefix={p}\">{name}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            c.in_progress,
            c.completed,
            c.released,
            c.parked,
            root = esc(&root(&base)),
            p = url(prefix),
            name = esc(prefix),
        );
    }
    body.push_str("</table>");
    let value = |name: &str| esc(params.get(name).map(String::as_str).unwrap_or(""));
    let selected = |state: &str| {
        if params.get("state").map(String::as_str) == Some(state) {
            " selected"
        } else {
            ""
        }
    };
    let _ = write!(
        body,
        "<h2>Records</h2><form method=\"get\" action=\"{root}\">\
         state <select name=\"state\"><option value=\"\">any</option>\
         <option{}>in_progress</option><option{}>completed</option><option{}>released</option><option{}>parked</option></select> \
         scope prefix <input name=\"prefix\" value=\"{}\"> \
         older than <input name=\"older_than\" size=\"5\" placeholder=\"5m\" value=\"{}\"> \
         <label><input type=\"checkbox\" name=\"work\" value=\"1\"{}> holding unfinished work</label> \
         limit <input name=\"limit\" size=\"5\" value=\"{}\"> <button>filter</button></form>",
        selected("in_progress"),
        selected("completed"),
        selected("released"),
        selected("parked"),
        value("prefix"),
        value("older_than"),
        if query.holding_work { " checked" } else { "" },
        value("limit"),
        root = esc(&root(&base)),
    );
    body.push_str(
        "<table id=\"records\"><tr><th>scope</th><th>key</th><th>state</th><th>fence</th><th>attempt</th>\
         <th>age</th><th>lease left</th><th>expires in</th></tr>",
    );
    for r in found {
        let _ = write!(
            body,
            "<tr><td>{}</td><td><a href=\"{}\">{}</a></td><td class=\"{state}\">{state}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.scope),
            record_link(&base, r),
            esc(&r.key),
            r.fence,
            r.attempt,
            age(r.age),
            r.lease_remaining.map(age).unwrap_or_default(),
            if r.expires_in.is_zero() {
                "expired".into()
            } else {
                age(r.expires_in)
            },
            state = r.state.as_str(),
        );
    }
    body.push_str("</table>");
    if found.len() == query.limit {
        let _ = write!(
            body,
            "<p>The first {} records; narrow the filter or raise the limit.</p>",
            query.limit
        );
    } else if !listed.complete {
        let _ = write!(
            body,
            "<p id=\"examined\">Only the first {} records in this listing's order were examined; \
             others may match: narrow it by scope prefix, or to records holding unfinished work.</p>",
            query.examine
        );
    }
    page("Idempotency records", &base, &body).into_response()
}

async fn record_page<S: Store + Clone>(
    Shared(admin): Shared<Arc<Admin<S>>>,
    OriginalUri(original): OriginalUri,
    seen: Uri,
    Query(params): Params,
) -> Response {
    let base = base(&original, &seen);
    let (scope, key) = match identity(&params) {
        Ok(id) => id,
        Err(why) => return error_page(StatusCode::BAD_REQUEST, &base, &why),
    };
    let r = match admin.store.inspect(scope, key).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return error_page(
                StatusCode::NOT_FOUND,
                &base,
                "No record with this scope and key (never claimed, or purged).",
            );
        }
        Err(e) => {
            return store_error_page(&e, &base);
        }
    };
    let mut body = String::new();
    if let Some(note) = params.get("released").or(params.get("retried")) {
        let _ = write!(body, "<p class=\"note\" id=\"notice\">{}</p>", esc(note));
    }
    let _ = write!(
        body,
        "<table id=\"record\"><tr><th>scope</th><td>{}</td></tr><tr><th>key</th><td>{}</td></tr>\
         <tr><th>state</th><td id=\"state\" class=\"{state}\">{state}</td></tr><tr><th>fence</th><td id=\"fence\">{}</td></tr>\
         <tr><th>attempt</th><td>{}</td></tr><tr><th>age</th><td>{}</td></tr>\
         <tr><th>lease left</th><td>{}</td></tr><tr><th>expires in</th><td>{}</td></tr>\
         <tr><th>fingerprint</th><td><code>{}</code></td></tr></table>",
        esc(&r.scope),
        esc(&r.key),
        r.fence,
        r.attempt,
        age(r.age),
        r.lease_remaining.map(age).unwrap_or_else(|| "–".into()),
        if r.expires_in.is_zero() {
            "expired".into()
        } else {
            age(r.expires_in)
        },
        r.fingerprint,
        state = r.state.as_str(),
    );
    if let Some(note) = &r.note {
        let what = if r.state == State::Parked {
            "Parked: its attempts ran out, and it waits for an operator"
        } else {
            "Unfinished: its outcome is unknown, and it waits to be resumed"
        };
        let _ = write!(
            body,
            "<h2>Why it is unfinished</h2><p>{what}{}.</p><pre id=\"why\">{}</pre>",
            if r.resumable {
                " (its request is stored: a completer can resume it)"
            } else {
                " (by the request's retry)"
            },
            esc(note)
        );
    }
    if let Some(point) = &r.recovery_point {
        let _ = write!(body, "<h2>Recovery point</h2><pre>{}</pre>", shown(point));
    }
    if let Some(answer) = &r.response {
        let _ = write!(
            body,
            "<h2>Stored answer</h2><p>status {}{}</p><pre id=\"answer\">{}</pre>",
            answer
                .status
                .map_or_else(|| "none".to_owned(), |s| s.to_string()),
            if answer.is_error {
                ", a final error"
            } else {
                ""
            },
            shown(&answer.body),
        );
    }
    if r.state == State::Parked {
        retry_section(&mut body, &admin, &base, &r);
    }
    if matches!(r.state, State::InProgress | State::Parked) {
        release_section(&mut body, &admin, &base, &r);
    }
    page("Record", &base, &body).into_response()
}

/// The record page's release form: for this claim (its fence), signed.
fn release_section<S>(body: &mut String, admin: &Admin<S>, base: &str, r: &RecordInfo) {
    if !admin.allow_release {
        body.push_str("<p>This view is read-only: releasing is turned off.</p>");
        return;
    }
    let Some(token) = admin
        .forms
        .token(protect::Action::Release, &r.scope, &r.key, r.fence)
    else {
        body.push_str(
            "<p class=\"error\">Releasing is refused: the view has no secret to sign its form \
             with (Admin::form_secret).</p>",
        );
        return;
    };
    let _ = write!(
        body,
        "<h2>Release</h2><p>If the process that holds this claim is gone (crashed, killed), \
         releasing lets the next request with this key run at once. Its fence moves on: should \
         the process still be running, it can no longer complete over the retry. Only this claim \
         (fence {fence}) is released: if another has taken its place by then, nothing is.</p>\
         <form method=\"post\" action=\"{}/release\"><input type=\"hidden\" name=\"scope\" value=\"{}\">\
         <input type=\"hidden\" name=\"key\" value=\"{}\"><input type=\"hidden\" name=\"fence\" value=\"{fence}\">\
         <input type=\"hidden\" name=\"token\" value=\"{token}\"><button id=\"release\">Release this claim</button></form>",
        esc(base),
        esc(&r.scope),
        esc(&r.key),
        fence = r.fence,
    );
}

/// The release form as the record page writes it; `fence` and `token` are checked, not
/// trusted to be there.
#[derive(Debug, serde::Deserialize)]
struct ReleaseForm {
    scope: String,
    key: String,
    fence: Option<String>,
    token: Option<String>,
}

/// The refusal of a form the view's own page did not send.
fn not_from_the_page(action: protect::Action) -> String {
    format!(
        "This {} was not sent by the record's page in this admin view: its form token is \
         missing or does not match (a page from before a restart, from another instance that \
         does not share the form secret, or a form another site wrote).",
        action.noun()
    )
}

/// What a signed form must prove before its action runs: releasing (or retrying) is allowed,
/// it is not another site's request, and its token is the view's own for its record and fence.
/// The fence it names, or the page that refuses it.
fn admit<S>(
    admin: &Admin<S>,
    action: protect::Action,
    original: &Uri,
    headers: &HeaderMap,
    base: &str,
    req: &ReleaseForm,
) -> Result<u64, Box<Response>> {
    if !admin.allow_release {
        return Err(Box::new(error_page(StatusCode::FORBIDDEN, base, READ_ONLY)));
    }
    if let Some(why) = protect::cross_site(headers, original) {
        let why = format!("This {} came from another site: {why}.", action.noun());
        return Err(Box::new(refused(base, req, action, &why)));
    }
    let fence = req.fence.as_deref().and_then(|f| f.parse::<u64>().ok());
    fence
        .filter(|&f| {
            let token = req.token.as_deref().unwrap_or("");
            admin.forms.admits(action, &req.scope, &req.key, f, token)
        })
        .ok_or_else(|| Box::new(refused(base, req, action, &not_from_the_page(action))))
}

async fn release_form<S: Store + Clone>(
    Shared(admin): Shared<Arc<Admin<S>>>,
    OriginalUri(original): OriginalUri,
    seen: Uri,
    headers: HeaderMap,
    Form(req): Form<ReleaseForm>,
) -> Response {
    let base = base(&original, &seen);
    let action = protect::Action::Release;
    let fence = match admit(&admin, action, &original, &headers, &base, &req) {
        Ok(fence) => fence,
        Err(refusal) => return *refusal,
    };
    let note = match release(&admin.store, &req.scope, &req.key, Some(fence)).await {
        Ok(ForcedRelease::Released { fence }) => format!("Released; the fence is now {fence}."),
        Ok(ForcedRelease::NotInProgress(state)) => {
            format!("Nothing released: the record is {}.", state.as_str())
        }
        Ok(ForcedRelease::FenceMoved { fence: now, state }) => {
            return moved_on(&base, &req, fence, now, state);
        }
        Ok(_) => "Nothing released: no such record.".to_owned(),
        Err(e) => {
            return store_error_page(&e, &base);
        }
    };
    // After a POST, a GET: reloading the page does not release again.
    Redirect::to(&format!(
        "{base}/record?scope={}&key={}&released={}",
        url(&req.scope),
        url(&req.key),
        url(&note)
    ))
    .into_response()
}

/// The record page's retry form, for parked work: for this record (its fence), signed.
fn retry_section<S>(body: &mut String, admin: &Admin<S>, base: &str, r: &RecordInfo) {
    if !admin.allow_release {
        return;
    }
    let Some(token) = admin
        .forms
        .token(protect::Action::Retry, &r.scope, &r.key, r.fence)
    else {
        return;
    };
    let _ = write!(
        body,
        "<h2>Retry</h2><p>Once what made it fail is fixed, retrying puts this work in progress          again: a completer resumes it at once (or the request's own retry does), with its          attempts counted afresh. Only this record (fence {fence}) is retried.</p>         <form method=\"post\" action=\"{}/retry\"><input type=\"hidden\" name=\"scope\" value=\"{}\">         <input type=\"hidden\" name=\"key\" value=\"{}\"><input type=\"hidden\" name=\"fence\" value=\"{fence}\">         <input type=\"hidden\" name=\"token\" value=\"{token}\"><button id=\"retry\">Retry this work</button></form>",
        esc(base),
        esc(&r.scope),
        esc(&r.key),
        fence = r.fence,
    );
}

async fn retry_form<S: Store + Clone>(
    Shared(admin): Shared<Arc<Admin<S>>>,
    OriginalUri(original): OriginalUri,
    seen: Uri,
    headers: HeaderMap,
    Form(req): Form<ReleaseForm>,
) -> Response {
    let base = base(&original, &seen);
    if let Err(refusal) = admit(
        &admin,
        protect::Action::Retry,
        &original,
        &headers,
        &base,
        &req,
    ) {
        return *refusal;
    }
    let note = match retry(&admin.store, &req.scope, &req.key).await {
        Ok(Retried::Retried { fence }) => {
            format!("Retried: in progress again (fence {fence}); a completer resumes it now.")
        }
        Ok(Retried::NotParked(state)) => {
            format!("Nothing retried: the record is {}.", state.as_str())
        }
        Ok(_) => "Nothing retried: no such record.".to_owned(),
        Err(e) => {
            return store_error_page(&e, &base);
        }
    };
    Redirect::to(&format!(
        "{base}/record?scope={}&key={}&retried={}",
        url(&req.scope),
        url(&req.key),
        url(&note)
    ))
    .into_response()
}

/// A retry by hand, logged.
async fn retry<S: Store>(store: &S, scope: &str, key: &str) -> crate::Result<Retried> {
    let done = store.retry(scope, key).await?;
    tracing::warn!(target: "idem", scope = %scope, key = %key, outcome = ?done, "parked work was retried by hand from the admin view");
    Ok(done)
}

/// The body of a retry through the API: which record.
#[derive(Debug, serde::Deserialize)]
struct RetryRequest {
    scope: String,
    key: String,
}

async fn api_retry<S: Store + Clone>(
    Shared(admin): Shared<Arc<Admin<S>>>,
    OriginalUri(original): OriginalUri,
    headers: HeaderMap,
    axum::Json(req): axum::Json<RetryRequest>,
) -> Response {
    if let Some(refusal) = refuse_api(&admin, protect::Action::Retry, &original, &headers) {
        return refusal;
    }
    match retry(&admin.store, &req.scope, &req.key).await {
        Ok(done) => {
            let status = match done {
                Retried::Retried { .. } => StatusCode::OK,
                Retried::NotParked(_) => StatusCode::CONFLICT,
                Retried::NotFound => StatusCode::NOT_FOUND,
            };
            (status, axum::Json(done.to_json())).into_response()
        }
        Err(e) => store_error_json(&e),
    }
}

/// A link to the record of a release form, for the pages that refuse it.
fn form_record_link(base: &str, req: &ReleaseForm) -> String {
    format!(
        "<p><a id=\"record-link\" href=\"{}/record?scope={}&amp;key={}\">Open the record again</a> \
         and decide from what it shows now.</p>",
        esc(base),
        url(&req.scope),
        url(&req.key)
    )
}

/// 403: a release refused before the store was asked; nothing changed.
fn refused(base: &str, req: &ReleaseForm, action: protect::Action, why: &str) -> Response {
    let what = action.noun();
    tracing::warn!(target: "idem", scope = %req.scope, key = %req.key, why, action = what, "the admin view refused a form");
    let body = format!(
        "<p class=\"error\" id=\"refused\">{} Nothing was {}.</p>{}",
        esc(why),
        action.done(),
        form_record_link(base, req)
    );
    let title = match action {
        protect::Action::Release => "Release refused",
        protect::Action::Retry => "Retry refused",
    };
    (StatusCode::FORBIDDEN, page(title, base, &body)).into_response()
}

/// 409: the record's fence is no longer the page's; nothing changed.
fn moved_on(base: &str, req: &ReleaseForm, seen: u64, now: u64, state: State) -> Response {
    let body = format!(
        "<p class=\"error\" id=\"refused\">Nothing released: the record's fence is now {now} \
         ({state}), not {seen} as the page showed. The claim you saw has ended and the record \
         has moved on since.</p>{}",
        form_record_link(base, req),
        state = state.as_str(),
    );
    (StatusCode::CONFLICT, page("Nothing released", base, &body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_text_is_cut_between_characters_and_stays_text() {
        // One byte, then two-byte characters: the cut at SHOWN_BYTES falls inside one.
        let text = format!("a{}", "é".repeat(SHOWN_BYTES));
        let page = shown(text.as_bytes());
        let kept = SHOWN_BYTES - 1;
        assert!(
            page.starts_with(&format!("a{}\n…", "é".repeat(kept / 2))),
            "{}",
            &page[..40]
        );
        assert!(
            page.ends_with(&format!(
                "… {} more bytes (the whole answer: api/record)",
                text.len() - kept
            )),
            "{}",
            &page[page.len() - 60..]
        );
        // Exactly SHOWN_BYTES of text: whole, no note.
        let exact = "é".repeat(SHOWN_BYTES / 2);
        assert_eq!(shown(exact.as_bytes()), exact);
        // A four-byte character across the cut.
        let text = format!("{}🦀🦀", "x".repeat(SHOWN_BYTES - 2));
        let page = shown(text.as_bytes());
        assert!(
            page.starts_with(&format!("{}\n…", "x".repeat(SHOWN_BYTES - 2))),
            "{page}"
        );
        assert!(
            page.ends_with("… 8 more bytes (the whole answer: api/record)"),
            "{page}"
        );
    }

    #[test]
    fn bytes_that_are_not_text_are_hex() {
        assert_eq!(shown(&[0xff, 0x00, 0x41]), "hex: ff0041");
        let mut bytes = "é".repeat(SHOWN_BYTES).into_bytes();
        bytes.push(0xff);
        let page = shown(&bytes);
        assert!(page.starts_with("hex: c3a9c3a9"), "{}", &page[..20]);
        assert!(page.ends_with(&format!(
            "… {} more bytes (the whole answer: api/record)",
            bytes.len() - SHOWN_BYTES
        )));
    }
}
