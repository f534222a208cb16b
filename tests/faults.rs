//! Fault injection: a proxy of our own (`tests/common/proxy.rs`) sits between idem and
//! PostgreSQL, MySQL (MariaDB), or Redis, and cuts the connection at one chosen point of a
//! guarded call — before a statement reaches the server, or after the server did it (committed)
//! but before the reply arrives — at every step: the claim, the body's own SQL, the completion,
//! the release, the checkpoint, the take-over of an abandoned claim, and in the transactional
//! mode the commit and the rollback.
//!
//! At each point a client that retries what idem says is retryable must end with:
//! - the side effect done once: in the separate-commit mode once per downstream key (the body
//!   records it with `INSERT … ON CONFLICT DO NOTHING`, on MySQL `INSERT IGNORE`, keyed by the
//!   guard's downstream key, as a gateway dedupes), in the transactional mode its SQL committed
//!   once;
//! - the completed answer never lost: the first call or a retry gets it, then every retry
//!   replays it exactly (floats included);
//! - no key left in progress past its lease (leases here are the macro's floor, one second);
//! - never a panic and never a 500: the errors seen on the way are `Unavailable` (503) or
//!   `InProgress` (409), both retryable.
//!
//! Each test checks that its fault was really injected. The last section feeds stores records
//! they cannot read, which must be errors naming the record, never answers.

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::proxy::{Fault, Proxy, Rule, Wire};
use idem::{
    Begun, Error, Fingerprint, Key, MySqlStore, PgStore, Policy, RecordState, RedisStore,
    SharedStore, Store, StoredResponse, TxStore, idempotent,
};
use serde::{Deserialize, Serialize};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// An amount that serde_json reads back one bit off unless it parses floats exactly.
const AMOUNT: f64 = 2.291712365432881e-9;

/// The lease of every claim here: the shortest the macro accepts.
const LEASE: Duration = Duration::from_secs(1);

/// How long a retrying client keeps at it before the test calls the key stuck: two leases (a
/// claim whose reply was lost, then a take-over whose reply was lost) and room for a slow CI.
const SETTLE: Duration = Duration::from_secs(6);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: u32,
    amount: f64,
    dkey: String,
}

impl Receipt {
    fn new(id: u32, dkey: String) -> Receipt {
        Receipt {
            id,
            amount: AMOUNT,
            dkey,
        }
    }
}

/// The errors of a guarded body here: idem's, the body's own SQL's, and a forced failure.
#[derive(Debug)]
enum AppError {
    Idem(Error),
    Downstream(sqlx::Error),
    Forced,
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Idem(e)
    }
}

/// Fails the test unless `e` tells the client to retry: idem's `Unavailable` or `InProgress`,
/// or the body's own SQL cut by the proxy. Never a 500.
fn assert_retryable(e: &AppError) {
    match e {
        AppError::Idem(e @ (Error::Unavailable(_) | Error::InProgress { .. })) => {
            assert!(matches!(e.status(), 503 | 409), "{e:?}");
        }
        AppError::Downstream(
            sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::PoolTimedOut,
        ) => {}
        other => panic!("not a retryable error: {other:?}"),
    }
}

/// Where the side effects go: a table with a row per downstream key (PostgreSQL and MySQL,
/// through the proxy, so that the body's SQL can be cut too), or a map that dedupes the same way
/// (Redis).
enum Effects {
    Pg {
        via_proxy: PgPool,
        direct: PgPool,
    },
    My {
        via_proxy: MySqlPool,
        direct: MySqlPool,
    },
    Memory(Mutex<HashMap<String, u32>>),
}

/// The rig's SQL store, for the transactional mode.
#[derive(Clone)]
enum SqlStore {
    Pg(PgStore),
    My(MySqlStore),
}

/// One test's store behind a proxy, and its effects.
struct Rig {
    proxy: Proxy,
    store: SharedStore,
    /// The store of a second instance of the service: on Redis a connection of its own (the
    /// store multiplexes one), on a SQL database the same pool.
    twin: SharedStore,
    /// The same SQL store, for the transactional mode.
    sql: Option<SqlStore>,
    effects: Effects,
    /// How many times a body got as far as doing its effect, per step.
    runs: Mutex<HashMap<String, usize>>,
    /// What keeps the test's schema, database or keys alive.
    _isolation: Box<dyn std::any::Any + Send + Sync>,
}

impl Rig {
    async fn pg() -> Rig {
        let url = common::pg_url();
        let schema = common::PgSchema::create(&url, 4).await;
        // The table is created directly; the store under test reaches it only through the proxy.
        PgStore::builder().build(schema.pool.clone()).await.unwrap();
        for ddl in [
            "CREATE TABLE effects (dkey text PRIMARY KEY)",
            "CREATE TABLE orders (key text NOT NULL)",
        ] {
            sqlx::query(ddl).execute(&schema.pool).await.unwrap();
        }
        let proxy = Proxy::postgres(&url).await;
        let options = PgConnectOptions::from_str(&url)
            .unwrap()
            .host("127.0.0.1")
            .port(proxy.addr.port())
            .options([("search_path", schema.name.as_str())])
            // Every statement carries its SQL text, so that a rule can find it.
            .statement_cache_capacity(0);
        let via_proxy = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(3))
            .connect_with(options)
            .await
            .unwrap();
        let pg = PgStore::builder()
            .create_table(false)
            .build(via_proxy.clone())
            .await
            .unwrap();
        let direct = schema.pool.clone();
        let effects = Effects::Pg { via_proxy, direct };
        Rig::on_sql(proxy, SqlStore::Pg(pg), effects, Box::new(schema))
    }

    /// The MySQL store on a pool of its own through the proxy, with the session's defaults
    /// (`REPEATABLE READ`) that a pool handed to `build` has.
    async fn mysql() -> Rig {
        let url = common::mysql_url();
        let database = common::MyDatabase::create(&url, 4).await;
        // The tables are created directly; the store under test reaches them only through the
        // proxy.
        MySqlStore::builder()
            .build(database.pool.clone())
            .await
            .unwrap();
        for ddl in [
            "CREATE TABLE effects (dkey VARCHAR(255) PRIMARY KEY) ENGINE = InnoDB",
            "CREATE TABLE orders (`key` VARCHAR(255) NOT NULL) ENGINE = InnoDB",
        ] {
            sqlx::query(ddl).execute(&database.pool).await.unwrap();
        }
        let proxy = Proxy::mysql(&url).await;
        let options = MySqlConnectOptions::from_str(&database.url)
            .unwrap()
            .host("127.0.0.1")
            .port(proxy.addr.port())
            // The proxy reads the statements: no TLS, and every statement prepared with its
            // text rather than run by the id of one prepared earlier.
            .ssl_mode(MySqlSslMode::Disabled)
            .statement_cache_capacity(0);
        let via_proxy = MySqlPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(3))
            .connect_with(options)
            .await
            .unwrap();
        let my = MySqlStore::builder()
            .create_table(false)
            .build(via_proxy.clone())
            .await
            .unwrap();
        let direct = database.pool.clone();
        let effects = Effects::My { via_proxy, direct };
        Rig::on_sql(proxy, SqlStore::My(my), effects, Box::new(database))
    }

    /// The rig of `sql`, reached through `proxy`; both instances of the service share its pool.
    fn on_sql(
        proxy: Proxy,
        sql: SqlStore,
        effects: Effects,
        isolation: Box<dyn std::any::Any + Send + Sync>,
    ) -> Rig {
        let store = match &sql {
            SqlStore::Pg(pg) => SharedStore::new(pg.clone()),
            SqlStore::My(my) => SharedStore::new(my.clone()),
        };
        Rig {
            proxy,
            twin: store.clone(),
            store,
            sql: Some(sql),
            effects,
            runs: Mutex::default(),
            _isolation: isolation,
        }
    }

    async fn redis() -> Rig {
        let url = common::redis_url();
        let keys = common::RedisKeys::new(std::slice::from_ref(&url));
        let proxy = Proxy::redis(&url).await;
        let store = RedisStore::builder()
            .prefix(keys.prefix.clone())
            .response_timeout(Duration::from_secs(2))
            .connect(&proxy.url(&url))
            .await
            .unwrap();
        // Load every script on the server first, so that a fault hits the script itself and not
        // a NOSCRIPT round trip.
        let fp = Fingerprint::of("warm-up").unwrap();
        let policy = Policy::DEFAULT;
        let req = idem::BeginRequest {
            scope: "warm-up",
            key: "warm-up",
            fingerprint: &fp,
            policy: &policy,
            request: None,
        };
        for complete in [false, true] {
            let idem::BeginOutcome::Claimed(c) = store.begin(req).await.unwrap() else {
                panic!("the warm-up key is new");
            };
            let claim = idem::ClaimRef {
                scope: "warm-up",
                key: "warm-up",
                fence: c.fence,
            };
            store.checkpoint(claim, b"warm", LEASE).await.unwrap();
            if complete {
                store
                    .complete(claim, &StoredResponse::ok(b"warm".to_vec()))
                    .await
                    .unwrap();
            } else {
                store.release(claim).await.unwrap();
            }
        }
        let twin = RedisStore::builder()
            .prefix(keys.prefix.clone())
            .response_timeout(Duration::from_secs(2))
            .connect(&proxy.url(&url))
            .await
            .unwrap();
        Rig {
            proxy,
            store: SharedStore::new(store),
            twin: SharedStore::new(twin),
            sql: None,
            effects: Effects::Memory(Mutex::default()),
            runs: Mutex::default(),
            _isolation: Box::new(keys),
        }
    }

    /// Does the side effect of `dkey`, once per downstream key.
    async fn effect(&self, dkey: &str) -> Result<(), AppError> {
        *self
            .runs
            .lock()
            .unwrap()
            .entry(dkey.to_owned())
            .or_default() += 1;
        match &self.effects {
            Effects::Pg { via_proxy, .. } => {
                sqlx::query("INSERT INTO effects (dkey) VALUES ($1) ON CONFLICT (dkey) DO NOTHING")
                    .bind(dkey)
                    .execute(via_proxy)
                    .await
                    .map_err(AppError::Downstream)?;
            }
            Effects::My { via_proxy, .. } => {
                sqlx::query("INSERT IGNORE INTO effects (dkey) VALUES (?)")
                    .bind(dkey)
                    .execute(via_proxy)
                    .await
                    .map_err(AppError::Downstream)?;
            }
            Effects::Memory(done) => {
                done.lock().unwrap().insert(dkey.to_owned(), 1);
            }
        }
        Ok(())
    }

    /// How many times the effect of `dkey` happened.
    async fn effects(&self, dkey: &str) -> i64 {
        match &self.effects {
            Effects::Pg { direct, .. } => {
                sqlx::query_scalar("SELECT count(*) FROM effects WHERE dkey = $1")
                    .bind(dkey)
                    .fetch_one(direct)
                    .await
                    .unwrap()
            }
            Effects::My { direct, .. } => {
                sqlx::query_scalar("SELECT count(*) FROM effects WHERE dkey = ?")
                    .bind(dkey)
                    .fetch_one(direct)
                    .await
                    .unwrap()
            }
            Effects::Memory(done) => i64::from(*done.lock().unwrap().get(dkey).unwrap_or(&0)),
        }
    }

    /// How many orders of `key` are committed (the transactional mode).
    async fn orders(&self, key: &str) -> i64 {
        match &self.effects {
            Effects::Pg { direct, .. } => {
                sqlx::query_scalar("SELECT count(*) FROM orders WHERE key = $1")
                    .bind(key)
                    .fetch_one(direct)
                    .await
                    .unwrap()
            }
            Effects::My { direct, .. } => {
                sqlx::query_scalar("SELECT count(*) FROM orders WHERE `key` = ?")
                    .bind(key)
                    .fetch_one(direct)
                    .await
                    .unwrap()
            }
            Effects::Memory(_) => unreachable!("the transactional mode runs on SQL stores"),
        }
    }

    fn runs(&self, dkey: &str) -> usize {
        *self.runs.lock().unwrap().get(dkey).unwrap_or(&0)
    }

    /// Checks that exactly the one planned fault was injected.
    fn assert_injected(&self) {
        let fired = self.proxy.fired();
        assert_eq!(fired.len(), 1, "the fault was injected once: {fired:?}");
    }

    /// Checks that `(scope, key)` is completed with `answer`, and that a retry replays it.
    async fn assert_completed(&self, scope: &str, key: &str, answer: &Receipt) {
        let record = self
            .store
            .lookup(scope, key)
            .await
            .unwrap()
            .expect("the record is there");
        assert_eq!(record.state, RecordState::Completed, "{record:?}");
        let stored: Receipt =
            serde_json::from_slice(&record.response.expect("a completed record's answer").body)
                .unwrap();
        assert_eq!(&stored, answer, "the stored answer is the one returned");
        assert_eq!(stored.amount.to_bits(), answer.amount.to_bits());
    }
}

/// A client that retries what idem says it may, until it has its answer: the answer, how long
/// it took, and the errors seen on the way (each checked to be retryable).
async fn settle<F, Fut>(mut call: F) -> (Receipt, Duration, Vec<String>)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Receipt, AppError>>,
{
    let start = Instant::now();
    let mut seen = Vec::new();
    loop {
        match call().await {
            Ok(answer) => return (answer, start.elapsed(), seen),
            Err(e) => {
                assert_retryable(&e);
                seen.push(format!("{e:?}"));
            }
        }
        assert!(
            start.elapsed() < SETTLE,
            "no answer after {SETTLE:?}: the key is stuck ({seen:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- the separate-commit mode: #[idempotent] -----------------------------------------------------

#[idempotent(scope = "charge:<id>", key = key, store = rig.store, lease = "1s", retain = "1m", claim = claim, skip(rig, fail))]
async fn charge(rig: &Rig, id: u32, key: &str, fail: bool) -> Result<Receipt, AppError> {
    if fail {
        return Err(AppError::Forced);
    }
    let dkey = claim.downstream_key("charge");
    rig.effect(&dkey).await?;
    Ok(Receipt::new(id, dkey))
}

/// `charge` on the second instance's store: the same scope, key and fingerprint.
#[idempotent(scope = "charge:<id>", key = key, store = rig.twin, lease = "1s", retain = "1m", claim = claim, skip(rig, fail))]
async fn charge_twin(rig: &Rig, id: u32, key: &str, fail: bool) -> Result<Receipt, AppError> {
    if fail {
        return Err(AppError::Forced);
    }
    let dkey = claim.downstream_key("charge");
    rig.effect(&dkey).await?;
    Ok(Receipt::new(id, dkey))
}

/// A step of a guarded call, and the bytes of the client's write that perform it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Claim,
    Body,
    Complete,
    Release,
    Checkpoint,
    TakeOver,
    /// On MySQL, which returns no row from an `UPDATE`: the read of the row a take-over wrote,
    /// on the same connection (the take-over committed before it).
    TakeOverRead,
    Commit,
    Rollback,
}

/// The needles of `step`'s write on PostgreSQL.
fn pg_needles(step: Step) -> Vec<&'static [u8]> {
    match step {
        Step::Claim => vec![b"ON CONFLICT (scope, key) DO NOTHING RETURNING fence"],
        Step::Body => vec![b"INSERT INTO effects"],
        Step::Complete => vec![b"SET state = 'completed'"],
        Step::Release => vec![b"SET state = 'released'"],
        Step::Checkpoint => vec![b"SET recovery_point = $4"],
        Step::TakeOver => vec![b"SET fence = fence + 1"],
        Step::TakeOverRead => unreachable!("a take-over on PostgreSQL returns its row"),
        Step::Commit => vec![b"COMMIT"],
        Step::Rollback => vec![b"ROLLBACK"],
    }
}

/// The needles of `step`'s write on MySQL: its statements as the MySQL dialect writes them.
fn mysql_needles(step: Step) -> Vec<&'static [u8]> {
    match step {
        Step::Claim => vec![b"ON DUPLICATE KEY UPDATE fence = fence + LAST_INSERT_ID(0)"],
        Step::Body => vec![b"INSERT IGNORE INTO effects"],
        Step::Complete => vec![b"SET state = 'completed'"],
        Step::Release => vec![b"SET state = 'released'"],
        Step::Checkpoint => vec![b"SET recovery_point = ?"],
        Step::TakeOver => vec![b"SET fence = LAST_INSERT_ID(fence + 1)"],
        Step::TakeOverRead => vec![b"AND fence = LAST_INSERT_ID()"],
        // The whole `COM_QUERY` packet (length 7 or 9, sequence 0, command 3): the statement
        // that opens a guarded transaction says `READ COMMITTED`.
        Step::Commit => vec![b"\x07\x00\x00\x00\x03COMMIT"],
        Step::Rollback => vec![b"\x09\x00\x00\x00\x03ROLLBACK"],
    }
}

/// The needles of `step`'s write on the SQL database behind `wire`.
fn sql_needles(wire: Wire, step: Step) -> Vec<&'static [u8]> {
    match wire {
        Wire::Postgres => pg_needles(step),
        Wire::Mysql => mysql_needles(step),
        Wire::Redis | Wire::Amqp | Wire::Http => unreachable!("not a SQL database"),
    }
}

/// The needles of `step`'s script call on Redis, for the record of `key`: each script's
/// arguments tell it apart (the fingerprint is `begin`'s, an answer `complete`'s, a recovery
/// point `checkpoint`'s; `release` is the one script called with two arguments).
fn redis_needles(step: Step, key: &str, fingerprint: &[u8]) -> Vec<Vec<u8>> {
    let key = key.as_bytes().to_vec();
    match step {
        Step::Claim | Step::TakeOver => vec![b"EVALSHA".to_vec(), key, fingerprint.to_vec()],
        Step::Complete => vec![b"EVALSHA".to_vec(), key, b"\"amount\"".to_vec()],
        Step::Release => vec![b"*6\r\n$7\r\nEVALSHA".to_vec(), key],
        Step::Checkpoint => vec![b"EVALSHA".to_vec(), key, b"step-1".to_vec()],
        Step::Body | Step::TakeOverRead | Step::Commit | Step::Rollback => {
            unreachable!("no Redis write")
        }
    }
}

fn rule(rig: &Rig, step: Step, key: &str, fingerprint: &[u8], fault: Fault) -> Rule {
    let needles = match rig.proxy.wire() {
        wire @ (Wire::Postgres | Wire::Mysql) => {
            sql_needles(wire, step).iter().map(|n| n.to_vec()).collect()
        }
        Wire::Redis => redis_needles(step, key, fingerprint),
        Wire::Amqp | Wire::Http => {
            unreachable!("the rig proxies stores, not a broker or a service")
        }
    };
    Rule {
        needles,
        nth: 1,
        fault,
    }
}

/// The fingerprint `charge(_, id, …)` claims with, for the Redis needles: what the macro hashes
/// is its own business, so it is read back from a first claim of another key.
async fn charge_fingerprint(rig: &Rig, id: u32) -> Vec<u8> {
    let probe = format!("probe-{id}");
    charge(rig, id, &probe, false).await.unwrap();
    let record = rig
        .store
        .lookup(&format!("charge:{id}"), &probe)
        .await
        .unwrap()
        .unwrap();
    record.fingerprint.as_bytes().to_vec()
}

/// A fault at `step` of `charge`, then a retrying client: the effect happened once, the answer
/// is kept and replayed, the key did not stay in progress past its lease.
async fn separate(rig: Rig, step: Step, fault: Fault) {
    let id = 7;
    let key = "k1";
    let scope = format!("charge:{id}");
    let fp = charge_fingerprint(&rig, id).await;
    rig.proxy.inject(rule(&rig, step, key, &fp, fault));

    // The first call meets the fault.
    let first = charge(&rig, id, key, step == Step::Release).await;
    match (step, &first) {
        // The effect happened: a completion the proxy cut is retried, and a completion whose
        // reply was lost is found done by this very claim. The caller gets its answer.
        (Step::Complete, Ok(_)) => {}
        (Step::Complete, Err(e)) => panic!("a completed answer was lost: {e:?}"),
        (Step::Release, Err(AppError::Forced)) => {}
        (Step::Release, other) => panic!("the body's own failure, not {other:?}"),
        (_, Ok(_)) => panic!("the {step:?} fault did not reach the caller"),
        (_, Err(e)) => assert_retryable(e),
    }
    rig.assert_injected();

    let (answer, took, seen) = settle(|| charge(&rig, id, key, false)).await;
    assert!(
        took < LEASE * 2 + Duration::from_secs(1),
        "{step:?}/{fault:?}: the retry waited {took:?}, past the lease ({seen:?})"
    );
    // Where the server did the work and the client never heard (a claim), or never got the
    // work (a release), a live claim is left behind: the retry is told to wait, then takes
    // it over after the lease.
    if matches!(
        (step, fault),
        (Step::Claim, Fault::CutAfterReply) | (Step::Release, Fault::CutBefore)
    ) {
        assert!(
            seen.iter().any(|e| e.contains("InProgress")),
            "{step:?}/{fault:?}: the claim left behind was live: {seen:?}"
        );
    }
    if let Ok(first) = &first {
        assert_eq!(first, &answer, "the retry replays the first answer");
    }
    let dkey = idem::downstream_key(&scope, key, "charge");
    assert_eq!(answer.dkey, dkey);
    assert_eq!(rig.effects(&dkey).await, 1, "{step:?}/{fault:?}: effects");
    // The body runs again only where the first attempt did not finish: its own SQL was cut, or
    // it failed (and ran no effect).
    let runs = if step == Step::Body { 2 } else { 1 };
    assert_eq!(rig.runs(&dkey), runs, "{step:?}/{fault:?}: body runs");
    rig.assert_completed(&scope, key, &answer).await;

    // Replays are exact and run nothing.
    let replay = charge(&rig, id, key, false).await.unwrap();
    assert_eq!(replay, answer);
    assert_eq!(replay.amount.to_bits(), answer.amount.to_bits());
    assert_eq!(rig.runs(&dkey), runs);
}

/// The completion is stalled past the lease while a duplicate arrives: the duplicate takes the
/// claim over and completes; the stalled completion then lands on a record it no longer owns
/// and is refused (409, the late original), never written over the new owner's answer. The
/// effect, keyed by the downstream key both attempts share, happened once.
async fn stalled_completion(rig: Rig) {
    let id = 11;
    let key = "k-stall";
    let scope = format!("charge:{id}");
    let fp = charge_fingerprint(&rig, id).await;
    // Past the lease, with room for the take-over; within Redis's response timeout.
    let stall = match rig.proxy.wire() {
        Wire::Postgres | Wire::Mysql => LEASE * 2,
        Wire::Redis => LEASE * 3 / 2,
        Wire::Amqp | Wire::Http => {
            unreachable!("the rig proxies stores, not a broker or a service")
        }
    };
    rig.proxy
        .inject(rule(&rig, Step::Complete, key, &fp, Fault::Stall(stall)));
    let (original, (answer, took, seen)) = tokio::join!(charge(&rig, id, key, false), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        settle(|| charge_twin(&rig, id, key, false)).await
    });
    rig.assert_injected();
    match original {
        Err(AppError::Idem(e @ Error::FenceLost { .. })) => assert_eq!(e.status(), 409),
        other => panic!("the late original must be refused, not {other:?}"),
    }
    assert!(
        took < stall,
        "the duplicate took over after the lease: {took:?}"
    );
    assert!(
        seen.iter().all(|e| e.contains("InProgress")),
        "the duplicate waited for the lease: {seen:?}"
    );
    let dkey = idem::downstream_key(&scope, key, "charge");
    assert_eq!(rig.runs(&dkey), 2, "the take-over ran the body again");
    assert_eq!(rig.effects(&dkey).await, 1, "once per downstream key");
    rig.assert_completed(&scope, key, &answer).await;
    assert_eq!(charge(&rig, id, key, false).await.unwrap(), answer);
}

// ---- checkpoints and take-overs: the guard, by hand ----------------------------------------------

const TWO_STEPS: &str = "two-steps";

fn two_step_policy() -> Policy {
    Policy::DEFAULT.lease(LEASE).retain(Duration::from_secs(60))
}

fn two_step_fingerprint() -> Fingerprint {
    Fingerprint::of(&("two-steps", 1)).unwrap()
}

/// A side effect in two steps with a checkpoint between them: a take-over that finds the
/// checkpoint resumes at step 2. With `crash`, the caller dies right after the checkpoint (its
/// guard is leaked: nothing is released, the claim waits out its lease).
async fn two_steps(rig: &Rig, key: &str, crash: bool) -> Result<Receipt, AppError> {
    let began = idem::begin(
        &rig.store,
        TWO_STEPS.to_owned(),
        Key::parse(key).unwrap(),
        two_step_fingerprint(),
        two_step_policy(),
    )
    .await?;
    let mut guard = match began {
        Begun::Replay(stored) => return Ok(serde_json::from_slice(&stored.body).unwrap()),
        Begun::Claimed(guard) => guard,
    };
    if guard.recovery_point() != Some(&b"step-1"[..]) {
        rig.effect(&guard.downstream_key("step-1")).await?;
        // A failed checkpoint drops the guard, which releases the claim: the retry starts over.
        guard.checkpoint(b"step-1").await?;
    }
    if crash {
        std::mem::forget(guard);
        return Err(AppError::Forced);
    }
    let dkey = guard.downstream_key("step-2");
    rig.effect(&dkey).await?;
    let answer = Receipt::new(2, dkey);
    guard
        .complete(&StoredResponse::ok(serde_json::to_vec(&answer).unwrap()))
        .await?;
    Ok(answer)
}

/// A fault on the checkpoint between two steps: each step's effect happens once.
async fn checkpoint(rig: Rig, fault: Fault) {
    let key = "k-checkpoint";
    let fp = two_step_fingerprint();
    rig.proxy
        .inject(rule(&rig, Step::Checkpoint, key, fp.as_bytes(), fault));
    let first = two_steps(&rig, key, false).await;
    assert!(first.is_err(), "the checkpoint fault reached the caller");
    assert_retryable(&first.unwrap_err());
    rig.assert_injected();
    let (answer, took, seen) = settle(|| two_steps(&rig, key, false)).await;
    assert!(
        took < LEASE * 2 + Duration::from_secs(1),
        "{took:?} {seen:?}"
    );
    for step in ["step-1", "step-2"] {
        let dkey = idem::downstream_key(TWO_STEPS, key, step);
        assert_eq!(rig.effects(&dkey).await, 1, "{fault:?}: {step} done once");
    }
    rig.assert_completed(TWO_STEPS, key, &answer).await;
}

/// A claim abandoned after its checkpoint; the take-over after its lease meets the fault. The
/// retry still resumes at step 2: step 1 ran once, step 2 once.
async fn take_over(rig: Rig, fault: Fault) {
    take_over_at(rig, Step::TakeOver, fault).await
}

/// [`take_over`] with the fault at `step`: the take-over's write, or on MySQL the read after it.
async fn take_over_at(rig: Rig, step: Step, fault: Fault) {
    let key = "k-take-over";
    let fp = two_step_fingerprint();
    assert!(matches!(
        two_steps(&rig, key, true).await,
        Err(AppError::Forced)
    ));
    let step1 = idem::downstream_key(TWO_STEPS, key, "step-1");
    assert_eq!(rig.runs(&step1), 1);
    // The abandoned claim is live for its lease; the fault is set for what follows.
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    rig.proxy
        .inject(rule(&rig, step, key, fp.as_bytes(), fault));
    let first = two_steps(&rig, key, false).await;
    assert!(first.is_err(), "the take-over fault reached the caller");
    assert_retryable(&first.unwrap_err());
    rig.assert_injected();
    let (answer, took, seen) = settle(|| two_steps(&rig, key, false)).await;
    assert!(
        took < LEASE * 2 + Duration::from_secs(1),
        "{took:?} {seen:?}"
    );
    if fault == Fault::CutAfterReply || step == Step::TakeOverRead {
        assert!(
            seen.iter().any(|e| e.contains("InProgress")),
            "the take-over whose reply was lost holds a live claim: {seen:?}"
        );
    }
    assert_eq!(rig.runs(&step1), 1, "{fault:?}: step 1 is not repeated");
    assert_eq!(rig.effects(&step1).await, 1);
    let step2 = idem::downstream_key(TWO_STEPS, key, "step-2");
    assert_eq!(rig.runs(&step2), 1, "{fault:?}: step 2 ran once");
    assert_eq!(rig.effects(&step2).await, 1);
    rig.assert_completed(TWO_STEPS, key, &answer).await;
}

// ---- the transactional mode (PostgreSQL, MySQL) -------------------------------------------------

/// The transaction a guarded body gets on `S`.
type Tx<S> = sqlx::Transaction<'static, <S as TxStore>::Database>;

/// A store of the transactional mode, and the body's insert in its database's SQL.
trait Orders: TxStore + Clone + Send + Sync + 'static {
    fn insert(tx: &mut Tx<Self>, key: &str) -> impl Future<Output = sqlx::Result<()>> + Send;
}

impl Orders for PgStore {
    async fn insert(tx: &mut Tx<Self>, key: &str) -> sqlx::Result<()> {
        sqlx::query("INSERT INTO orders (key) VALUES ($1)")
            .bind(key)
            .execute(&mut **tx)
            .await
            .map(drop)
    }
}

impl Orders for MySqlStore {
    async fn insert(tx: &mut Tx<Self>, key: &str) -> sqlx::Result<()> {
        sqlx::query("INSERT INTO orders (`key`) VALUES (?)")
            .bind(key)
            .execute(&mut **tx)
            .await
            .map(drop)
    }
}

#[idempotent(scope = "order:<id>", key = key, store = store, lease = "1s", retain = "1m", skip(fail), transaction = tx)]
async fn order<S: Orders>(store: &S, id: u32, key: &str, fail: bool) -> Result<Receipt, AppError> {
    S::insert(tx, key).await.map_err(AppError::Downstream)?;
    if fail {
        return Err(AppError::Forced);
    }
    Ok(Receipt::new(id, format!("order-{key}")))
}

/// A fault at `step` of a transactional call: the body's SQL committed once, with the record.
async fn transactional(rig: Rig, step: Step, fault: Fault) {
    match rig.sql.clone().expect("a SQL store") {
        SqlStore::Pg(store) => transactional_on(&rig, &store, step, fault).await,
        SqlStore::My(store) => transactional_on(&rig, &store, step, fault).await,
    }
}

async fn transactional_on<S: Orders>(rig: &Rig, store: &S, step: Step, fault: Fault) {
    let id = 9;
    let key = "k-tx";
    let needles = if step == Step::Body {
        vec![&b"INSERT INTO orders"[..]]
    } else {
        sql_needles(rig.proxy.wire(), step)
    };
    rig.proxy.inject(Rule::first(&needles, fault));
    let first = order(store, id, key, step == Step::Rollback).await;
    match (step, &first) {
        (Step::Rollback, Err(AppError::Forced)) => {}
        (_, Ok(_)) => panic!("the {step:?} fault did not reach the caller"),
        (_, Err(e)) => assert_retryable(e),
    }
    rig.assert_injected();
    // Only a COMMIT whose reply was lost committed; every other cut rolled everything back
    // (a cut rollback is the database's to finish when it sees the connection gone).
    let committed = i64::from((step, fault) == (Step::Commit, Fault::CutAfterReply));
    assert_eq!(
        rig.orders(key).await,
        committed,
        "{step:?}/{fault:?}: after the fault"
    );
    let (answer, took, seen) = settle(|| order(store, id, key, false)).await;
    assert!(
        took < LEASE * 2 + Duration::from_secs(1),
        "{took:?} {seen:?}"
    );
    assert_eq!(
        rig.orders(key).await,
        1,
        "{step:?}/{fault:?}: the body's SQL committed once"
    );
    rig.assert_completed(&format!("order:{id}"), key, &answer)
        .await;
    let replay = order(store, id, key, false).await.unwrap();
    assert_eq!(replay, answer);
    assert_eq!(replay.amount.to_bits(), answer.amount.to_bits());
}

// ---- the matrix ------------------------------------------------------------------------------------

/// Runs a test, failing it (rather than the CI job's clock) if it hangs: a fault must end in an
/// answer or an error, never in a wait without end.
async fn within_a_minute<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(60), test)
        .await
        .expect("the test hung for a minute")
}

/// Every case of the SQL stores, on the rig `$rig` makes (one module per database, each case
/// under the same name), and the cases `$extra` of that database alone; `$attr` (which says
/// when the database is missing) goes on each.
macro_rules! sql_tests {
    (#[$attr:meta] $rig:path; $($extra:tt)*) => {
        sql_tests! { @cases #[$attr] $rig;
            claim_cut_before: |rig| separate(rig, Step::Claim, Fault::CutBefore);
            claim_reply_lost: |rig| separate(rig, Step::Claim, Fault::CutAfterReply);
            body_sql_cut_before: |rig| separate(rig, Step::Body, Fault::CutBefore);
            body_sql_reply_lost: |rig| separate(rig, Step::Body, Fault::CutAfterReply);
            complete_cut_before: |rig| separate(rig, Step::Complete, Fault::CutBefore);
            complete_reply_lost: |rig| separate(rig, Step::Complete, Fault::CutAfterReply);
            release_cut_before: |rig| separate(rig, Step::Release, Fault::CutBefore);
            release_reply_lost: |rig| separate(rig, Step::Release, Fault::CutAfterReply);
            complete_stalled_past_the_lease: stalled_completion;
            checkpoint_cut_before: |rig| checkpoint(rig, Fault::CutBefore);
            checkpoint_reply_lost: |rig| checkpoint(rig, Fault::CutAfterReply);
            take_over_cut_before: |rig| take_over(rig, Fault::CutBefore);
            take_over_reply_lost: |rig| take_over(rig, Fault::CutAfterReply);
            tx_claim_cut_before: |rig| transactional(rig, Step::Claim, Fault::CutBefore);
            tx_claim_reply_lost: |rig| transactional(rig, Step::Claim, Fault::CutAfterReply);
            tx_body_sql_cut_before: |rig| transactional(rig, Step::Body, Fault::CutBefore);
            tx_body_sql_reply_lost: |rig| transactional(rig, Step::Body, Fault::CutAfterReply);
            tx_complete_cut_before: |rig| transactional(rig, Step::Complete, Fault::CutBefore);
            tx_complete_reply_lost: |rig| transactional(rig, Step::Complete, Fault::CutAfterReply);
            tx_commit_cut_before: |rig| transactional(rig, Step::Commit, Fault::CutBefore);
            tx_commit_reply_lost: |rig| transactional(rig, Step::Commit, Fault::CutAfterReply);
            tx_rollback_cut_before: |rig| transactional(rig, Step::Rollback, Fault::CutBefore);
            tx_rollback_reply_lost: |rig| transactional(rig, Step::Rollback, Fault::CutAfterReply);
            $($extra)*
        }
    };
    (@cases #[$attr:meta] $rig:path; $($name:ident: $run:expr;)*) => {$(
        #[$attr]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            within_a_minute(async { ($run)($rig().await).await }).await;
        }
    )*};
}

macro_rules! redis_tests {
    ($($name:ident: $run:expr;)*) => {$(
        #[cfg_attr(not(idem_redis), ignore = "needs Redis: set IDEM_REDIS_URL=redis://…")]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            within_a_minute(async { ($run)(Rig::redis().await).await }).await;
        }
    )*};
}
mod postgres {
    use super::*;

    sql_tests! {
        #[cfg_attr(not(idem_postgres), ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…")]
        Rig::pg;
    }
}

mod mysql {
    use super::*;

    sql_tests! {
        #[cfg_attr(not(idem_mysql), ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…")]
        Rig::mysql;
        take_over_read_cut_before: |rig| take_over_at(rig, Step::TakeOverRead, Fault::CutBefore);
        take_over_read_reply_lost: |rig| {
            take_over_at(rig, Step::TakeOverRead, Fault::CutAfterReply)
        };
    }
}

redis_tests! {
    redis_claim_cut_before: |rig| separate(rig, Step::Claim, Fault::CutBefore);
    redis_claim_reply_lost: |rig| separate(rig, Step::Claim, Fault::CutAfterReply);
    redis_complete_cut_before: |rig| separate(rig, Step::Complete, Fault::CutBefore);
    redis_complete_reply_lost: |rig| separate(rig, Step::Complete, Fault::CutAfterReply);
    redis_release_cut_before: |rig| separate(rig, Step::Release, Fault::CutBefore);
    redis_release_reply_lost: |rig| separate(rig, Step::Release, Fault::CutAfterReply);
    redis_complete_stalled_past_the_lease: stalled_completion;
    redis_checkpoint_cut_before: |rig| checkpoint(rig, Fault::CutBefore);
    redis_checkpoint_reply_lost: |rig| checkpoint(rig, Fault::CutAfterReply);
    redis_take_over_cut_before: |rig| take_over(rig, Fault::CutBefore);
    redis_take_over_reply_lost: |rig| take_over(rig, Fault::CutAfterReply);
}

// ---- a pooled connection the server closed while it sat idle ----------------------------------------

/// A store opened with `connect` pings a pooled connection before lending it only when it has
/// been idle for half a second or more. `kill` closes, on the server, every connection of the
/// store's pool and says how many it closed.
///
/// - Right after a call, a closed connection may be lent unpinged: the statement fails, always
///   retryably (`Unavailable`, 503), the connection is dropped, and a retry succeeds within as
///   many attempts as the pool has connections.
/// - Past the half second, the ping finds the connection closed and a new one is lent instead:
///   the first call succeeds.
async fn connection_closed_while_idle<S, K, Fut>(store: &S, kill: K)
where
    S: Store,
    K: Fn() -> Fut,
    Fut: Future<Output = usize>,
{
    let f = Fingerprint::of("a").unwrap();
    let call = |key: String| {
        let f = &f;
        async move {
            store
                .begin(idem::BeginRequest::new("idle", &key, f, &Policy::DEFAULT))
                .await
        }
    };
    call("k-first".into()).await.unwrap();
    assert!(kill().await >= 1, "the store's connection was closed");
    let mut failures = 0;
    while let Err(e) = call(format!("k-within-{failures}")).await {
        assert!(matches!(e, Error::Unavailable(_)), "retryable: {e}");
        failures += 1;
        assert!(failures <= 16, "a retry is lent a live connection");
    }

    assert!(kill().await >= 1, "the store's connection was closed");
    tokio::time::sleep(Duration::from_millis(800)).await;
    call("k-past".into())
        .await
        .expect("a connection idle past the half second is pinged, and replaced when closed");
}

#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
#[tokio::test]
async fn postgres_connection_closed_while_idle() {
    let schema = common::PgSchema::create(&common::pg_url(), 1).await;
    let app = common::unique("idle");
    let url = format!("{}&application_name={app}", schema.scoped_url());
    let store = PgStore::builder().connect(&url).await.unwrap();
    let kill = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1",
        )
        .bind(&app)
        .fetch_one(&schema.pool)
        .await
        .unwrap() as usize
    };
    connection_closed_while_idle(&store, kill).await;
}

#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
#[tokio::test]
async fn mysql_connection_closed_while_idle() {
    // One connection of the test's own, which the kill leaves alone; every other connection to
    // the database is the store's.
    let database = common::MyDatabase::create(&common::mysql_url(), 1).await;
    let store = MySqlStore::builder().connect(&database.url).await.unwrap();
    let kill = || async {
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM information_schema.processlist \
             WHERE db = ? AND id <> CONNECTION_ID()",
        )
        .bind(&database.name)
        .fetch_all(&database.pool)
        .await
        .unwrap();
        for id in &ids {
            sqlx::query(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
                .execute(&database.pool)
                .await
                .unwrap();
        }
        ids.len()
    };
    connection_closed_while_idle(&store, kill).await;
}

// ---- records a store cannot read: errors naming the record, never answers --------------------------

#[idempotent(scope = "created:<id>", key = key, store = store)]
async fn create_sqlite(
    store: &idem::SqliteStore,
    id: u32,
    key: &str,
) -> Result<(axum::http::StatusCode, axum::Json<Receipt>), Error> {
    Ok((
        axum::http::StatusCode::CREATED,
        axum::Json(Receipt::new(id, String::new())),
    ))
}

#[idempotent(scope = "created:<id>", key = key, store = store)]
async fn create<S: Store + Clone>(store: &S, id: u32, key: &str) -> Result<Receipt, Error> {
    Ok(Receipt::new(id, String::new()))
}

/// A stored HTTP status that is not a status is an error, never replayed as something else.
#[tokio::test]
async fn a_stored_status_that_does_not_decode_is_an_error() {
    let store = idem::SqliteStore::in_memory().await.unwrap();
    let (status, axum::Json(first)) = create_sqlite(&store, 3, "k").await.unwrap();
    assert_eq!(status, axum::http::StatusCode::CREATED);
    let (_, axum::Json(replayed)) = create_sqlite(&store, 3, "k").await.unwrap();
    assert_eq!(
        replayed.amount.to_bits(),
        first.amount.to_bits(),
        "exact float"
    );
    for status in ["1000", "NULL"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE idem_records SET response_status = {status}"
        )))
        .execute(store.pool())
        .await
        .unwrap();
        match create_sqlite(&store, 3, "k").await {
            Err(e @ Error::Decode(_)) => assert!(e.to_string().contains("status"), "{e}"),
            other => panic!("status {status} replayed as {other:?}"),
        }
    }
}

/// A NULL where a record must have a value (a hand-edited row, a table created by hand without
/// the constraints) is an error that names the record: the body does not run on it, and nothing
/// is replayed in its place. `run` runs a statement on the store's table behind its back;
/// `loosen` drops the constraints that keep NULLs out.
async fn nulls_in_a_record_are_errors_naming_it<S, F, Fut>(store: &S, run: F, loosen: [&str; 2])
where
    S: Store + Clone,
    F: Fn(String) -> Fut,
    Fut: Future<Output = ()>,
{
    create(store, 5, "k-null").await.unwrap();
    for stmt in loosen {
        run(stmt.to_owned()).await;
    }
    for column in ["response_body", "fence", "fingerprint"] {
        run(format!("UPDATE idem_records SET {column} = NULL")).await;
        let e = create(store, 5, "k-null").await.unwrap_err();
        assert!(matches!(e, Error::Store(_)), "{column}: {e:?}");
        let text = e.to_string();
        assert!(
            text.contains("created:5") && text.contains("k-null"),
            "{column}: the error names the record: {text}"
        );
        // Put the row back for the next column.
        run("DELETE FROM idem_records".to_owned()).await;
        create(store, 5, "k-null").await.unwrap();
    }
}

#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
#[tokio::test]
async fn postgres_nulls_in_a_record_are_errors_naming_it() {
    let url = common::pg_url();
    let schema = common::PgSchema::create(&url, 2).await;
    let store = PgStore::builder().build(schema.pool.clone()).await.unwrap();
    let run = |sql: String| async {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&schema.pool)
            .await
            .unwrap();
    };
    let loosen = [
        "ALTER TABLE idem_records ALTER COLUMN fence DROP NOT NULL",
        "ALTER TABLE idem_records ALTER COLUMN fingerprint DROP NOT NULL",
    ];
    nulls_in_a_record_are_errors_naming_it(&store, run, loosen).await;
}

#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
#[tokio::test]
async fn mysql_nulls_in_a_record_are_errors_naming_it() {
    let database = common::MyDatabase::create(&common::mysql_url(), 2).await;
    let store = MySqlStore::builder()
        .build(database.pool.clone())
        .await
        .unwrap();
    let run = |sql: String| async {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&database.pool)
            .await
            .unwrap();
    };
    let loosen = [
        "ALTER TABLE idem_records MODIFY fence BIGINT NULL",
        "ALTER TABLE idem_records MODIFY fingerprint VARBINARY(64) NULL",
    ];
    nulls_in_a_record_are_errors_naming_it(&store, run, loosen).await;
}
