//! One conformance suite, the same cases against every store: memory, SQLite, PostgreSQL, and
//! Redis standalone and cluster.
//!
//! PostgreSQL runs when `DATABASE_URL` points at it (each test in a schema of its own) and is
//! skipped with a printed reason otherwise, unless `IDEM_REQUIRE_POSTGRES=1`. Redis runs when
//! `IDEM_REDIS_URL` (standalone) and `IDEM_REDIS_CLUSTER` (comma-separated nodes) are set (each
//! test under a key prefix of its own), and is skipped otherwise, unless `IDEM_REQUIRE_REDIS=1`.

mod common;

use std::time::Duration;

use idem::{
    BeginOutcome, BeginRequest, ClaimRef, Error, ExpiredLease, Fingerprint, Key, ManualClock,
    MemoryStore, PgStore, Policy, RecordState, RedisStore, SqliteStore, Store, StoredResponse,
    TxStore,
};

use common::{PgSchema, RedisKeys, SqliteFile, pg_url, redis_cluster, redis_url};

/// A store under test, with a way to let time pass.
pub struct Env<S> {
    store: S,
    clock: Option<ManualClock>,
    /// The store deletes expired records by itself (a key's TTL): `purge_expired` finds none.
    expires_by_itself: bool,
    _pg: Option<PgSchema>,
    _file: Option<SqliteFile>,
    _redis: Option<RedisKeys>,
}

impl<S: Store + Clone> Env<S> {
    async fn wait(&self, d: Duration) {
        match &self.clock {
            Some(c) => c.advance(d),
            None => tokio::time::sleep(d).await,
        }
    }
}

async fn memory(_test: &str) -> Option<Env<MemoryStore>> {
    let clock = ManualClock::new();
    Some(Env {
        store: MemoryStore::with_clock(clock.clone()),
        clock: Some(clock),
        expires_by_itself: false,
        _pg: None,
        _file: None,
        _redis: None,
    })
}

async fn sqlite(_test: &str) -> Option<Env<SqliteStore>> {
    let file = SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.expect("open SQLite");
    Some(Env {
        store,
        clock: None,
        expires_by_itself: false,
        _pg: None,
        _file: Some(file),
        _redis: None,
    })
}

async fn postgres(test: &str) -> Option<Env<PgStore>> {
    let url = pg_url(test)?;
    let schema = PgSchema::create(&url, 16).await;
    let store = PgStore::builder()
        .build(schema.pool.clone())
        .await
        .expect("create the table");
    Some(Env {
        store,
        clock: None,
        expires_by_itself: false,
        _pg: Some(schema),
        _file: None,
        _redis: None,
    })
}

async fn redis(test: &str) -> Option<Env<RedisStore>> {
    let url = redis_url(test)?;
    let keys = RedisKeys::new(std::slice::from_ref(&url));
    let store = RedisStore::builder()
        .prefix(keys.prefix.clone())
        .connect(&url)
        .await
        .expect("connect to Redis");
    Some(Env {
        store,
        clock: None,
        expires_by_itself: true,
        _pg: None,
        _file: None,
        _redis: Some(keys),
    })
}

async fn redis_cluster_env(test: &str) -> Option<Env<RedisStore>> {
    let nodes = redis_cluster(test)?;
    let keys = RedisKeys::new(&nodes);
    let store = RedisStore::builder()
        .prefix(keys.prefix.clone())
        .connect_cluster(&nodes)
        .await
        .expect("connect to the Redis cluster");
    Some(Env {
        store,
        clock: None,
        expires_by_itself: true,
        _pg: None,
        _file: None,
        _redis: Some(keys),
    })
}

fn key(s: &str) -> Key {
    Key::parse(s).unwrap()
}

fn fp(v: &str) -> Fingerprint {
    Fingerprint::of(v).unwrap()
}

const POLICY: Policy = Policy::DEFAULT;

fn req<'a>(
    scope: &'a str,
    key: &'a Key,
    fp: &'a Fingerprint,
    policy: &'a Policy,
) -> BeginRequest<'a> {
    BeginRequest {
        scope,
        key: key.as_str(),
        fingerprint: fp,
        policy,
    }
}

fn claimed(outcome: BeginOutcome) -> idem::Claimed {
    match outcome {
        BeginOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn claim<'a>(scope: &'a str, key: &'a Key, fence: u64) -> ClaimRef<'a> {
    ClaimRef {
        scope,
        key: key.as_str(),
        fence,
    }
}

mod cases {
    use super::*;

    pub async fn first_claim<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-first");
        let f = fp("body");
        let c = claimed(env.store.begin(req("s", &k, &f, &POLICY)).await.unwrap());
        assert!(c.fence > 0);
        assert!(!c.reclaimed);
        assert_eq!(c.recovery_point, None);
        // The same key under another scope is another record.
        let other = claimed(env.store.begin(req("s2", &k, &f, &POLICY)).await.unwrap());
        assert!(!other.reclaimed);
    }

    pub async fn replay_is_byte_identical<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-replay");
        let f = fp("body");
        let c = claimed(env.store.begin(req("s", &k, &f, &POLICY)).await.unwrap());
        // Unusual spacing, key order and escapes: a JSON column would normalise these away.
        let body = b"{ \"z\":1,  \"a\" : [2 ,1],\n\t\"u\":\"\\u00e9\" }  ".to_vec();
        let stored = StoredResponse {
            status: Some(201),
            is_error: false,
            body: body.clone().into(),
        };
        env.store
            .complete(claim("s", &k, c.fence), &stored)
            .await
            .unwrap();
        for _ in 0..2 {
            match env.store.begin(req("s", &k, &f, &POLICY)).await.unwrap() {
                BeginOutcome::Replay(r) => {
                    assert_eq!(r.body, body, "replayed bytes differ");
                    assert_eq!(r.status, Some(201));
                    assert!(!r.is_error);
                }
                other => panic!("expected a replay, got {other:?}"),
            }
        }
        let rec = env.store.lookup("s", k.as_str()).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(rec.response.unwrap().body, body);
    }

    pub async fn different_fingerprint_is_key_reuse<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-reuse");
        let c = claimed(
            env.store
                .begin(req("s", &k, &fp("a"), &POLICY))
                .await
                .unwrap(),
        );
        // While in progress…
        assert_eq!(
            env.store
                .begin(req("s", &k, &fp("b"), &POLICY))
                .await
                .unwrap(),
            BeginOutcome::KeyReused
        );
        env.store
            .complete(claim("s", &k, c.fence), &StoredResponse::ok(b"1".to_vec()))
            .await
            .unwrap();
        // …and once completed.
        assert_eq!(
            env.store
                .begin(req("s", &k, &fp("b"), &POLICY))
                .await
                .unwrap(),
            BeginOutcome::KeyReused
        );
    }

    pub async fn live_claim_is_in_progress<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-live");
        let f = fp("a");
        let policy = POLICY.lease(Duration::from_secs(30));
        claimed(env.store.begin(req("s", &k, &f, &policy)).await.unwrap());
        match env.store.begin(req("s", &k, &f, &policy)).await.unwrap() {
            BeginOutcome::InProgress { retry_after } => {
                assert!(retry_after > Duration::from_secs(25), "{retry_after:?}");
                assert!(retry_after <= Duration::from_secs(30), "{retry_after:?}");
            }
            other => panic!("expected in progress, got {other:?}"),
        }
        let rec = env.store.lookup("s", k.as_str()).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::InProgress);
        assert!(rec.response.is_none());
    }

    pub async fn expired_lease_reclaims_with_fence_and_recovery_point<S: Store + Clone>(
        env: &Env<S>,
    ) {
        let k = key("k-lease");
        let f = fp("a");
        let policy = POLICY.lease(Duration::from_millis(300));
        let old = claimed(env.store.begin(req("s", &k, &f, &policy)).await.unwrap());
        env.store
            .checkpoint(claim("s", &k, old.fence), b"charged", policy.lease)
            .await
            .unwrap();
        env.wait(Duration::from_millis(450)).await;

        let new = claimed(env.store.begin(req("s", &k, &f, &policy)).await.unwrap());
        assert_eq!(new.fence, old.fence + 1);
        assert!(new.reclaimed);
        assert_eq!(new.recovery_point.as_deref(), Some(&b"charged"[..]));

        // The slow original wakes up: every write it tries is refused and changes nothing.
        let late = StoredResponse::ok(b"late".to_vec());
        for result in [
            env.store.complete(claim("s", &k, old.fence), &late).await,
            env.store
                .checkpoint(claim("s", &k, old.fence), b"x", policy.lease)
                .await,
            env.store.release(claim("s", &k, old.fence)).await,
        ] {
            assert!(
                matches!(result, Err(Error::FenceLost { fence }) if fence == old.fence),
                "{result:?}"
            );
        }
        env.store
            .complete(
                claim("s", &k, new.fence),
                &StoredResponse::ok(b"new".to_vec()),
            )
            .await
            .unwrap();
        match env.store.begin(req("s", &k, &f, &policy)).await.unwrap() {
            BeginOutcome::Replay(r) => assert_eq!(r.body, &b"new"[..]),
            other => panic!("expected the new owner's replay, got {other:?}"),
        }
    }

    pub async fn fail_closed_keeps_in_progress<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-closed");
        let f = fp("a");
        let policy = POLICY
            .lease(Duration::from_millis(300))
            .expired_lease(ExpiredLease::FailClosed);
        claimed(env.store.begin(req("s", &k, &f, &policy)).await.unwrap());
        env.wait(Duration::from_millis(450)).await;
        assert!(matches!(
            env.store.begin(req("s", &k, &f, &policy)).await.unwrap(),
            BeginOutcome::InProgress { .. }
        ));
    }

    pub async fn release_lets_a_retry_claim<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-release");
        let f = fp("a");
        let c = claimed(env.store.begin(req("s", &k, &f, &POLICY)).await.unwrap());
        env.store.release(claim("s", &k, c.fence)).await.unwrap();
        assert!(env.store.lookup("s", k.as_str()).await.unwrap().is_none());
        let retry = claimed(env.store.begin(req("s", &k, &f, &POLICY)).await.unwrap());
        assert!(
            retry.fence > c.fence,
            "fences must keep growing across a release"
        );
        assert!(!retry.reclaimed);
        // The released owner cannot write over the retry.
        assert!(matches!(
            env.store
                .complete(claim("s", &k, c.fence), &StoredResponse::ok(vec![]))
                .await,
            Err(Error::FenceLost { .. })
        ));
        // After a release, the key is free for another body too.
        let k2 = key("k-release-2");
        let c2 = claimed(
            env.store
                .begin(req("s", &k2, &fp("a"), &POLICY))
                .await
                .unwrap(),
        );
        env.store.release(claim("s", &k2, c2.fence)).await.unwrap();
        claimed(
            env.store
                .begin(req("s", &k2, &fp("b"), &POLICY))
                .await
                .unwrap(),
        );
    }

    pub async fn dropped_guard_releases_promptly<S: Store + Clone>(env: &Env<S>) {
        let f = fp("a");
        let guard = match idem::begin(&env.store, "s".into(), key("k-drop"), f, POLICY).await {
            Ok(idem::Begun::Claimed(g)) => g,
            other => panic!("{other:?}"),
        };
        let first = guard.fence();
        drop(guard);
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        loop {
            match env
                .store
                .begin(req("s", &key("k-drop"), &f, &POLICY))
                .await
                .unwrap()
            {
                BeginOutcome::Claimed(c) => {
                    assert_eq!(c.fence, first + 1);
                    break;
                }
                BeginOutcome::InProgress { .. } if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                other => panic!("the dropped claim was not released within 1 s: {other:?}"),
            }
        }
    }

    pub async fn racing_tasks_claim_once<S: Store + Clone>(env: &Env<S>) {
        let f = fp("a");
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let store = env.store.clone();
            tasks.push(tokio::spawn(async move {
                let k = key("k-race");
                store.begin(req("s", &k, &f, &POLICY)).await.unwrap()
            }));
        }
        let mut claims = 0;
        let mut in_progress = 0;
        for t in tasks {
            match t.await.unwrap() {
                BeginOutcome::Claimed(c) => {
                    assert!(!c.reclaimed);
                    claims += 1;
                }
                BeginOutcome::InProgress { .. } => in_progress += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(claims, 1, "exactly one of 64 racing tasks may claim");
        assert_eq!(in_progress, 63);
    }

    pub async fn retention_expiry_frees_the_identity<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-retain");
        let policy = POLICY.retain(Duration::from_millis(300));
        let c = claimed(
            env.store
                .begin(req("s", &k, &fp("a"), &policy))
                .await
                .unwrap(),
        );
        env.store
            .complete(claim("s", &k, c.fence), &StoredResponse::ok(b"1".to_vec()))
            .await
            .unwrap();
        assert!(matches!(
            env.store
                .begin(req("s", &k, &fp("b"), &policy))
                .await
                .unwrap(),
            BeginOutcome::KeyReused
        ));
        env.wait(Duration::from_millis(450)).await;
        assert!(env.store.lookup("s", k.as_str()).await.unwrap().is_none());
        let again = claimed(
            env.store
                .begin(req("s", &k, &fp("b"), &policy))
                .await
                .unwrap(),
        );
        assert!(again.fence > c.fence);
        assert_eq!(again.recovery_point, None);
    }

    pub async fn purge_removes_only_expired<S: Store + Clone>(env: &Env<S>) {
        let short = POLICY.retain(Duration::from_millis(300));
        for i in 0..5 {
            let k = key(&format!("k-purge-{i}"));
            let c = claimed(
                env.store
                    .begin(req("s", &k, &fp("a"), &short))
                    .await
                    .unwrap(),
            );
            env.store
                .complete(claim("s", &k, c.fence), &StoredResponse::ok(vec![]))
                .await
                .unwrap();
        }
        let keep = key("k-keep");
        let c = claimed(
            env.store
                .begin(req("s", &keep, &fp("a"), &POLICY))
                .await
                .unwrap(),
        );
        env.store
            .complete(claim("s", &keep, c.fence), &StoredResponse::ok(vec![]))
            .await
            .unwrap();
        env.wait(Duration::from_millis(450)).await;
        for i in 0..5 {
            let k = format!("k-purge-{i}");
            assert!(env.store.lookup("s", &k).await.unwrap().is_none(), "{k}");
        }
        let expired = if env.expires_by_itself { 0 } else { 5 };
        assert_eq!(env.store.purge_expired().await.unwrap(), expired);
        assert_eq!(env.store.purge_expired().await.unwrap(), 0);
        assert!(
            env.store
                .lookup("s", keep.as_str())
                .await
                .unwrap()
                .is_some()
        );
    }

    pub async fn a_purged_identity_never_reuses_a_fence<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-purged");
        let short = POLICY
            .retain(Duration::from_millis(300))
            .lease(Duration::from_millis(300));
        let old = claimed(
            env.store
                .begin(req("s", &k, &fp("a"), &short))
                .await
                .unwrap(),
        );
        // The owner stalls past the retention; the record is purged and claimed afresh.
        env.wait(Duration::from_millis(450)).await;
        let expired = if env.expires_by_itself { 0 } else { 1 };
        assert_eq!(env.store.purge_expired().await.unwrap(), expired);
        let new = claimed(
            env.store
                .begin(req("s", &k, &fp("a"), &POLICY))
                .await
                .unwrap(),
        );
        assert!(
            new.fence > old.fence,
            "{} must exceed {}",
            new.fence,
            old.fence
        );
        let late = env
            .store
            .complete(
                claim("s", &k, old.fence),
                &StoredResponse::ok(b"late".to_vec()),
            )
            .await;
        assert!(matches!(late, Err(Error::FenceLost { .. })), "{late:?}");
        env.store
            .complete(
                claim("s", &k, new.fence),
                &StoredResponse::ok(b"new".to_vec()),
            )
            .await
            .unwrap();
    }

    pub async fn bad_keys_are_rejected<S: Store + Clone>(_env: &Env<S>) {
        for bad in [
            String::new(),
            "k".repeat(256),
            "tab\there".into(),
            "nul\0".into(),
            "naïve".into(),
            "with space".into(),
        ] {
            assert!(
                matches!(Key::parse(&bad), Err(Error::InvalidKey(_))),
                "{bad:?} accepted"
            );
        }
        assert!(Key::parse(&"k".repeat(255)).is_ok());
    }
}

mod tx_cases {
    use super::*;

    /// A business table next to the records, in the test's own database or schema.
    pub trait Biz: TxStore + Clone {
        async fn create_biz(&self);
        async fn insert_biz(
            &self,
            tx: &mut sqlx::Transaction<'static, Self::Database>,
            order_no: &str,
        );
        async fn count_biz(&self, order_no: &str) -> i64;
    }

    impl Biz for SqliteStore {
        async fn create_biz(&self) {
            sqlx::query("CREATE TABLE biz (order_no TEXT NOT NULL UNIQUE)")
                .execute(self.pool())
                .await
                .unwrap();
        }
        async fn insert_biz(&self, tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>, n: &str) {
            sqlx::query("INSERT INTO biz (order_no) VALUES ($1)")
                .bind(n)
                .execute(&mut **tx)
                .await
                .unwrap();
        }
        async fn count_biz(&self, n: &str) -> i64 {
            // The readers: a transaction may be holding the one writer connection.
            sqlx::query_scalar("SELECT count(*) FROM biz WHERE order_no = $1")
                .bind(n)
                .fetch_one(self.reader_pool())
                .await
                .unwrap()
        }
    }

    impl Biz for PgStore {
        async fn create_biz(&self) {
            sqlx::query("CREATE TABLE biz (order_no text NOT NULL UNIQUE)")
                .execute(self.pool())
                .await
                .unwrap();
        }
        async fn insert_biz(&self, tx: &mut sqlx::Transaction<'static, sqlx::Postgres>, n: &str) {
            sqlx::query("INSERT INTO biz (order_no) VALUES ($1)")
                .bind(n)
                .execute(&mut **tx)
                .await
                .unwrap();
        }
        async fn count_biz(&self, n: &str) -> i64 {
            sqlx::query_scalar("SELECT count(*) FROM biz WHERE order_no = $1")
                .bind(n)
                .fetch_one(self.pool())
                .await
                .unwrap()
        }
    }

    pub async fn tx_commit_makes_both_durable<S: Biz>(env: &Env<S>) {
        env.store.create_biz().await;
        let k = key("k-tx-commit");
        let f = fp("a");
        let mut tx = env.store.begin_transaction().await.unwrap();
        let c = claimed(
            env.store
                .begin_in(&mut tx, req("s", &k, &f, &POLICY))
                .await
                .unwrap(),
        );
        env.store.insert_biz(&mut tx, "A1").await;
        env.store
            .complete_in(
                &mut tx,
                claim("s", &k, c.fence),
                &StoredResponse::ok(b"A1".to_vec()),
            )
            .await
            .unwrap();
        // Nothing is visible before the commit.
        assert_eq!(env.store.count_biz("A1").await, 0);
        tx.commit().await.unwrap();
        assert_eq!(env.store.count_biz("A1").await, 1);
        match env.store.begin(req("s", &k, &f, &POLICY)).await.unwrap() {
            BeginOutcome::Replay(r) => assert_eq!(r.body, &b"A1"[..]),
            other => panic!("{other:?}"),
        }
    }

    pub async fn tx_rollback_leaves_nothing<S: Biz>(env: &Env<S>) {
        env.store.create_biz().await;
        let k = key("k-tx-rollback");
        let f = fp("a");
        let mut tx = env.store.begin_transaction().await.unwrap();
        let c = claimed(
            env.store
                .begin_in(&mut tx, req("s", &k, &f, &POLICY))
                .await
                .unwrap(),
        );
        env.store.insert_biz(&mut tx, "B1").await;
        env.store
            .complete_in(
                &mut tx,
                claim("s", &k, c.fence),
                &StoredResponse::ok(b"B1".to_vec()),
            )
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(env.store.count_biz("B1").await, 0);
        assert!(env.store.lookup("s", k.as_str()).await.unwrap().is_none());
        // The identity is free: the retry claims it afresh.
        claimed(env.store.begin(req("s", &k, &f, &POLICY)).await.unwrap());
    }

    pub async fn tx_duplicate_waits_then_replays<S: Biz>(env: &Env<S>) {
        env.store.create_biz().await;
        let k = key("k-tx-dup");
        let f = fp("a");
        let mut tx = env.store.begin_transaction().await.unwrap();
        let c = claimed(
            env.store
                .begin_in(&mut tx, req("s", &k, &f, &POLICY))
                .await
                .unwrap(),
        );

        let store = env.store.clone();
        let duplicate = tokio::spawn(async move {
            let k = key("k-tx-dup");
            let mut tx = store.begin_transaction().await.unwrap();
            let outcome = store
                .begin_in(&mut tx, req("s", &k, &f, &POLICY))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            outcome
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !duplicate.is_finished(),
            "the duplicate must wait for the first transaction"
        );

        env.store.insert_biz(&mut tx, "C1").await;
        env.store
            .complete_in(
                &mut tx,
                claim("s", &k, c.fence),
                &StoredResponse::ok(b"C1".to_vec()),
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();

        match duplicate.await.unwrap() {
            BeginOutcome::Replay(r) => assert_eq!(r.body, &b"C1"[..]),
            other => panic!("the duplicate should replay, got {other:?}"),
        }
        assert_eq!(env.store.count_biz("C1").await, 1);
    }

    pub async fn tx_duplicate_claims_after_rollback<S: Biz>(env: &Env<S>) {
        env.store.create_biz().await;
        let k = key("k-tx-dup-rb");
        let f = fp("a");
        let mut tx = env.store.begin_transaction().await.unwrap();
        claimed(
            env.store
                .begin_in(&mut tx, req("s", &k, &f, &POLICY))
                .await
                .unwrap(),
        );
        let store = env.store.clone();
        let duplicate = tokio::spawn(async move {
            let k = key("k-tx-dup-rb");
            let mut tx = store.begin_transaction().await.unwrap();
            let outcome = store
                .begin_in(&mut tx, req("s", &k, &f, &POLICY))
                .await
                .unwrap();
            tx.rollback().await.unwrap();
            outcome
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        tx.rollback().await.unwrap();
        assert!(matches!(duplicate.await.unwrap(), BeginOutcome::Claimed(_)));
    }
}

macro_rules! suite {
    ($name:ident, $make:ident, $module:ident, [$($case:ident),* $(,)?]) => {
        mod $name {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let Some(env) = $make(concat!(stringify!($name), "::", stringify!($case))).await
                    else {
                        return;
                    };
                    $module::$case(&env).await;
                }
            )*
        }
    };
}

macro_rules! every_store {
    ($($name:ident => $make:ident),*) => {$(
        suite!($name, $make, cases, [
            first_claim,
            replay_is_byte_identical,
            different_fingerprint_is_key_reuse,
            live_claim_is_in_progress,
            expired_lease_reclaims_with_fence_and_recovery_point,
            fail_closed_keeps_in_progress,
            release_lets_a_retry_claim,
            dropped_guard_releases_promptly,
            racing_tasks_claim_once,
            retention_expiry_frees_the_identity,
            purge_removes_only_expired,
            a_purged_identity_never_reuses_a_fence,
            bad_keys_are_rejected,
        ]);
    )*};
}

every_store!(
    memory_store => memory,
    sqlite_store => sqlite,
    postgres_store => postgres,
    redis_store => redis,
    redis_cluster_store => redis_cluster_env
);

suite!(
    sqlite_transactional,
    sqlite,
    tx_cases,
    [
        tx_commit_makes_both_durable,
        tx_rollback_leaves_nothing,
        tx_duplicate_waits_then_replays,
        tx_duplicate_claims_after_rollback,
    ]
);
suite!(
    postgres_transactional,
    postgres,
    tx_cases,
    [
        tx_commit_makes_both_durable,
        tx_rollback_leaves_nothing,
        tx_duplicate_waits_then_replays,
        tx_duplicate_claims_after_rollback,
    ]
);
