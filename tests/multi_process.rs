//! Several OS processes race on the same keys, against one SQLite file, against PostgreSQL, MySQL
//! (MariaDB), and against Redis standalone and Redis Cluster: every key is claimed, and its side
//! effect done, exactly once.
//!
//! On SQLite, PostgreSQL and MySQL the race is at scale: 4 processes × 8 tasks each send every one of
//! 320 keys, 10,240 racing duplicate requests per store, and each key still runs once.
//!
//! A plain `main` (harness = false): the test starts copies of its own binary with `--worker`.

mod common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::{
    BeginOutcome, BeginRequest, ClaimRef, Fingerprint, Key, MySqlStore, PgStore, Policy,
    RedisStore, SqliteStore, Store, StoredResponse,
};

const PROCESSES: usize = 4;

/// How many keys, and how many tasks in each process send every key.
#[derive(Debug, Clone, Copy)]
struct Scale {
    keys: usize,
    tasks: usize,
}

impl Scale {
    /// SQLite and PostgreSQL: 4 × 8 × 320 = 10,240 racing duplicates.
    const SQL: Scale = Scale {
        keys: 320,
        tasks: 8,
    };
    /// Redis: one task per process.
    const REDIS: Scale = Scale { keys: 40, tasks: 1 };

    fn of(kind: &str) -> Scale {
        match kind {
            "sqlite" | "postgres" | "mysql" => Scale::SQL,
            _ => Scale::REDIS,
        }
    }

    /// Duplicate requests sent in all: every task of every process sends every key.
    fn requests(self) -> usize {
        PROCESSES * self.tasks * self.keys
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--worker") {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(worker(&args[2], &args[3], args[4].parse().unwrap()));
        use std::io::Write as _;
        std::io::stdout().flush().unwrap();
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let file = common::SqliteFile::new();
        let store = SqliteStore::connect(&file.url).await.unwrap();
        create_effects_sqlite(&store).await;
        race("sqlite", &file.url).await;
        let counts: Vec<(String, i64)> =
            sqlx::query_as("SELECT key, count(*) FROM effects GROUP BY key")
                .fetch_all(store.pool())
                .await
                .unwrap();
        check_effects("sqlite", counts);
        println!("test multi_process::sqlite_file ... ok");

        if cfg!(idem_postgres) {
            let url = common::pg_url();
            let schema = common::PgSchema::create(&url, 4).await;
            let store = PgStore::builder().build(schema.pool.clone()).await.unwrap();
            sqlx::query("CREATE TABLE effects (key text NOT NULL, pid bigint NOT NULL)")
                .execute(store.pool())
                .await
                .unwrap();
            let target = format!("{url}#{}", schema.name);
            race("postgres", &target).await;
            let counts: Vec<(String, i64)> =
                sqlx::query_as("SELECT key, count(*) FROM effects GROUP BY key")
                    .fetch_all(store.pool())
                    .await
                    .unwrap();
            check_effects("postgres", counts);
            println!("test multi_process::postgres ... ok");
        } else {
            println!(
                "test multi_process::postgres ... ignored, needs PostgreSQL: set DATABASE_URL=postgres://…"
            );
        }

        if cfg!(idem_mysql) {
            let db = common::MyDatabase::create(&common::mysql_url(), 4).await;
            let store = MySqlStore::builder().connect(&db.url).await.unwrap();
            sqlx::query("CREATE TABLE effects (`key` VARCHAR(64) NOT NULL, pid BIGINT NOT NULL)")
                .execute(store.pool())
                .await
                .unwrap();
            race("mysql", &db.url).await;
            let counts: Vec<(String, i64)> =
                sqlx::query_as("SELECT `key`, count(*) FROM effects GROUP BY `key`")
                    .fetch_all(store.pool())
                    .await
                    .unwrap();
            check_effects("mysql", counts);
            println!("test multi_process::mysql ... ok");
        } else {
            println!(
                "test multi_process::mysql ... ignored, needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
            );
        }

        if cfg!(idem_redis) {
            let url = common::redis_url();
            let keys = common::RedisKeys::new(std::slice::from_ref(&url));
            race("redis", &format!("{url}#{}", keys.prefix)).await;
            let mut conn = redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            check_effects("redis", redis_effects(&mut conn, &keys.prefix).await);
            println!("test multi_process::redis ... ok");
        } else {
            println!("test multi_process::redis ... ignored, needs Redis: set IDEM_REDIS_URL=redis://…");
        }

        if cfg!(idem_redis_cluster) {
            let nodes = common::redis_cluster();
            let keys = common::RedisKeys::new(&nodes);
            race(
                "redis-cluster",
                &format!("{}#{}", nodes.join(","), keys.prefix),
            )
            .await;
            let mut conn = redis::cluster::ClusterClient::new(nodes)
                .unwrap()
                .get_async_connection()
                .await
                .unwrap();
            check_effects(
                "redis-cluster",
                redis_effects(&mut conn, &keys.prefix).await,
            );
            println!("test multi_process::redis_cluster ... ok");
        } else {
            println!(
                "test multi_process::redis_cluster ... ignored, needs a Redis Cluster: set IDEM_REDIS_CLUSTER=redis://host:port,…"
            );
        }
    });
}

/// The side effects of a Redis race: one hash, a counter per key, next to the records.
fn effects_key(prefix: &str) -> String {
    format!("{prefix}effects")
}

async fn redis_effects<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    prefix: &str,
) -> Vec<(String, i64)> {
    redis::cmd("HGETALL")
        .arg(effects_key(prefix))
        .query_async(conn)
        .await
        .unwrap()
}

async fn redis_effect<C: redis::aio::ConnectionLike>(mut conn: C, prefix: &str, key: &str) {
    let _: i64 = redis::cmd("HINCRBY")
        .arg(effects_key(prefix))
        .arg(key)
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
}

async fn create_effects_sqlite(store: &SqliteStore) {
    sqlx::query("CREATE TABLE effects (key TEXT NOT NULL, pid INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
}

fn check_effects(what: &str, counts: Vec<(String, i64)>) {
    let keys = Scale::of(what).keys;
    assert_eq!(counts.len(), keys, "{what}: every key's effect happened");
    for (key, n) in counts {
        assert_eq!(n, 1, "{what}: the effect for {key} happened {n} times");
    }
}

/// Starts the workers at one instant and checks that each key was claimed by exactly one.
async fn race(kind: &str, target: &str) {
    let scale = Scale::of(kind);
    let started = std::time::Instant::now();
    let start_at =
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_millis(1500);
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .args(["--worker", kind, target, &start_at.as_millis().to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start a worker process")
        })
        .collect();
    let mut claims: HashMap<String, Vec<u32>> = HashMap::new();
    let (mut requests, mut calls, mut replays) = (0usize, 0usize, 0usize);
    for child in children {
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{kind}: a worker failed");
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            if let Some(key) = line.strip_prefix("CLAIMED ") {
                claims.entry(key.to_owned()).or_default().push(pid);
            } else if let Some(counts) = line.strip_prefix("COUNTS ") {
                let n: Vec<usize> = counts.split(' ').map(|n| n.parse().unwrap()).collect();
                requests += n[0];
                calls += n[1];
                replays += n[2];
            }
        }
    }
    assert_eq!(
        requests,
        scale.requests(),
        "{kind}: every task reported its requests"
    );
    assert_eq!(claims.len(), scale.keys, "{kind}: every key was claimed");
    for (key, by) in &claims {
        assert_eq!(by.len(), 1, "{kind}: {key} was claimed by {by:?}");
    }
    let executions: usize = claims.values().map(Vec::len).sum();
    let winners: std::collections::HashSet<_> = claims.values().flatten().collect();
    eprintln!(
        "{kind}: {requests} racing duplicate requests ({calls} begin calls, {replays} replays) \
         from {PROCESSES} processes × {} tasks on {} keys: {executions} executions, one per key, \
         won by {} of {PROCESSES} processes, in {:.1} s",
        scale.tasks,
        scale.keys,
        winners.len(),
        started.elapsed().as_secs_f64(),
    );
}

async fn worker(kind: &str, target: &str, start_at_ms: u128) {
    match kind {
        "sqlite" => {
            let store = SqliteStore::connect(target).await.unwrap();
            let pool = store.pool().clone();
            run(kind, &store, start_at_ms, |key| {
                let pool = pool.clone();
                async move {
                    sqlx::query("INSERT INTO effects (key, pid) VALUES ($1, $2)")
                        .bind(key)
                        .bind(i64::from(std::process::id()))
                        .execute(&pool)
                        .await
                        .unwrap();
                }
            })
            .await
        }
        "mysql" => {
            let store = MySqlStore::connect(target).await.unwrap();
            let pool = store.pool().clone();
            run(kind, &store, start_at_ms, |key| {
                let pool = pool.clone();
                async move {
                    sqlx::query("INSERT INTO effects (`key`, pid) VALUES (?, ?)")
                        .bind(key)
                        .bind(i64::from(std::process::id()))
                        .execute(&pool)
                        .await
                        .unwrap();
                }
            })
            .await
        }
        "redis" => {
            let (url, prefix) = target.split_once('#').unwrap();
            let store = RedisStore::builder()
                .prefix(prefix)
                .connect(url)
                .await
                .unwrap();
            let conn = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            run(kind, &store, start_at_ms, |key| {
                let conn = conn.clone();
                async move { redis_effect(conn, prefix, &key).await }
            })
            .await
        }
        "redis-cluster" => {
            let (nodes, prefix) = target.split_once('#').unwrap();
            let nodes: Vec<&str> = nodes.split(',').collect();
            let store = RedisStore::builder()
                .prefix(prefix)
                .connect_cluster(&nodes)
                .await
                .unwrap();
            let conn = redis::cluster::ClusterClient::new(nodes)
                .unwrap()
                .get_async_connection()
                .await
                .unwrap();
            run(kind, &store, start_at_ms, |key| {
                let conn = conn.clone();
                async move { redis_effect(conn, prefix, &key).await }
            })
            .await
        }
        _ => {
            let (url, schema) = target.split_once('#').unwrap();
            let pool = common::PgSchema::pool_for(url, schema, 8).await;
            let store = PgStore::builder().build(pool.clone()).await.unwrap();
            run(kind, &store, start_at_ms, |key| {
                let pool = pool.clone();
                async move {
                    sqlx::query("INSERT INTO effects (key, pid) VALUES ($1, $2)")
                        .bind(key)
                        .bind(i64::from(std::process::id()))
                        .execute(&pool)
                        .await
                        .unwrap();
                }
            })
            .await
        }
    }
}

async fn run<S, F, Fut>(kind: &str, store: &S, start_at_ms: u128, effect: F)
where
    S: Store,
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let scale = Scale::of(kind);
    // The tasks of one process run concurrently on the same store (and pool).
    let tasks = (0..scale.tasks).map(|_| send_every_key(store, start_at_ms, scale, &effect));
    let (mut requests, mut calls, mut replays) = (0, 0, 0);
    for (claimed, n, r) in futures_util::future::join_all(tasks).await {
        for key in claimed {
            println!("CLAIMED {key}");
        }
        requests += scale.keys;
        calls += n;
        replays += r;
    }
    println!("COUNTS {requests} {calls} {replays}");
}

/// One task's requests: every key in turn, at the same instant as every other task's; each
/// request retries until it has the answer. Returns the keys this task claimed, its begin calls
/// and its replays.
async fn send_every_key<S, F, Fut>(
    store: &S,
    start_at_ms: u128,
    scale: Scale,
    effect: &F,
) -> (Vec<String>, usize, usize)
where
    S: Store,
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let fp = Fingerprint::of("same request").unwrap();
    let policy = Policy::DEFAULT;
    let (mut claimed, mut calls, mut replays) = (Vec::new(), 0, 0);
    for i in 0..scale.keys {
        // Every task of every process goes for key i at the same instant, so each key is a
        // real race (a task that falls behind its slot goes at once, still racing the others).
        let slot = start_at_ms + 20 * i as u128;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
        if slot > now {
            tokio::time::sleep(Duration::from_millis((slot - now) as u64)).await;
        }
        let key = Key::parse(&format!("key-{i}")).unwrap();
        let req = BeginRequest {
            scope: "multi-process",
            key: key.as_str(),
            fingerprint: &fp,
            policy: &policy,
            request: None,
        };
        loop {
            calls += 1;
            match store.begin(req).await {
                Ok(BeginOutcome::Claimed(c)) => {
                    claimed.push(key.as_str().to_owned());
                    effect(key.as_str().to_owned()).await;
                    let claim = ClaimRef {
                        scope: req.scope,
                        key: key.as_str(),
                        fence: c.fence,
                    };
                    let done = StoredResponse::ok(b"done".to_vec());
                    // A completion that met a busy database is retried: once it is through,
                    // a repeat finds it done.
                    let mut tries = 0;
                    while let Err(e) = store.complete(claim, &done).await {
                        tries += 1;
                        assert!(
                            matches!(e, idem::Error::Unavailable(_)) && tries < 50,
                            "complete: {e}"
                        );
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    break;
                }
                Ok(BeginOutcome::Replay(r)) => {
                    assert_eq!(r.body, &b"done"[..]);
                    replays += 1;
                    break;
                }
                Ok(BeginOutcome::InProgress { .. }) => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Ok(BeginOutcome::KeyReused) => panic!("same fingerprint everywhere"),
                Ok(BeginOutcome::Parked) => panic!("nothing is parked here"),
                // A busy database (SQLite's lock across processes): retry, as a client would.
                Err(idem::Error::Unavailable(_)) => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Err(e) => panic!("begin: {e}"),
            }
        }
    }
    (claimed, calls, replays)
}
