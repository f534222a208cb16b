//! Several OS processes race on the same keys, against one SQLite file, against PostgreSQL, and
//! against Redis standalone and Redis Cluster: every key is claimed, and its side effect done,
//! exactly once.
//!
//! A plain `main` (harness = false): the test starts copies of its own binary with `--worker`.

mod common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::{
    BeginOutcome, BeginRequest, ClaimRef, Fingerprint, Key, PgStore, Policy, RedisStore,
    SqliteStore, Store, StoredResponse,
};

const PROCESSES: usize = 4;
const KEYS: usize = 40;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--worker") {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(worker(&args[2], &args[3], args[4].parse().unwrap()));
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
    assert_eq!(counts.len(), KEYS, "{what}: every key's effect happened");
    for (key, n) in counts {
        assert_eq!(n, 1, "{what}: the effect for {key} happened {n} times");
    }
}

/// Starts the workers at one instant and checks that each key was claimed by exactly one.
async fn race(kind: &str, target: &str) {
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
    let mut pids = Vec::new();
    for child in children {
        pids.push(child.id());
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{kind}: a worker failed");
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            if let Some(key) = line.strip_prefix("CLAIMED ") {
                claims
                    .entry(key.to_owned())
                    .or_default()
                    .push(pids[pids.len() - 1]);
            }
        }
    }
    assert_eq!(claims.len(), KEYS, "{kind}: every key was claimed");
    for (key, by) in &claims {
        assert_eq!(by.len(), 1, "{kind}: {key} was claimed by {by:?}");
    }
    let winners: std::collections::HashSet<_> = claims.values().flatten().collect();
    eprintln!(
        "{kind}: {KEYS} keys, one claim each, won by {} of {PROCESSES} processes",
        winners.len()
    );
}

async fn worker(kind: &str, target: &str, start_at_ms: u128) {
    match kind {
        "sqlite" => {
            let store = SqliteStore::connect(target).await.unwrap();
            let pool = store.pool().clone();
            run(&store, start_at_ms, |key| {
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
            run(&store, start_at_ms, |key| {
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
            run(&store, start_at_ms, |key| {
                let conn = conn.clone();
                async move { redis_effect(conn, prefix, &key).await }
            })
            .await
        }
        _ => {
            let (url, schema) = target.split_once('#').unwrap();
            let pool = common::PgSchema::pool_for(url, schema, 8).await;
            let store = PgStore::builder().build(pool.clone()).await.unwrap();
            run(&store, start_at_ms, |key| {
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

async fn run<S, F, Fut>(store: &S, start_at_ms: u128, effect: F)
where
    S: Store + Clone,
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let fp = Fingerprint::of("same request").unwrap();
    let policy = Policy::DEFAULT;
    for i in 0..KEYS {
        // Every process goes for key i at the same instant, so each key is a real race.
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
        };
        loop {
            match store.begin(req).await.unwrap() {
                BeginOutcome::Claimed(c) => {
                    println!("CLAIMED {}", key.as_str());
                    effect(key.as_str().to_owned()).await;
                    let claim = ClaimRef {
                        scope: req.scope,
                        key: key.as_str(),
                        fence: c.fence,
                    };
                    store
                        .complete(claim, &StoredResponse::ok(b"done".to_vec()))
                        .await
                        .unwrap();
                    break;
                }
                BeginOutcome::Replay(r) => {
                    assert_eq!(r.body, &b"done"[..]);
                    break;
                }
                BeginOutcome::InProgress { .. } => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                BeginOutcome::KeyReused => panic!("same fingerprint everywhere"),
            }
        }
    }
}
