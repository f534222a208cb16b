//! `#[idempotent]` across the signatures it must support, and its behaviour, on the memory and
//! SQLite stores.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use idem::{Error, Idempotent, MemoryStore, SqliteStore, Store, idempotent};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Refund {
    order_no: String,
    cents: u64,
    run: usize,
}

/// The application state of the handlers below: a store and a counter of body runs.
#[derive(Clone)]
struct App<S> {
    store: S,
    runs: Arc<AtomicUsize>,
}

impl<S> App<S> {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
    fn run(&self) -> usize {
        self.runs.fetch_add(1, Ordering::SeqCst) + 1
    }
}

// ---- the signature matrix -------------------------------------------------------------------

#[idempotent(scope = "refund:<order_no>", key = key, store = app.store, skip(app))]
async fn free_fn<S: Store + Clone>(
    app: &App<S>,
    order_no: String,
    key: &str,
    cents: u64,
) -> Result<Refund, Error> {
    let run = app.run();
    Ok(Refund {
        order_no,
        cents,
        run,
    })
}

struct Service<S> {
    app: App<S>,
    handled: Vec<String>,
}

impl<S: Store + Clone> Service<S> {
    #[idempotent(scope = "svc:<order_no>", key = key, store = self.app.store)]
    async fn by_ref(&self, order_no: &str, key: &str) -> Result<usize, Error> {
        Ok(self.app.run())
    }

    #[idempotent(scope = "svc-mut:<order_no>", key = key, store = self.app.store)]
    async fn by_mut(&mut self, order_no: String, key: String) -> Result<usize, Error> {
        self.handled.push(order_no);
        Ok(self.app.run())
    }
}

#[idempotent(scope = "generic:<id>", key = key, store = app.store, skip(app))]
async fn generic<S, T>(app: &App<S>, id: u32, key: &str, item: T) -> Result<(T, usize), Error>
where
    S: Store + Clone,
    T: Serialize + DeserializeOwned + Send,
{
    Ok((item, app.run()))
}

#[idempotent(scope = "impl-arg", key = key.as_ref(), store = app.store, skip(app, key))]
async fn impl_trait_args<S: Store + Clone>(
    app: &App<S>,
    key: impl AsRef<str>,
    payload: impl Serialize,
) -> Result<usize, Error> {
    let _ = &payload;
    Ok(app.run())
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum Parsed {
    Early,
    Late(u64),
}

#[idempotent(scope = "early:<input>", key = key, store = app.store, skip(app))]
async fn early_return_and_try<S: Store + Clone>(
    app: &App<S>,
    input: String,
    key: &str,
) -> Result<Parsed, Error> {
    app.run();
    if input == "early" {
        return Ok(Parsed::Early);
    }
    let n: u64 = input
        .parse()
        .map_err(|_| Error::Encode("not a number".into()))?;
    Ok(Parsed::Late(n))
}

#[derive(Debug, Serialize, Deserialize)]
struct RefundReq {
    cents: u64,
}

#[idempotent(scope = "axum:<order_no>", key = key, store = app.store)]
async fn extractor_patterns<S: Store + Clone>(
    #[idem(skip)] State(app): State<App<S>>,
    axum::extract::Path(order_no): axum::extract::Path<String>,
    key: String,
    Json(req): Json<RefundReq>,
) -> Result<Json<Refund>, Error> {
    let run = app.run();
    Ok(Json(Refund {
        order_no,
        cents: req.cents,
        run,
    }))
}

/// Not serializable: fingerprinting it would not compile, so it must really be cfg'd out.
#[allow(dead_code)]
struct Opaque;

#[idempotent(scope = "cfg", key = key, store = app.store, skip(app))]
async fn cfg_on_argument<S: Store + Clone>(
    app: &App<S>,
    key: &str,
    #[cfg(any())] gone: Opaque,
    #[cfg(test)] kept: u32,
) -> Result<u32, Error> {
    app.run();
    Ok(kept)
}

#[idempotent(scope = "tracked:<n>", key = key, store = app.store, skip(app))]
async fn tracked<S: Store + Clone>(
    app: &App<S>,
    n: u32,
    key: &str,
) -> Result<Idempotent<u32>, Error> {
    app.run();
    Ok(Idempotent::Fresh(n))
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum PayError {
    Declined(String),
    GatewayDown,
    Idem(String),
}

impl From<Error> for PayError {
    fn from(e: Error) -> Self {
        PayError::Idem(e.code().to_owned())
    }
}

impl idem::FinalError for PayError {
    fn is_final(&self) -> bool {
        matches!(self, PayError::Declined(_))
    }
}

#[idempotent(scope = "pay:<card>", key = key, store = app.store, skip(app), on_error = "store_final")]
async fn pay<S: Store + Clone>(app: &App<S>, card: &str, key: &str) -> Result<u64, PayError> {
    let run = app.run();
    match card {
        "declined" => Err(PayError::Declined(format!("run {run}"))),
        "flaky" if run == 1 => Err(PayError::GatewayDown),
        _ => Ok(run as u64),
    }
}

#[idempotent(scope = "slow:<id>", key = key, store = app.store, skip(app, delay, panic))]
async fn slow<S: Store + Clone>(
    app: &App<S>,
    id: u32,
    key: &str,
    delay: Duration,
    panic: bool,
) -> Result<usize, Error> {
    let run = app.run();
    tokio::time::sleep(delay).await;
    assert!(!panic, "the body panicked");
    Ok(run)
}

/// `slow`, whose duplicates wait for the running call's answer instead of being told "in
/// progress".
#[idempotent(scope = "waits:<id>", key = key, store = app.store, skip(app, delay), wait = "10s")]
async fn waits<S: Store + Clone>(
    app: &App<S>,
    id: u32,
    key: &str,
    delay: Duration,
) -> Result<usize, Error> {
    let run = app.run();
    tokio::time::sleep(delay).await;
    Ok(run)
}

/// Runs to its end even when its caller is dropped; counts the runs that got there.
#[idempotent(scope = "finish:<id>", key = key, store = app.store, skip(app, delay), on_cancel = "finish")]
async fn finishing<S: Store + Clone + 'static>(
    app: App<S>,
    id: u32,
    key: String,
    delay: Duration,
) -> Result<usize, Error> {
    tokio::time::sleep(delay).await;
    Ok(app.run())
}

/// Not a serde type: replayed through its own encoding.
#[derive(Debug, PartialEq)]
struct Receipt(u64);

impl idem::replay::ReplayBytes for Receipt {
    fn to_replay_bytes(&self) -> Result<Vec<u8>, Error> {
        Ok(self.0.to_be_bytes().to_vec())
    }
    fn from_replay_bytes(bytes: &[u8]) -> Result<Self, Error> {
        let b: [u8; 8] = bytes
            .try_into()
            .map_err(|_| Error::Decode("8 bytes".into()))?;
        Ok(Receipt(u64::from_be_bytes(b)))
    }
}

#[idempotent(scope = "receipt:<n>", key = key, store = app.store, skip(app))]
async fn own_encoding<S: Store + Clone>(app: &App<S>, n: u64, key: &str) -> Result<Receipt, Error> {
    Ok(Receipt(n * 100 + app.run() as u64))
}

#[idempotent(scope = "charge:<order_no>", key = key, store = app.store, skip(app), claim = claim)]
async fn sees_its_claim<S: Store + Clone>(
    app: &App<S>,
    order_no: &str,
    key: &str,
) -> Result<(String, u64), Error> {
    app.run();
    assert_eq!(claim.scope(), format!("charge:{order_no}"));
    Ok((claim.downstream_key("gateway"), claim.fence()))
}

async fn memory_app() -> App<MemoryStore> {
    App {
        store: MemoryStore::new(),
        runs: Arc::new(AtomicUsize::new(0)),
    }
}

async fn sqlite_app() -> App<SqliteStore> {
    App {
        store: SqliteStore::in_memory().await.unwrap(),
        runs: Arc::new(AtomicUsize::new(0)),
    }
}

macro_rules! on_every_store {
    ($($name:ident => $make:ident),*) => {$(
mod $name {
    use super::*;

    #[tokio::test]
    async fn free_function_replays_without_running() {
        let app = $make().await;
        let first = free_fn(&app, "A1".into(), "k1", 250).await.unwrap();
        let again = free_fn(&app, "A1".into(), "k1", 250).await.unwrap();
        assert_eq!(first, again);
        assert_eq!(app.runs(), 1, "a replay must not run the body");
        // Another key, or the same key for another order, is another request.
        free_fn(&app, "A1".into(), "k2", 250).await.unwrap();
        free_fn(&app, "A2".into(), "k1", 250).await.unwrap();
        assert_eq!(app.runs(), 3);
    }

    #[tokio::test]
    async fn same_key_different_arguments_is_key_reuse() {
        let app = $make().await;
        free_fn(&app, "A1".into(), "k1", 250).await.unwrap();
        let err = free_fn(&app, "A1".into(), "k1", 999).await.unwrap_err();
        assert!(matches!(err, Error::KeyReused), "{err:?}");
        assert_eq!(err.status(), 422);
        assert_eq!(app.runs(), 1);
    }

    #[tokio::test]
    async fn methods_by_ref_and_by_mut() {
        let app = $make().await;
        let svc = Service { app: app.clone(), handled: vec![] };
        assert_eq!(svc.by_ref("A1", "k").await.unwrap(), 1);
        assert_eq!(svc.by_ref("A1", "k").await.unwrap(), 1);
        let mut svc = svc;
        assert_eq!(svc.by_mut("B1".into(), "k".into()).await.unwrap(), 2);
        assert_eq!(svc.by_mut("B1".into(), "k".into()).await.unwrap(), 2);
        assert_eq!(svc.handled, ["B1"], "the replay did not run the body");
    }

    #[tokio::test]
    async fn generics_and_where_clauses() {
        let app = $make().await;
        assert_eq!(generic(&app, 1, "k", vec!["x".to_string()]).await.unwrap(), (vec!["x".to_string()], 1));
        assert_eq!(generic(&app, 1, "k", vec!["x".to_string()]).await.unwrap(), (vec!["x".to_string()], 1));
        assert!(matches!(generic(&app, 1, "k", vec!["y".to_string()]).await, Err(Error::KeyReused)));
    }

    #[tokio::test]
    async fn impl_trait_arguments() {
        let app = $make().await;
        assert_eq!(impl_trait_args(&app, "k", [1, 2]).await.unwrap(), 1);
        assert_eq!(impl_trait_args(&app, String::from("k"), [1, 2]).await.unwrap(), 1);
        assert!(matches!(impl_trait_args(&app, "k", [3]).await, Err(Error::KeyReused)));
    }

    #[tokio::test]
    async fn early_return_and_question_mark() {
        let app = $make().await;
        assert_eq!(early_return_and_try(&app, "early".into(), "k1").await.unwrap(), Parsed::Early);
        assert_eq!(early_return_and_try(&app, "7".into(), "k2").await.unwrap(), Parsed::Late(7));
        assert!(early_return_and_try(&app, "x".into(), "k3").await.is_err());
        // The error released the claim: the retry runs the body again.
        assert!(early_return_and_try(&app, "x".into(), "k3").await.is_err());
        assert_eq!(app.runs(), 4);
    }

    #[tokio::test]
    async fn axum_extractor_patterns() {
        let app = $make().await;
        let call = |cents| {
            extractor_patterns(
                State(app.clone()),
                axum::extract::Path("A1".to_string()),
                "k".into(),
                Json(RefundReq { cents }),
            )
        };
        let Json(first) = call(100).await.unwrap();
        let Json(again) = call(100).await.unwrap();
        assert_eq!(first, again);
        assert_eq!(app.runs(), 1);
        assert!(matches!(call(200).await, Err(Error::KeyReused)));
    }

    #[tokio::test]
    async fn cfg_on_an_argument() {
        let app = $make().await;
        assert_eq!(cfg_on_argument(&app, "k", 7).await.unwrap(), 7);
        assert!(matches!(cfg_on_argument(&app, "k", 8).await, Err(Error::KeyReused)));
    }

    #[tokio::test]
    async fn the_future_is_send() {
        let app = $make().await;
        let spawned = {
            let app = app.clone();
            tokio::spawn(async move { free_fn(&app, "A1".into(), "k".into(), 1).await })
        };
        spawned.await.unwrap().unwrap();
        let a2 = app.clone();
        let direct = tokio::spawn(async move { slow(&a2, 1, "k2", Duration::ZERO, false).await });
        assert_eq!(direct.await.unwrap().unwrap(), 2);
    }

    #[tokio::test]
    async fn a_type_with_its_own_encoding_replays() {
        let app = $make().await;
        assert_eq!(own_encoding(&app, 7, "k").await.unwrap(), Receipt(701));
        assert_eq!(own_encoding(&app, 7, "k").await.unwrap(), Receipt(701));
        assert_eq!(app.runs(), 1);
    }

    #[tokio::test]
    async fn the_body_can_see_its_claim() {
        let app = $make().await;
        let (downstream, fence) = sees_its_claim(&app, "A1", "k").await.unwrap();
        assert!(fence > 0);
        assert_eq!(downstream, idem::downstream_key("charge:A1", "k", "gateway"));
        assert_eq!(sees_its_claim(&app, "A1", "k").await.unwrap().0, downstream);
        assert_eq!(app.runs(), 1);
    }

    #[tokio::test]
    async fn a_caller_can_tell_a_replay() {
        let app = $make().await;
        let first = tracked(&app, 5, "k").await.unwrap();
        let again = tracked(&app, 5, "k").await.unwrap();
        assert!(!first.is_replay());
        assert!(again.is_replay());
        assert_eq!(*first, *again);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_calls_run_the_body_once() {
        let app = $make().await;
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let app = app.clone();
            tasks.push(tokio::spawn(async move {
                slow(&app, 9, "same-key", Duration::from_millis(200), false).await
            }));
        }
        let (mut ok, mut busy) = (0, 0);
        for t in tasks {
            match t.await.unwrap() {
                Ok(run) => {
                    assert_eq!(run, 1);
                    ok += 1;
                }
                Err(Error::InProgress { .. }) => busy += 1,
                Err(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(app.runs(), 1, "64 concurrent calls ran the body more than once");
        assert_eq!(ok + busy, 64);
        assert!(ok >= 1);
        // Once done, everyone gets the first answer.
        assert_eq!(slow(&app, 9, "same-key", Duration::ZERO, false).await.unwrap(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn duplicates_with_a_wait_get_the_first_answer_not_in_progress() {
        let app = $make().await;
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let app = app.clone();
            tasks.push(tokio::spawn(async move {
                waits(&app, 9, "same-key", Duration::from_millis(300)).await
            }));
        }
        for t in tasks {
            assert_eq!(
                t.await.unwrap().expect("a duplicate with a wait is never told in progress"),
                1
            );
        }
        assert_eq!(app.runs(), 1, "32 concurrent calls ran the body more than once");
    }

    #[tokio::test]
    async fn an_error_releases_and_the_retry_runs() {
        let app = $make().await;
        assert_eq!(pay(&app, "flaky", "k").await, Err(PayError::GatewayDown));
        assert_eq!(pay(&app, "flaky", "k").await, Ok(2));
        assert_eq!(pay(&app, "flaky", "k").await, Ok(2));
        assert_eq!(app.runs(), 2);
    }

    #[tokio::test]
    async fn a_final_error_is_stored_and_replayed() {
        let app = $make().await;
        let first = pay(&app, "declined", "k").await;
        assert_eq!(first, Err(PayError::Declined("run 1".into())));
        assert_eq!(pay(&app, "declined", "k").await, first);
        assert_eq!(app.runs(), 1, "a stored final error must not run the body again");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_future_releases_within_a_second() {
        let app = $make().await;
        let timed_out = tokio::time::timeout(
            Duration::from_millis(50),
            slow(&app, 1, "k", Duration::from_secs(60), false),
        )
        .await;
        assert!(timed_out.is_err());
        let started = std::time::Instant::now();
        loop {
            match slow(&app, 1, "k", Duration::ZERO, false).await {
                Ok(run) => {
                    assert_eq!(run, 2);
                    break;
                }
                Err(Error::InProgress { .. }) if started.elapsed() < Duration::from_secs(1) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                other => panic!("the abandoned claim was not released within 1 s: {other:?}"),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_cancel_finish_runs_a_dropped_call_to_its_end() {
        let app = $make().await;
        let call = finishing(app.clone(), 1, "k".into(), Duration::from_millis(400));
        assert!(tokio::time::timeout(Duration::from_millis(50), call).await.is_err());
        // The caller is gone, the body is not: a retry is told to wait, not run a second body.
        match finishing(app.clone(), 1, "k".into(), Duration::ZERO).await {
            Err(Error::InProgress { .. }) => {}
            other => panic!("a retry while the dropped call still runs: {other:?}"),
        }
        let started = std::time::Instant::now();
        loop {
            match finishing(app.clone(), 1, "k".into(), Duration::ZERO).await {
                Ok(run) => {
                    assert_eq!(run, 1, "the retry got another run than the dropped call's");
                    break;
                }
                Err(Error::InProgress { .. }) if started.elapsed() < Duration::from_secs(5) => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                other => panic!("the dropped call's answer was not stored: {other:?}"),
            }
        }
        assert_eq!(app.runs(), 1, "the body ran more than once");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_releases() {
        let app = $make().await;
        let a = app.clone();
        let panicked = tokio::spawn(async move { slow(&a, 1, "k", Duration::ZERO, true).await }).await;
        assert!(panicked.unwrap_err().is_panic());
        let started = std::time::Instant::now();
        loop {
            match slow(&app, 1, "k", Duration::ZERO, false).await {
                Ok(run) => {
                    assert_eq!(run, 2);
                    break;
                }
                Err(Error::InProgress { .. }) if started.elapsed() < Duration::from_secs(1) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                other => panic!("the panicked claim was not released: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_bad_key_is_rejected_before_the_store() {
        let app = $make().await;
        for bad in ["", "has space", "naïve"] {
            let err = free_fn(&app, "A1".into(), bad, 1).await.unwrap_err();
            assert!(matches!(err, Error::InvalidKey(_)), "{bad:?}: {err:?}");
            assert_eq!(err.status(), 400);
        }
        let long = "k".repeat(256);
        assert!(matches!(free_fn(&app, "A1".into(), &long, 1).await, Err(Error::InvalidKey(_))));
        assert_eq!(app.runs(), 0);
        assert!(app.store.lookup("refund:A1", "has space").await.unwrap().is_none());
    }
}
    )*};
}

on_every_store!(memory => memory_app, sqlite => sqlite_app);

// ---- the default store ----------------------------------------------------------------------

static DEFAULT_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(scope = "default:<n>", key = key)]
async fn uses_the_default_store(n: u32, key: &str) -> Result<u32, Error> {
    DEFAULT_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(n)
}

#[tokio::test]
async fn the_default_store_is_used_when_none_is_named() {
    // Installed once for this test binary; no other test here uses the default store.
    idem::set_default_store(MemoryStore::new()).unwrap();
    assert!(matches!(
        idem::set_default_store(MemoryStore::new()),
        Err(Error::Config(_))
    ));
    assert_eq!(uses_the_default_store(3, "k").await.unwrap(), 3);
    assert_eq!(uses_the_default_store(3, "k").await.unwrap(), 3);
    assert_eq!(DEFAULT_RUNS.load(Ordering::SeqCst), 1);
}

// ---- lease, retention, fingerprint selection, expired-lease policy --------------------------

static LEASE_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(scope = "lease:<id>", key = key, store = store, lease = "2s", retain = "10s", claim = claim, skip(hang))]
async fn leased(store: &MemoryStore, id: u32, key: &str, hang: bool) -> Result<bool, Error> {
    LEASE_RUNS.fetch_add(1, Ordering::SeqCst);
    if hang {
        std::future::pending::<()>().await;
    }
    Ok(claim.is_reclaim())
}

#[idempotent(scope = "closed:<id>", key = key, store = store, lease = "2s", on_expired_lease = "fail_closed", skip(hang))]
async fn fail_closed(store: &MemoryStore, id: u32, key: &str, hang: bool) -> Result<u32, Error> {
    if hang {
        std::future::pending::<()>().await;
    }
    Ok(id)
}

/// Starts a call and abandons it mid-body without dropping it: a process that crashed while
/// holding the claim.
fn crash<F: std::future::Future>(fut: F) {
    let mut fut = Box::pin(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(
        fut.as_mut().poll(&mut cx).is_pending(),
        "the body is running"
    );
    std::mem::forget(fut);
}

#[tokio::test]
async fn the_lease_argument_bounds_a_crashed_claim() {
    let clock = idem::ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    crash(leased(&store, 1, "k", true));
    match leased(&store, 1, "k", false).await {
        Err(Error::InProgress { retry_after }) => {
            assert!(retry_after <= Duration::from_secs(2), "{retry_after:?}")
        }
        other => panic!("{other:?}"),
    }
    clock.advance(Duration::from_millis(2100));
    // The lease ran out: the retry takes the claim over and knows it.
    assert!(leased(&store, 1, "k", false).await.unwrap());
    assert!(leased(&store, 1, "k", false).await.unwrap(), "replayed");
}

#[tokio::test]
async fn the_retain_argument_frees_the_key_after_retention() {
    let clock = idem::ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let before = LEASE_RUNS.load(Ordering::SeqCst);
    assert!(!leased(&store, 2, "k", false).await.unwrap());
    clock.advance(Duration::from_secs(9));
    leased(&store, 2, "k", false).await.unwrap();
    assert_eq!(
        LEASE_RUNS.load(Ordering::SeqCst) - before,
        1,
        "replayed within retention"
    );
    clock.advance(Duration::from_secs(2));
    leased(&store, 2, "k", false).await.unwrap();
    assert_eq!(
        LEASE_RUNS.load(Ordering::SeqCst) - before,
        2,
        "run again after retention"
    );
}

#[tokio::test]
async fn fail_closed_keeps_answering_in_progress() {
    let clock = idem::ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    crash(fail_closed(&store, 1, "k", true));
    clock.advance(Duration::from_secs(60));
    assert!(matches!(
        fail_closed(&store, 1, "k", false).await,
        Err(Error::InProgress { .. })
    ));
}

#[idempotent(scope = "charge:<id>", key = key, store = store, fingerprint(amount))]
async fn fingerprint_only_amount(
    store: &MemoryStore,
    id: u32,
    key: &str,
    amount: u64,
    note: &str,
) -> Result<u64, Error> {
    let _ = note;
    Ok(amount)
}

#[tokio::test]
async fn fingerprint_covers_exactly_the_named_arguments() {
    let store = MemoryStore::new();
    assert_eq!(
        fingerprint_only_amount(&store, 1, "k", 100, "first")
            .await
            .unwrap(),
        100
    );
    // Another note is the same request: replayed.
    assert_eq!(
        fingerprint_only_amount(&store, 1, "k", 100, "retry")
            .await
            .unwrap(),
        100
    );
    // Another amount is another request: refused.
    assert!(matches!(
        fingerprint_only_amount(&store, 1, "k", 200, "first").await,
        Err(Error::KeyReused)
    ));
}

// ---- fingerprints of unordered collections ----------------------------------------------------

/// A request with sets and maps inside it, whose iteration order is the hasher's: a random
/// seed in every `HashSet`/`HashMap`, so it differs between processes and between two
/// collections of one process.
#[derive(Debug, Clone, Serialize)]
struct Basket {
    items: std::collections::HashSet<String>,
    prices: std::collections::HashMap<String, u64>,
    groups: Vec<std::collections::HashSet<u64>>,
}

/// The same basket, built by inserting in `order` into collections with fresh hashers.
fn basket(order: impl Iterator<Item = u64> + Clone) -> Basket {
    use std::collections::hash_map::RandomState;
    let mut items = std::collections::HashSet::with_hasher(RandomState::new());
    let mut prices = std::collections::HashMap::with_hasher(RandomState::new());
    let mut group = std::collections::HashSet::with_hasher(RandomState::new());
    for i in order {
        items.insert(format!("sku-{i}"));
        prices.insert(format!("sku-{i}"), i * 100);
        group.insert(i * 1_000_003);
    }
    Basket {
        items: items.into_iter().collect(),
        prices: prices.into_iter().collect(),
        groups: vec![group.into_iter().collect()],
    }
}

#[idempotent(scope = "basket:<id>", key = key, store = app.store, skip(app))]
async fn check_out(
    app: &App<MemoryStore>,
    id: u32,
    key: &str,
    basket: Basket,
) -> Result<usize, Error> {
    let _ = basket;
    Ok(app.run())
}

#[tokio::test]
async fn a_set_in_the_request_fingerprints_the_same_whatever_its_order() {
    let app = memory_app().await;
    assert_eq!(check_out(&app, 1, "k", basket(0..64)).await.unwrap(), 1);
    // The retry builds the same basket in another order, with other hashers: the same request.
    assert_eq!(
        check_out(&app, 1, "k", basket((0..64).rev()))
            .await
            .unwrap(),
        1,
        "a retry with the same sets must be replayed, not refused as another request"
    );
    assert_eq!(app.runs(), 1);
    // A set with another element is another request.
    assert!(matches!(
        check_out(&app, 1, "k", basket(0..65)).await,
        Err(Error::KeyReused)
    ));
}

/// Set in a child process (by the test below): print the fingerprint of the basket.
const FINGERPRINT_CHILD: &str = "IDEM_TEST_FINGERPRINT_CHILD";

#[test]
fn fingerprint_of_a_basket() {
    let forward = idem::Fingerprint::of(&basket(0..64)).unwrap();
    let backward = idem::Fingerprint::of(&basket((0..64).rev())).unwrap();
    assert_eq!(forward, backward);
    if std::env::var_os(FINGERPRINT_CHILD).is_some() {
        println!("fingerprint={forward}");
    }
}

#[test]
fn a_set_fingerprints_the_same_in_every_process() {
    let here = idem::Fingerprint::of(&basket(0..64)).unwrap().to_string();
    for _ in 0..2 {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fingerprint_of_a_basket",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(FINGERPRINT_CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs = stdout
            .lines()
            // The harness may print the test's name on the same line.
            .find_map(|l| l.split_once("fingerprint=").map(|(_, fp)| fp.trim()))
            .unwrap_or_else(|| panic!("the child printed no fingerprint: {stdout}"));
        assert_eq!(
            theirs, here,
            "another process fingerprints the same basket differently"
        );
    }
}

// ---- a caller dropped while its answer is being stored ------------------------------------------

/// A memory store whose completions wait at a gate: the test drops the caller while one is in
/// flight. Writes a dropped guard defers run through the memory store at once.
#[derive(Clone)]
struct StallsComplete {
    inner: MemoryStore,
    /// Told when a completion reached the store.
    reached: Arc<tokio::sync::Notify>,
    gate: Arc<tokio::sync::Semaphore>,
    releases: Arc<AtomicUsize>,
}

impl Store for StallsComplete {
    async fn call(&self, op: idem::store::Operation<'_>) -> idem::Result<idem::store::Reply> {
        match &op {
            idem::store::Operation::Complete { .. } => {
                self.reached.notify_one();
                let _pass = self.gate.acquire().await;
            }
            idem::store::Operation::Release(_) => {
                self.releases.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        self.inner.call(op).await
    }
    fn defer(&self, write: idem::store::Deferred) {
        if let idem::store::DeferredWrite::Release = write.write {
            self.releases.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.defer(write)
    }
}

#[idempotent(scope = "ship:<order_no>", key = key, store = app.store, skip(app))]
async fn ship(app: &App<StallsComplete>, order_no: u32, key: &str) -> Result<String, Error> {
    Ok(format!("shipment {} of order {order_no}", app.run()))
}

#[tokio::test]
async fn a_caller_dropped_while_its_answer_is_stored_completes_the_record_never_releases_it() {
    use idem::lifecycle::State;
    use idem::store::StoreAdmin;
    let store = StallsComplete {
        inner: MemoryStore::new(),
        reached: Arc::default(),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
        releases: Arc::default(),
    };
    let app = App {
        store: store.clone(),
        runs: Arc::default(),
    };
    // The body ran (the shipment is made) and its answer is on its way to the store when the
    // client hangs up: axum drops the handler's future.
    let call = tokio::spawn({
        let app = app.clone();
        async move { ship(&app, 7, "k-1").await }
    });
    store.reached.notified().await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert_eq!(app.runs(), 1);
    // The dropped guard handed its answer to the store: the record is completed with it.
    let mut record = None;
    for _ in 0..100 {
        let found = store.inner.inspect("ship:7", "k-1").await.unwrap();
        if found.as_ref().is_some_and(|r| r.state != State::InProgress) {
            record = found;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let record = record.expect("the record left in progress");
    assert_eq!(record.state, State::Completed, "{record:?}");
    assert_eq!(
        &record.response.unwrap().body[..],
        br#""shipment 1 of order 7""#
    );
    assert_eq!(store.releases.load(Ordering::SeqCst), 0, "never released");
    // The retry replays it: the shipment is not made again.
    store.gate.add_permits(1 << 20);
    assert_eq!(ship(&app, 7, "k-1").await.unwrap(), "shipment 1 of order 7");
    assert_eq!(app.runs(), 1);
}
