//! A resumable route of the `tower` guard (`GuardLayer::resumable`) finished by a completer
//! that sends the stored request again (`idem::tower::resend`), on every store that keeps
//! requests (memory, SQLite, PostgreSQL, MySQL): an answer lost, an unknown outcome and an
//! inner call cut off, none retried by its client; what the completer learns of the call it
//! re-sent; which headers are stored and sent again; requests too large to store; completers
//! and client retries racing.
//!
//! The inner service pays out through a bank that deduplicates by the downstream key it is
//! given (`ClaimInfo::downstream_key`), as payment gateways do, and counts what moved.
//!
//! PostgreSQL runs when `DATABASE_URL` points at it at build time (each case in a schema of its
//! own), MySQL when `IDEM_MYSQL_URL` does (each case in a database of its own); otherwise their
//! cases are listed as ignored.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, LOCATION};
use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem::completer::{Completer, Resumption, Round};
use idem::lifecycle::State;
use idem::store::{RecordInfo, RecordQuery, StoreAdmin};
use idem::tower::{GuardBody, GuardLayer, GuardService, StoredHttpRequest, resend};
use idem::{
    BoxError, ClaimInfo, MemoryStore, MySqlStore, PgStore, Policy, SqliteStore, Store,
    StoredRequest,
};
use tower::{Layer, ServiceExt};

use common::{MyDatabase, PgSchema, SqliteFile};

/// A store for one case, and what keeps its database alive.
trait Backend: Store + StoreAdmin + Clone + Sized {
    async fn fresh() -> (Self, Box<dyn std::any::Any + Send>);
}

impl Backend for MemoryStore {
    async fn fresh() -> (Self, Box<dyn std::any::Any + Send>) {
        (MemoryStore::new(), Box::new(()))
    }
}

impl Backend for SqliteStore {
    async fn fresh() -> (Self, Box<dyn std::any::Any + Send>) {
        let file = SqliteFile::new();
        let store = SqliteStore::connect(&file.url).await.expect("open SQLite");
        (store, Box::new(file))
    }
}

impl Backend for PgStore {
    async fn fresh() -> (Self, Box<dyn std::any::Any + Send>) {
        let schema = PgSchema::create(&common::pg_url(), 16).await;
        let store = PgStore::builder()
            .build(schema.pool.clone())
            .await
            .expect("create the table");
        (store, Box::new(schema))
    }
}

impl Backend for MySqlStore {
    async fn fresh() -> (Self, Box<dyn std::any::Any + Send>) {
        let database = MyDatabase::create(&common::mysql_url(), 16).await;
        (database.store().await, Box::new(database))
    }
}

// ---------------------------------------------------------------------------------------------
// The bank, and the payout service in front of it.

/// What the bank does on a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Moves the money (once per downstream key) and answers.
    Works,
    /// Moves the money, and its answer is lost: the service cannot tell.
    LosesAnswers,
    /// Does not answer (nothing moves), and the service cannot tell that either.
    TimesOut,
    /// Declines the payout: nothing moves, and the service says so (422).
    Declines,
    /// Hangs until the gate opens, then works.
    Hangs,
}

/// A call of the payout service, as it saw it.
#[derive(Debug, Clone)]
struct Seen {
    headers: HeaderMap,
    target: String,
    body: Bytes,
    attempt: u32,
    downstream: String,
}

struct Bank {
    mode: Mutex<Mode>,
    /// Money moved, by downstream key: the effects.
    moved: Mutex<HashMap<String, u32>>,
    /// Transfers asked of the bank, duplicates included.
    transfers: AtomicUsize,
    /// Every call of the payout service.
    seen: Mutex<Vec<Seen>>,
    gate: tokio::sync::Semaphore,
    entered: AtomicUsize,
}

impl Bank {
    fn new(mode: Mode) -> Arc<Bank> {
        Arc::new(Bank {
            mode: Mutex::new(mode),
            moved: Mutex::default(),
            transfers: AtomicUsize::new(0),
            seen: Mutex::default(),
            gate: tokio::sync::Semaphore::new(0),
            entered: AtomicUsize::new(0),
        })
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// How many payouts moved money: one per downstream key, however often it was asked.
    fn moves(&self) -> usize {
        self.moved.lock().unwrap().len()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Calls of the payout service for `account`.
    fn runs(&self, account: &str) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.target.contains(&format!("/{account}/")))
            .count()
    }

    fn transfer(&self, downstream: &str) {
        self.transfers.fetch_add(1, Ordering::SeqCst);
        *self
            .moved
            .lock()
            .unwrap()
            .entry(downstream.to_owned())
            .or_default() += 1;
    }
}

fn answer(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::from(body))
        .unwrap()
}

/// `POST /accounts/{account}/payouts`: pays out through the bank, with the claim's downstream
/// key.
#[derive(Clone)]
struct Payouts(Arc<Bank>);

impl tower::Service<Request<GuardBody<Full<Bytes>>>> for Payouts {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<GuardBody<Full<Bytes>>>) -> Self::Future {
        let bank = self.0.clone();
        Box::pin(async move {
            let Some(claim) = req.extensions().get::<ClaimInfo>().cloned() else {
                let no = "called without a claim: not through the guard".to_owned();
                return Ok(answer(StatusCode::INTERNAL_SERVER_ERROR, no));
            };
            let (parts, body) = req.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            let downstream = claim.downstream_key("payout");
            let run = {
                let mut seen = bank.seen.lock().unwrap();
                seen.push(Seen {
                    headers: parts.headers.clone(),
                    target: parts.uri.to_string(),
                    body: body.clone(),
                    attempt: claim.attempt(),
                    downstream: downstream.clone(),
                });
                seen.len()
            };
            let mode = *bank.mode.lock().unwrap();
            if mode == Mode::Hangs {
                bank.entered.fetch_add(1, Ordering::SeqCst);
                let _open = bank.gate.acquire().await;
            }
            match mode {
                Mode::TimesOut => {
                    claim.outcome_unknown("the bank timed out");
                    return Ok(answer(StatusCode::GATEWAY_TIMEOUT, "{}".into()));
                }
                Mode::Declines => {
                    return Ok(answer(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        r#"{"declined":true}"#.into(),
                    ));
                }
                _ => {}
            }
            bank.transfer(&downstream);
            if mode == Mode::LosesAnswers {
                claim.outcome_unknown("the bank's answer was lost");
                return Ok(answer(StatusCode::BAD_GATEWAY, "{}".into()));
            }
            let mut created = answer(
                StatusCode::CREATED,
                format!(
                    r#"{{"payout":"{}","request":{},"attempt":{},"run":{run}}}"#,
                    parts.uri.path(),
                    String::from_utf8_lossy(&body),
                    claim.attempt()
                ),
            );
            let headers = created.headers_mut();
            headers.insert(LOCATION, format!("/payouts/{run}").parse().unwrap());
            headers.insert("x-served-by", format!("run-{run}").parse().unwrap());
            Ok(created)
        })
    }
}

type Guarded<St> = GuardService<Payouts, St>;

fn user(parts: &http::request::Parts) -> Option<String> {
    Some(parts.headers.get("x-user")?.to_str().ok()?.to_owned())
}

/// The guard of the payout route: the principal from `x-user`, resumable as "payouts", the
/// tenant stored with the request.
fn layer<St: Store + Clone>(store: &St) -> GuardLayer<St> {
    GuardLayer::new(store.clone())
        .principal(user)
        .resumable("payouts")
        .resumable_headers([HeaderName::from_static("x-tenant")])
}

fn guarded<St: Store + Clone>(layer: GuardLayer<St>, bank: &Arc<Bank>) -> Guarded<St> {
    layer.layer(Payouts(bank.clone()))
}

/// The client's request for payout `n`: its key, its user and tenant, its credentials, a trace
/// header, and a body.
fn payout(n: usize) -> Request<Full<Bytes>> {
    Request::post(format!("/accounts/acct-{n}/payouts?notify=1"))
        .header("idempotency-key", key(n))
        .header("x-user", "u-7")
        .header("x-tenant", "t-1")
        .header(AUTHORIZATION, "Bearer secret-token")
        .header(COOKIE, "session=s3cret")
        .header("x-trace", format!("trace-{n}"))
        .header(CONTENT_TYPE, "application/json")
        .body(Full::from(format!(r#"{{"cents":{}}}"#, 100 + n)))
        .unwrap()
}

fn key(n: usize) -> String {
    format!("payout-key-{n}")
}

/// An answer, read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    async fn read<B>(resp: Response<B>) -> Answer
    where
        B: http_body::Body,
        B::Error: std::fmt::Debug,
    {
        let (head, body) = resp.into_parts();
        Answer {
            status: head.status,
            headers: head.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }

    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    fn code(&self) -> String {
        let json: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_default();
        json["code"].as_str().unwrap_or_default().to_owned()
    }
}

async fn send<St: Store + Clone>(svc: &Guarded<St>, req: Request<Full<Bytes>>) -> Answer {
    Answer::read(svc.clone().oneshot(req).await.unwrap()).await
}

/// The record of payout `n`'s key.
async fn record<S: Backend>(store: &S, n: usize) -> Option<RecordInfo> {
    let all = store.list(&RecordQuery::new()).await.unwrap();
    let mut mine: Vec<_> = all.into_iter().filter(|r| r.key == key(n)).collect();
    assert!(mine.len() <= 1, "{mine:?}");
    mine.pop()
}

/// The completer's answers, as `resend` returned them.
type Answers = Arc<Mutex<Vec<Answer>>>;

/// A completer that resends "payouts" through `svc`, keeping the answers it got in `answers`.
fn completer<S: Backend>(store: &S, svc: &Guarded<S>, answers: &Answers) -> Completer<S> {
    let resend = Arc::new(resend::<Full<Bytes>, _>(svc.clone()));
    let answers = answers.clone();
    Completer::new(store.clone()).resume("payouts", move |r: Resumption| {
        let (resend, answers) = (resend.clone(), answers.clone());
        async move {
            let resp = resend(r).await?;
            let answer = Answer::read(resp).await;
            answers.lock().unwrap().push(answer);
            Ok::<(), BoxError>(())
        }
    })
}

/// Rounds of `c` until one finds a due claim, at most `limit`.
async fn round_that_resumes<S: Backend>(c: &Completer<S>, limit: Duration) -> Round {
    let end = tokio::time::Instant::now() + limit;
    loop {
        let round = c.run_once().await.expect("a round");
        if round.due > 0 || tokio::time::Instant::now() >= end {
            return round;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the completer's call of payout `n` must have been: the stored request, as the client
/// sent it, with only the stored headers; the same downstream key as the first attempt's, and
/// the next attempt number.
fn assert_resent_as_stored(first: &Seen, resent: &Seen) {
    assert_eq!(resent.target, first.target, "the path and query");
    assert_eq!(resent.body, first.body, "the body, byte for byte");
    assert_eq!(
        resent.downstream, first.downstream,
        "the same downstream key"
    );
    assert_eq!(resent.attempt, first.attempt + 1, "the next attempt");
    let mut names: Vec<&str> = resent.headers.keys().map(|n| n.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["content-type", "idempotency-key", "x-tenant"],
        "only the stored headers are sent again: {:?}",
        resent.headers
    );
    for name in ["content-type", "idempotency-key", "x-tenant"] {
        assert_eq!(resent.headers[name], first.headers[name], "{name}");
    }
}

// ---------------------------------------------------------------------------------------------
// The cases.

async fn a_lost_answer_nobody_retries_is_finished_by_resending_it<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::LosesAnswers);
    let svc = guarded(layer(&store), &bank);
    let first = send(&svc, payout(1)).await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY, "the answer was lost");
    assert_eq!(bank.moves(), 1, "the money moved");
    let kept = record(&store, 1).await.expect("the claim is kept");
    assert_eq!(kept.state, State::InProgress, "{kept:?}");
    assert!(kept.resumable && kept.holds_work(), "{kept:?}");
    assert_eq!(kept.note.as_deref(), Some("the bank's answer was lost"));

    // Nobody retries. The completer waits out the resume delay, then sends the request again.
    bank.set(Mode::Works);
    let answers = Answers::default();
    let c = completer(&store, &svc, &answers);
    assert_eq!(
        c.run_once().await.unwrap().due,
        0,
        "not before its resume time"
    );
    let round = round_that_resumes(&c, Duration::from_secs(5)).await;
    assert_eq!((round.due, round.completed), (1, 1), "{round:?}");
    assert_eq!(bank.moves(), 1, "exactly one effect");
    assert_eq!(
        bank.transfers.load(Ordering::SeqCst),
        2,
        "asked twice, moved once"
    );
    let seen = bank.seen();
    assert_eq!(seen.len(), 2);
    assert_resent_as_stored(&seen[0], &seen[1]);

    let done = record(&store, 1).await.unwrap();
    assert_eq!(done.state, State::Completed, "{done:?}");
    assert!(!done.holds_work(), "{done:?}");
    let resent = answers
        .lock()
        .unwrap()
        .pop()
        .expect("the completer's answer");
    assert_eq!(resent.status, StatusCode::CREATED);
    assert!(!resent.replayed());

    // The client's later retry replays the completer's answer byte for byte; nothing runs.
    let late = send(&svc, payout(1)).await;
    assert!(late.replayed(), "{late:?}");
    assert_eq!(late.status, resent.status);
    assert_eq!(late.body, resent.body, "byte for byte");
    assert_eq!(late.headers[LOCATION], resent.headers[LOCATION]);
    assert_eq!(late.headers[CONTENT_TYPE], resent.headers[CONTENT_TYPE]);
    assert_eq!(
        late.body,
        r#"{"payout":"/accounts/acct-1/payouts","request":{"cents":101},"attempt":2,"run":2}"#
    );
    assert_eq!(bank.seen().len(), 2);
    assert_eq!(c.run_once().await.unwrap().due, 0, "nothing left to do");
}

async fn an_unknown_outcome_nobody_retries_moves_the_money_once<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::TimesOut);
    let svc = guarded(layer(&store), &bank);
    let first = send(&svc, payout(2)).await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(bank.moves(), 0);
    bank.set(Mode::Works);
    let c = completer(&store, &svc, &Answers::default());
    let round = round_that_resumes(&c, Duration::from_secs(5)).await;
    assert_eq!((round.due, round.completed), (1, 1), "{round:?}");
    assert_eq!(bank.moves(), 1);
    let late = send(&svc, payout(2)).await;
    assert!(late.replayed());
    assert_eq!(late.status, StatusCode::CREATED);
    assert_eq!(bank.runs("acct-2"), 2);
}

async fn an_inner_call_cut_off_is_taken_over_once_its_lease_runs_out<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::Hangs);
    let lease = Policy::DEFAULT.lease(Duration::from_secs(1));
    let svc = guarded(layer(&store).policy(lease), &bank);
    // The first call hangs inside the service, as one whose process stopped would: nobody
    // says anything, its lease runs out.
    let client = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, payout(3)).await }
    });
    assert!(
        common::until(Duration::from_secs(5), || bank
            .entered
            .load(Ordering::SeqCst)
            == 1)
        .await
    );
    bank.set(Mode::Works);
    let answers = Answers::default();
    let c = completer(&store, &svc, &answers);
    let round = round_that_resumes(&c, Duration::from_secs(6)).await;
    assert_eq!((round.due, round.completed), (1, 1), "{round:?}");
    assert_eq!(bank.moves(), 1);
    let seen = bank.seen();
    assert_resent_as_stored(&seen[0], &seen[1]);
    let done = record(&store, 3).await.unwrap();
    assert_eq!(done.state, State::Completed, "{done:?}");

    // The first call wakes up: the bank dedupes its transfer, and its answer is not stored
    // over the completer's (its fence is stale).
    bank.gate.add_permits(1);
    let stale = client.await.unwrap();
    assert_eq!(stale.status, StatusCode::CONFLICT, "{stale:?}");
    assert_eq!(stale.code(), "REQUEST_SUPERSEDED");
    assert_eq!(bank.moves(), 1, "one effect");
    let late = send(&svc, payout(3)).await;
    assert!(late.replayed());
    assert_eq!(
        late.body,
        answers.lock().unwrap()[0].body,
        "the completer's answer"
    );
}

async fn the_completer_learns_how_the_resent_call_ended<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::TimesOut);
    let svc = guarded(layer(&store), &bank);
    send(&svc, payout(4)).await;
    let c = completer(&store, &svc, &Answers::default());
    // Still no answer from the bank: kept unknown again, as the next attempt.
    let round = round_that_resumes(&c, Duration::from_secs(5)).await;
    assert_eq!((round.due, round.suspended), (1, 1), "{round:?}");
    let kept = record(&store, 4).await.unwrap();
    assert_eq!(
        (kept.state, kept.attempt),
        (State::InProgress, 2),
        "{kept:?}"
    );
    assert_eq!(kept.note.as_deref(), Some("the bank timed out"));
    // The bank declines: nothing happened, the key is free again.
    bank.set(Mode::Declines);
    let round = round_that_resumes(&c, Duration::from_secs(8)).await;
    assert_eq!((round.due, round.released), (1, 1), "{round:?}");
    let released = record(&store, 4).await;
    assert!(
        released
            .as_ref()
            .is_none_or(|r| r.state == State::Released && !r.holds_work()),
        "{released:?}"
    );
    assert_eq!(c.run_once().await.unwrap().due, 0);
    // The client's retry runs afresh.
    bank.set(Mode::Works);
    let retry = send(&svc, payout(4)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!((bank.runs("acct-4"), bank.moves()), (4, 1));
}

async fn only_the_stored_headers_are_kept_and_sent_again<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::LosesAnswers);
    let svc = guarded(layer(&store), &bank);
    send(&svc, payout(5)).await;
    // What the store holds: the envelope, with the route's headers only.
    let listed = record(&store, 5).await.unwrap();
    let kept = store
        .inspect(&listed.scope, &listed.key)
        .await
        .unwrap()
        .unwrap();
    let request =
        StoredRequest::decode(kept.request.as_deref().expect("the request is stored")).unwrap();
    assert_eq!(request.name(), "payouts");
    let envelope = StoredHttpRequest::decode(request.payload()).unwrap();
    assert_eq!(envelope.method, http::Method::POST);
    assert_eq!(envelope.target, "/accounts/acct-5/payouts?notify=1");
    assert_eq!(envelope.body, r#"{"cents":105}"#);
    let mut names: Vec<&str> = envelope.headers.keys().map(|n| n.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["content-type", "idempotency-key", "x-tenant"]);
    let text = String::from_utf8_lossy(kept.request.as_deref().unwrap()).into_owned();
    for secret in ["secret-token", "s3cret", "u-7", "trace-5"] {
        assert!(!text.contains(secret), "{secret} is not stored: {text}");
    }
    // The principal came from `x-user`, which is not stored: the re-sent request still runs
    // under the record's scope, and the client's retry (with its principal) replays it.
    bank.set(Mode::Works);
    let c = completer(&store, &svc, &Answers::default());
    let round = round_that_resumes(&c, Duration::from_secs(5)).await;
    assert_eq!(round.completed, 1, "{round:?}");
    let seen = bank.seen();
    assert_resent_as_stored(&seen[0], &seen[1]);
    for absent in [AUTHORIZATION, COOKIE, HeaderName::from_static("x-user")] {
        assert!(
            !seen[1].headers.contains_key(&absent),
            "{absent} is not sent again"
        );
    }
    assert!(send(&svc, payout(5)).await.replayed());

    // Credentials are stored only when the route names them.
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::TimesOut);
    let named = layer(&store).resumable_headers([AUTHORIZATION, CONTENT_LENGTH]);
    let svc = guarded(named, &bank);
    send(&svc, payout(6)).await;
    bank.set(Mode::Works);
    let c = completer(&store, &svc, &Answers::default());
    assert_eq!(
        round_that_resumes(&c, Duration::from_secs(5))
            .await
            .completed,
        1
    );
    let seen = bank.seen();
    assert_eq!(seen[1].headers[AUTHORIZATION], "Bearer secret-token");
    assert!(
        !seen[1].headers.contains_key("x-tenant"),
        "resumable_headers replaces what was named before"
    );
}

async fn a_request_too_large_to_store_is_refused_before_it_is_claimed<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::Works);
    let svc = guarded(layer(&store), &bank);
    let big = "x".repeat(StoredRequest::MAX_PAYLOAD);
    let body = format!(r#"{{"memo":"{big}"}}"#);
    let too_big = |announced: bool| {
        let mut req = payout(7);
        if announced {
            req.headers_mut()
                .insert(CONTENT_LENGTH, body.len().to_string().parse().unwrap());
        }
        *req.body_mut() = Full::from(body.clone());
        req
    };
    // Announced or not, and whatever part of it is large.
    let mut huge_header = payout(7);
    huge_header
        .headers_mut()
        .insert("x-tenant", big.parse().unwrap());
    for req in [too_big(true), too_big(false), huge_header] {
        let r = send(&svc, req).await;
        assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{r:?}");
        assert_eq!(r.code(), "REQUEST_TOO_LARGE_TO_RESUME");
        let detail: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let detail = detail["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("65536"), "{detail}");
    }
    assert_eq!(bank.seen().len(), 0, "the service never ran");
    assert!(record(&store, 7).await.is_none(), "nothing was claimed");
    // The same request on a route that is not resumable is under its body limit.
    let plain = guarded(GuardLayer::new(store.clone()).principal(user), &bank);
    assert_eq!(
        send(&plain, too_big(true)).await.status,
        StatusCode::CREATED
    );
}

async fn a_resend_that_reaches_no_guard_is_an_error_and_the_claim_is_kept<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::TimesOut);
    let svc = guarded(layer(&store), &bank);
    send(&svc, payout(8)).await;
    // Given the service inside the guard: the request reaches no guard.
    let unguarded = resend::<GuardBody<Full<Bytes>>, _>(Payouts(bank.clone()));
    let c = Completer::new(store.clone()).resume("payouts", unguarded);
    let round = round_that_resumes(&c, Duration::from_secs(5)).await;
    assert_eq!((round.due, round.suspended), (1, 1), "{round:?}");
    let kept = record(&store, 8).await.unwrap();
    assert_eq!(kept.state, State::InProgress);
    let note = kept.note.unwrap_or_default();
    assert!(note.contains("reached no idem guard"), "{note}");
    assert_eq!(bank.moves(), 0);
}

async fn racing_completers_and_client_retries_pay_each_out_once<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::LosesAnswers);
    let svc = guarded(layer(&store), &bank);
    const PAYOUTS: usize = 8;
    for n in 0..PAYOUTS {
        assert_eq!(send(&svc, payout(n)).await.status, StatusCode::BAD_GATEWAY);
    }
    assert_eq!(bank.moves(), PAYOUTS);
    bank.set(Mode::Works);
    // Once they are due: four completers, and a client retry of each payout, all at once.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut racers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let c = completer(&store, &svc, &Answers::default());
        racers.spawn(async move {
            c.run_once().await.unwrap();
        });
    }
    for n in 0..PAYOUTS {
        let svc = svc.clone();
        racers.spawn(async move {
            // In progress (another holds it), its answer, or the resumption itself.
            let r = send(&svc, payout(n)).await;
            assert!(
                [StatusCode::CREATED, StatusCode::CONFLICT].contains(&r.status),
                "{r:?}"
            );
        });
    }
    while let Some(done) = racers.join_next().await {
        done.unwrap();
    }
    // Whatever is left (a retry told "in progress"), one more round finishes.
    completer(&store, &svc, &Answers::default())
        .run_once()
        .await
        .unwrap();
    for n in 0..PAYOUTS {
        let account = format!("acct-{n}");
        assert_eq!(
            bank.runs(&account),
            2,
            "{account}: the first call and one resumption"
        );
        let done = record(&store, n).await.unwrap();
        assert_eq!(done.state, State::Completed, "{done:?}");
        let late = send(&svc, payout(n)).await;
        assert!(
            late.replayed() && late.status == StatusCode::CREATED,
            "{late:?}"
        );
    }
    assert_eq!(bank.moves(), PAYOUTS, "no money moved twice");
}

mod memory {
    crate::backend_tests!(
        idem::MemoryStore:
        a_lost_answer_nobody_retries_is_finished_by_resending_it,
        an_unknown_outcome_nobody_retries_moves_the_money_once,
        an_inner_call_cut_off_is_taken_over_once_its_lease_runs_out,
        the_completer_learns_how_the_resent_call_ended,
        only_the_stored_headers_are_kept_and_sent_again,
        a_request_too_large_to_store_is_refused_before_it_is_claimed,
        a_resend_that_reaches_no_guard_is_an_error_and_the_claim_is_kept,
        racing_completers_and_client_retries_pay_each_out_once(flavor = "multi_thread", worker_threads = 4),
    );
}

mod sqlite {
    crate::backend_tests!(
        idem::SqliteStore:
        a_lost_answer_nobody_retries_is_finished_by_resending_it,
        an_unknown_outcome_nobody_retries_moves_the_money_once,
        an_inner_call_cut_off_is_taken_over_once_its_lease_runs_out,
        the_completer_learns_how_the_resent_call_ended,
        only_the_stored_headers_are_kept_and_sent_again,
        a_request_too_large_to_store_is_refused_before_it_is_claimed,
        a_resend_that_reaches_no_guard_is_an_error_and_the_claim_is_kept,
        racing_completers_and_client_retries_pay_each_out_once(flavor = "multi_thread", worker_threads = 4),
    );
}

mod postgres {
    crate::backend_tests!(
        #[cfg_attr(not(idem_postgres), ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…")]
        idem::PgStore:
        a_lost_answer_nobody_retries_is_finished_by_resending_it,
        an_unknown_outcome_nobody_retries_moves_the_money_once,
        an_inner_call_cut_off_is_taken_over_once_its_lease_runs_out,
        the_completer_learns_how_the_resent_call_ended,
        only_the_stored_headers_are_kept_and_sent_again,
        a_request_too_large_to_store_is_refused_before_it_is_claimed,
        a_resend_that_reaches_no_guard_is_an_error_and_the_claim_is_kept,
        racing_completers_and_client_retries_pay_each_out_once(flavor = "multi_thread", worker_threads = 4),
    );
}

mod mysql {
    crate::backend_tests!(
        #[cfg_attr(not(idem_mysql), ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…")]
        idem::MySqlStore:
        a_lost_answer_nobody_retries_is_finished_by_resending_it,
        an_unknown_outcome_nobody_retries_moves_the_money_once,
        an_inner_call_cut_off_is_taken_over_once_its_lease_runs_out,
        the_completer_learns_how_the_resent_call_ended,
        only_the_stored_headers_are_kept_and_sent_again,
        a_request_too_large_to_store_is_refused_before_it_is_claimed,
        a_resend_that_reaches_no_guard_is_an_error_and_the_claim_is_kept,
        racing_completers_and_client_retries_pay_each_out_once(flavor = "multi_thread", worker_threads = 4),
    );
}

// ---------------------------------------------------------------------------------------------
// Over the network: a proxy whose upstream commits after everyone gave up on it.

/// The upstream of the proxy: a payment service on a port of its own that moves money once per
/// downstream key. The first call of a key commits only after `COMMIT_AFTER` (longer than the
/// proxy waits for it); a call of a key it knows answers the move at once.
#[derive(Clone, Default)]
struct Upstream {
    moves: Arc<Mutex<HashMap<String, usize>>>,
    calls: Arc<AtomicUsize>,
}

const COMMIT_AFTER: Duration = Duration::from_millis(500);
const PROXY_WAITS: Duration = Duration::from_millis(150);

async fn upstream_pay(
    axum::extract::State(up): axum::extract::State<Upstream>,
    headers: HeaderMap,
) -> (StatusCode, String) {
    up.calls.fetch_add(1, Ordering::SeqCst);
    let dkey = headers["x-downstream-key"].to_str().unwrap().to_owned();
    let known = up.moves.lock().unwrap().get(&dkey).copied();
    let id = match known {
        Some(id) => id,
        // The move commits whether or not its caller is still there (its connection closed
        // when the proxy gave up): on a task of its own, as a database transaction would.
        None => tokio::spawn(async move {
            tokio::time::sleep(COMMIT_AFTER).await;
            let mut moves = up.moves.lock().unwrap();
            let next = moves.len() + 1;
            *moves.entry(dkey).or_insert(next)
        })
        .await
        .unwrap(),
    };
    (StatusCode::CREATED, format!(r#"{{"move":{id}}}"#))
}

/// The guard in front of a real reverse proxy (a `reqwest` client that gives its upstream
/// 150 ms, then answers 504), the upstream on its own port: the client gives up after 50 ms,
/// the proxy gives up after 150, and the upstream commits the money move after 500. The 504
/// may come after the upstream acted, so the claim is kept, not freed; nobody retries, and the
/// completer sends the stored request through the proxy again with the same downstream key,
/// which the upstream answers with the move it made. One move; the client's late retry replays
/// the completer's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_upstream_that_commits_after_the_client_gave_up_moves_the_money_once() {
    let up = Upstream::default();
    let app = axum::Router::new()
        .route("/pay", axum::routing::post(upstream_pay))
        .with_state(up.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}/pay", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let http = reqwest::Client::new();
    let proxy = tower::service_fn(move |req: Request<GuardBody<Full<Bytes>>>| {
        let (http, upstream) = (http.clone(), upstream.clone());
        async move {
            let claim = req.extensions().get::<ClaimInfo>().unwrap().clone();
            let sent = http
                .post(upstream)
                .header("x-downstream-key", claim.downstream_key("pay"))
                .timeout(PROXY_WAITS)
                .send()
                .await;
            let (status, body) = match sent {
                Ok(resp) => (
                    StatusCode::from_u16(resp.status().as_u16()).unwrap(),
                    resp.bytes().await.unwrap_or_default(),
                ),
                Err(_) => (
                    StatusCode::GATEWAY_TIMEOUT,
                    Bytes::from_static(b"upstream timed out"),
                ),
            };
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .header(CONTENT_TYPE, "application/json")
                    .body(Full::new(body))
                    .unwrap(),
            )
        }
    });
    let store = MemoryStore::new();
    let svc = GuardLayer::new(store.clone())
        .allow_anonymous()
        .resumable("proxied")
        .layer(proxy);
    let request = || {
        Request::post("/pay")
            .header("idempotency-key", "pay-1")
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(br#"{"cents":250}"#)))
            .unwrap()
    };
    let gave_up =
        tokio::time::timeout(Duration::from_millis(50), svc.clone().oneshot(request())).await;
    assert!(gave_up.is_err(), "the client gave up before any answer");

    // The proxy's 504 came, then the upstream committed: the claim is still held.
    tokio::time::sleep(COMMIT_AFTER + Duration::from_millis(200)).await;
    assert_eq!(
        up.moves.lock().unwrap().len(),
        1,
        "the upstream moved the money"
    );
    let all = store.list(&RecordQuery::new()).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(
        all[0].state,
        State::InProgress,
        "kept after the 504: {:?}",
        all[0]
    );
    assert!(all[0].holds_work(), "{:?}", all[0]);

    let resend = Arc::new(resend::<Full<Bytes>, _>(svc.clone()));
    let c = Completer::new(store.clone()).resume("proxied", move |r: Resumption| {
        let resend = resend.clone();
        async move {
            let resp = resend(r).await?;
            let status = resp.status();
            resp.into_body()
                .collect()
                .await
                .map_err(|e| format!("{e:?}"))?;
            Ok::<StatusCode, BoxError>(status)
        }
    });
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    let round = loop {
        let round = c.run_once().await.unwrap();
        if round.completed > 0 || tokio::time::Instant::now() >= end {
            break round;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(round.completed, 1, "the completer finished it: {round:?}");
    assert_eq!(up.moves.lock().unwrap().len(), 1, "moved once");
    assert_eq!(up.calls.load(Ordering::SeqCst), 2, "asked twice");

    let late = Answer::read(svc.clone().oneshot(request()).await.unwrap()).await;
    assert!(late.replayed(), "{late:?}");
    assert_eq!(
        (late.status, &late.body[..]),
        (StatusCode::CREATED, &br#"{"move":1}"#[..])
    );
    assert_eq!(
        up.calls.load(Ordering::SeqCst),
        2,
        "the replay asked nobody"
    );
}
