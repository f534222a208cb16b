//! The completer: resumable work whose caller never came back is finished once, on every store
//! (memory, SQLite, PostgreSQL, MySQL, Redis standalone and cluster). A lost answer nobody
//! retries, a call cut off mid-body, attempts that run out (parked, then retried by an
//! operator), completers and client retries racing on the same claims, and unfinished work that
//! outlives its retention.
//!
//! PostgreSQL runs when `DATABASE_URL` points at it at build time (each case in a schema of its
//! own), MySQL when `IDEM_MYSQL_URL` does (each case in a database of its own), Redis when
//! `IDEM_REDIS_URL` or `IDEM_REDIS_CLUSTER` does (each case under a key prefix of its own);
//! otherwise their cases are listed as ignored.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::completer::{Completer, Resumption, Round};
use idem::lifecycle::State;
use idem::store::{Deferred, Operation, Reply};
use idem::store::{Retried, StoreAdmin};
use idem::{MemoryStore, MySqlStore, PgStore, RedisStore, SqliteStore, Store, idempotent};

use common::{MyDatabase, PgSchema, RedisKeys, SqliteFile};

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
        let store = MySqlStore::builder()
            .build(database.pool.clone())
            .await
            .expect("create the table");
        (store, Box::new(database))
    }
}

impl Backend for RedisStore {
    async fn fresh() -> (Self, Box<dyn std::any::Any + Send>) {
        let (keys, store) = common::redis_store().await;
        (store, Box::new(keys))
    }
}

/// The Redis store on a cluster: records spread over every primary, the completer's index on
/// one of them.
#[derive(Clone)]
struct RedisCluster(RedisStore);

impl Store for RedisCluster {
    fn call<'a>(
        &'a self,
        op: Operation<'a>,
    ) -> impl Future<Output = idem::Result<Reply>> + Send + 'a {
        self.0.call(op)
    }

    fn defer(&self, write: Deferred) {
        self.0.defer(write)
    }
}

impl Backend for RedisCluster {
    async fn fresh() -> (Self, Box<dyn std::any::Any + Send>) {
        let nodes = common::redis_cluster();
        let keys = RedisKeys::new(&nodes);
        let store = RedisStore::builder()
            .prefix(keys.prefix.clone())
            .connect_cluster(&nodes)
            .await
            .expect("connect to the Redis Cluster");
        (RedisCluster(store), Box::new(keys))
    }
}

/// What the bank does on a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Moves the money (once per downstream key) and answers.
    Works,
    /// Moves the money, and the answer is lost: the caller cannot tell.
    LosesAnswers,
    /// Does not answer at all (no money moves), and the caller cannot tell that either.
    TimesOut,
    /// Hangs until the gate opens, then works.
    Hangs,
}

/// A bank that deduplicates by key, as real payment gateways do, and counts what happens.
struct Bank {
    mode: Mutex<Mode>,
    /// Money moved, by the caller's downstream key.
    moved: Mutex<HashMap<String, u32>>,
    /// Calls of the guarded body, by order.
    runs: Mutex<HashMap<String, u32>>,
    gate: tokio::sync::Semaphore,
    entered: AtomicUsize,
}

impl Bank {
    fn new(mode: Mode) -> Arc<Bank> {
        Arc::new(Bank {
            mode: Mutex::new(mode),
            moved: Mutex::default(),
            runs: Mutex::default(),
            gate: tokio::sync::Semaphore::new(0),
            entered: AtomicUsize::new(0),
        })
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    fn moves(&self) -> u32 {
        self.moved.lock().unwrap().values().sum()
    }

    fn runs(&self, order_no: &str) -> u32 {
        self.runs
            .lock()
            .unwrap()
            .get(order_no)
            .copied()
            .unwrap_or(0)
    }
}

#[derive(Debug)]
enum PayError {
    Idem(idem::Error),
    NoAnswer,
}

impl From<idem::Error> for PayError {
    fn from(e: idem::Error) -> Self {
        PayError::Idem(e)
    }
}

/// Refunds `order_no` through the bank. When the bank's answer is lost, says the outcome is
/// unknown: the claim is kept for the completer or a retry.
#[idempotent(
    scope = "pay:<order_no>",
    key = key,
    store = store,
    claim = claim,
    skip(bank),
    resumable
)]
async fn pay<S: Store + Clone>(
    store: &S,
    bank: &Bank,
    order_no: String,
    key: String,
) -> Result<String, PayError> {
    *bank
        .runs
        .lock()
        .unwrap()
        .entry(order_no.clone())
        .or_default() += 1;
    let mode = *bank.mode.lock().unwrap();
    if mode == Mode::Hangs {
        bank.entered.fetch_add(1, Ordering::SeqCst);
        let _open = bank.gate.acquire().await;
    }
    if mode == Mode::TimesOut {
        claim.outcome_unknown("the bank timed out");
        return Err(PayError::NoAnswer);
    }
    let downstream = claim.downstream_key("bank");
    bank.moved.lock().unwrap().entry(downstream).or_insert(1);
    if mode == Mode::LosesAnswers {
        claim.outcome_unknown("the bank's answer was lost");
        return Err(PayError::NoAnswer);
    }
    Ok(format!(
        "refunded {order_no} on attempt {}",
        claim.attempt()
    ))
}

/// A completer that resumes `pay` with `bank`.
fn completer<S: Backend>(store: &S, bank: &Arc<Bank>) -> Completer<S> {
    let (store2, bank) = (store.clone(), bank.clone());
    Completer::new(store.clone()).resume("pay:<order_no>", move |r: Resumption| {
        let (store, bank) = (store2.clone(), bank.clone());
        async move {
            let order_no: String = r.arg("order_no")?;
            pay(&store, &bank, order_no, r.key().to_string()).await
        }
    })
}

/// Rounds of `c` until one resumes something (the claim's resume time passed), at most `limit`.
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

async fn a_lost_answer_nobody_retries_is_finished_by_the_completer_once<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::LosesAnswers);
    let first = pay(&store, &bank, "ORD-1".into(), "k-1".into()).await;
    assert!(matches!(first, Err(PayError::NoAnswer)), "{first:?}");
    assert_eq!(bank.moves(), 1, "the money moved");
    let kept = store.inspect("pay:ORD-1", "k-1").await.unwrap().unwrap();
    assert_eq!(kept.state, State::InProgress, "{kept:?}");
    assert!(kept.holds_work() && kept.resumable, "{kept:?}");
    assert_eq!(kept.note.as_deref(), Some("the bank's answer was lost"));

    // Nobody retries. The completer waits out the resume delay, then finishes it.
    bank.set(Mode::Works);
    let c = completer(&store, &bank);
    let early = c.run_once().await.unwrap();
    assert_eq!(early.due, 0, "not before its resume time: {early:?}");
    let round = round_that_resumes(&c, Duration::from_secs(5)).await;
    assert_eq!((round.due, round.completed), (1, 1), "{round:?}");
    assert_eq!(
        bank.moves(),
        1,
        "resumed with the same downstream key: no second move"
    );
    assert_eq!(bank.runs("ORD-1"), 2);

    // The client's later retry gets the completer's answer; nothing runs again.
    let late = pay(&store, &bank, "ORD-1".into(), "k-1".into()).await;
    assert_eq!(late.unwrap(), "refunded ORD-1 on attempt 2");
    assert_eq!(bank.runs("ORD-1"), 2);
    let done = store.inspect("pay:ORD-1", "k-1").await.unwrap().unwrap();
    assert_eq!(done.state, State::Completed);
    assert!(!done.holds_work(), "{done:?}");
    assert_eq!(c.run_once().await.unwrap().due, 0, "nothing left to do");
}

async fn a_call_cut_off_mid_body_is_resumed<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::Hangs);
    // The caller goes away while the body waits on the bank.
    let cut = tokio::time::timeout(
        Duration::from_millis(300),
        pay(&store, &bank, "ORD-2".into(), "k-2".into()),
    )
    .await;
    assert!(cut.is_err(), "the call was cut off");
    assert_eq!(bank.entered.load(Ordering::SeqCst), 1);
    bank.set(Mode::Works);
    let c = completer(&store, &bank);
    let round = round_that_resumes(&c, Duration::from_secs(6)).await;
    assert_eq!((round.due, round.completed), (1, 1), "{round:?}");
    assert_eq!(bank.moves(), 1);
    let replay = pay(&store, &bank, "ORD-2".into(), "k-2".into()).await;
    assert_eq!(replay.unwrap(), "refunded ORD-2 on attempt 2");
    assert_eq!(bank.runs("ORD-2"), 2);
}

async fn attempts_run_out_and_the_claim_is_parked_until_an_operator_retries<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::TimesOut);
    let first = pay(&store, &bank, "ORD-3".into(), "k-3".into()).await;
    assert!(matches!(first, Err(PayError::NoAnswer)));
    let c = completer(&store, &bank).max_attempts(2);
    // Attempt 2, by the completer: the bank still times out, the claim is suspended again.
    let round = round_that_resumes(&c, Duration::from_secs(5)).await;
    assert_eq!((round.due, round.suspended), (1, 1), "{round:?}");
    // Its attempts ran out: parked, with its last error, never run again by itself.
    let round = round_that_resumes(&c, Duration::from_secs(8)).await;
    assert_eq!((round.due, round.parked), (1, 1), "{round:?}");
    assert_eq!(bank.runs("ORD-3"), 2);
    let parked = store.inspect("pay:ORD-3", "k-3").await.unwrap().unwrap();
    assert_eq!(parked.state, State::Parked, "{parked:?}");
    assert!(
        parked
            .note
            .as_deref()
            .unwrap()
            .contains("the bank timed out"),
        "{parked:?}"
    );
    assert_eq!(
        c.run_once().await.unwrap().due,
        0,
        "a parked claim is not due"
    );
    // Its client is told it waits for an operator, and nothing runs.
    let asked = pay(&store, &bank, "ORD-3".into(), "k-3".into()).await;
    match asked {
        Err(PayError::Idem(e)) => {
            assert!(matches!(e, idem::Error::Parked), "{e:?}");
            assert_eq!(e.status(), 409);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(bank.runs("ORD-3"), 2);
    // The operator retries it once the bank is back: the completer finishes it at once.
    bank.set(Mode::Works);
    let retried = store.retry("pay:ORD-3", "k-3").await.unwrap();
    assert!(matches!(retried, Retried::Retried { .. }), "{retried:?}");
    let round = c.run_once().await.unwrap();
    assert_eq!((round.due, round.completed), (1, 1), "{round:?}");
    assert_eq!(bank.moves(), 1);
    let answer = pay(&store, &bank, "ORD-3".into(), "k-3".into()).await;
    assert!(answer.unwrap().starts_with("refunded ORD-3"));
    assert_eq!(bank.runs("ORD-3"), 3);
}

async fn completers_and_retries_racing_on_the_same_claims_run_each_once<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let bank = Bank::new(Mode::LosesAnswers);
    const ORDERS: usize = 12;
    for n in 0..ORDERS {
        let r = pay(&store, &bank, format!("ORD-{n}"), format!("k-{n}")).await;
        assert!(r.is_err());
    }
    assert_eq!(bank.moves() as usize, ORDERS);
    bank.set(Mode::Works);
    // Wait until they are due, then four completers and a client retry per order, at once.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut racers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let c = completer(&store, &bank);
        racers.spawn(async move {
            c.run_once().await.unwrap();
        });
    }
    for n in 0..ORDERS {
        let (store, bank) = (store.clone(), bank.clone());
        racers.spawn(async move {
            // In progress (a completer holds it) or its answer: never a second run.
            let _ = pay(&store, &bank, format!("ORD-{n}"), format!("k-{n}")).await;
        });
    }
    while let Some(done) = racers.join_next().await {
        done.unwrap();
    }
    // Whatever is left (a retry that was told "in progress"), one more round finishes.
    completer(&store, &bank).run_once().await.unwrap();
    for n in 0..ORDERS {
        let order = format!("ORD-{n}");
        assert_eq!(
            bank.runs(&order),
            2,
            "{order}: the first call and one resumption"
        );
        let done = store
            .inspect(&format!("pay:{order}"), &format!("k-{n}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(done.state, State::Completed, "{done:?}");
    }
    assert_eq!(bank.moves() as usize, ORDERS, "no money moved twice");
}

/// Unfinished, and kept for a second only: its retention is over before anyone finishes it.
#[idempotent(
    scope = "short:<order_no>",
    key = key,
    store = store,
    claim = claim,
    lease = "1s",
    retain = "1s",
    resumable
)]
async fn short_lived<S: Store + Clone>(
    store: &S,
    order_no: String,
    key: String,
) -> Result<(), PayError> {
    claim.outcome_unknown("the bank timed out");
    Err(PayError::NoAnswer)
}

async fn unfinished_work_outlives_its_retention_and_the_purge<S: Backend>() {
    let (store, _keep) = S::fresh().await;
    let r = short_lived(&store, "ORD-9".into(), "k-9".into()).await;
    assert!(r.is_err());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    store.purge_expired().await.unwrap();
    let kept = store.inspect("short:ORD-9", "k-9").await.unwrap();
    let kept = kept.expect("unfinished work is never purged");
    assert!(kept.holds_work(), "{kept:?}");
    assert_eq!(kept.state, State::InProgress);
    // It is still the same request's: its retry resumes it as the next attempt, never starts
    // it as new.
    let again = short_lived(&store, "ORD-9".into(), "k-9".into()).await;
    assert!(again.is_err());
    let resumed = store.inspect("short:ORD-9", "k-9").await.unwrap().unwrap();
    assert_eq!(resumed.attempt, 2, "{resumed:?}");
    assert!(resumed.holds_work(), "{resumed:?}");
}

mod memory {
    crate::backend_tests!(
        idem::MemoryStore:
        a_lost_answer_nobody_retries_is_finished_by_the_completer_once,
        a_call_cut_off_mid_body_is_resumed,
        attempts_run_out_and_the_claim_is_parked_until_an_operator_retries,
        completers_and_retries_racing_on_the_same_claims_run_each_once(flavor = "multi_thread", worker_threads = 4),
        unfinished_work_outlives_its_retention_and_the_purge,
    );
}

mod sqlite {
    crate::backend_tests!(
        idem::SqliteStore:
        a_lost_answer_nobody_retries_is_finished_by_the_completer_once,
        a_call_cut_off_mid_body_is_resumed,
        attempts_run_out_and_the_claim_is_parked_until_an_operator_retries,
        completers_and_retries_racing_on_the_same_claims_run_each_once(flavor = "multi_thread", worker_threads = 4),
        unfinished_work_outlives_its_retention_and_the_purge,
    );
}

mod postgres {
    crate::backend_tests!(
        #[cfg_attr(not(idem_postgres), ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…")]
        idem::PgStore:
        a_lost_answer_nobody_retries_is_finished_by_the_completer_once,
        a_call_cut_off_mid_body_is_resumed,
        attempts_run_out_and_the_claim_is_parked_until_an_operator_retries,
        completers_and_retries_racing_on_the_same_claims_run_each_once(flavor = "multi_thread", worker_threads = 4),
        unfinished_work_outlives_its_retention_and_the_purge,
    );
}

mod mysql {
    crate::backend_tests!(
        #[cfg_attr(not(idem_mysql), ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…")]
        idem::MySqlStore:
        a_lost_answer_nobody_retries_is_finished_by_the_completer_once,
        a_call_cut_off_mid_body_is_resumed,
        attempts_run_out_and_the_claim_is_parked_until_an_operator_retries,
        completers_and_retries_racing_on_the_same_claims_run_each_once(flavor = "multi_thread", worker_threads = 4),
        unfinished_work_outlives_its_retention_and_the_purge,
    );
}

mod redis {
    crate::backend_tests!(
        #[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
        idem::RedisStore:
        a_lost_answer_nobody_retries_is_finished_by_the_completer_once,
        a_call_cut_off_mid_body_is_resumed,
        attempts_run_out_and_the_claim_is_parked_until_an_operator_retries,
        completers_and_retries_racing_on_the_same_claims_run_each_once(flavor = "multi_thread", worker_threads = 4),
        unfinished_work_outlives_its_retention_and_the_purge,
    );
}

mod redis_cluster {
    crate::backend_tests!(
        #[cfg_attr(
            not(idem_redis_cluster),
            ignore = "needs a Redis Cluster: set IDEM_REDIS_CLUSTER=redis://host:port,…"
        )]
        super::RedisCluster:
        a_lost_answer_nobody_retries_is_finished_by_the_completer_once,
        a_call_cut_off_mid_body_is_resumed,
        attempts_run_out_and_the_claim_is_parked_until_an_operator_retries,
        completers_and_retries_racing_on_the_same_claims_run_each_once(flavor = "multi_thread", worker_threads = 4),
        unfinished_work_outlives_its_retention_and_the_purge,
    );
}

// ---- the size cap of a stored request -------------------------------------------------------

/// Resumable with the default cap (64 KiB): the note is part of the stored request.
#[idempotent(scope = "note:<order_no>", key = key, store = store, skip(runs), resumable)]
async fn note_default(
    store: &MemoryStore,
    runs: &AtomicUsize,
    order_no: String,
    key: String,
    note: String,
) -> Result<usize, idem::Error> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

/// Resumable with a cap of its own, 1 KiB.
#[idempotent(scope = "small:<order_no>", key = key, store = store, skip(runs), resumable, max_request = "1KiB")]
async fn note_small(
    store: &MemoryStore,
    runs: &AtomicUsize,
    order_no: String,
    key: String,
    note: String,
) -> Result<usize, idem::Error> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::test]
async fn a_resumable_call_past_its_size_cap_is_refused_with_413_before_anything_is_claimed() {
    let store = MemoryStore::new();
    let runs = AtomicUsize::new(0);
    // The default cap: 64 KiB of stored request. A note just under it runs; one past it is
    // the client's 413, and nothing is claimed or run.
    let fits = "n".repeat(60 * 1024);
    assert_eq!(
        note_default(&store, &runs, "A".into(), "k-a".into(), fits)
            .await
            .unwrap(),
        1
    );
    let past = "n".repeat(64 * 1024);
    match note_default(&store, &runs, "B".into(), "k-b".into(), past).await {
        Err(e @ idem::Error::RequestTooLarge { max: 65_536, .. }) => {
            assert_eq!((e.status(), e.code()), (413, "REQUEST_TOO_LARGE_TO_RESUME"));
        }
        other => panic!("{other:?}"),
    }
    assert!(store.inspect("note:B", "k-b").await.unwrap().is_none());
    // `max_request = "1KiB"`: the call's own cap.
    let small = note_small(&store, &runs, "C".into(), "k-c".into(), "n".repeat(2000)).await;
    match small {
        Err(idem::Error::RequestTooLarge { len, max: 1024 }) => assert!(len > 2000, "{len}"),
        other => panic!("{other:?}"),
    }
    assert!(store.inspect("small:C", "k-c").await.unwrap().is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "no refused call ran");
    assert_eq!(
        note_small(&store, &runs, "D".into(), "k-d".into(), "short".into())
            .await
            .unwrap(),
        2
    );
}

#[test]
fn a_size_cap_out_of_range_is_refused_where_it_is_made() {
    use idem::RequestCap;
    assert_eq!(RequestCap::DEFAULT.bytes(), 64 * 1024);
    // The attribute's range (`max_request`, checked when it compiles) is the runtime's.
    assert_eq!(RequestCap::MAX.bytes(), 1024 * 1024);
    assert_eq!(RequestCap::new(1).unwrap().bytes(), 1);
    assert_eq!(RequestCap::new(1024 * 1024).unwrap(), RequestCap::MAX);
    for bad in [0, 1024 * 1024 + 1, usize::MAX] {
        match RequestCap::new(bad) {
            Err(idem::Error::Config(why)) => assert!(why.contains("1 MiB"), "{why}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}
