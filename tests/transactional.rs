//! `#[idempotent(…, transaction = tx)]`: the claim, the body's SQL and the completion commit
//! together; a failure rolls all of them back, and so does a dropped call. Each case is written
//! once over a [`Backend`] and runs on SQLite (`sqlite::…`), PostgreSQL (`postgres::…`) and
//! MySQL (`mysql::…`).

mod common;

use std::future::Future;
use std::time::Duration;

use idem::{Error, MySqlStore, PgStore, SqliteStore, TxStore, idempotent};

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

    /// Whether a duplicate may be answered "in progress" rather than wait for the first
    /// transaction (PostgreSQL and MySQL bound the wait and the number of waiting duplicates;
    /// SQLite's one writer serialises them).
    const BOUNDS_WAITING_DUPLICATES: bool;
}

/// A database whose transactional duplicates wait within a bound.
trait Bounded: Backend {
    /// A store on a pool of `connections` whose duplicates wait `wait`, with an empty `orders`
    /// table.
    fn waiting(
        connections: u32,
        wait: Duration,
    ) -> impl Future<Output = (Self, Self::Guard)> + Send;

    /// Sets how long `tx`'s statements wait for a lock, in whole seconds, as a caller would.
    fn set_lock_wait(tx: &mut Tx<Self>, seconds: u32) -> impl Future<Output = ()> + Send;

    /// How long `tx`'s statements wait for a lock, in whole seconds.
    fn lock_wait(tx: &mut Tx<Self>) -> impl Future<Output = u32> + Send;
}

/// The `orders` table in each database's types.
const ORDERS_SQLITE: &str = "CREATE TABLE orders (sku INTEGER NOT NULL)";
const ORDERS_PG: &str = "CREATE TABLE orders (sku bigint NOT NULL)";
const ORDERS_MYSQL: &str = "CREATE TABLE orders (sku BIGINT NOT NULL) ENGINE = InnoDB";

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

async fn mysql_store(connections: u32) -> (MySqlStore, common::MyDatabase) {
    let db = common::MyDatabase::create(&common::mysql_url(), connections).await;
    let store = MySqlStore::builder().build(db.pool.clone()).await.unwrap();
    (store, db)
}

/// [`Backend`] for stores whose statements are the same text: only the connection type differs.
macro_rules! backend {
    ($($store:ty: $guard:ty = $fresh:ident, $orders:ident, $insert:literal, $bounds:literal;)*) => {$(
        impl Backend for $store {
            type Guard = $guard;
            const BOUNDS_WAITING_DUPLICATES: bool = $bounds;

            async fn fresh(connections: u32) -> (Self, $guard) {
                let (store, guard) = $fresh(connections).await;
                sqlx::query($orders).execute(store.pool()).await.unwrap();
                (store, guard)
            }

            async fn insert_order(tx: &mut Tx<Self>, sku: i64) -> Result<i64, Error> {
                sqlx::query($insert)
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
    SqliteStore: common::SqliteFile = sqlite_store, ORDERS_SQLITE, "INSERT INTO orders (sku) VALUES ($1)", false;
    PgStore: common::PgSchema = pg_store, ORDERS_PG, "INSERT INTO orders (sku) VALUES ($1)", true;
    MySqlStore: common::MyDatabase = mysql_store, ORDERS_MYSQL, "INSERT INTO orders (sku) VALUES (?)", true;
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

/// Duplicates racing on one key: one inserts, the others wait for its commit and replay it (on
/// PostgreSQL, those past the number allowed to wait are told "in progress" instead).
async fn concurrent_duplicates_insert_once<S: Backend>() {
    let (store, _guard) = S::fresh(40).await;
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            create_order(&store, 1, "dup", Then::Commit).await
        }));
    }
    let mut answered = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(orders) => {
                assert_eq!(orders, 1, "every duplicate answered gets the first answer");
                answered += 1;
            }
            Err(Error::InProgress { .. }) if S::BOUNDS_WAITING_DUPLICATES => {}
            Err(e) => panic!("a duplicate failed: {e:?}"),
        }
    }
    assert!(answered >= 1);
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

/// Two MiB and a bit of JSON: larger than the default policy keeps.
#[idempotent(scope = "big:<sku>", key = key, store = store, transaction = tx)]
async fn big_order<S: Backend>(store: &S, sku: i64, key: &str) -> Result<String, Error> {
    S::insert_order(tx, sku).await?;
    Ok("x".repeat(2 << 20))
}

/// An answer larger than the policy keeps is returned to its caller once, with its insert
/// committed; the record is completed without it, and the retry is told so (409
/// `ANSWER_NOT_KEPT`) rather than replay two MiB or run the body again: what separate commits
/// do. (Transactional mode stored every answer whole.)
async fn an_answer_larger_than_the_policy_keeps_is_returned_once<S: Backend>() {
    let (store, _guard) = S::fresh(4).await;
    let first = big_order(&store, 1, "k").await.unwrap();
    assert_eq!(
        first.len(),
        2 << 20,
        "the first caller gets the whole answer"
    );
    match big_order(&store, 1, "k").await {
        Err(e @ Error::AnswerNotKept { len, max }) => {
            assert_eq!(
                (len, max),
                (Some((2 << 20) + 2), idem::record::DEFAULT_MAX_ANSWER)
            );
            assert_eq!((e.status(), e.code()), (409, "ANSWER_NOT_KEPT"));
        }
        other => panic!("the retry: {:?}", other.map(|s| s.len())),
    }
    assert_eq!(store.committed_orders().await, 1, "the body ran once");
    let record = store.lookup("big:1", "k").await.unwrap().unwrap();
    assert_eq!(record.state, idem::RecordState::Completed);
    let kept = record.response.expect("a completed record has an answer");
    assert!(
        kept.body.len() < 1024,
        "the record keeps no copy of the answer: {} bytes",
        kept.body.len()
    );
}

impl Bounded for PgStore {
    async fn waiting(connections: u32, wait: Duration) -> (PgStore, common::PgSchema) {
        let schema = common::PgSchema::create(&common::pg_url(), connections).await;
        sqlx::query(ORDERS_PG).execute(&schema.pool).await.unwrap();
        let store = PgStore::builder()
            .duplicate_wait(wait)
            .build(schema.pool.clone())
            .await
            .unwrap();
        (store, schema)
    }

    async fn set_lock_wait(tx: &mut Tx<Self>, seconds: u32) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SET LOCAL lock_timeout = '{seconds}s'"
        )))
        .execute(&mut **tx)
        .await
        .unwrap();
    }

    async fn lock_wait(tx: &mut Tx<Self>) -> u32 {
        let setting: String = sqlx::query_scalar("SHOW lock_timeout")
            .fetch_one(&mut **tx)
            .await
            .unwrap();
        let seconds = setting.strip_suffix('s').expect("lock_timeout in seconds");
        seconds.parse().unwrap()
    }
}

impl Bounded for MySqlStore {
    async fn waiting(connections: u32, wait: Duration) -> (MySqlStore, common::MyDatabase) {
        let db = common::MyDatabase::create(&common::mysql_url(), connections).await;
        sqlx::query(ORDERS_MYSQL).execute(&db.pool).await.unwrap();
        let store = MySqlStore::builder()
            .duplicate_wait(wait)
            .build(db.pool.clone())
            .await
            .unwrap();
        (store, db)
    }

    async fn set_lock_wait(tx: &mut Tx<Self>, seconds: u32) {
        sqlx::query("SET SESSION innodb_lock_wait_timeout = ?")
            .bind(seconds)
            .execute(&mut **tx)
            .await
            .unwrap();
    }

    async fn lock_wait(tx: &mut Tx<Self>) -> u32 {
        let seconds: i64 =
            sqlx::query_scalar("SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS SIGNED)")
                .fetch_one(&mut **tx)
                .await
                .unwrap();
        seconds.try_into().unwrap()
    }
}

/// Retries of one slow request in transactional mode: each is answered "in progress" (409 with
/// `Retry-After`) once its bound runs out, only one of them waits at all, and the pool stays
/// free for every other key. (Unbounded, each duplicate held a connection while its insert waited
/// on the unique index, and the other key's request waited for the pool.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn postgres_duplicates_of_a_slow_transaction_never_take_the_pool() {
    duplicates_of_a_slow_transaction_never_take_the_pool::<PgStore>(Duration::from_millis(400))
        .await
}

/// The same on MySQL, whose lock waits are counted in whole seconds. (Unbounded, each duplicate
/// waited on the first transaction's row for `innodb_lock_wait_timeout`, 50 s by default.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn mysql_duplicates_of_a_slow_transaction_never_take_the_pool() {
    duplicates_of_a_slow_transaction_never_take_the_pool::<MySqlStore>(Duration::from_secs(1)).await
}

async fn duplicates_of_a_slow_transaction_never_take_the_pool<S: Bounded>(wait: Duration) {
    let (store, _guard) = S::waiting(4, wait).await;
    let slow = tokio::spawn({
        let store = store.clone();
        async move { create_order(&store, 1, "slow", Then::Hang).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let began = std::time::Instant::now();
    let duplicates: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let answer = create_order(&store, 1, "slow", Then::Commit).await;
                (answer, began.elapsed())
            })
        })
        .collect();
    // Another key goes through while the duplicates are answered.
    let other = tokio::time::timeout(
        Duration::from_secs(2),
        create_order(&store, 2, "other", Then::Commit),
    )
    .await
    .expect("another key's request is not held up by the duplicates");
    assert_eq!(other.unwrap(), 1);
    let mut waited = 0;
    for d in duplicates {
        let (answer, took) = tokio::time::timeout(Duration::from_secs(5), d)
            .await
            .expect("a duplicate is answered within its bound, not held until the first ends")
            .unwrap();
        match answer {
            Err(Error::InProgress { retry_after }) => {
                assert!(retry_after >= Duration::from_secs(1), "{retry_after:?}");
            }
            other => panic!("a duplicate of a running request: {other:?}"),
        }
        assert!(took < Duration::from_secs(3), "answered after {took:?}");
        waited += usize::from(took >= wait);
    }
    assert_eq!(
        waited, 1,
        "one duplicate (a quarter of 4 connections) waits its bound"
    );
    // The slow request gives up (its transaction rolls back): the next retry claims.
    slow.abort();
    let _ = slow.await;
    let retried = tokio::time::timeout(
        Duration::from_secs(5),
        create_order(&store, 1, "slow", Then::Commit),
    )
    .await
    .expect("the retry after the rollback");
    assert_eq!(retried.unwrap(), 2, "the other key's order and this one");
}

/// A duplicate that waited for the first transaction and then claimed (the first rolled back)
/// runs its body with the caller's own lock wait, not the wait's bound.
async fn a_waiting_duplicate_leaves_the_lock_wait_as_it_was<S: Bounded>() {
    use idem::{BeginOutcome, BeginRequest, Fingerprint, Policy};
    let (store, _guard) = S::waiting(4, Duration::from_secs(5)).await;
    let fp = Fingerprint::of(&1).unwrap();
    let policy = Policy::DEFAULT;
    let req = BeginRequest::new("s", "k", &fp, &policy);
    let mut first = store.begin_transaction().await.unwrap();
    assert!(matches!(
        store.begin_in(&mut first, req).await.unwrap(),
        BeginOutcome::Claimed(_)
    ));
    let duplicate = tokio::spawn({
        let store = store.clone();
        async move {
            let (fp, policy) = (Fingerprint::of(&1).unwrap(), Policy::DEFAULT);
            let mut tx = store.begin_transaction().await.unwrap();
            S::set_lock_wait(&mut tx, 7).await;
            let outcome = store
                .begin_in(&mut tx, BeginRequest::new("s", "k", &fp, &policy))
                .await
                .unwrap();
            (outcome, S::lock_wait(&mut tx).await)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !duplicate.is_finished(),
        "the duplicate waits for the first transaction"
    );
    first.rollback().await.unwrap();
    let (outcome, seconds) = duplicate.await.unwrap();
    assert!(matches!(outcome, BeginOutcome::Claimed(_)), "{outcome:?}");
    assert_eq!(seconds, 7, "the caller's lock wait after the duplicate's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idem_postgres),
    ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
)]
async fn postgres_a_waiting_duplicate_leaves_lock_timeout_as_it_was() {
    a_waiting_duplicate_leaves_the_lock_wait_as_it_was::<PgStore>().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn mysql_a_waiting_duplicate_leaves_the_lock_wait_timeout_as_it_was() {
    a_waiting_duplicate_leaves_the_lock_wait_as_it_was::<MySqlStore>().await
}

mod sqlite {
    crate::backend_tests!(
        idem::SqliteStore:
        commits_together_and_rolls_back_together,
        concurrent_duplicates_insert_once(flavor = "multi_thread", worker_threads = 4),
        a_cancelled_call_leaves_nothing_behind,
        an_answer_larger_than_the_policy_keeps_is_returned_once,
    );
}

mod mysql {
    crate::backend_tests!(
        #[cfg_attr(
            not(idem_mysql),
            ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
        )]
        idem::MySqlStore:
        commits_together_and_rolls_back_together,
        concurrent_duplicates_insert_once(flavor = "multi_thread", worker_threads = 4),
        a_cancelled_call_leaves_nothing_behind,
        an_answer_larger_than_the_policy_keeps_is_returned_once,
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
        an_answer_larger_than_the_policy_keeps_is_returned_once,
    );
}
