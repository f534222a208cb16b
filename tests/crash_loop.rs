//! Crash loops: service processes under load are killed with SIGKILL at random moments and
//! restarted, hundreds of times; afterwards every key is driven to its answer and every money
//! move is checked to have happened exactly once, on one SQLite file, on PostgreSQL and on MySQL
//! (MariaDB).
//!
//! A plain `main` (harness = false). The service is a copy of this binary started with
//! `--worker`: an axum server whose one `#[idempotent]` handler moves money in several steps,
//! each step an insert on the step's downstream key (`INSERT … ON CONFLICT DO NOTHING`, on MySQL
//! `INSERT IGNORE`, as a payment gateway dedupes a repeated call), with pauses between steps so that a kill can cut
//! the body halfway. After each step the body records how far it got (a checkpoint, which also
//! renews the lease), so the attempt that takes an abandoned claim over resumes there.
//!
//! The test's own process is the driver: clients send requests on a bounded set of keys and
//! retry each on 409, 503 and connection errors; a killer SIGKILLs a random service process
//! after a random pause (a fixed seed, printed) and starts it again. Then every key is driven
//! to completion, asked once more (a replay), and checked:
//! - each step of each key's money move was applied exactly once (by step, not by downstream
//!   key, so a downstream key that changed between attempts shows as a duplicate);
//! - every answer a key ever gave is byte for byte its first, at most one of them fresh (not a
//!   replay), and it names the moves the table holds;
//! - an attempt that resumed from a checkpoint found the steps before it done by earlier
//!   attempts, and the completing attempt's number counts the attempts that did not finish;
//! - no record is left in progress.
//!
//! Then the same with clients that go away: a second loop sends resumable moves
//! (`#[idempotent(resumable)]`) whose clients mostly try once and never come back (a kill, a
//! 409, a 503 ends their interest), while the first attempt of one key in six loses its answer
//! on purpose (`ClaimInfo::outcome_unknown`, the claim kept) and every service process runs a
//! completer.
//! With the kills over and nobody retrying, the completers alone must finish every move that
//! started, within the settle time: each ends completed exactly once (or parked), none is left
//! in progress, no step moved money twice, and every answer a client got is the stored one.
//!
//! `IDEM_CRASH_KILLS` sets the kills per store (the abandoned-work loop makes half as many;
//! default 50: about a minute for the three stores); `IDEM_CRASH_SEED` the seed.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use idem::axum::{IdempotencyKey, IdempotencyLayer};
use idem::completer::{Completer, Resumption};
use idem::{ClaimRef, MySqlStore, PgStore, RecordState, SqliteStore, Store, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, MySqlPool, PgPool, SqlitePool};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Steps of one money move.
const STEPS: u32 = 4;
/// Service processes running at once; the killer picks one of them each time.
const PROCESSES: usize = 2;
/// Concurrent clients in the driver.
const CLIENTS: usize = 8;
/// The lease of the handler: the shortest `#[idempotent]` accepts, so that a claim abandoned
/// by a killed process is taken over quickly.
const LEASE: Duration = Duration::from_secs(1);
/// A service process is killed after a pause drawn from this range (milliseconds) once it is
/// up: about the time a few bodies take, so most kills land with bodies in flight.
const KILL_AFTER_MS: (u64, u64) = (40, 400);
/// Pause before each step of a body (milliseconds).
const STEP_PAUSE_MS: (u64, u64) = (5, 40);
const DEFAULT_KILLS: usize = 50;
/// How often each service process's completer looks for abandoned moves.
const COMPLETER_EVERY: Duration = Duration::from_millis(200);
/// Attempts before a move is parked: far more than the kills one key can meet here.
const MAX_ATTEMPTS: u32 = 20;
/// One key in this many loses the answer of its first attempt of a resumable move (keys are
/// sent in order, so every loop that sends a few keys has some).
const LOST_ANSWER_EVERY: usize = 6;
/// A client of the abandoned-work loop pauses this long (milliseconds) before each new key.
const NEW_KEY_PAUSE_MS: (u64, u64) = (400, 1200);
/// How long abandoned moves may take to be finished once the kills stopped.
const SETTLE: Duration = Duration::from_secs(90);
const DEFAULT_SEED: u64 = 0x1de3_c4a5_b00c_0001;

// ---- a tiny PRNG of our own: SplitMix64 ------------------------------------------------------

#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (`hi > lo`).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

// ---- the service: one guarded handler that moves money in steps ------------------------------

/// The application's tables, in the database the store uses.
#[derive(Clone)]
enum Db {
    Lite(SqlitePool),
    Pg(PgPool),
    My(MySqlPool),
}

/// Runs `$body` with `$pool` bound to whichever pool `$db` holds (the SQL is the same on each,
/// through [`Db::sql`]).
macro_rules! on_db {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            Db::Lite($pool) => $body,
            Db::Pg($pool) => $body,
            Db::My($pool) => $body,
        }
    };
}

const SCHEMA: [&str; 4] = [
    // The money moves, as a gateway keeps them: one row per downstream key.
    "CREATE TABLE moves (dkey VARCHAR(255) PRIMARY KEY, idem_key VARCHAR(255) NOT NULL, step BIGINT NOT NULL, \
     amount BIGINT NOT NULL, fence BIGINT NOT NULL, pid BIGINT NOT NULL)",
    // Every execution of a step, whether it moved money or found it moved: the figures.
    "CREATE TABLE step_runs (idem_key VARCHAR(255) NOT NULL, step BIGINT NOT NULL, fence BIGINT NOT NULL, \
     applied BIGINT NOT NULL)",
    // Every body that started: its claim, and where it resumed.
    "CREATE TABLE runs (idem_key VARCHAR(255) NOT NULL, fence BIGINT NOT NULL, attempt BIGINT NOT NULL, \
     reclaimed BIGINT NOT NULL, resumed_from BIGINT NOT NULL, pid BIGINT NOT NULL)",
    // Every body that lost its answer on purpose (its outcome unknown).
    "CREATE TABLE lost_answers (idem_key VARCHAR(255) NOT NULL, fence BIGINT NOT NULL)",
];

fn unavailable(e: sqlx::Error) -> idem::Error {
    idem::Error::Unavailable(Box::new(e))
}

impl Db {
    /// `sql`, written with `$n` placeholders bound in order, in this database's terms: MySQL
    /// numbers none (`?`).
    fn sql(&self, sql: &str) -> AssertSqlSafe<String> {
        let Db::My(_) = self else {
            return AssertSqlSafe(sql.to_owned());
        };
        let mut out = String::with_capacity(sql.len());
        let mut chars = sql.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
                while chars.next_if(char::is_ascii_digit).is_some() {}
                out.push('?');
            } else {
                out.push(c);
            }
        }
        AssertSqlSafe(out)
    }

    /// The insert of a move that does nothing when its downstream key moved money already.
    fn insert_move(&self) -> &'static str {
        match self {
            Db::My(_) => {
                "INSERT IGNORE INTO moves (dkey, idem_key, step, amount, fence, pid) \
                 VALUES ($1, $2, $3, $4, $5, $6)"
            }
            Db::Lite(_) | Db::Pg(_) => {
                "INSERT INTO moves (dkey, idem_key, step, amount, fence, pid) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (dkey) DO NOTHING"
            }
        }
    }

    async fn create(&self) {
        for sql in SCHEMA {
            on_db!(self, pool => {
                sqlx::query(sql).execute(pool).await.unwrap();
            });
        }
    }

    async fn log_run(
        &self,
        key: &str,
        claim: &idem::ClaimInfo,
        resumed_from: u32,
    ) -> idem::Result<()> {
        on_db!(self, pool => sqlx::query(self.sql(
            "INSERT INTO runs (idem_key, fence, attempt, reclaimed, resumed_from, pid) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        ))
        .bind(key)
        .bind(claim.fence() as i64)
        .bind(i64::from(claim.attempt()))
        .bind(i64::from(claim.is_reclaim()))
        .bind(i64::from(resumed_from))
        .bind(i64::from(std::process::id()))
        .execute(pool)
        .await
        .map_err(unavailable)?
        .rows_affected());
        Ok(())
    }

    async fn log_lost(&self, key: &str, fence: u64) -> idem::Result<()> {
        on_db!(self, pool => sqlx::query(self.sql("INSERT INTO lost_answers (idem_key, fence) VALUES ($1, $2)"))
            .bind(key)
            .bind(fence as i64)
            .execute(pool)
            .await
            .map_err(unavailable)?
            .rows_affected());
        Ok(())
    }

    /// One step of the money move: the move on its downstream key, deduplicated as a gateway
    /// would, and the execution noted, in one transaction.
    async fn apply(
        &self,
        key: &str,
        step: u32,
        dkey: &str,
        amount: i64,
        fence: u64,
    ) -> idem::Result<()> {
        on_db!(self, pool => {
            let mut tx = pool.begin().await.map_err(unavailable)?;
            let applied = sqlx::query(self.sql(self.insert_move()))
            .bind(dkey)
            .bind(key)
            .bind(i64::from(step))
            .bind(amount)
            .bind(fence as i64)
            .bind(i64::from(std::process::id()))
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?
            .rows_affected();
            sqlx::query(self.sql(
                "INSERT INTO step_runs (idem_key, step, fence, applied) VALUES ($1, $2, $3, $4)",
            ))
                .bind(key)
                .bind(i64::from(step))
                .bind(fence as i64)
                .bind(applied as i64)
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?;
            tx.commit().await.map_err(unavailable)?;
        });
        Ok(())
    }

    /// The moves of `key`, by step: (step, amount, fence, pid).
    async fn moves(&self, key: &str) -> Result<Vec<MoveRow>, sqlx::Error> {
        let rows: Vec<(i64, i64, i64, i64)> = on_db!(self, pool => sqlx::query_as(self.sql(
            "SELECT step, amount, fence, pid FROM moves WHERE idem_key = $1 ORDER BY step, fence",
        ))
        .bind(key)
        .fetch_all(pool)
        .await?);
        Ok(rows
            .into_iter()
            .map(|(step, amount, fence, pid)| MoveRow {
                step,
                amount,
                fence,
                pid,
            })
            .collect())
    }
}

#[derive(Clone)]
struct App<S> {
    store: S,
    db: Db,
    rng: Arc<Mutex<Rng>>,
    /// Who runs the body: "http" (a client's request) or "completer".
    via: &'static str,
    /// Whether first attempts of resumable moves sometimes lose their answer.
    loses_answers: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct MoveReq {
    amount: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct MoveRow {
    step: i64,
    amount: i64,
    fence: i64,
    pid: i64,
}

/// The answer: what was moved, and which attempt finished it. The pid and a nonce make two
/// completions of one key tell apart.
#[derive(Debug, Serialize, Deserialize)]
struct Moved {
    scope: String,
    key: String,
    moves: Vec<MoveRow>,
    fence: u64,
    attempt: u32,
    resumed_from: u32,
    pid: u32,
    via: String,
    nonce: u64,
}

#[idempotent(
    scope = "move:<account>",
    key = key,
    store = app.store,
    skip(app),
    lease = "1s",
    retain = "1h",
    claim = claim
)]
async fn transfer<S: Store + Clone>(
    State(app): State<App<S>>,
    Path(account): Path<String>,
    key: IdempotencyKey,
    Json(req): Json<MoveReq>,
) -> Result<(StatusCode, Json<Moved>), idem::Error> {
    move_money(&app, &claim, req.amount).await
}

/// The same money move, resumable: its account and amount are stored with its claim, and a
/// completer in any service process finishes it when its client went away. For one key in
/// [`LOST_ANSWER_EVERY`], the first attempt ends as a gateway whose answer was lost would: the
/// money of the steps so far moved, the outcome unknown, the claim suspended.
#[idempotent(
    scope = "abandoned:<account>",
    key = key,
    store = app.store,
    skip(app),
    lease = "1s",
    retain = "1h",
    claim = claim,
    resumable
)]
async fn transfer_resumable<S: Store + Clone>(
    State(app): State<App<S>>,
    Path(account): Path<String>,
    key: IdempotencyKey,
    Json(req): Json<MoveReq>,
) -> Result<(StatusCode, Json<Moved>), idem::Error> {
    move_money(&app, &claim, req.amount).await
}

/// The body of both handlers: the steps of the move from the claim's recovery point on, each
/// on its downstream key and checkpointed.
async fn move_money<S: Store + Clone>(
    app: &App<S>,
    claim: &idem::ClaimInfo,
    amount: i64,
) -> Result<(StatusCode, Json<Moved>), idem::Error> {
    let k = claim.key().as_str();
    let resumed_from: u32 = claim
        .recovery_point()
        .map(|p| std::str::from_utf8(p).unwrap().parse().unwrap())
        .unwrap_or(0);
    app.db.log_run(k, claim, resumed_from).await?;
    // Where a first attempt of a resumable move loses its answer, if it does (STEPS: never).
    // Chosen by the key, not drawn: a drawn loss can miss every key of a short loop.
    let lost_after = match loses_answer(k) {
        Some(step) if app.loses_answers && claim.attempt() == 1 && !claim.is_reclaim() => step,
        _ => STEPS,
    };
    for step in resumed_from..STEPS {
        let pause = app
            .rng
            .lock()
            .unwrap()
            .range(STEP_PAUSE_MS.0, STEP_PAUSE_MS.1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let dkey = claim.downstream_key(&format!("step-{step}"));
        let done = (step + 1).to_string();
        let at = ClaimRef {
            scope: claim.scope(),
            key: k,
            fence: claim.fence(),
        };
        let stepped = match app.db.apply(k, step, &dkey, amount, claim.fence()).await {
            Ok(()) => app.store.checkpoint(at, done.as_bytes(), LEASE).await,
            Err(e) => Err(e),
        };
        if let Err(e) = stepped {
            // The move's transaction may have committed before its answer was lost: the
            // outcome is unknown, and the claim is kept for a retry or the completer.
            claim.outcome_unknown(format!("step {step}: {e}"));
            return Err(e);
        }
        if step == lost_after {
            app.db.log_lost(k, claim.fence()).await?;
            claim.outcome_unknown(format!("the answer of step {step} was lost"));
            return Err(idem::Error::Unavailable(
                format!("the answer of step {step} was lost").into(),
            ));
        }
    }
    let moves = app.db.moves(k).await.map_err(unavailable)?;
    let nonce = app.rng.lock().unwrap().next_u64();
    Ok((
        StatusCode::CREATED,
        Json(Moved {
            scope: claim.scope().to_owned(),
            key: k.to_owned(),
            moves,
            fence: claim.fence(),
            attempt: claim.attempt(),
            resumed_from,
            pid: std::process::id(),
            via: app.via.to_owned(),
            nonce,
        }),
    ))
}

/// The completer of a service process: resumable moves whose client went away, finished by
/// calling the handler again with the stored account and amount.
fn completer<S: Store + Clone>(app: App<S>) -> Completer<S> {
    Completer::new(app.store.clone())
        .resume("abandoned:<account>", move |r: Resumption| {
            let app = App {
                via: "completer",
                ..app.clone()
            };
            async move {
                let account: String = r.arg("account")?;
                let req: MoveReq = r.arg("req")?;
                let key = IdempotencyKey(r.key().clone());
                transfer_resumable(State(app), Path(account), key, Json(req)).await
            }
        })
        .every(COMPLETER_EVERY)
        .max_attempts(MAX_ATTEMPTS)
}

/// The service process: serves until it is killed. With `completing`, it also runs a
/// completer, and first attempts of resumable moves sometimes lose their answer.
async fn worker(kind: &str, target: &str, seed: u64, completing: bool) {
    let rng = Arc::new(Mutex::new(Rng(seed ^ u64::from(std::process::id()))));
    match kind {
        "sqlite" => {
            let store = SqliteStore::connect(target).await.unwrap();
            let db = Db::Lite(store.pool().clone());
            serve(store, db, rng, completing).await;
        }
        "postgres" => {
            let (url, schema) = target.split_once('#').unwrap();
            let pool = common::PgSchema::pool_for(url, schema, 8).await;
            let store = PgStore::builder().build(pool.clone()).await.unwrap();
            serve(store, Db::Pg(pool), rng, completing).await;
        }
        "mysql" => {
            // As a service connects: the store's own pool (READ COMMITTED), which the
            // application's tables share.
            let store = MySqlStore::connect(target).await.unwrap();
            let db = Db::My(store.pool().clone());
            serve(store, db, rng, completing).await;
        }
        other => panic!("no store {other:?}"),
    }
}

async fn serve<S: Store + Clone>(store: S, db: Db, rng: Arc<Mutex<Rng>>, completing: bool) {
    let app = App {
        store,
        db,
        rng,
        via: "http",
        loses_answers: completing,
    };
    let _completer = completing.then(|| completer(app.clone()).start().unwrap());
    let router = Router::new()
        .route("/move/{account}", post(transfer::<S>))
        .route("/abandoned/{account}", post(transfer_resumable::<S>))
        .with_state(app)
        .layer(IdempotencyLayer::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("LISTENING http://{}", listener.local_addr().unwrap());
    axum::serve(listener, router).await.unwrap();
}

// ---- the driver ------------------------------------------------------------------------------

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--worker") {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let completing = args.get(5).map(String::as_str) == Some("completer");
        rt.block_on(worker(
            &args[2],
            &args[3],
            args[4].parse().unwrap(),
            completing,
        ));
        return;
    }
    let kills = match std::env::var("IDEM_CRASH_KILLS") {
        Ok(n) => n.parse().expect("IDEM_CRASH_KILLS is a number of kills"),
        Err(_) => DEFAULT_KILLS,
    };
    // Each abandoned move is finished by a completer after its lease or resume delay: fewer
    // kills, so that the loop keeps its time.
    let abandon_kills = kills.div_ceil(2).max(5);
    let seed = match std::env::var("IDEM_CRASH_SEED") {
        Ok(s) => s.parse().expect("IDEM_CRASH_SEED is a u64"),
        Err(_) => DEFAULT_SEED,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let file = common::SqliteFile::new();
        let store = SqliteStore::connect(&file.url).await.unwrap();
        let db = Db::Lite(store.pool().clone());
        db.create().await;
        crash_loop("sqlite", &file.url, &store, &db, kills, seed).await;
        println!("test crash_loop::sqlite ... ok");
        abandon_loop("sqlite", &file.url, &store, &db, abandon_kills, seed).await;
        println!("test crash_loop::sqlite_abandoned_work_is_completed ... ok");

        if cfg!(idem_postgres) {
            let url = common::pg_url();
            let schema = common::PgSchema::create(&url, 4).await;
            let store = PgStore::builder().build(schema.pool.clone()).await.unwrap();
            let db = Db::Pg(schema.pool.clone());
            db.create().await;
            let target = format!("{url}#{}", schema.name);
            crash_loop("postgres", &target, &store, &db, kills, seed).await;
            println!("test crash_loop::postgres ... ok");
            abandon_loop("postgres", &target, &store, &db, abandon_kills, seed).await;
            println!("test crash_loop::postgres_abandoned_work_is_completed ... ok");
        } else {
            for name in ["postgres", "postgres_abandoned_work_is_completed"] {
                println!(
                    "test crash_loop::{name} ... ignored, needs PostgreSQL: set DATABASE_URL=postgres://…"
                );
            }
        }

        if cfg!(idem_mysql) {
            let database = common::MyDatabase::create(&common::mysql_url(), 4).await;
            let store = MySqlStore::builder()
                .build(database.pool.clone())
                .await
                .unwrap();
            let db = Db::My(database.pool.clone());
            db.create().await;
            crash_loop("mysql", &database.url, &store, &db, kills, seed).await;
            println!("test crash_loop::mysql ... ok");
            abandon_loop("mysql", &database.url, &store, &db, abandon_kills, seed).await;
            println!("test crash_loop::mysql_abandoned_work_is_completed ... ok");
        } else {
            for name in ["mysql", "mysql_abandoned_work_is_completed"] {
                println!(
                    "test crash_loop::{name} ... ignored, needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
                );
            }
        }
    });
}

/// A running service process, SIGKILLed when dropped.
struct Service {
    child: Child,
    base: String,
}

/// Starts a service process; `mode` is "plain", or "completer" for one that runs a completer.
async fn start(kind: &str, target: &str, seed: u64, mode: &str) -> Service {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--worker", kind, target, &seed.to_string(), mode])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start a service process");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .await
        .unwrap();
    let base = line
        .strip_prefix("LISTENING ")
        .unwrap_or_else(|| panic!("{kind}: unexpected first line of a service: {line:?}"))
        .trim()
        .to_owned();
    Service { child, base }
}

/// Every key's identity and request: a few accounts (scopes), an amount of its own.
fn account(i: usize) -> String {
    format!("acct-{}", i % 7)
}

/// After which step the first attempt of key `key` ("abandon-00042") loses its answer: one key
/// in [`LOST_ANSWER_EVERY`], each at a step of its own.
fn loses_answer(key: &str) -> Option<u32> {
    let i: usize = key.rsplit('-').next()?.parse().ok()?;
    (i % LOST_ANSWER_EVERY == 2).then_some((i / LOST_ANSWER_EVERY) as u32 % STEPS)
}

fn key_name(i: usize) -> String {
    format!("key-{i:05}")
}

fn amount(i: usize) -> i64 {
    100 + i as i64
}

/// What the driver saw of one key.
#[derive(Default)]
struct Seen {
    /// The first answer's bytes.
    first: Option<Vec<u8>>,
    /// Answers without `Idempotent-Replayed`, and with it.
    fresh: u32,
    replays: u32,
    /// Answers that differed from the first.
    mismatches: Vec<String>,
}

#[derive(Default)]
struct Stats {
    requests: AtomicU64,
    in_progress: AtomicU64,
    unavailable: AtomicU64,
    connection_errors: AtomicU64,
    answers: AtomicU64,
}

struct Driver {
    kind: String,
    /// The route's first segment ("move" or "abandoned") and the keys' prefix ("key" or
    /// "abandon").
    path: &'static str,
    prefix: &'static str,
    http: reqwest::Client,
    /// Each service's base URL; `None` while it is being killed and restarted.
    bases: RwLock<Vec<Option<String>>>,
    seen: Mutex<HashMap<usize, Seen>>,
    unexpected: Mutex<Vec<String>>,
    stats: Stats,
    stop: AtomicBool,
}

impl Driver {
    fn key(&self, i: usize) -> String {
        format!("{}-{i:05}", self.prefix)
    }

    /// Replays answered so far, over every key.
    fn replays(&self) -> u32 {
        self.seen.lock().unwrap().values().map(|s| s.replays).sum()
    }

    fn base(&self, rng: &mut Rng) -> Option<String> {
        let live: Vec<String> = self
            .bases
            .read()
            .unwrap()
            .iter()
            .flatten()
            .cloned()
            .collect();
        (!live.is_empty()).then(|| live[rng.below(live.len())].clone())
    }

    /// Sends key `i` until it is answered (retrying 409, 503 and connection errors), or until
    /// `stop` is set when `interruptible`, or after the first try that was not answered when
    /// `gives_up` (a client that goes away). Returns whether it was answered.
    async fn send(&self, i: usize, rng: &mut Rng, interruptible: bool, gives_up: bool) -> bool {
        let pause = || tokio::time::sleep(Duration::from_millis(30));
        let mut tries = 0;
        loop {
            if gives_up && tries > 0 {
                return false;
            }
            tries += 1;
            if interruptible && self.stop.load(Ordering::Relaxed) {
                return false;
            }
            let Some(base) = self.base(rng) else {
                pause().await;
                continue;
            };
            self.stats.requests.fetch_add(1, Ordering::Relaxed);
            let sent = self
                .http
                .post(format!("{base}/{}/{}", self.path, account(i)))
                .header("Idempotency-Key", self.key(i))
                .json(&MoveReq { amount: amount(i) })
                .send()
                .await;
            let r = match sent {
                Ok(r) => r,
                Err(_) => {
                    self.stats.connection_errors.fetch_add(1, Ordering::Relaxed);
                    pause().await;
                    continue;
                }
            };
            let status = r.status();
            let replayed = r
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true");
            let Ok(body) = r.bytes().await else {
                // Killed while sending the body.
                self.stats.connection_errors.fetch_add(1, Ordering::Relaxed);
                pause().await;
                continue;
            };
            match status.as_u16() {
                200 | 201 => {
                    self.stats.answers.fetch_add(1, Ordering::Relaxed);
                    self.record(i, replayed, &body);
                    return true;
                }
                409 => {
                    self.stats.in_progress.fetch_add(1, Ordering::Relaxed);
                    pause().await;
                }
                503 => {
                    self.stats.unavailable.fetch_add(1, Ordering::Relaxed);
                    pause().await;
                }
                _ => {
                    self.unexpected.lock().unwrap().push(format!(
                        "{}: {}: {status} {}",
                        self.kind,
                        self.key(i),
                        String::from_utf8_lossy(&body)
                    ));
                    return true;
                }
            }
        }
    }

    fn record(&self, i: usize, replayed: bool, body: &[u8]) {
        let mut seen = self.seen.lock().unwrap();
        let s = seen.entry(i).or_default();
        if replayed {
            s.replays += 1;
        } else {
            s.fresh += 1;
        }
        match &s.first {
            None => s.first = Some(body.to_vec()),
            Some(first) if first != body => s.mismatches.push(format!(
                "first {} then {}",
                String::from_utf8_lossy(first),
                String::from_utf8_lossy(body)
            )),
            Some(_) => {}
        }
    }
}

/// A load of `CLIENTS` clients on `keys` keys, `kills` SIGKILLs and restarts, then every key
/// driven to its answer, and the exactly-once checks.
async fn crash_loop<S: Store>(
    kind: &str,
    target: &str,
    store: &S,
    db: &Db,
    kills: usize,
    seed: u64,
) {
    let keys = 3 * kills + 20;
    println!(
        "{kind}: seed {seed} (IDEM_CRASH_SEED), {kills} kills (IDEM_CRASH_KILLS), {keys} keys, \
         {PROCESSES} service processes, {CLIENTS} clients, lease {LEASE:?}"
    );
    let began = Instant::now();
    // The loop is bounded: each kill comes after at most KILL_AFTER_MS.1 and a restart.
    let budget = Duration::from_secs(120) + Duration::from_millis(1500) * kills as u32;
    let mut services = Vec::new();
    for p in 0..PROCESSES {
        services.push(start(kind, target, seed.wrapping_add(p as u64), "plain").await);
    }
    let driver = Arc::new(Driver {
        kind: kind.to_owned(),
        path: "move",
        prefix: "key",
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .pool_max_idle_per_host(0)
            .build()
            .unwrap(),
        bases: RwLock::new(services.iter().map(|s| Some(s.base.clone())).collect()),
        seen: Mutex::new(HashMap::new()),
        unexpected: Mutex::new(Vec::new()),
        stats: Stats::default(),
        stop: AtomicBool::new(false),
    });

    // The load: each client takes the next key not yet sent, or one already sent (a replay, or
    // a wait behind a live claim), and sends it until answered.
    let next = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (driver, next) = (driver.clone(), next.clone());
            let mut rng = Rng(seed ^ ((0xc1 + c as u64) << 32));
            tokio::spawn(async move {
                while !driver.stop.load(Ordering::Relaxed) {
                    let sent = next.load(Ordering::Relaxed).min(keys);
                    let i = if sent < keys && (sent == 0 || rng.below(10) < 6) {
                        match next.fetch_add(1, Ordering::Relaxed) {
                            i if i < keys => i,
                            _ => rng.below(keys),
                        }
                    } else {
                        rng.below(sent.max(1))
                    };
                    driver.send(i, &mut rng, true, false).await;
                }
            })
        })
        .collect();

    // The killer.
    let mut rng = Rng(seed);
    for _ in 0..kills {
        let after = rng.range(KILL_AFTER_MS.0, KILL_AFTER_MS.1);
        tokio::time::sleep(Duration::from_millis(after)).await;
        let p = rng.below(PROCESSES);
        driver.bases.write().unwrap()[p] = None;
        let s = &mut services[p];
        s.child.start_kill().expect("SIGKILL a service process");
        let status = s.child.wait().await.unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "{kind}: the service died of SIGKILL, not of something else: {status}"
        );
        services[p] = start(kind, target, rng.next_u64(), "plain").await;
        driver.bases.write().unwrap()[p] = Some(services[p].base.clone());
        assert!(
            began.elapsed() < budget,
            "{kind}: the crash loop ran past {budget:?}"
        );
    }
    let looped = began.elapsed();
    driver.stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let loop_requests = driver.stats.requests.load(Ordering::Relaxed);

    // Every key to its answer (claims cut by the last kills are taken over after the lease),
    // then once more: now every key must replay.
    for round in ["drive", "replay"] {
        let replays_before = driver.replays();
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let driver = driver.clone();
                let mut rng = Rng(seed ^ 0xd1 ^ c as u64);
                tokio::spawn(async move {
                    for i in (c..keys).step_by(CLIENTS) {
                        driver.send(i, &mut rng, false, false).await;
                    }
                })
            })
            .collect();
        let drive = async {
            for t in tasks {
                t.await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(60), drive)
            .await
            .unwrap_or_else(|_| panic!("{kind}: {round}: some key was not answered within 60 s"));
        if round == "replay" {
            let replays = driver.replays();
            assert_eq!(
                (replays - replays_before) as usize,
                keys,
                "{kind}: after the loop, every key replays"
            );
        }
    }
    drop(services);

    let unexpected = driver.unexpected.lock().unwrap().clone();
    assert!(
        unexpected.is_empty(),
        "{kind}: unexpected answers: {unexpected:#?}"
    );
    let seen = std::mem::take(&mut *driver.seen.lock().unwrap());
    let answers = check(kind, store, db, keys, &seen).await;
    let figures = check_runs(kind, db, keys, &answers).await;

    let st = &driver.stats;
    println!(
        "{kind}: {kills} kills in {looped:.1?}; {loop_requests} requests in the loop, {} in all \
         ({} answered, {} in progress, {} unavailable, {} connection errors); {keys} keys, \
         {} cut mid-body, {} re-claimed, {} resumed from a checkpoint; executions per step: {}; \
         {} step executions found their move done; duplicates found: 0; {:.1?} in all",
        st.requests.load(Ordering::Relaxed),
        st.answers.load(Ordering::Relaxed),
        st.in_progress.load(Ordering::Relaxed),
        st.unavailable.load(Ordering::Relaxed),
        st.connection_errors.load(Ordering::Relaxed),
        figures.cut,
        figures.reclaimed,
        figures.resumed,
        figures
            .executions
            .iter()
            .map(|(n, steps)| format!("{steps} ran {n}x"))
            .collect::<Vec<_>>()
            .join(", "),
        figures.deduped,
        began.elapsed(),
    );
    assert!(
        figures.cut > 0,
        "{kind}: no kill cut a body halfway: the loop tested nothing"
    );
}

/// Each key's answers and moves: exactly once, the same bytes every time. Returns each key's
/// decoded answer.
async fn check<S: Store>(
    kind: &str,
    store: &S,
    db: &Db,
    keys: usize,
    seen: &HashMap<usize, Seen>,
) -> Vec<Moved> {
    // By (key, step), not by downstream key: a move repeated under another downstream key is a
    // duplicate here.
    let counts: Vec<(String, i64, i64)> = on_db!(db, pool => sqlx::query_as(
        "SELECT idem_key, step, count(*) FROM moves GROUP BY idem_key, step",
    )
    .fetch_all(pool)
    .await
    .unwrap());
    let mut duplicates = Vec::new();
    let mut per_key: HashMap<String, usize> = HashMap::new();
    for (key, step, n) in &counts {
        if *n != 1 {
            duplicates.push(format!("{key} step {step}: {n} moves"));
        }
        *per_key.entry(key.clone()).or_default() += 1;
    }
    assert!(
        duplicates.is_empty(),
        "{kind}: money moved twice: {duplicates:#?}"
    );
    let mut answers = Vec::new();
    for i in 0..keys {
        let key = key_name(i);
        assert_eq!(
            per_key.get(&key).copied().unwrap_or(0),
            STEPS as usize,
            "{kind}: {key}: every step moved money"
        );
        let s = &seen[&i];
        assert!(
            s.mismatches.is_empty(),
            "{kind}: {key} answered differently: {:#?}",
            s.mismatches
        );
        assert!(
            s.fresh <= 1,
            "{kind}: {key} ran to completion {} times",
            s.fresh
        );
        let first = s.first.as_ref().unwrap();
        let moved: Moved = serde_json::from_slice(first).unwrap();
        assert_eq!(moved.key, key);
        let moves = db.moves(&key).await.unwrap();
        assert_eq!(
            moved.moves, moves,
            "{kind}: {key}: the answer names the moves made"
        );
        assert!(
            moves.iter().all(|m| m.amount == amount(i)),
            "{kind}: {key}: {moves:?}"
        );
        let record = store.lookup(&moved.scope, &key).await.unwrap();
        let record = record.unwrap_or_else(|| panic!("{kind}: {key}: no record"));
        assert_eq!(record.state, RecordState::Completed, "{kind}: {key}");
        assert_eq!(
            record.fence, moved.fence,
            "{kind}: {key}: completed by the fence that answered"
        );
        assert_eq!(
            &record.response.unwrap().body[..],
            &first[..],
            "{kind}: {key}: the stored answer is the one given"
        );
        answers.push(moved);
    }
    answers
}

struct Figures {
    cut: usize,
    reclaimed: usize,
    resumed: usize,
    deduped: i64,
    /// How many (key, step) pairs ran n times, by n.
    executions: BTreeMap<i64, usize>,
}

/// What the bodies did: which attempts were cut, where the completing one resumed.
async fn check_runs(kind: &str, db: &Db, keys: usize, answers: &[Moved]) -> Figures {
    let runs: Vec<(String, i64, i64)> = on_db!(db, pool => sqlx::query_as(
        "SELECT idem_key, fence, resumed_from FROM runs",
    )
    .fetch_all(pool)
    .await
    .unwrap());
    let steps: Vec<(String, i64, i64, i64)> = on_db!(db, pool => sqlx::query_as(
        "SELECT idem_key, step, fence, applied FROM step_runs",
    )
    .fetch_all(pool)
    .await
    .unwrap());
    let mut runs_of: HashMap<&str, Vec<(i64, i64)>> = HashMap::new();
    for (key, fence, resumed_from) in &runs {
        runs_of
            .entry(key)
            .or_default()
            .push((*fence, *resumed_from));
    }
    let mut steps_by_fence: HashMap<(&str, i64), usize> = HashMap::new();
    let mut executions: HashMap<(&str, i64), i64> = HashMap::new();
    let mut deduped = 0;
    for (key, step, fence, applied) in &steps {
        *steps_by_fence.entry((key, *fence)).or_default() += 1;
        *executions.entry((key, *step)).or_default() += 1;
        deduped += i64::from(*applied == 0);
    }
    let mut figures = Figures {
        cut: 0,
        reclaimed: 0,
        resumed: 0,
        deduped,
        executions: BTreeMap::new(),
    };
    for n in executions.values() {
        *figures.executions.entry(*n).or_default() += 1;
    }
    assert_eq!(
        executions.len(),
        keys * STEPS as usize,
        "{kind}: every step was executed"
    );
    for a in answers {
        let fence = a.fence as i64;
        let mine = runs_of
            .get(a.key.as_str())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        assert!(
            mine.contains(&(fence, i64::from(a.resumed_from))),
            "{kind}: {}: the completing run is logged",
            a.key
        );
        assert!(
            a.attempt as usize >= mine.len(),
            "{kind}: {}: attempt {} but {} bodies ran: the attempt number forgot one",
            a.key,
            a.attempt,
            mine.len()
        );
        let cut = mine
            .iter()
            .any(|(f, _)| *f != fence && steps_by_fence.contains_key(&(a.key.as_str(), *f)));
        figures.cut += usize::from(cut);
        figures.reclaimed += usize::from(a.attempt > 1);
        if a.resumed_from > 0 {
            figures.resumed += 1;
            // The steps before the recovery point were done, by earlier attempts.
            for m in &a.moves[..a.resumed_from as usize] {
                assert!(
                    m.fence < fence && m.step < i64::from(a.resumed_from),
                    "{kind}: {}: resumed at {} but {m:?}",
                    a.key,
                    a.resumed_from
                );
            }
        }
    }
    figures
}

// ---- abandoned work: clients that go away, completers that finish it -------------------------

/// Resumable moves under load whose clients mostly go away after one try (a kill, a lost
/// answer, a 409 or a 503 ends their interest), `kills` SIGKILLs and restarts of service
/// processes that each run a completer; then, with the kills over and nobody retrying, the
/// completers must finish every move that started: each ends completed exactly once (or
/// parked), none is left in progress after the settle time, and no step moved money twice.
async fn abandon_loop<S: Store>(
    kind: &str,
    target: &str,
    store: &S,
    db: &Db,
    kills: usize,
    seed: u64,
) {
    let keys = 2 * kills + 20;
    println!(
        "{kind}: abandoned work: {kills} kills, {keys} keys, {PROCESSES} service processes with a \
         completer each (every {COMPLETER_EVERY:?}), {CLIENTS} clients that mostly give up after \
         one try, the first attempt of one key in {LOST_ANSWER_EVERY} losing its answer"
    );
    let began = Instant::now();
    let budget = Duration::from_secs(120) + Duration::from_millis(1500) * kills as u32;
    let mut services = Vec::new();
    for p in 0..PROCESSES {
        services.push(
            start(
                kind,
                target,
                seed.wrapping_add(0xab + p as u64),
                "completer",
            )
            .await,
        );
    }
    let driver = Arc::new(Driver {
        kind: kind.to_owned(),
        path: "abandoned",
        prefix: "abandon",
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .pool_max_idle_per_host(0)
            .build()
            .unwrap(),
        bases: RwLock::new(services.iter().map(|s| Some(s.base.clone())).collect()),
        seen: Mutex::new(HashMap::new()),
        unexpected: Mutex::new(Vec::new()),
        stats: Stats::default(),
        stop: AtomicBool::new(false),
    });

    // Each client sends the next key: seven times in ten it goes away after one try, else it
    // retries until answered. Once every key was sent, clients come back now and then to a
    // key already sent, for one try (racing the completers).
    let next = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (driver, next) = (driver.clone(), next.clone());
            let mut rng = Rng(seed ^ ((0xa1 + c as u64) << 32));
            tokio::spawn(async move {
                while !driver.stop.load(Ordering::Relaxed) {
                    match next.fetch_add(1, Ordering::Relaxed) {
                        i if i < keys => {
                            // New keys arrive through the whole loop, so that kills land in
                            // first attempts as well as in resumed ones.
                            let pause = rng.range(NEW_KEY_PAUSE_MS.0, NEW_KEY_PAUSE_MS.1);
                            tokio::time::sleep(Duration::from_millis(pause)).await;
                            let gives_up = rng.below(10) < 7;
                            driver.send(i, &mut rng, true, gives_up).await;
                        }
                        _ => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            let i = rng.below(keys);
                            driver.send(i, &mut rng, true, true).await;
                        }
                    }
                }
            })
        })
        .collect();

    let mut rng = Rng(seed ^ 0xab);
    for _ in 0..kills {
        let after = rng.range(KILL_AFTER_MS.0, KILL_AFTER_MS.1);
        tokio::time::sleep(Duration::from_millis(after)).await;
        let p = rng.below(PROCESSES);
        driver.bases.write().unwrap()[p] = None;
        let s = &mut services[p];
        s.child.start_kill().expect("SIGKILL a service process");
        let status = s.child.wait().await.unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "{kind}: the service died of SIGKILL, not of something else: {status}"
        );
        services[p] = start(kind, target, rng.next_u64(), "completer").await;
        driver.bases.write().unwrap()[p] = Some(services[p].base.clone());
        assert!(
            began.elapsed() < budget,
            "{kind}: the abandoned-work loop ran past {budget:?}"
        );
    }
    // A short loop (few kills) goes on without kills until enough keys were sent that some
    // of them lose their answer: each client holds one key in its pause when it stops.
    let enough = (3 * LOST_ANSWER_EVERY + CLIENTS).min(keys);
    while next.load(Ordering::Relaxed) < enough {
        assert!(
            began.elapsed() < budget,
            "{kind}: the abandoned-work loop ran past {budget:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let looped = began.elapsed();
    driver.stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let sent = next.load(Ordering::Relaxed).min(keys);

    // Nobody retries now: only the completers work. Every move that started must end.
    let settle_began = Instant::now();
    let ends = loop {
        let ends = ends(kind, store, db, sent).await;
        let unfinished: Vec<&String> = ends
            .iter()
            .filter(|(_, e)| matches!(e, End::Unfinished(_)))
            .map(|(k, _)| k)
            .collect();
        if unfinished.is_empty() {
            break ends;
        }
        assert!(
            settle_began.elapsed() < SETTLE,
            "{kind}: {} moves still unfinished {SETTLE:?} after the kills: {:?}",
            unfinished.len(),
            ends.iter()
                .filter(|(_, e)| matches!(e, End::Unfinished(_)))
                .take(10)
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let settled = settle_began.elapsed();

    // Once more, by hand: every completed move replays its stored answer.
    let mut replays = 0;
    for (i, (key, end)) in ends.iter().enumerate() {
        if let End::Completed(stored) = end {
            let mut rng = Rng(seed ^ 0xee ^ i as u64);
            let before = driver.replays();
            assert!(
                driver.send(i, &mut rng, false, false).await,
                "{kind}: {key}"
            );
            assert_eq!(
                driver.replays(),
                before + 1,
                "{kind}: {key}: a completed move replays"
            );
            let seen = driver.seen.lock().unwrap();
            assert_eq!(
                seen[&i].first.as_deref(),
                Some(&stored[..]),
                "{kind}: {key}: every answer is the stored one"
            );
            replays += 1;
        }
    }
    drop(services);

    let unexpected = driver.unexpected.lock().unwrap().clone();
    assert!(
        unexpected.is_empty(),
        "{kind}: unexpected answers: {unexpected:#?}"
    );
    let seen = std::mem::take(&mut *driver.seen.lock().unwrap());
    let figures = check_abandoned(kind, db, &ends, &seen).await;
    let st = &driver.stats;
    println!(
        "{kind}: abandoned work: {kills} kills in {looped:.1?}; {} requests ({} answered, {} in \
         progress, {} unavailable, {} connection errors); {sent} keys sent, {} started, {} never \
         reached a body; settled {settled:.1?} after the kills; {} completed ({} by a completer, \
         {} after a lost answer), {} parked, {} cut mid-body, {replays} replays; duplicates \
         found: 0; {:.1?} in all",
        st.requests.load(Ordering::Relaxed),
        st.answers.load(Ordering::Relaxed),
        st.in_progress.load(Ordering::Relaxed),
        st.unavailable.load(Ordering::Relaxed),
        st.connection_errors.load(Ordering::Relaxed),
        figures.started,
        sent - figures.started,
        figures.completed,
        figures.by_completer,
        figures.after_lost_answer,
        figures.parked,
        figures.cut,
        began.elapsed(),
    );
    assert!(
        figures.by_completer > 0 && figures.after_lost_answer > 0 && figures.cut > 0,
        "{kind}: the completers finished nothing that was lost or cut: the loop tested nothing"
    );
}

/// How a sent key ended, as its record says.
#[derive(Debug)]
enum End {
    /// No body ever ran for it: the request never reached the handler.
    NeverStarted,
    /// Completed, with the stored answer's body.
    Completed(Vec<u8>),
    Parked,
    /// Still in progress (or anything else): why.
    Unfinished(String),
}

/// The end of each of the first `sent` keys, read from the store and the run log.
async fn ends<S: Store>(kind: &str, store: &S, db: &Db, sent: usize) -> Vec<(String, End)> {
    let started: Vec<(String,)> = on_db!(db, pool => sqlx::query_as(
        "SELECT DISTINCT idem_key FROM runs WHERE idem_key LIKE 'abandon-%'",
    )
    .fetch_all(pool)
    .await
    .unwrap());
    let started: std::collections::HashSet<String> = started.into_iter().map(|(k,)| k).collect();
    let mut out = Vec::new();
    for i in 0..sent {
        let key = format!("abandon-{i:05}");
        let scope = format!("abandoned:{}", account(i));
        let record = store
            .lookup(&scope, &key)
            .await
            .unwrap_or_else(|e| panic!("{kind}: {key}: lookup: {e}"));
        let end = match record {
            None if !started.contains(&key) => End::NeverStarted,
            None => End::Unfinished("a body ran, but no record is left".into()),
            Some(r) => match r.state {
                RecordState::Completed => End::Completed(r.response.unwrap().body.to_vec()),
                RecordState::Parked => End::Parked,
                other => End::Unfinished(format!("{other:?}, fence {}", r.fence)),
            },
        };
        out.push((key, end));
    }
    out
}

struct AbandonedFigures {
    started: usize,
    completed: usize,
    by_completer: usize,
    after_lost_answer: usize,
    parked: usize,
    cut: usize,
}

/// Exactly once: no step moved twice; a completed move moved every step, and its answer, the
/// one every client got, names them; a key that never started moved nothing.
async fn check_abandoned(
    kind: &str,
    db: &Db,
    ends: &[(String, End)],
    seen: &HashMap<usize, Seen>,
) -> AbandonedFigures {
    let counts: Vec<(String, i64, i64)> = on_db!(db, pool => sqlx::query_as(
        "SELECT idem_key, step, count(*) FROM moves WHERE idem_key LIKE 'abandon-%' GROUP BY idem_key, step",
    )
    .fetch_all(pool)
    .await
    .unwrap());
    let doubled: Vec<_> = counts.iter().filter(|(_, _, n)| *n != 1).collect();
    assert!(
        doubled.is_empty(),
        "{kind}: money moved twice: {doubled:#?}"
    );
    let bodies: Vec<(String, i64)> = on_db!(db, pool => sqlx::query_as(
        "SELECT idem_key, count(DISTINCT fence) FROM runs WHERE idem_key LIKE 'abandon-%' GROUP BY idem_key",
    )
    .fetch_all(pool)
    .await
    .unwrap());
    let bodies: HashMap<String, i64> = bodies.into_iter().collect();
    let lost: Vec<(String,)> = on_db!(db, pool => sqlx::query_as(
        "SELECT DISTINCT idem_key FROM lost_answers WHERE idem_key LIKE 'abandon-%'",
    )
    .fetch_all(pool)
    .await
    .unwrap());
    let lost: std::collections::HashSet<String> = lost.into_iter().map(|(k,)| k).collect();
    let mut figures = AbandonedFigures {
        started: 0,
        completed: 0,
        by_completer: 0,
        after_lost_answer: 0,
        parked: 0,
        cut: 0,
    };
    for (i, (key, end)) in ends.iter().enumerate() {
        let moves = db.moves(key).await.unwrap();
        let s = seen.get(&i);
        match end {
            End::NeverStarted => {
                assert!(
                    moves.is_empty(),
                    "{kind}: {key} never started but moved {moves:?}"
                );
                continue;
            }
            End::Unfinished(why) => panic!("{kind}: {key} unfinished: {why}"),
            End::Parked => figures.parked += 1,
            End::Completed(stored) => {
                figures.completed += 1;
                let moved: Moved = serde_json::from_slice(stored).unwrap();
                assert_eq!(moved.key, *key);
                assert_eq!(
                    moved.moves, moves,
                    "{kind}: {key}: the answer names the moves made"
                );
                assert_eq!(
                    moves.len(),
                    STEPS as usize,
                    "{kind}: {key}: every step moved money"
                );
                if let Some(s) = s {
                    assert!(
                        s.mismatches.is_empty(),
                        "{kind}: {key} answered differently: {:#?}",
                        s.mismatches
                    );
                    assert!(
                        s.fresh <= 1,
                        "{kind}: {key} ran to completion {} times",
                        s.fresh
                    );
                }
                figures.by_completer += usize::from(moved.via == "completer");
                if lost.contains(key) {
                    figures.after_lost_answer += 1;
                } else if bodies.get(key).copied().unwrap_or(0) > 1 {
                    // An earlier body of this move died with its process.
                    figures.cut += 1;
                }
            }
        }
        figures.started += 1;
    }
    figures
}
