//! How the guard's cost grows with the records table and how live traffic fares while the purge
//! runs, on PostgreSQL, SQLite and MySQL.
//!
//! ```text
//! cargo run --release -p idem-tests --example scale -- --store postgres|sqlite|mysql growth [--sizes 100000,1000000,10000000] [--samples N]
//! cargo run --release -p idem-tests --example scale -- --store postgres|sqlite|mysql purge [--expired 1000000] [--concurrency C]
//! ```
//!
//! `growth` fills the store's table with completed records (random keys, as real keys are) up to
//! each size in turn and, at each size, makes `--samples` guarded calls on new keys one after
//! another (claim + complete: the body itself does no I/O) and as many replays of them in
//! another order, and prints their p50 and p99 latency:
//!
//! ```text
//! GROWTH store=postgres records=100000 op=claim_complete samples=3000 p50_us=… p99_us=… mean_us=…
//! GROWTH store=postgres records=100000 op=replay samples=3000 p50_us=… p99_us=… mean_us=…
//! ```
//!
//! `purge` fills the table with `--expired` records whose retention has ended, runs live traffic
//! (`--concurrency` tasks of guarded calls on new keys) for a while alone, then again while
//! `purge_expired` deletes them, and prints both windows:
//!
//! ```text
//! PURGE store=postgres expired=1000000 deleted=1000000 purge_ms=… concurrency=8 before_p50_us=… before_p99_us=… during_p50_us=… during_p99_us=… during_ops=…
//! ```
//!
//! PostgreSQL needs `DATABASE_URL`; the run works in a schema of its own and drops it. MySQL
//! needs `IDEM_MYSQL_URL` (MariaDB here); the run works in a database of its own and drops it.
//! SQLite works in a file in a temporary directory.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem::{Error, idempotent};
use serde::{Deserialize, Serialize};

#[path = "support/cli.rs"]
mod cli;
#[path = "support/my_database.rs"]
mod my_database;
#[path = "support/pg_schema.rs"]
mod pg_schema;
use my_database::RunDatabase;
use pg_schema::RunSchema;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Answer {
    key: String,
    amount: i64,
}

/// The guarded call: claim, a body that does no I/O, complete.
#[idempotent(scope = "scale", key = key, store = store)]
async fn guarded<S: idem::Store + Clone>(
    store: &S,
    key: &str,
    amount: i64,
) -> Result<Answer, Error> {
    Ok(Answer {
        key: key.to_owned(),
        amount,
    })
}

/// The columns a prefilled record sets; the rest keep their defaults.
const FILL_COLUMNS: &str = "scope, key, fingerprint, state, fence, lease_until, expires_at, \
                            attempt, response_status, response_error, response_body, created_at, \
                            updated_at";

/// How many records one prefill statement writes.
const FILL_BATCH: u64 = 250_000;

/// How many on MySQL, whose statement numbers its rows from tables of digits.
const MYSQL_FILL_BATCH: u64 = 100_000;

#[derive(Clone)]
enum Target {
    Postgres(idem::PgStore),
    Sqlite(idem::SqliteStore),
    Mysql(idem::MySqlStore),
}

impl Target {
    async fn call(&self, key: &str, amount: i64) -> Result<Answer, Error> {
        match self {
            Target::Postgres(s) => guarded(s, key, amount).await,
            Target::Sqlite(s) => guarded(s, key, amount).await,
            Target::Mysql(s) => guarded(s, key, amount).await,
        }
    }

    async fn purge(&self) -> Result<u64, Error> {
        use idem::Store;
        match self {
            Target::Postgres(s) => s.purge_expired().await,
            Target::Sqlite(s) => s.purge_expired().await,
            Target::Mysql(s) => s.purge_expired().await,
        }
    }

    /// Adds records `from..to` (by number): completed, with random keys, whose retention ends a
    /// day from now, or ended a day ago when `expired`.
    async fn fill(&self, from: u64, to: u64, expired: bool) -> Result<(), sqlx::Error> {
        let mut at = from;
        while at < to {
            let end = (at + FILL_BATCH).min(to);
            match self {
                Target::Postgres(s) => {
                    let expires = if expired {
                        "now() - interval '1 day'"
                    } else {
                        "now() + interval '1 day'"
                    };
                    let sql = format!(
                        "INSERT INTO idem_records ({FILL_COLUMNS}) \
                         SELECT 'scale', md5(random()::text || g::text), \
                                sha256(g::text::bytea), 'completed', 1, now(), {expires}, 1, \
                                NULL, false, '\\x7b7d'::bytea, now(), now() \
                         FROM generate_series($1::int8, $2::int8 - 1) g"
                    );
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .bind(at as i64)
                        .bind(end as i64)
                        .execute(s.pool())
                        .await?;
                }
                Target::Sqlite(s) => {
                    let now = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
                    let expires = if expired {
                        format!("{now} - 86400000")
                    } else {
                        format!("{now} + 86400000")
                    };
                    let sql = format!(
                        "WITH RECURSIVE g(i) AS (SELECT $1 UNION ALL SELECT i + 1 FROM g WHERE i + 1 < $2) \
                         INSERT INTO idem_records ({FILL_COLUMNS}) \
                         SELECT 'scale', lower(hex(randomblob(16))), randomblob(32), 'completed', 1, \
                                {now}, {expires}, 1, NULL, 0, X'7b7d', {now}, {now} FROM g"
                    );
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .bind(at as i64)
                        .bind(end as i64)
                        .execute(s.pool())
                        .await?;
                }
                Target::Mysql(s) => {
                    // The server's clock in UTC milliseconds, as the store reads it; numbers
                    // from five tables of digits (100,000 a statement), no recursion limit.
                    let now = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', \
                               UTC_TIMESTAMP(6)) DIV 1000)";
                    let expires = if expired {
                        format!("{now} - 86400000")
                    } else {
                        format!("{now} + 86400000")
                    };
                    let digits = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL \
                                  SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL \
                                  SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL \
                                  SELECT 9)";
                    let end = (at + MYSQL_FILL_BATCH).min(to);
                    let sql = format!(
                        "INSERT INTO idem_records ({}) \
                         SELECT 'scale', MD5(CONCAT(RAND(), '-', ? + n)), \
                                UNHEX(SHA2(? + n, 256)), 'completed', 1, {now}, {expires}, 1, \
                                NULL, FALSE, X'7b7d', {now}, {now} \
                         FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n \
                               FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f) g \
                         WHERE n < ?",
                        FILL_COLUMNS.replace(" key,", " `key`,")
                    );
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .bind(at as i64)
                        .bind(at as i64)
                        .bind((end - at) as i64)
                        .execute(s.pool())
                        .await?;
                    at = end;
                    continue;
                }
            }
            at = end;
        }
        match self {
            Target::Postgres(s) => {
                sqlx::query("VACUUM ANALYZE idem_records")
                    .execute(s.pool())
                    .await?;
            }
            Target::Sqlite(s) => {
                sqlx::query("ANALYZE").execute(s.pool()).await?;
            }
            Target::Mysql(s) => {
                sqlx::query("ANALYZE TABLE idem_records")
                    .execute(s.pool())
                    .await?;
            }
        }
        Ok(())
    }

    async fn count(&self) -> Result<i64, sqlx::Error> {
        let q = "SELECT count(*) FROM idem_records";
        match self {
            Target::Postgres(s) => sqlx::query_scalar(q).fetch_one(s.pool()).await,
            Target::Sqlite(s) => sqlx::query_scalar(q).fetch_one(s.pool()).await,
            Target::Mysql(s) => sqlx::query_scalar(q).fetch_one(s.pool()).await,
        }
    }
}

/// A small deterministic generator for keys and orders (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn key(&mut self) -> String {
        format!("{:016x}{:016x}", self.next(), self.next())
    }
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn summary(mut lat: Vec<u32>) -> (usize, u32, u32, f64) {
    lat.sort_unstable();
    let mean = lat.iter().map(|&x| f64::from(x)).sum::<f64>() / lat.len().max(1) as f64;
    (
        lat.len(),
        percentile(&lat, 0.50),
        percentile(&lat, 0.99),
        mean,
    )
}

struct Args {
    store: String,
    mode: String,
    sizes: Vec<u64>,
    samples: usize,
    expired: u64,
    concurrency: usize,
}

const USAGE: &str = "\
usage: scale --store postgres|sqlite|mysql growth [--sizes 100000,1000000,10000000] [--samples N]
       scale --store postgres|sqlite|mysql purge [--expired 1000000] [--concurrency C]
(what each mode measures: the header of benches/programs/scale.rs)";

fn args() -> Args {
    let mut a = Args {
        store: "sqlite".into(),
        mode: "growth".into(),
        sizes: vec![100_000, 1_000_000, 10_000_000],
        samples: 3_000,
        expired: 1_000_000,
        concurrency: 8,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            cli::usage(USAGE, None);
        }
        if !flag.starts_with("--") {
            a.mode = flag;
            continue;
        }
        let value = cli::value(&mut it, &flag, USAGE);
        match flag.as_str() {
            "--store" => a.store = value,
            "--sizes" => {
                a.sizes = value
                    .split(',')
                    .map(|s| s.parse().expect("--sizes N,N,…"))
                    .collect();
                a.sizes.sort_unstable();
            }
            "--samples" => a.samples = value.parse().expect("--samples N"),
            "--expired" => a.expired = value.parse().expect("--expired N"),
            "--concurrency" => a.concurrency = value.parse().expect("--concurrency C"),
            other => cli::usage(USAGE, Some(&format!("unknown flag {other}"))),
        }
    }
    a
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args();
    let _dir;
    let mut pg_cleanup = None;
    let mut mysql_cleanup: Option<RunDatabase> = None;
    let target = match a.store.as_str() {
        "postgres" => {
            let url =
                std::env::var("DATABASE_URL").map_err(|_| "--store postgres needs DATABASE_URL")?;
            let schema = RunSchema::create(&url, "idem_scale").await?;
            let options = schema.connect_options(&url)?;
            pg_cleanup = Some(schema);
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(a.concurrency.max(2) as u32 + 1)
                .connect_with(options)
                .await?;
            // The run times its own purges: no background purge in between.
            Target::Postgres(
                idem::PgStore::builder()
                    .background_purge(false)
                    .build(pool)
                    .await?,
            )
        }
        "sqlite" => {
            let dir = tempfile::tempdir()?;
            let url = format!("sqlite://{}", dir.path().join("scale.db").display());
            _dir = dir;
            Target::Sqlite(
                idem::SqliteStore::builder()
                    .background_purge(false)
                    .connect(&url)
                    .await?,
            )
        }
        "mysql" => {
            let url = std::env::var("IDEM_MYSQL_URL")
                .map_err(|_| "--store mysql needs IDEM_MYSQL_URL")?;
            // A database of the run's own, on the server the URL names.
            let database = RunDatabase::create(&url, "idem_scale").await?;
            let store = idem::MySqlStore::builder()
                .background_purge(false)
                .connect(&database.url())
                .await;
            match store {
                Ok(store) => {
                    mysql_cleanup = Some(database);
                    Target::Mysql(store)
                }
                Err(e) => {
                    database.drop().await?;
                    return Err(e.into());
                }
            }
        }
        other => {
            return Err(format!("unknown store {other}: postgres, sqlite or mysql").into());
        }
    };

    let result = match a.mode.as_str() {
        "growth" => growth(&a, &target).await,
        "purge" => purge(&a, &target).await,
        other => Err(format!("unknown mode {other}: growth or purge").into()),
    };

    if let Some(schema) = pg_cleanup {
        schema.drop().await?;
    }
    if let Some(database) = mysql_cleanup {
        database.drop().await?;
    }
    result
}

async fn growth(a: &Args, target: &Target) -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = Rng(0x1de3);
    let mut filled = 0u64;
    for &size in &a.sizes {
        let t = Instant::now();
        target.fill(filled, size, false).await?;
        filled = size;
        eprintln!(
            "filled to {size} records in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        // A short warm-up, then the samples.
        for _ in 0..200 {
            target.call(&rng.key(), 1).await?;
        }
        let keys: Vec<String> = (0..a.samples).map(|_| rng.key()).collect();
        let mut lat = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let t = Instant::now();
            target.call(key, i as i64).await?;
            lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        }
        report(a, size, "claim_complete", lat);
        // Replays in another order than the claims.
        let mut order: Vec<usize> = (0..keys.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        let mut lat = Vec::with_capacity(keys.len());
        for i in order {
            let t = Instant::now();
            let answer = target.call(&keys[i], i as i64).await?;
            lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            assert_eq!(answer.amount, i as i64, "a replay answers the first call");
        }
        report(a, size, "replay", lat);
        filled += 200 + a.samples as u64;
    }
    let rows = target.count().await?;
    eprintln!("{rows} records in the table at the end");
    Ok(())
}

fn report(a: &Args, size: u64, op: &str, lat: Vec<u32>) {
    let (n, p50, p99, mean) = summary(lat);
    println!(
        "GROWTH store={} records={size} op={op} samples={n} p50_us={p50} p99_us={p99} mean_us={mean:.0}",
        a.store
    );
}

/// Live traffic: `concurrency` tasks of guarded calls on new keys until `stop` is set.
async fn traffic(
    target: &Target,
    concurrency: usize,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> Vec<u32> {
    let counter = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let (target, stop, counter) = (target.clone(), stop.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(seed ^ (t as u64) << 32);
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                target
                    .call(&rng.key(), n as i64)
                    .await
                    .unwrap_or_else(|e| panic!("live traffic: {e}"));
                lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("a traffic task"));
    }
    all
}

async fn purge(a: &Args, target: &Target) -> Result<(), Box<dyn std::error::Error>> {
    let t = Instant::now();
    target.fill(0, a.expired, true).await?;
    eprintln!(
        "filled {} expired records in {:.1} s",
        a.expired,
        t.elapsed().as_secs_f64()
    );

    // Live traffic alone, as long as the purge is expected to take (at least 5 s).
    let stop = Arc::new(AtomicBool::new(false));
    let live = tokio::spawn(traffic_owned(
        target.clone(),
        a.concurrency,
        stop.clone(),
        1,
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    let before = summary(live.await?);

    // Live traffic again, while the purge runs.
    let stop = Arc::new(AtomicBool::new(false));
    let live = tokio::spawn(traffic_owned(
        target.clone(),
        a.concurrency,
        stop.clone(),
        2,
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let deleted = target.purge().await?;
    let purge_ms = t.elapsed().as_millis();
    stop.store(true, Ordering::Relaxed);
    let during = summary(live.await?);
    if deleted != a.expired {
        return Err(format!("the purge deleted {deleted} records, not {}", a.expired).into());
    }
    println!(
        "PURGE store={} expired={} deleted={deleted} purge_ms={purge_ms} concurrency={} \
         before_p50_us={} before_p99_us={} during_p50_us={} during_p99_us={} during_ops={}",
        a.store, a.expired, a.concurrency, before.1, before.2, during.1, during.2, during.0
    );
    Ok(())
}

async fn traffic_owned(
    target: Target,
    concurrency: usize,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> Vec<u32> {
    traffic(&target, concurrency, stop, seed).await
}
