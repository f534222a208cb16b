//! Runtime pieces around the stores: cache, sweeper, downstream keys, table names, default
//! store, the high-level guard.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::store::{Operation, Reply};
use idem::{
    BeginOutcome, BeginRequest, Begun, CachedStore, ClaimRef, Error, Fingerprint, Key, ManualClock,
    MemoryStore, Policy, SqliteStore, Store, StoredResponse, TxStore,
};

/// A store that counts how often `begin` reaches it.
#[derive(Clone)]
struct Counting<S> {
    inner: S,
    begins: Arc<AtomicUsize>,
}

impl<S: Store> Store for Counting<S> {
    async fn call(&self, op: Operation<'_>) -> idem::Result<Reply> {
        if let Operation::Begin(_) = op {
            self.begins.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.call(op).await
    }
    fn defer(&self, write: idem::store::Deferred) {
        self.inner.defer(write)
    }
}

fn req<'a>(key: &'a Key, fp: &'a Fingerprint) -> BeginRequest<'a> {
    BeginRequest {
        scope: "s",
        key: key.as_str(),
        fingerprint: fp,
        policy: &Policy::DEFAULT,
        request: None,
    }
}

#[tokio::test]
async fn cache_serves_completed_records_and_never_in_progress_ones() {
    let begins = Arc::new(AtomicUsize::new(0));
    let store = CachedStore::new(
        Counting {
            inner: MemoryStore::new(),
            begins: begins.clone(),
        },
        100,
    );
    let k = Key::parse("k").unwrap();
    let f = Fingerprint::of("a").unwrap();
    let c = match store.begin(req(&k, &f)).await.unwrap() {
        BeginOutcome::Claimed(c) => c,
        other => panic!("{other:?}"),
    };
    // In progress: every attempt asks the store.
    for _ in 0..3 {
        assert!(matches!(
            store.begin(req(&k, &f)).await.unwrap(),
            BeginOutcome::InProgress { .. }
        ));
    }
    assert_eq!(begins.load(Ordering::SeqCst), 4);
    store
        .complete(
            ClaimRef {
                scope: "s",
                key: "k",
                fence: c.fence,
            },
            &StoredResponse::ok(b"r".to_vec()),
        )
        .await
        .unwrap();
    // The first replay reads the store, the rest come from memory.
    for _ in 0..5 {
        match store.begin(req(&k, &f)).await.unwrap() {
            BeginOutcome::Replay(r) => assert_eq!(r.body, &b"r"[..]),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(begins.load(Ordering::SeqCst), 5);
    assert_eq!(store.cached(), 1);
    // Key reuse is answered from the cache too.
    let other = Fingerprint::of("b").unwrap();
    assert_eq!(
        store.begin(req(&k, &other)).await.unwrap(),
        BeginOutcome::KeyReused
    );
    assert_eq!(begins.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn cache_is_bounded_and_expires() {
    let store = CachedStore::new(MemoryStore::new(), 16).ttl(Duration::from_millis(100));
    let f = Fingerprint::of("a").unwrap();
    for i in 0..200 {
        let k = Key::parse(&format!("k{i}")).unwrap();
        let BeginOutcome::Claimed(c) = store.begin(req(&k, &f)).await.unwrap() else {
            panic!()
        };
        let claim = ClaimRef {
            scope: "s",
            key: k.as_str(),
            fence: c.fence,
        };
        store
            .complete(claim, &StoredResponse::ok(vec![]))
            .await
            .unwrap();
        store.begin(req(&k, &f)).await.unwrap();
    }
    assert!(store.cached() <= 16, "{} cached", store.cached());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let k = Key::parse("k199").unwrap();
    // Expired from the cache, still replayed from the store.
    assert!(matches!(
        store.begin(req(&k, &f)).await.unwrap(),
        BeginOutcome::Replay(_)
    ));
}

#[tokio::test]
async fn sweeper_purges_in_the_background() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let policy = Policy::DEFAULT
        .lease(Duration::from_secs(60))
        .retain(Duration::from_secs(60));
    let k = Key::parse("k").unwrap();
    let f = Fingerprint::of("a").unwrap();
    let r = BeginRequest {
        scope: "s",
        key: "k",
        fingerprint: &f,
        policy: &policy,
        request: None,
    };
    let BeginOutcome::Claimed(c) = store.begin(r).await.unwrap() else {
        panic!()
    };
    store
        .complete(
            ClaimRef {
                scope: "s",
                key: k.as_str(),
                fence: c.fence,
            },
            &StoredResponse::ok(vec![]),
        )
        .await
        .unwrap();
    let _sweeper = idem::spawn_sweeper(store.clone(), Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(store.len(), 1, "not expired yet");
    clock.advance(Duration::from_secs(61));
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while !store.is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.len(), 0, "the sweeper purged the expired record");
}

#[tokio::test]
async fn downstream_keys_are_stable_per_request_and_distinct_per_step() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let key = Key::parse("k").unwrap();
    let f = Fingerprint::of("a").unwrap();
    let policy = Policy::DEFAULT.lease(Duration::from_secs(1));
    let Begun::Claimed(first) = idem::begin(&store, "refund:A1".into(), key.clone(), f, policy)
        .await
        .unwrap()
    else {
        panic!()
    };
    let charge = first.downstream_key("charge");
    assert_ne!(charge, first.downstream_key("notify"));
    assert!(
        charge.starts_with("idem-") && charge.len() == 37,
        "{charge}"
    );
    std::mem::forget(first); // a crashed owner: its claim is never released
    clock.advance(Duration::from_secs(2));
    let Begun::Claimed(second) = idem::begin(&store, "refund:A1".into(), key.clone(), f, policy)
        .await
        .unwrap()
    else {
        panic!()
    };
    assert!(second.is_reclaim());
    assert_eq!(
        second.downstream_key("charge"),
        charge,
        "a take-over repeats the same downstream call"
    );
    assert_ne!(idem::downstream_key("refund:A2", "k", "charge"), charge);
    assert_ne!(idem::downstream_key("refund:A1", "k2", "charge"), charge);
}

#[tokio::test]
async fn guard_checkpoint_then_complete() {
    let store = MemoryStore::new();
    let key = Key::parse("k").unwrap();
    let f = Fingerprint::of("a").unwrap();
    let Begun::Claimed(mut g) = idem::begin(&store, "s".into(), key.clone(), f, Policy::DEFAULT)
        .await
        .unwrap()
    else {
        panic!()
    };
    g.checkpoint(b"step-1").await.unwrap();
    g.complete(&StoredResponse::ok(b"ok".to_vec()))
        .await
        .unwrap();
    match idem::begin(&store, "s".into(), key, f, Policy::DEFAULT)
        .await
        .unwrap()
    {
        Begun::Replay(r) => assert_eq!(r.body, &b"ok"[..]),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn high_level_begin_reports_in_progress_and_reuse_as_errors() {
    let store = MemoryStore::new();
    let key = Key::parse("k").unwrap();
    let f = Fingerprint::of("a").unwrap();
    let _g = idem::begin(&store, "s".into(), key.clone(), f, Policy::DEFAULT)
        .await
        .unwrap();
    match idem::begin(&store, "s".into(), key.clone(), f, Policy::DEFAULT).await {
        Err(Error::InProgress { retry_after }) => assert!(retry_after >= Duration::from_secs(1)),
        other => panic!("{other:?}"),
    }
    let other = Fingerprint::of("b").unwrap();
    assert!(matches!(
        idem::begin(&store, "s".into(), key, other, Policy::DEFAULT).await,
        Err(Error::KeyReused)
    ));
}

#[tokio::test]
async fn table_names_must_be_identifiers() {
    for bad in ["idem; DROP TABLE orders", "a-b", "\"x\"", ""] {
        let r = SqliteStore::builder()
            .table(bad)
            .connect("sqlite::memory:")
            .await;
        assert!(matches!(r, Err(Error::Config(_))), "{bad:?}: {r:?}");
    }
    let ok = SqliteStore::builder()
        .table("my_records")
        .connect("sqlite::memory:")
        .await
        .unwrap();
    assert_eq!(ok.table(), "my_records");
}

#[tokio::test]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn table_names_must_be_identifiers_on_postgres() {
    let url = common::pg_url();
    let schema = common::PgSchema::create(&url, 2).await;
    for bad in ["x.y.z", "x'; --", "1abc"] {
        let r = idem::PgStore::builder()
            .table(bad)
            .build(schema.pool.clone())
            .await;
        assert!(matches!(r, Err(Error::Config(_))), "{bad:?}: {r:?}");
    }
    let qualified = format!("{}.records", schema.name);
    let store = idem::PgStore::builder()
        .table(&qualified)
        .build(schema.pool.clone())
        .await
        .unwrap();
    let k = Key::parse("k").unwrap();
    let f = Fingerprint::of("a").unwrap();
    assert!(matches!(
        store.begin(req(&k, &f)).await.unwrap(),
        BeginOutcome::Claimed(_)
    ));
}

/// Starting a PostgreSQL store, on a new schema or on one that has the tables, says nothing:
/// no "column … already exists, skipping" or "relation … already exists" notices in the log.
#[tokio::test]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn postgres_stores_start_quietly() {
    #[derive(Clone, Default)]
    struct Log(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Log {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = Log::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let log = log.clone();
            move || log.clone()
        })
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .finish();
    // The test's runtime runs on this thread only: every statement's notice is logged here.
    let _logging = tracing::subscriber::set_default(subscriber);

    let schema = common::PgSchema::create(&common::pg_url(), 2).await;
    // Other tests of this binary set and drop subscribers of their own on other threads; a
    // callsite that one of them registered while ours was being set can keep an interest
    // computed without ours. Recompute every callsite's interest now that all are registered.
    tracing::callsite::rebuild_interest_cache();
    for _ in 0..2 {
        idem::PgStore::builder()
            .build(schema.pool.clone())
            .await
            .unwrap();
        let outbox = idem::outbox::PgOutbox::new(schema.pool.clone());
        outbox.migrate().await.unwrap();
    }
    let text = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    assert!(
        text.contains("sqlx::query"),
        "the statements were logged: {text}"
    );
    assert!(
        !text.contains("sqlx::postgres::notice"),
        "a notice was logged: {text}"
    );
}

#[tokio::test]
async fn unreachable_store_is_unavailable_not_a_crash() {
    // Nothing listens on port 1.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://postgres@127.0.0.1:1/test")
        .unwrap();
    let store = idem::PgStore::new(pool);
    let k = Key::parse("k").unwrap();
    let f = Fingerprint::of("a").unwrap();
    let err = store.begin(req(&k, &f)).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert_eq!(err.status(), 503);
}

/// Counts `idem_outcomes_total` by outcome.
#[derive(Default, Clone)]
struct Outcomes(Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>);

struct OutcomeCounter(String, Outcomes);

impl metrics::CounterFn for OutcomeCounter {
    fn increment(&self, value: u64) {
        *self.1.0.lock().unwrap().entry(self.0.clone()).or_default() += value;
    }
    fn absolute(&self, _: u64) {}
}

impl metrics::Recorder for Outcomes {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        assert_eq!(key.name(), "idem_outcomes_total");
        let outcome = key
            .labels()
            .find(|l| l.key() == "outcome")
            .unwrap()
            .value()
            .to_owned();
        metrics::Counter::from_arc(Arc::new(OutcomeCounter(outcome, self.clone())))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

#[test]
fn outcomes_are_counted_through_the_metrics_facade() {
    let recorder = Outcomes::default();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let store = MemoryStore::new();
            let key = Key::parse("k").unwrap();
            let f = Fingerprint::of("a").unwrap();
            let Begun::Claimed(g) =
                idem::begin(&store, "s".into(), key.clone(), f, Policy::DEFAULT)
                    .await
                    .unwrap()
            else {
                panic!()
            };
            g.complete(&StoredResponse::ok(b"ok".to_vec()))
                .await
                .unwrap();
            idem::begin(&store, "s".into(), key.clone(), f, Policy::DEFAULT)
                .await
                .unwrap();
            let other = Fingerprint::of("b").unwrap();
            assert!(
                idem::begin(&store, "s".into(), key, other, Policy::DEFAULT)
                    .await
                    .is_err()
            );
        });
    });
    let counts = recorder.0.lock().unwrap().clone();
    for (outcome, n) in [
        ("claimed", 1),
        ("completed", 1),
        ("replayed", 1),
        ("key_reused", 1),
    ] {
        assert_eq!(counts.get(outcome), Some(&n), "{outcome}: {counts:?}");
    }
}

/// Every outcome event carries a message, not only fields, so a log line reads on its own.
#[test]
fn outcome_events_say_what_happened() {
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Messages(Mutex<Vec<(String, String)>>);

    struct Visit<'a>(&'a mut String, &'a mut String);

    impl tracing::field::Visit for Visit<'_> {
        fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
            if field.name() == "outcome" {
                *self.0 = value.to_owned();
            }
        }
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                *self.1 = format!("{value:?}");
            }
        }
    }

    struct Collect(Arc<Messages>);

    impl tracing::Subscriber for Collect {
        fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
            m.target() == "idem"
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, e: &tracing::Event<'_>) {
            let (mut outcome, mut message) = (String::new(), String::new());
            e.record(&mut Visit(&mut outcome, &mut message));
            self.0.0.lock().unwrap().push((outcome, message));
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    let seen = Arc::new(Messages::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    tracing::subscriber::with_default(Collect(seen.clone()), || {
        rt.block_on(async {
            let store = MemoryStore::new();
            let key = Key::parse("k").unwrap();
            let a = Fingerprint::of("a").unwrap();
            let b = Fingerprint::of("b").unwrap();
            let _held = idem::begin(&store, "s".into(), key.clone(), a, Policy::DEFAULT)
                .await
                .unwrap();
            assert!(
                idem::begin(&store, "s".into(), key.clone(), a, Policy::DEFAULT)
                    .await
                    .is_err()
            );
            assert!(
                idem::begin(&store, "s".into(), key, b, Policy::DEFAULT)
                    .await
                    .is_err()
            );
        })
    });
    let seen = seen.0.lock().unwrap();
    let message = |outcome: &str| {
        seen.iter()
            .find(|(o, _)| o == outcome)
            .map(|(_, m)| m.clone())
            .unwrap_or_else(|| panic!("no {outcome} event in {seen:?}"))
    };
    assert!(message("claimed").contains("claimed"), "{seen:?}");
    assert!(message("in_progress").contains("in progress"), "{seen:?}");
    assert!(
        message("key_reused").contains("different fingerprint"),
        "{seen:?}"
    );
}

/// The purge deletes in batches and gives SQLite's one writer back between them: a claim that
/// arrives while a large purge runs waits for one batch, not for the whole purge.
#[tokio::test]
async fn sqlite_purge_lets_live_claims_in_between_batches() {
    let file = common::SqliteFile::new();
    // This test purges by itself, and counts what it purged.
    let store = SqliteStore::builder()
        .background_purge(false)
        .connect(&file.url)
        .await
        .unwrap();
    // 20,000 records whose retention ended a day ago: twenty batches.
    sqlx::query(
        "WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i + 1 < 20000) \
         INSERT INTO idem_records (scope, key, fingerprint, state, fence, lease_until, expires_at, \
           created_at, updated_at) \
         SELECT 'old', 'k' || i, zeroblob(32), 'completed', 1, 0, \
           CAST(unixepoch('subsec') * 1000 AS INTEGER) - 86400000, 0, 0 FROM g",
    )
    .execute(store.pool())
    .await
    .unwrap();

    let purging = {
        let store = store.clone();
        tokio::spawn(async move { store.purge_expired().await })
    };
    // Let the purge take the writer, then claim.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let key = Key::parse("live").unwrap();
    let fp = Fingerprint::of("a").unwrap();
    let outcome = store.begin(req(&key, &fp)).await.unwrap();
    assert!(matches!(outcome, BeginOutcome::Claimed(_)));
    assert!(
        !purging.is_finished(),
        "the claim was answered before the purge ended, not after it"
    );
    assert_eq!(purging.await.unwrap().unwrap(), 20_000);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(left, 1, "only the live record is left");
}

/// A store written before some operation existed: it answers what it knows and refuses the rest.
struct Partial(MemoryStore);

impl Store for Partial {
    async fn call(&self, op: Operation<'_>) -> idem::Result<Reply> {
        match op {
            Operation::Begin(_) | Operation::Complete { .. } => self.0.call(op).await,
            // Answers a lookup with another operation's reply: a bug the typed call reports.
            Operation::Lookup { .. } => Ok(Reply::Purged(7)),
            other => Err(other.unsupported()),
        }
    }
    fn defer(&self, write: idem::store::Deferred) {
        self.0.defer(write)
    }
}

#[tokio::test]
async fn an_operation_a_store_does_not_offer_is_a_501_naming_it_and_a_wrong_reply_is_an_error() {
    let store = Partial(MemoryStore::new());
    let (k, f) = (
        Key::parse("k-partial").unwrap(),
        Fingerprint::from_bytes([3; 32]),
    );
    let BeginOutcome::Claimed(c) = store.begin(req(&k, &f)).await.unwrap() else {
        panic!("a fresh key is claimed")
    };
    let claim = ClaimRef {
        scope: "s",
        key: k.as_str(),
        fence: c.fence,
    };
    let err = store.release(claim).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unsupported {
                operation: "release"
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        (err.status(), err.code()),
        (501, "OPERATION_NOT_SUPPORTED_BY_STORE")
    );
    assert_eq!(
        err.to_string(),
        "the idempotency store does not support `release`"
    );
    let err = store.purge_expired().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unsupported {
                operation: "purge_expired"
            }
        ),
        "{err:?}"
    );

    let err = store.lookup("s", k.as_str()).await.unwrap_err();
    assert!(matches!(err, Error::Store(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("answered `lookup` with `Reply::Purged`"),
        "{err}"
    );

    // What it does offer still works: the claim completes and replays.
    store
        .complete(claim, &StoredResponse::ok(b"done".to_vec()))
        .await
        .unwrap();
    let BeginOutcome::Replay(r) = store.begin(req(&k, &f)).await.unwrap() else {
        panic!("a completed key replays")
    };
    assert_eq!(r.body, &b"done"[..]);
}

/// A policy whose retention is shorter than its lease (or with no lease) would let a record
/// expire under its running body: refused with a configuration error wherever the policy was
/// built, before the store is asked, and nothing is lost or run.
#[tokio::test]
async fn a_policy_that_lets_a_record_expire_under_its_body_is_refused_everywhere() {
    use idem::consumer::testing::{Said, TestDelivery};
    use idem::consumer::{Consumer, HandlerError, Message, Settlement};
    use idem::tower::GuardLayer;
    use tower::{Layer as _, ServiceExt as _};

    let bad = [
        Policy::DEFAULT
            .lease(Duration::from_secs(600))
            .retain(Duration::from_secs(60)),
        Policy::DEFAULT.lease(Duration::ZERO),
        Policy::DEFAULT.retain(Duration::from_secs(u64::MAX / 4)),
    ];
    for policy in bad {
        let what = format!("{policy:?}");
        assert!(policy.check().is_err(), "{what}");
        // By hand: the store is never asked, and says what to change.
        let store = MemoryStore::new();
        let (k, f) = (Key::parse("k").unwrap(), Fingerprint::of("a").unwrap());
        let req = BeginRequest::new("s", k.as_str(), &f, &policy);
        match store.begin(req).await {
            Err(Error::Config(why)) => assert!(why.contains("policy"), "{why}"),
            other => panic!("{what}: {other:?}"),
        }
        assert!(store.lookup("s", "k").await.unwrap().is_none(), "{what}");

        // The tower guard: a 500 problem, the inner service never runs.
        let runs = Arc::new(AtomicUsize::new(0));
        let inner = {
            let runs = runs.clone();
            tower::service_fn(move |_req: http::Request<idem::tower::GuardBody<String>>| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, std::io::Error>(http::Response::new(String::from("moved"))) }
            })
        };
        let svc = GuardLayer::new(MemoryStore::new())
            .allow_anonymous()
            .policy(policy)
            .layer(inner);
        let req = http::Request::post("/pay")
            .header("idempotency-key", "k-1")
            .body(String::from("{}"))
            .unwrap();
        let resp = svc.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), 500, "{what}");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{what}");

        // A consumer: the delivery is retried, never acked, never run.
        let c = Consumer::new("pay", MemoryStore::new())
            .unwrap()
            .lease(policy.lease)
            .retain(policy.retain);
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let h = c.guarded(move |_msg: Message, _claim| {
            r.fetch_add(1, Ordering::SeqCst);
            async { Ok::<(), HandlerError>(()) }
        });
        let d = TestDelivery::new("m-1", "pay");
        let settled = c.handle(&d, &h).await;
        assert!(
            matches!(settled, Settlement::Retry(_)),
            "{what}: {settled:?}"
        );
        assert!(!d.said().contains(&Said::Ack), "{what}");
        assert_eq!(ran.load(Ordering::SeqCst), 0, "{what}");

        // Transactional mode, where the policy comes from the context (a consumer's, or
        // `with_default_policy`): refused, the body never runs, nothing is written.
        let file = common::SqliteFile::new();
        let sqlite = SqliteStore::connect(&file.url).await.unwrap();
        let runs = TX_RUNS.load(Ordering::SeqCst);
        match idem::with_default_policy(policy, tx_pay(&sqlite, "k-tx")).await {
            Err(Error::Config(why)) => assert!(why.contains("policy"), "{what}: {why}"),
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(TX_RUNS.load(Ordering::SeqCst), runs, "{what}");
        assert!(
            sqlite.lookup("tx-pay", "k-tx").await.unwrap().is_none(),
            "{what}"
        );
        // By hand, inside the caller's transaction: the store is never asked.
        let by_hand = BeginRequest::new("s", k.as_str(), &f, &policy);
        let mut tx = sqlite.begin_transaction().await.unwrap();
        for answer in [
            sqlite.answer_first(by_hand).await.map(|_| ()),
            sqlite.begin_in(&mut tx, by_hand).await.map(|_| ()),
        ] {
            match answer {
                Err(Error::Config(why)) => assert!(why.contains("policy"), "{what}: {why}"),
                other => panic!("{what}: {other:?}"),
            }
        }
        drop(tx);
        assert!(sqlite.lookup("s", "k").await.unwrap().is_none(), "{what}");
    }
    assert!(Policy::DEFAULT.check().is_ok());
    let tight = Policy::DEFAULT
        .lease(Duration::from_millis(1))
        .retain(Duration::from_millis(1));
    assert!(
        tight.check().is_ok(),
        "a retention equal to the lease is fine"
    );
}

static TX_RUNS: AtomicUsize = AtomicUsize::new(0);

/// A transactional call with no policy of its own: it takes its context's.
#[idem::idempotent(scope = "tx-pay", key = key, store = store, transaction = tx)]
async fn tx_pay(store: &SqliteStore, key: &str) -> Result<usize, Error> {
    let _ = &tx;
    Ok(TX_RUNS.fetch_add(1, Ordering::SeqCst))
}

static BIG_RUNS: AtomicUsize = AtomicUsize::new(0);

/// An answer of `mib` MiB and a bit.
#[idem::idempotent(scope = "big:<n>", key = key, store = store)]
async fn big_answer<S: Store + Clone>(
    store: &S,
    n: u32,
    mib: usize,
    key: &str,
) -> Result<String, Error> {
    BIG_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok("x".repeat(mib << 20))
}

/// An answer larger than the policy keeps (1 MiB by default) is returned to its caller once;
/// its record is completed without it, and a retry is told so (409 `ANSWER_NOT_KEPT`) rather
/// than run again. A policy that keeps more stores and replays it. On memory and SQLite.
#[tokio::test]
async fn an_answer_larger_than_the_policy_keeps_is_returned_once_and_never_run_again() {
    let file = common::SqliteFile::new();
    let sqlite = SqliteStore::connect(&file.url).await.unwrap();
    big_answers(MemoryStore::new(), "memory").await;
    big_answers(sqlite, "sqlite").await;
}

async fn big_answers<S: Store + Clone>(store: S, what: &str) {
    let runs = || BIG_RUNS.load(Ordering::SeqCst);
    let before = runs();
    let first = big_answer(&store, 1, 2, "k").await.unwrap();
    assert_eq!(
        first.len(),
        2 << 20,
        "{what}: the first caller gets the whole answer"
    );
    match big_answer(&store, 1, 2, "k").await {
        Err(e @ Error::AnswerNotKept { len, max }) => {
            assert_eq!(
                (len, max),
                (Some((2 << 20) + 2), idem::record::DEFAULT_MAX_ANSWER),
                "{what}"
            );
            assert_eq!((e.status(), e.code()), (409, "ANSWER_NOT_KEPT"), "{what}");
        }
        other => panic!("{what}: {:?}", other.map(|s| s.len())),
    }
    assert_eq!(
        runs() - before,
        1,
        "{what}: the retry did not run the call again"
    );
    let record = store.lookup("big:1", "k").await.unwrap().unwrap();
    assert_eq!(record.state, idem::RecordState::Completed, "{what}");
    // Asked by key (the lookup a client makes before retrying): the same 409.
    let asked = idem::axum::lookup(&store, "big:1", &Key::parse("k").unwrap()).await;
    assert_eq!(asked.status(), 409, "{what}");

    // Kept when the policy allows it: replayed as it was.
    let roomy = Policy::DEFAULT.max_answer(4 << 20);
    let again = idem::with_default_policy(roomy, async {
        let first = big_answer(&store, 2, 2, "k").await.unwrap();
        let replay = big_answer(&store, 2, 2, "k").await.unwrap();
        (first, replay)
    })
    .await;
    assert_eq!(again.0, again.1, "{what}");
    assert_eq!(runs() - before, 2, "{what}");
    assert!(Policy::DEFAULT.max_answer(0).check().is_err());
}

static PAYS: AtomicUsize = AtomicUsize::new(0);

#[idem::idempotent(scope = "pay:<user>", key = key, store = store)]
async fn pay<S: Store + Clone>(store: &S, user: &str, key: &str) -> Result<usize, Error> {
    Ok(PAYS.fetch_add(1, Ordering::SeqCst))
}

/// A `BoundedStore` gives each principal a budget of new records: past it, a request with a new
/// key is refused (429 `TOO_MANY_NEW_KEYS`, `Retry-After`) before anything is written, while a
/// request whose record exists is always served and other principals go on; the budget
/// refills with time. Over the tower guard, the refusal is a 429 problem with `Retry-After`.
#[tokio::test]
async fn new_keys_past_their_budget_are_refused_and_known_keys_are_always_served() {
    use idem::BoundedStore;
    let inner = MemoryStore::new();
    let store = BoundedStore::new(inner.clone(), 2.0)
        .burst(3)
        .per(|scope| scope.split(':').nth(1).map(str::to_owned));
    let mut answers = Vec::new();
    for k in ["a1", "a2", "a3"] {
        answers.push(pay(&store, "alice", k).await.unwrap());
    }
    let runs = PAYS.load(Ordering::SeqCst);
    match pay(&store, "alice", "a4").await {
        Err(e @ Error::TooManyNewKeys { retry_after }) => {
            assert!(retry_after >= Duration::from_secs(1), "{retry_after:?}");
            assert_eq!((e.status(), e.code()), (429, "TOO_MANY_NEW_KEYS"));
            assert!(e.is_retryable());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        PAYS.load(Ordering::SeqCst),
        runs,
        "the refused call did not run"
    );
    assert!(
        inner.lookup("pay:alice", "a4").await.unwrap().is_none(),
        "nothing written"
    );
    // Known keys: replayed, whatever the budget.
    for (k, first) in ["a1", "a2", "a3"].into_iter().zip(&answers) {
        assert_eq!(pay(&store, "alice", k).await.unwrap(), *first);
    }
    // Another principal has its own budget.
    pay(&store, "bob", "b1").await.unwrap();
    // The budget refills: two a second.
    tokio::time::sleep(Duration::from_millis(600)).await;
    pay(&store, "alice", "a4").await.unwrap();

    // Over the tower guard: a 429 problem with Retry-After; the inner service never runs.
    use tower::{Layer as _, ServiceExt as _};
    let runs = Arc::new(AtomicUsize::new(0));
    let inner = {
        let runs = runs.clone();
        tower::service_fn(move |_req: http::Request<idem::tower::GuardBody<String>>| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::io::Error>(http::Response::new(String::from("paid"))) }
        })
    };
    let svc = idem::tower::GuardLayer::new(BoundedStore::new(MemoryStore::new(), 0.5))
        .allow_anonymous()
        .layer(inner);
    let post = |key: &str| {
        http::Request::post("/pay")
            .header("idempotency-key", key)
            .body(String::new())
            .unwrap()
    };
    let first = svc.clone().oneshot(post("k-1")).await.unwrap();
    assert_eq!(first.status(), 200);
    let refused = svc.clone().oneshot(post("k-2")).await.unwrap();
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key(http::header::RETRY_AFTER));
    let replay = svc.clone().oneshot(post("k-1")).await.unwrap();
    assert_eq!(replay.status(), 200);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Claims `k-wait` on `store`, starts a duplicate that waits up to 10 s, completes the claim
/// after a second (of Tokio's paused clock), and answers whether the duplicate replayed and
/// how long it waited.
async fn wait_for_a_completion<S: Store + Clone>(store: S) -> (bool, Duration) {
    let fp = Fingerprint::of("x").unwrap();
    let key = Key::parse("k-wait").unwrap();
    let Begun::Claimed(guard) = idem::begin(&store, "s".into(), key.clone(), fp, Policy::DEFAULT)
        .await
        .unwrap()
    else {
        panic!("a new key was not claimed");
    };
    let duplicate = {
        let store = store.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let policy = Policy::DEFAULT.wait(Duration::from_secs(10));
            let began = idem::begin(&store, "s".into(), key, fp, policy).await;
            (matches!(began, Ok(Begun::Replay(_))), started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    guard
        .complete(&StoredResponse::ok(&b"first"[..]))
        .await
        .unwrap();
    duplicate.await.unwrap()
}

/// A waiting duplicate is woken by the store's announcement that the running call completed,
/// not by its next poll; behind a store that passes no announcements on, it still replays, at
/// the polls' pace; and a call that finds no running claim asks the store once.
#[tokio::test(start_paused = true)]
async fn a_waiting_duplicate_replays_the_moment_the_first_call_completes() {
    let (replayed, took) = wait_for_a_completion(MemoryStore::new()).await;
    assert!(replayed, "the waiting duplicate did not replay");
    assert!(
        took < Duration::from_millis(1005),
        "woken {took:?} after it began waiting, not at the completion (1 s)"
    );
    let begins = Arc::new(AtomicUsize::new(0));
    let unannounced = Counting {
        inner: MemoryStore::new(),
        begins: begins.clone(),
    };
    let (replayed, took) = wait_for_a_completion(unannounced.clone()).await;
    assert!(
        replayed,
        "without announcements, the duplicate did not replay"
    );
    assert!(
        took > Duration::from_millis(1005) && took < Duration::from_millis(1300),
        "without announcements, the duplicate replays at its next ask ({took:?})"
    );
    begins.store(0, Ordering::SeqCst);
    let fp = Fingerprint::of("x").unwrap();
    let fresh = Key::parse("k-fresh").unwrap();
    let policy = Policy::DEFAULT.wait(Duration::from_secs(10));
    let began = idem::begin(&unannounced, "s".into(), fresh, fp, policy).await;
    assert!(matches!(began, Ok(Begun::Claimed(_))));
    assert_eq!(begins.load(Ordering::SeqCst), 1, "a new key is one ask");
}

/// The sizes of the futures a guarded call carries on `store`: the store's `begin` and
/// `complete`, and the macro's whole call.
fn future_sizes<S: Store + Clone>(store: &S) -> [(&'static str, usize); 3] {
    fn size<F>(_: &F) -> usize {
        std::mem::size_of::<F>()
    }
    let key = Key::parse("k").unwrap();
    let fp = Fingerprint::of("a").unwrap();
    let claim = ClaimRef {
        scope: "s",
        key: "k",
        fence: 1,
    };
    let answer = StoredResponse::ok(b"1".to_vec());
    [
        ("begin", size(&store.begin(req(&key, &fp)))),
        ("complete", size(&store.complete(claim, &answer))),
        ("guarded call", size(&pay(store, "u", "k"))),
    ]
}

/// Every request in flight holds its guarded call's future, and each level of the call copies
/// its part once when it starts: they stay at a few kilobytes on every store (an `async` block
/// that holds a store's future twice, or a pool's `acquire` held inline, made `begin` tens of
/// kilobytes on the SQL stores).
async fn futures_stay_small<S: Store + Clone>(store: S, what: &str) {
    for (future, size) in future_sizes(&store) {
        eprintln!("{what} {future} {size}");
        assert!(size <= FUTURE_BUDGET, "{what}: {future} is {size} bytes");
    }
}

/// What each may take, in bytes (in a debug build, as the tests run).
const FUTURE_BUDGET: usize = 8 << 10;

#[tokio::test]
async fn the_futures_of_a_guarded_call_stay_small() {
    let file = common::SqliteFile::new();
    futures_stay_small(MemoryStore::new(), "memory").await;
    futures_stay_small(SqliteStore::connect(&file.url).await.unwrap(), "sqlite").await;
}

#[tokio::test]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn the_futures_of_a_guarded_call_stay_small_on_postgres() {
    let schema = common::PgSchema::create(&common::pg_url(), 2).await;
    let store = idem::PgStore::builder()
        .build(schema.pool.clone())
        .await
        .unwrap();
    futures_stay_small(store, "postgres").await;
}

#[tokio::test]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn the_futures_of_a_guarded_call_stay_small_on_mysql() {
    let database = common::MyDatabase::create(&common::mysql_url(), 2).await;
    let store = idem::MySqlStore::builder()
        .connect(&database.url)
        .await
        .unwrap();
    futures_stay_small(store, "mysql").await;
}

#[tokio::test]
#[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
async fn the_futures_of_a_guarded_call_stay_small_on_redis() {
    let (_keys, store) = common::redis_store().await;
    futures_stay_small(store, "redis").await;
}
