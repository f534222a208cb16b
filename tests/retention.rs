//! Records expire by default: the SQL stores purge expired records in the background with
//! nothing started by the user (SQLite, PostgreSQL in a schema of its own, MySQL in a database of
//! its own), the opt-out keeps them, the purge task ends with the last handle of its store and survives a failing
//! round; the memory store purges as it is used.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::{
    BeginOutcome, BeginRequest, ClaimRef, Fingerprint, ManualClock, MemoryStore, MySqlStore,
    PgStore, Policy, SqliteStore, Store, StoredResponse,
};

/// Leases and retention short enough for a test to outlive them.
const SHORT: Policy = Policy::DEFAULT
    .lease(Duration::from_millis(200))
    .retain(Duration::from_millis(300));

/// Claims and completes `n` keys under `prefix` with `policy`.
async fn write(store: &impl Store, prefix: &str, n: usize, policy: &Policy) {
    let fp = Fingerprint::of("a").unwrap();
    for i in 0..n {
        let key = format!("{prefix}-{i}");
        let req = BeginRequest {
            scope: "s",
            key: &key,
            fingerprint: &fp,
            policy,
            request: None,
        };
        let BeginOutcome::Claimed(c) = store.begin(req).await.unwrap() else {
            panic!("{key} was not claimed");
        };
        let claim = ClaimRef {
            scope: "s",
            key: &key,
            fence: c.fence,
        };
        store
            .complete(claim, &StoredResponse::ok(b"ok".to_vec()))
            .await
            .unwrap();
    }
}

/// Waits up to ten seconds for `count` to reach `want`; returns the last count.
async fn until<F, Fut>(want: i64, mut count: F) -> i64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = i64>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = count().await;
        if n == want || Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn sqlite_rows(pool: &sqlx::SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn pg_rows(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn mysql_rows(pool: &sqlx::MySqlPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A store purging every 100 ms by itself: what expired goes, the live record stays.
async fn purges_expired_records_by_itself<S, F, Fut>(store: &S, rows: F)
where
    S: Store,
    F: FnMut() -> Fut,
    Fut: Future<Output = i64>,
{
    write(store, "short", 50, &SHORT).await;
    write(store, "long", 1, &Policy::DEFAULT).await;
    let left = until(1, rows).await;
    assert_eq!(
        left, 1,
        "the expired records were purged, the live one kept"
    );
    assert!(store.lookup("s", "long-0").await.unwrap().is_some());
}

/// A store whose background purge is off (every 50 ms were it on): nothing goes until asked.
async fn without_background_purge_keeps_expired_records<S, F, Fut>(store: &S, mut rows: F)
where
    S: Store,
    F: FnMut() -> Fut,
    Fut: Future<Output = i64>,
{
    write(store, "short", 20, &SHORT).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(rows().await, 20, "nothing purged in the background");
    assert!(store.lookup("s", "short-0").await.unwrap().is_none());
    assert_eq!(store.purge_expired().await.unwrap(), 20);
}

/// Inserts `n` records whose retention ended a day ago, behind the store's back.
async fn sqlite_insert_expired(pool: &sqlx::SqlitePool, prefix: &str, n: i64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i + 1 < {n}) \
         INSERT INTO idem_records (scope, key, fingerprint, state, fence, lease_until, \
           expires_at, created_at, updated_at) \
         SELECT 'old', '{prefix}' || i, zeroblob(32), 'completed', 1, 0, \
           CAST(unixepoch('subsec') * 1000 AS INTEGER) - 86400000, 0, 0 FROM g"
    )))
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn sqlite_purges_expired_records_by_itself() {
    let file = common::SqliteFile::new();
    let store = SqliteStore::builder()
        .purge_every(Duration::from_millis(100))
        .connect(&file.url)
        .await
        .unwrap();
    purges_expired_records_by_itself(&store, || sqlite_rows(store.pool())).await;
}

#[tokio::test]
async fn sqlite_without_background_purge_keeps_expired_records() {
    let file = common::SqliteFile::new();
    let store = SqliteStore::builder()
        .purge_every(Duration::from_millis(50))
        .background_purge(false)
        .connect(&file.url)
        .await
        .unwrap();
    without_background_purge_keeps_expired_records(&store, || sqlite_rows(store.pool())).await;
}

#[tokio::test]
async fn a_zero_purge_interval_is_a_configuration_error() {
    let r = SqliteStore::builder()
        .purge_every(Duration::ZERO)
        .connect("sqlite::memory:")
        .await;
    assert!(matches!(r, Err(idem::Error::Config(_))), "{r:?}");
    // Off, the interval does not matter.
    SqliteStore::builder()
        .purge_every(Duration::ZERO)
        .background_purge(false)
        .connect("sqlite::memory:")
        .await
        .unwrap();
}

/// Clones share one purge task; it runs while any handle lives and ends with the last one.
#[tokio::test]
async fn the_purge_task_ends_with_the_last_handle() {
    let file = common::SqliteFile::new();
    let pool = sqlx::SqlitePool::connect(&format!("{}?mode=rwc", file.url))
        .await
        .unwrap();
    let store = SqliteStore::builder()
        .purge_every(Duration::from_millis(50))
        .build(pool.clone())
        .await
        .unwrap();
    let clone = store.clone();
    drop(store);
    sqlite_insert_expired(&pool, "a", 10).await;
    assert_eq!(
        until(0, || sqlite_rows(&pool)).await,
        0,
        "a clone alive: purged"
    );

    drop(clone);
    tokio::time::sleep(Duration::from_millis(100)).await;
    sqlite_insert_expired(&pool, "b", 10).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        sqlite_rows(&pool).await,
        10,
        "every handle dropped: the task is gone"
    );
}

/// A captured log, for a test that reads what the store said.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A round that fails (here, the table is gone) is logged, and the next rounds go on.
#[tokio::test]
async fn a_failing_purge_is_logged_and_the_next_one_runs() {
    let log = Log::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let log = log.clone();
            move || log.clone()
        })
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    // The test's runtime runs on this thread only, the purge task included.
    let _logging = tracing::subscriber::set_default(subscriber);

    let file = common::SqliteFile::new();
    let store = SqliteStore::builder()
        .purge_every(Duration::from_millis(50))
        .connect(&file.url)
        .await
        .unwrap();
    sqlx::query("DROP TABLE idem_records")
        .execute(store.pool())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log.text().contains("purging expired records failed") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let text = log.text();
    assert!(text.contains("purging expired records failed"), "{text}");
    assert!(
        text.contains("idem_records"),
        "the log names the table: {text}"
    );

    store.migrate().await.unwrap();
    sqlite_insert_expired(store.pool(), "after", 10).await;
    assert_eq!(
        until(0, || sqlite_rows(store.pool())).await,
        0,
        "purging resumed"
    );
}

#[tokio::test]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn postgres_purges_expired_records_by_itself() {
    let schema = common::PgSchema::create(&common::pg_url(), 4).await;
    let store = PgStore::builder()
        .purge_every(Duration::from_millis(100))
        .build(schema.pool.clone())
        .await
        .unwrap();
    purges_expired_records_by_itself(&store, || pg_rows(&schema.pool)).await;
}

#[tokio::test]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn postgres_without_background_purge_keeps_expired_records() {
    let schema = common::PgSchema::create(&common::pg_url(), 4).await;
    let store = PgStore::builder()
        .purge_every(Duration::from_millis(50))
        .background_purge(false)
        .build(schema.pool.clone())
        .await
        .unwrap();
    without_background_purge_keeps_expired_records(&store, || pg_rows(&schema.pool)).await;
}

#[tokio::test]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn mysql_purges_expired_records_by_itself() {
    let database = common::MyDatabase::create(&common::mysql_url(), 4).await;
    let store = MySqlStore::builder()
        .purge_every(Duration::from_millis(100))
        .build(database.pool.clone())
        .await
        .unwrap();
    purges_expired_records_by_itself(&store, || mysql_rows(&database.pool)).await;
}

#[tokio::test]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn mysql_without_background_purge_keeps_expired_records() {
    let database = common::MyDatabase::create(&common::mysql_url(), 4).await;
    let store = MySqlStore::builder()
        .purge_every(Duration::from_millis(50))
        .background_purge(false)
        .build(database.pool.clone())
        .await
        .unwrap();
    without_background_purge_keeps_expired_records(&store, || mysql_rows(&database.pool)).await;
}

/// MySQL deletes expired records 1,000 at a time (`DELETE … LIMIT`): a purge goes on until a
/// batch comes back short, and the live record stays.
#[tokio::test]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn mysql_purges_batch_after_batch() {
    let database = common::MyDatabase::create(&common::mysql_url(), 4).await;
    let store = MySqlStore::builder()
        .background_purge(false)
        .build(database.pool.clone())
        .await
        .unwrap();
    write(&store, "long", 1, &Policy::DEFAULT).await;
    // 2,500 records whose retention ended long ago, behind the store's back.
    for chunk in 0..5 {
        let rows: Vec<String> = (0..500)
            .map(|i| {
                format!("('old', 'old-{chunk}-{i}', REPEAT('a', 32), 'completed', 1, 0, 1, 0, 0)")
            })
            .collect();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO idem_records (scope, `key`, fingerprint, state, fence, lease_until, \
             expires_at, created_at, updated_at) VALUES {}",
            rows.join(", ")
        )))
        .execute(&database.pool)
        .await
        .unwrap();
    }
    assert_eq!(mysql_rows(&database.pool).await, 2_501);
    assert_eq!(store.purge_expired().await.unwrap(), 2_500);
    assert_eq!(mysql_rows(&database.pool).await, 1, "the live record stays");
    assert!(store.lookup("s", "long-0").await.unwrap().is_some());
}

/// The memory store purges as it is used: the first claim a minute after the last purge
/// removes every expired record, whichever shard it is in.
#[tokio::test]
async fn the_memory_store_purges_as_it_is_used() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    write(&store, "short", 500, &SHORT).await;
    write(&store, "long", 1, &Policy::DEFAULT).await;
    clock.advance(Duration::from_secs(30));
    write(&store, "next", 1, &Policy::DEFAULT).await;
    assert_eq!(store.len(), 502, "not a minute yet: nothing purged");
    clock.advance(Duration::from_secs(31));
    write(&store, "later", 1, &Policy::DEFAULT).await;
    assert_eq!(store.len(), 3, "the expired records left");
    assert_eq!(store.purge_expired().await.unwrap(), 0);
}
