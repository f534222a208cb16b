//! `#[idempotent(…, transaction = tx)]`: the claim, the body's SQL and the completion commit
//! together; a failure rolls all of them back. On SQLite and PostgreSQL.

mod common;

use idem::{Error, PgStore, SqliteStore, idempotent};

fn db(e: sqlx::Error) -> Error {
    Error::Store(e.into())
}

#[idempotent(scope = "order:<sku>", key = key, store = store, skip(fail), transaction = tx)]
async fn create_order_sqlite(
    store: &SqliteStore,
    sku: i64,
    key: &str,
    fail: bool,
) -> Result<i64, Error> {
    sqlx::query("INSERT INTO orders (sku) VALUES ($1)")
        .bind(sku)
        .execute(&mut **tx)
        .await
        .map_err(db)?;
    if fail {
        return Err(Error::Encode("forced failure after the insert".into()));
    }
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut **tx)
        .await
        .map_err(db)
}

#[idempotent(scope = "order:<sku>", key = key, store = store, skip(fail), transaction = tx)]
async fn create_order_pg(store: &PgStore, sku: i64, key: &str, fail: bool) -> Result<i64, Error> {
    sqlx::query("INSERT INTO orders (sku) VALUES ($1)")
        .bind(sku)
        .execute(&mut **tx)
        .await
        .map_err(db)?;
    if fail {
        return Err(Error::Encode("forced failure after the insert".into()));
    }
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut **tx)
        .await
        .map_err(db)
}

#[tokio::test]
async fn sqlite_commits_together_and_rolls_back_together() {
    let file = common::SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.unwrap();
    sqlx::query("CREATE TABLE orders (sku INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM orders")
            .fetch_one(store.pool())
            .await
            .unwrap()
    };

    // A forced failure after the insert: neither the row nor the record survive.
    assert!(create_order_sqlite(&store, 7, "k", true).await.is_err());
    assert_eq!(count().await, 0);
    assert!(
        idem::Store::lookup(&store, "order:7", "k")
            .await
            .unwrap()
            .is_none()
    );

    // The retry commits both; the replay changes nothing.
    assert_eq!(create_order_sqlite(&store, 7, "k", false).await.unwrap(), 1);
    assert_eq!(create_order_sqlite(&store, 7, "k", false).await.unwrap(), 1);
    assert_eq!(count().await, 1);
    assert!(
        idem::Store::lookup(&store, "order:7", "k")
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_concurrent_duplicates_insert_once() {
    let file = common::SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.unwrap();
    sqlx::query("CREATE TABLE orders (sku INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            create_order_sqlite(&store, 1, "dup", false).await
        }));
    }
    for t in tasks {
        assert_eq!(
            t.await.unwrap().unwrap(),
            1,
            "every duplicate gets the first answer"
        );
    }
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
#[tokio::test]
async fn postgres_commits_together_and_rolls_back_together() {
    let url = common::pg_url();
    let schema = common::PgSchema::create(&url, 8).await;
    let store = PgStore::builder().build(schema.pool.clone()).await.unwrap();
    sqlx::query("CREATE TABLE orders (sku bigint NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM orders")
            .fetch_one(store.pool())
            .await
            .unwrap()
    };
    assert!(create_order_pg(&store, 7, "k", true).await.is_err());
    assert_eq!(count().await, 0);
    assert!(
        idem::Store::lookup(&store, "order:7", "k")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(create_order_pg(&store, 7, "k", false).await.unwrap(), 1);
    assert_eq!(create_order_pg(&store, 7, "k", false).await.unwrap(), 1);
    assert_eq!(count().await, 1);
}

#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_concurrent_duplicates_wait_and_replay() {
    let url = common::pg_url();
    let schema = common::PgSchema::create(&url, 40).await;
    let store = PgStore::builder().build(schema.pool.clone()).await.unwrap();
    sqlx::query("CREATE TABLE orders (sku bigint NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            create_order_pg(&store, 1, "dup", false).await
        }));
    }
    for t in tasks {
        assert_eq!(
            t.await.unwrap().unwrap(),
            1,
            "every duplicate gets the first answer"
        );
    }
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
}

// ---- cancellation: a dropped call rolls back its claim and its SQL -------------------------------

#[idempotent(scope = "order:<sku>", key = key, store = store, skip(hang), transaction = tx)]
async fn hanging_order_sqlite(
    store: &SqliteStore,
    sku: i64,
    key: &str,
    hang: bool,
) -> Result<i64, Error> {
    sqlx::query("INSERT INTO orders (sku) VALUES ($1)")
        .bind(sku)
        .execute(&mut **tx)
        .await
        .map_err(db)?;
    if hang {
        std::future::pending::<()>().await;
    }
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut **tx)
        .await
        .map_err(db)
}

#[idempotent(scope = "order:<sku>", key = key, store = store, skip(hang), transaction = tx)]
async fn hanging_order_pg(store: &PgStore, sku: i64, key: &str, hang: bool) -> Result<i64, Error> {
    sqlx::query("INSERT INTO orders (sku) VALUES ($1)")
        .bind(sku)
        .execute(&mut **tx)
        .await
        .map_err(db)?;
    if hang {
        std::future::pending::<()>().await;
    }
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut **tx)
        .await
        .map_err(db)
}

/// Runs `call` for 300 ms, then drops it mid-body, as a client timeout or a shutdown does.
async fn cancel_mid_body<F: std::future::Future>(call: F) {
    let cut = tokio::time::timeout(std::time::Duration::from_millis(300), call).await;
    assert!(
        cut.is_err(),
        "the call was still running when it was dropped"
    );
}

/// The retry after a cancelled call neither waits out a lease nor finds the cancelled row.
const PROMPT: std::time::Duration = std::time::Duration::from_secs(5);

#[tokio::test]
async fn sqlite_a_cancelled_call_leaves_nothing_behind() {
    let file = common::SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.unwrap();
    sqlx::query("CREATE TABLE orders (sku INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    cancel_mid_body(hanging_order_sqlite(&store, 3, "k", true)).await;
    let retry = tokio::time::timeout(PROMPT, hanging_order_sqlite(&store, 3, "k", false)).await;
    assert_eq!(
        retry
            .expect("the retry is not blocked by the dropped call")
            .unwrap(),
        1,
        "only the retry's row"
    );
}

#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
#[tokio::test]
async fn postgres_a_cancelled_call_leaves_nothing_behind() {
    let url = common::pg_url();
    let schema = common::PgSchema::create(&url, 4).await;
    let store = PgStore::builder().build(schema.pool.clone()).await.unwrap();
    sqlx::query("CREATE TABLE orders (sku bigint NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    cancel_mid_body(hanging_order_pg(&store, 3, "k", true)).await;
    let retry = tokio::time::timeout(PROMPT, hanging_order_pg(&store, 3, "k", false)).await;
    assert_eq!(
        retry
            .expect("the retry is not blocked by the dropped call")
            .unwrap(),
        1,
        "only the retry's row"
    );
}
