//! `#[idempotent(…, transaction = tx)]`: the claim, the body's SQL and the completion commit
//! together; a failure rolls all of them back, and so does a dropped call. Each case is written
//! once over a [`Backend`] and runs on SQLite (`sqlite::…`) and PostgreSQL (`postgres::…`).

mod common;

use std::future::Future;
use std::time::Duration;

use idem::{Error, PgStore, SqliteStore, TxStore, idempotent};

/// The transaction a guarded body gets on `S`.
type Tx<S> = sqlx::Transaction<'static, <S as TxStore>::Database>;

/// A database the cases run on: a store of its own with an empty `orders` table, and the
/// body's statements on it.
trait Backend: TxStore + Clone + Send + Sync + 'static {
    /// What must live as long as the case: the database file, the schema.
    type Guard;

    /// A store on a pool of at most `connections`, with an empty `orders` table.
    fn fresh(connections: u32) -> impl Future<Output = (Self, Self::Guard)> + Send;

    /// Inserts an order for `sku` in `tx`; the number of orders `tx` then sees.
    fn insert_order(tx: &mut Tx<Self>, sku: i64)
    -> impl Future<Output = Result<i64, Error>> + Send;

    /// The number of committed orders.
    fn committed_orders(&self) -> impl Future<Output = i64> + Send;
}

/// The `orders` table in each database's types.
const ORDERS_SQLITE: &str = "CREATE TABLE orders (sku INTEGER NOT NULL)";
const ORDERS_PG: &str = "CREATE TABLE orders (sku bigint NOT NULL)";

async fn sqlite_store(_connections: u32) -> (SqliteStore, common::SqliteFile) {
    let file = common::SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.unwrap();
    (store, file)
}

async fn pg_store(connections: u32) -> (PgStore, common::PgSchema) {
    let schema = common::PgSchema::create(&common::pg_url(), connections).await;
    let store = PgStore::builder().build(schema.pool.clone()).await.unwrap();
    (store, schema)
}

/// [`Backend`] for stores whose statements are the same text: only the connection type differs.
macro_rules! backend {
    ($($store:ty: $guard:ty = $fresh:ident, $orders:ident;)*) => {$(
        impl Backend for $store {
            type Guard = $guard;

            async fn fresh(connections: u32) -> (Self, $guard) {
                let (store, guard) = $fresh(connections).await;
                sqlx::query($orders).execute(store.pool()).await.unwrap();
                (store, guard)
            }

            async fn insert_order(tx: &mut Tx<Self>, sku: i64) -> Result<i64, Error> {
                sqlx::query("INSERT INTO orders (sku) VALUES ($1)")
                    .bind(sku)
                    .execute(&mut **tx)
                    .await
                    .map_err(db)?;
                sqlx::query_scalar("SELECT count(*) FROM orders")
                    .fetch_one(&mut **tx)
                    .await
                    .map_err(db)
            }

            async fn committed_orders(&self) -> i64 {
                sqlx::query_scalar("SELECT count(*) FROM orders")
                    .fetch_one(self.pool())
                    .await
                    .unwrap()
            }
        }
    )*};
}

backend! {
    SqliteStore: common::SqliteFile = sqlite_store, ORDERS_SQLITE;
    PgStore: common::PgSchema = pg_store, ORDERS_PG;
}

fn db(e: sqlx::Error) -> Error {
    Error::Store(e.into())
}

/// What the body does after its insert.
#[derive(Clone, Copy)]
enum Then {
    /// Counts the orders and returns.
    Commit,
    /// Fails.
    Fail,
    /// Never finishes, until the call is dropped.
    Hang,
}

#[idempotent(scope = "order:<sku>", key = key, store = store, skip(then), transaction = tx)]
async fn create_order<S: Backend>(
    store: &S,
    sku: i64,
    key: &str,
    then: Then,
) -> Result<i64, Error> {
    let orders = S::insert_order(tx, sku).await?;
    match then {
        Then::Commit => Ok(orders),
        Then::Fail => Err(Error::Encode("forced failure after the insert".into())),
        Then::Hang => std::future::pending().await,
    }
}

async fn commits_together_and_rolls_back_together<S: Backend>() {
    let (store, _guard) = S::fresh(8).await;

    // A forced failure after the insert: neither the row nor the record survive.
    assert!(create_order(&store, 7, "k", Then::Fail).await.is_err());
    assert_eq!(store.committed_orders().await, 0);
    assert!(store.lookup("order:7", "k").await.unwrap().is_none());

    // The retry commits both; the replay changes nothing.
    assert_eq!(create_order(&store, 7, "k", Then::Commit).await.unwrap(), 1);
    assert_eq!(create_order(&store, 7, "k", Then::Commit).await.unwrap(), 1);
    assert_eq!(store.committed_orders().await, 1);
    assert!(store.lookup("order:7", "k").await.unwrap().is_some());
}

/// Duplicates racing on one key: one inserts, the others wait for its commit and replay it.
async fn concurrent_duplicates_insert_once<S: Backend>() {
    let (store, _guard) = S::fresh(40).await;
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            create_order(&store, 1, "dup", Then::Commit).await
        }));
    }
    for t in tasks {
        assert_eq!(
            t.await.unwrap().unwrap(),
            1,
            "every duplicate gets the first answer"
        );
    }
    assert_eq!(store.committed_orders().await, 1);
}

/// A call dropped mid-body (a client timeout, a shutdown) rolls back its claim and its SQL: the
/// retry neither waits out a lease nor finds the dropped call's row.
async fn a_cancelled_call_leaves_nothing_behind<S: Backend>() {
    let (store, _guard) = S::fresh(4).await;
    let cut = tokio::time::timeout(
        Duration::from_millis(300),
        create_order(&store, 3, "k", Then::Hang),
    )
    .await;
    assert!(
        cut.is_err(),
        "the call was still running when it was dropped"
    );
    let retry = tokio::time::timeout(
        Duration::from_secs(5),
        create_order(&store, 3, "k", Then::Commit),
    )
    .await;
    assert_eq!(
        retry
            .expect("the retry is not blocked by the dropped call")
            .unwrap(),
        1,
        "only the retry's row"
    );
}

mod sqlite {
    crate::backend_tests!(
        idem::SqliteStore:
        commits_together_and_rolls_back_together,
        concurrent_duplicates_insert_once(flavor = "multi_thread", worker_threads = 4),
        a_cancelled_call_leaves_nothing_behind,
    );
}

mod postgres {
    crate::backend_tests!(
        #[cfg_attr(
            not(idem_postgres),
            ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
        )]
        idem::PgStore:
        commits_together_and_rolls_back_together,
        concurrent_duplicates_insert_once(flavor = "multi_thread", worker_threads = 4),
        a_cancelled_call_leaves_nothing_behind,
    );
}
