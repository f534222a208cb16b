//! `#[state_transition]`, `state_machine!`, `#[versioned_update]` and `#[create_once]` against
//! SQLite, PostgreSQL and MySQL (MariaDB): every outcome, on every kind of executor, and under
//! races.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::transition::{Retry, retry_versioned};
use idem::{Created, Error, Transition, Versioned};

idem::state_machine! {
    /// The order lifecycle: PENDING → PAID → SHIPPED → DONE, and cancellation before shipping.
    pub enum OrderStatus {
        Pending = "PENDING",
        Paid = "PAID",
        Shipped = "SHIPPED",
        Done = "DONE",
        Cancelled = "CANCELLED",
    }
    Pending -> Paid -> Shipped -> Done;
    Pending -> Cancelled;
    Paid -> Cancelled;
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Order {
    pub id: i64,
    pub order_no: String,
    pub user_id: i64,
    pub amount_cents: i64,
    pub status: String,
}

/// The same functions for each database: only the executor's database differs.
macro_rules! order_functions {
    ($db:ty) => {
        use super::*;

        #[idem::state_transition(
            table = "orders",
            key = "order_no",
            from = "PENDING",
            to = "PAID",
            guard = "amount_cents",
            set = "paid_at = now()",
            returning = Order,
            machine = OrderStatus
        )]
        pub async fn mark_paid(
            db: impl sqlx::Acquire<'_, Database = $db>,
            order_no: &str,
            amount_cents: i64,
        ) -> Result<Transition<Order, OrderStatus>, Error>;

        // A guard on a nullable column, with an `Option`: `None` is compared as NULL, not
        // with `=` (never true for NULL), so a row whose column is NULL can be matched.
        #[idem::state_transition(table = "orders", key = "order_no", from = "PENDING", to = "CANCELLED", guard = "refund_request")]
        pub async fn cancel_unclaimed(
            db: impl sqlx::Acquire<'_, Database = $db>,
            order_no: &str,
            refund_request: Option<&str>,
        ) -> Result<Transition, Error>;

        #[idem::state_transition(table = "orders", key = "order_no", from = "PAID", to = "SHIPPED", machine = OrderStatus)]
        pub async fn ship(
            db: impl sqlx::Acquire<'_, Database = $db>,
            order_no: &str,
        ) -> Result<Transition<(), OrderStatus>, Error>;

        #[idem::state_transition(table = "orders", key = "order_no", from = ["PENDING", "PAID"], to = "CANCELLED", machine = OrderStatus)]
        pub async fn cancel(
            db: impl sqlx::Acquire<'_, Database = $db>,
            order_no: &str,
        ) -> Result<Transition<(), OrderStatus>, Error>;

        // No machine: states are plain text, and several key columns.
        #[idem::state_transition(table = "orders", key = "user_id, order_no", state = "status", from = "SHIPPED", to = "DONE")]
        pub async fn confirm(
            db: impl sqlx::Acquire<'_, Database = $db>,
            user_id: i64,
            order_no: &str,
        ) -> Result<Transition, Error>;

        // A refund's first step: one request wins the paid order; `owner` records which.
        #[idem::state_transition(table = "orders", key = "order_no", from = "PAID", to = "REFUNDING", owner = "refund_request", returning = Order)]
        pub async fn begin_refund(
            db: impl sqlx::Acquire<'_, Database = $db>,
            order_no: &str,
            refund_request: &str,
        ) -> Result<Transition<Order>, Error>;

        // The same without a row, and with a guard besides the owner.
        #[idem::state_transition(table = "orders", key = "order_no", from = "PAID", to = "REFUNDING", guard = "amount_cents", owner = "refund_request")]
        pub async fn begin_refund_of(
            db: impl sqlx::Acquire<'_, Database = $db>,
            order_no: &str,
            amount_cents: i64,
            refund_request: &str,
        ) -> Result<Transition, Error>;

        #[idem::versioned_update(table = "user_profile", key = "user_id", set = "nickname, points")]
        pub async fn update_profile(
            db: impl sqlx::Acquire<'_, Database = $db>,
            user_id: i64,
            nickname: &str,
            points: i64,
            version: i64,
        ) -> Result<Versioned, Error>;

        #[idem::create_once(table = "orders", unique = "order_no", returning = Order)]
        pub async fn insert_order(
            db: impl sqlx::Acquire<'_, Database = $db>,
            order_no: &str,
            user_id: i64,
            amount_cents: i64,
        ) -> Result<Created<Order>, Error>;
    };
}

mod sqlite_fns {
    order_functions!(sqlx::Sqlite);
}

mod pg_fns {
    order_functions!(sqlx::Postgres);
}

mod my_fns {
    order_functions!(sqlx::MySql);
}

/// Captures warn-level events of the transition module.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Warnings {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        *m.level() == tracing::Level::WARN && m.target() == "idem::transition"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        self.0
            .lock()
            .unwrap()
            .push(format!("{:?}", e.fields().collect::<Vec<_>>()));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

macro_rules! suite {
    ($name:ident, $fns:ident, $setup:ident, $conn:ty $(, #[$attr:meta])*) => {
        mod $name {
            use super::$fns::*;
            use super::*;

            #[tokio::test]
            $(#[$attr])*
            async fn an_optional_guard_matches_null() {
                let db = $setup().await;
                let pool = &db.pool;
                insert_order(pool, "N1", 7, 250).await.unwrap();
                // The row's `refund_request` is NULL: a value differs from it, `None` matches it.
                assert_eq!(cancel_unclaimed(pool, "N1", Some("req-a")).await.unwrap(), Transition::GuardMismatch(()));
                assert_eq!(cancel_unclaimed(pool, "N1", None).await.unwrap(), Transition::Applied(()));
                assert_eq!(cancel_unclaimed(pool, "N1", None).await.unwrap(), Transition::AlreadyApplied(()));
                // A row whose column holds a value: `None` differs from it, the value matches it.
                insert_order(pool, "N2", 7, 250).await.unwrap();
                sqlx::query("UPDATE orders SET refund_request = 'req-b' WHERE order_no = 'N2'")
                    .execute(pool).await.unwrap();
                assert_eq!(cancel_unclaimed(pool, "N2", None).await.unwrap(), Transition::GuardMismatch(()));
                assert_eq!(cancel_unclaimed(pool, "N2", Some("req-c")).await.unwrap(), Transition::GuardMismatch(()));
                assert_eq!(cancel_unclaimed(pool, "N2", Some("req-b")).await.unwrap(), Transition::Applied(()));
            }

            #[tokio::test]
            $(#[$attr])*
            async fn payment_callback_outcomes() {
                let db = $setup().await;
                let pool = &db.pool;
                let first = insert_order(pool, "A1", 7, 250).await.unwrap().into_row();
                assert_eq!(first.status, "PENDING");

                // Applied, in one statement, with the row as it is now.
                match mark_paid(pool, "A1", 250).await.unwrap() {
                    Transition::Applied(o) => {
                        assert_eq!(o.status, "PAID");
                        assert_eq!(o.id, first.id);
                    }
                    other => panic!("{other:?}"),
                }
                let paid: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE order_no = 'A1' AND paid_at IS NOT NULL")
                    .fetch_one(pool).await.unwrap();
                assert_eq!(paid, 1, "set = \"paid_at = now()\" wrote the database's time");

                // The duplicate callback: an idempotent success, with the row.
                let warnings = Warnings::default();
                let outcome = {
                    let _guard = tracing::subscriber::set_default(warnings.clone());
                    mark_paid(pool, "A1", 250).await.unwrap()
                };
                match outcome {
                    Transition::AlreadyApplied(o) => assert_eq!(o.status, "PAID"),
                    other => panic!("{other:?}"),
                }
                assert!(warnings.0.lock().unwrap().is_empty());
                // A late callback with another amount: still already applied, but not silently.
                let outcome = {
                    let _guard = tracing::subscriber::set_default(warnings.clone());
                    mark_paid(pool, "A1", 999).await.unwrap()
                };
                assert!(matches!(outcome, Transition::AlreadyApplied(_)));
                assert_eq!(warnings.0.lock().unwrap().len(), 1, "a differing guard on a done row is logged");
                warnings.0.lock().unwrap().clear();

                // A callback with another amount for a pending order: surfaced, logged, not applied.
                insert_order(pool, "A2", 7, 300).await.unwrap();
                let warnings = Warnings::default();
                let outcome = {
                    let _guard = tracing::subscriber::set_default(warnings.clone());
                    mark_paid(pool, "A2", 999).await.unwrap()
                };
                match outcome {
                    Transition::GuardMismatch(o) => assert_eq!(o.status, "PENDING"),
                    other => panic!("{other:?}"),
                }
                assert_eq!(warnings.0.lock().unwrap().len(), 1, "a guard mismatch is logged at warn");

                // Shipped orders cannot be paid.
                assert!(mark_paid(pool, "A2", 300).await.unwrap().is_applied());
                assert!(ship(pool, "A2").await.unwrap().is_applied());
                assert_eq!(
                    mark_paid(pool, "A2", 300).await.unwrap(),
                    Transition::Illegal { current: OrderStatus::Shipped }
                );
                assert_eq!(mark_paid(pool, "nope", 1).await.unwrap(), Transition::NotFound);
            }

            #[tokio::test]
            $(#[$attr])*
            async fn several_from_states_and_plain_text_states() {
                let db = $setup().await;
                let pool = &db.pool;
                insert_order(pool, "C1", 1, 10).await.unwrap();
                insert_order(pool, "C2", 1, 10).await.unwrap();
                assert!(mark_paid(pool, "C2", 10).await.unwrap().is_applied());
                assert_eq!(cancel(pool, "C1").await.unwrap(), Transition::Applied(()));
                assert_eq!(cancel(pool, "C2").await.unwrap(), Transition::Applied(()));
                assert_eq!(cancel(pool, "C2").await.unwrap(), Transition::AlreadyApplied(()));
                assert_eq!(
                    ship(pool, "C2").await.unwrap(),
                    Transition::Illegal { current: OrderStatus::Cancelled }
                );

                insert_order(pool, "D1", 5, 10).await.unwrap();
                assert!(mark_paid(pool, "D1", 10).await.unwrap().is_applied());
                assert!(ship(pool, "D1").await.unwrap().is_applied());
                assert_eq!(confirm(pool, 6, "D1").await.unwrap(), Transition::NotFound, "both keys must match");
                assert_eq!(confirm(pool, 5, "D1").await.unwrap(), Transition::Applied(()));
                assert_eq!(
                    confirm(pool, 1, "C1").await.unwrap(),
                    Transition::Illegal { current: "CANCELLED".to_string() }
                );
            }

            #[tokio::test]
            $(#[$attr])*
            async fn any_executor() {
                let db = $setup().await;
                let pool = &db.pool;
                insert_order(pool, "E1", 1, 10).await.unwrap();
                // A connection.
                let mut conn = pool.acquire().await.unwrap();
                assert!(mark_paid(&mut *conn, "E1", 10).await.unwrap().is_applied());
                drop(conn);
                // A transaction: rolled back, the transition is gone; committed, it stays.
                let mut tx = pool.begin().await.unwrap();
                assert!(ship(&mut tx, "E1").await.unwrap().is_applied());
                tx.rollback().await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                assert!(ship(&mut tx, "E1").await.unwrap().is_applied());
                tx.commit().await.unwrap();
                assert_eq!(ship(pool, "E1").await.unwrap(), Transition::AlreadyApplied(()));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn concurrent_duplicate_callbacks_apply_once() {
                let db = $setup().await;
                insert_order(&db.pool, "R1", 1, 500).await.unwrap();
                let mut tasks = Vec::new();
                for _ in 0..32 {
                    let pool = db.pool.clone();
                    tasks.push(tokio::spawn(async move { mark_paid(&pool, "R1", 500).await.unwrap() }));
                }
                let (mut applied, mut already) = (0, 0);
                for t in tasks {
                    match t.await.unwrap() {
                        Transition::Applied(_) => applied += 1,
                        Transition::AlreadyApplied(_) => already += 1,
                        other => panic!("{other:?}"),
                    }
                }
                assert_eq!((applied, already), (1, 31));
            }

            #[tokio::test]
            $(#[$attr])*
            async fn an_owner_tells_its_own_transition_from_another() {
                let db = $setup().await;
                let pool = &db.pool;
                insert_order(pool, "F1", 1, 100).await.unwrap();
                assert_eq!(begin_refund(pool, "F1", "req-a").await.unwrap(), Transition::Illegal { current: "PENDING".into() });
                assert!(mark_paid(pool, "F1", 100).await.unwrap().is_applied());
                match begin_refund(pool, "F1", "req-a").await.unwrap() {
                    Transition::Applied(o) => assert_eq!(o.status, "REFUNDING"),
                    other => panic!("{other:?}"),
                }
                let owner: String = sqlx::query_scalar("SELECT refund_request FROM orders WHERE order_no = 'F1'")
                    .fetch_one(pool).await.unwrap();
                assert_eq!(owner, "req-a", "the winner is recorded");
                // The same owner again: its own earlier transition, never `Applied` a second time.
                match begin_refund(pool, "F1", "req-a").await.unwrap() {
                    Transition::AlreadyApplied(o) => assert_eq!(o.status, "REFUNDING"),
                    other => panic!("{other:?}"),
                }
                // Another owner: applied by another, with the row, and the owner stays.
                let other = begin_refund(pool, "F1", "req-b").await.unwrap();
                assert!(matches!(&other, Transition::AppliedByAnother(o) if o.order_no == "F1"), "{other:?}");
                assert_eq!(other.kind(), "applied_by_another");
                assert!(!other.is_applied());
                assert!(other.clone().applied().is_err());
                let owner: String = sqlx::query_scalar("SELECT refund_request FROM orders WHERE order_no = 'F1'")
                    .fetch_one(pool).await.unwrap();
                assert_eq!(owner, "req-a");
                assert_eq!(begin_refund(pool, "nope", "req-a").await.unwrap(), Transition::NotFound);

                // Without a row, and with a guard: the guard decides in a `from` state, the owner
                // in `to`.
                insert_order(pool, "F2", 1, 200).await.unwrap();
                assert!(mark_paid(pool, "F2", 200).await.unwrap().is_applied());
                assert_eq!(begin_refund_of(pool, "F2", 999, "req-c").await.unwrap(), Transition::GuardMismatch(()));
                assert_eq!(begin_refund_of(pool, "F2", 200, "req-c").await.unwrap(), Transition::Applied(()));
                assert_eq!(begin_refund_of(pool, "F2", 200, "req-c").await.unwrap(), Transition::AlreadyApplied(()));
                assert_eq!(begin_refund_of(pool, "F2", 200, "req-d").await.unwrap(), Transition::AppliedByAnother(()));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn racing_owners_one_wins() {
                let db = $setup().await;
                insert_order(&db.pool, "F3", 1, 500).await.unwrap();
                assert!(mark_paid(&db.pool, "F3", 500).await.unwrap().is_applied());
                let mut tasks = Vec::new();
                for i in 0..32 {
                    let pool = db.pool.clone();
                    tasks.push(tokio::spawn(async move {
                        let owner = format!("req-{i}");
                        (begin_refund(&pool, "F3", &owner).await.unwrap(), owner)
                    }));
                }
                let (mut winners, mut losers) = (Vec::new(), 0);
                for t in tasks {
                    match t.await.unwrap() {
                        (Transition::Applied(_), owner) => winners.push(owner),
                        (Transition::AppliedByAnother(_), _) => losers += 1,
                        (other, _) => panic!("{other:?}"),
                    }
                }
                assert_eq!((winners.len(), losers), (1, 31));
                let owner: String = sqlx::query_scalar("SELECT refund_request FROM orders WHERE order_no = 'F3'")
                    .fetch_one(&db.pool).await.unwrap();
                assert_eq!(owner, winners[0]);
            }

            #[tokio::test]
            $(#[$attr])*
            async fn versioned_update_outcomes() {
                let db = $setup().await;
                let pool = &db.pool;
                sqlx::query("INSERT INTO user_profile (user_id, nickname, points, version) VALUES (1, 'a', 0, 0)")
                    .execute(pool).await.unwrap();
                assert_eq!(update_profile(pool, 1, "b", 5, 0).await.unwrap(), Versioned::Updated { version: 1 });
                assert_eq!(update_profile(pool, 1, "c", 6, 0).await.unwrap(), Versioned::Stale { current_version: 1 });
                assert_eq!(update_profile(pool, 2, "c", 6, 0).await.unwrap(), Versioned::NotFound);
                let (nick, points): (String, i64) = sqlx::query_as("SELECT nickname, points FROM user_profile WHERE user_id = 1")
                    .fetch_one(pool).await.unwrap();
                assert_eq!((nick.as_str(), points), ("b", 5), "the stale update changed nothing");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn concurrent_versioned_updates_lose_nothing() {
                let db = $setup().await;
                sqlx::query("INSERT INTO user_profile (user_id, nickname, points, version) VALUES (1, 'n', 0, 0)")
                    .execute(&db.pool).await.unwrap();
                let retry = Retry { attempts: 200, base: Duration::from_millis(2), max: Duration::from_millis(50) };
                let mut tasks = Vec::new();
                for _ in 0..32 {
                    let pool = db.pool.clone();
                    tasks.push(tokio::spawn(async move {
                        retry_versioned(retry, || async {
                            let (points, version): (i64, i64) =
                                sqlx::query_as("SELECT points, version FROM user_profile WHERE user_id = 1")
                                    .fetch_one(&pool)
                                    .await
                                    .map_err(|e| Error::Store(e.into()))?;
                            update_profile(&pool, 1, "n", points + 1, version).await
                        })
                        .await
                        .unwrap()
                    }));
                }
                for t in tasks {
                    assert!(matches!(t.await.unwrap(), Versioned::Updated { .. }));
                }
                let (points, version): (i64, i64) =
                    sqlx::query_as("SELECT points, version FROM user_profile WHERE user_id = 1")
                        .fetch_one(&db.pool).await.unwrap();
                assert_eq!((points, version), (32, 32), "every success is accounted for");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            $(#[$attr])*
            async fn concurrent_create_once_inserts_one_row() {
                let db = $setup().await;
                let mut tasks = Vec::new();
                for _ in 0..32 {
                    let pool = db.pool.clone();
                    tasks.push(tokio::spawn(async move { insert_order(&pool, "N1", 3, 70).await.unwrap() }));
                }
                let mut inserted = 0;
                let mut ids = std::collections::HashSet::new();
                for t in tasks {
                    let created = t.await.unwrap();
                    inserted += usize::from(created.is_inserted());
                    ids.insert(created.into_row().id);
                }
                assert_eq!(inserted, 1);
                assert_eq!(ids.len(), 1, "every caller gets the one row");
                let n: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE order_no = 'N1'")
                    .fetch_one(&db.pool).await.unwrap();
                assert_eq!(n, 1);
                // A later insert of the same number returns the row as first written.
                match insert_order(&db.pool, "N1", 99, 1).await.unwrap() {
                    Created::Existing(o) => assert_eq!((o.user_id, o.amount_cents), (3, 70)),
                    other => panic!("{other:?}"),
                }
            }
        }
    };
}

struct SqliteDb {
    pool: sqlx::SqlitePool,
    _file: common::SqliteFile,
}

async fn sqlite() -> SqliteDb {
    let file = common::SqliteFile::new();
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(idem::SqliteStore::connect_options(&file.url).unwrap())
        .await
        .unwrap();
    for stmt in [
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, order_no TEXT NOT NULL UNIQUE, user_id INTEGER NOT NULL, \
         amount_cents INTEGER NOT NULL, status TEXT NOT NULL DEFAULT 'PENDING', paid_at TEXT, refund_request TEXT)",
        "CREATE TABLE user_profile (user_id INTEGER PRIMARY KEY, nickname TEXT NOT NULL, points INTEGER NOT NULL, \
         version INTEGER NOT NULL)",
    ] {
        sqlx::query(stmt).execute(&pool).await.unwrap();
    }
    SqliteDb { pool, _file: file }
}

struct PgDb {
    pool: sqlx::PgPool,
    _schema: common::PgSchema,
}

async fn postgres() -> PgDb {
    let url = common::pg_url();
    let schema = common::PgSchema::create(&url, 40).await;
    for stmt in [
        "CREATE TABLE orders (id bigserial PRIMARY KEY, order_no text NOT NULL UNIQUE, user_id bigint NOT NULL, \
         amount_cents bigint NOT NULL, status text NOT NULL DEFAULT 'PENDING', paid_at timestamptz, refund_request text)",
        "CREATE TABLE user_profile (user_id bigint PRIMARY KEY, nickname text NOT NULL, points bigint NOT NULL, \
         version bigint NOT NULL)",
    ] {
        sqlx::query(stmt).execute(&schema.pool).await.unwrap();
    }
    PgDb {
        pool: schema.pool.clone(),
        _schema: schema,
    }
}

struct MyDb {
    pool: sqlx::MySqlPool,
    _db: common::MyDatabase,
}

async fn mysql() -> MyDb {
    let db = common::MyDatabase::create(&common::mysql_url(), 40).await;
    for stmt in [
        "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_no VARCHAR(64) NOT NULL UNIQUE, \
         user_id BIGINT NOT NULL, amount_cents BIGINT NOT NULL, status VARCHAR(16) NOT NULL DEFAULT 'PENDING', \
         paid_at DATETIME(6), refund_request VARCHAR(64)) ENGINE = InnoDB",
        "CREATE TABLE user_profile (user_id BIGINT PRIMARY KEY, nickname VARCHAR(64) NOT NULL, points BIGINT NOT NULL, \
         version BIGINT NOT NULL) ENGINE = InnoDB",
    ] {
        sqlx::query(stmt).execute(&db.pool).await.unwrap();
    }
    MyDb {
        pool: db.pool.clone(),
        _db: db,
    }
}

suite!(on_sqlite, sqlite_fns, sqlite, sqlx::SqliteConnection);
suite!(on_postgres, pg_fns, postgres, sqlx::PgConnection, #[cfg_attr(not(idem_postgres), ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…")]);
suite!(on_mysql, my_fns, mysql, sqlx::MySqlConnection, #[cfg_attr(not(idem_mysql), ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…")]);

/// MySQL's transactions read a snapshot taken at their first read (`REPEATABLE READ`), while an
/// `UPDATE` matches the rows as last committed. A transition, an optimistic update or a
/// create-once inside such a transaction, on a row another transaction changed since, is
/// classified by the row as committed: a plain read would see the older row and take the miss
/// for a change between the two statements, again and again.
#[tokio::test]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn on_mysql_a_snapshot_older_than_the_row_is_classified_by_the_committed_row() {
    use my_fns::*;
    use sqlx::Connection as _;
    let db = mysql().await;
    insert_order(&db.pool, "S1", 1, 100).await.unwrap();
    sqlx::query(
        "INSERT INTO user_profile (user_id, nickname, points, version) VALUES (1, 'a', 0, 0)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    // The snapshot: taken by this first read, before the changes below.
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(n, 1);
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM user_profile")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert!(matches!(
        mark_paid(&db.pool, "S1", 100).await.unwrap(),
        Transition::Applied(_)
    ));
    assert!(matches!(
        update_profile(&db.pool, 1, "b", 1, 0).await.unwrap(),
        Versioned::Updated { version: 1 }
    ));
    insert_order(&db.pool, "S2", 2, 200).await.unwrap();

    match mark_paid(&mut *tx, "S1", 100).await.unwrap() {
        Transition::AlreadyApplied(o) => assert_eq!(o.status, "PAID"),
        other => panic!("a payment already committed: {other:?}"),
    }
    assert_eq!(
        update_profile(&mut *tx, 1, "c", 2, 0).await.unwrap(),
        Versioned::Stale { current_version: 1 }
    );
    match insert_order(&mut *tx, "S2", 9, 900).await.unwrap() {
        Created::Existing(o) => assert_eq!((o.user_id, o.amount_cents), (2, 200)),
        other => panic!("an order already committed: {other:?}"),
    }
    tx.rollback().await.unwrap();
}

/// On MySQL, a create-once whose row is refused by another unique column than the one it names
/// reports the database's error: that value is not the number `unique` says is taken.
#[tokio::test]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
async fn on_mysql_another_unique_column_taken_is_an_error() {
    use my_fns::*;
    let db = mysql().await;
    sqlx::query("ALTER TABLE orders ADD UNIQUE (user_id)")
        .execute(&db.pool)
        .await
        .unwrap();
    insert_order(&db.pool, "U1", 7, 100).await.unwrap();
    match insert_order(&db.pool, "U2", 7, 100).await {
        Err(Error::Store(e)) => assert!(e.to_string().contains("Duplicate"), "{e}"),
        other => panic!("another unique column's value taken: {other:?}"),
    }
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn the_machine_knows_its_edges() {
    use idem::StateMachine;
    assert!(OrderStatus::Pending.can_become(OrderStatus::Paid));
    assert!(OrderStatus::Paid.can_become(OrderStatus::Cancelled));
    assert!(!OrderStatus::Shipped.can_become(OrderStatus::Cancelled));
    assert!(!OrderStatus::Done.can_become(OrderStatus::Pending));
    assert_eq!(
        OrderStatus::from_text("SHIPPED"),
        Some(OrderStatus::Shipped)
    );
    assert_eq!("PAID".parse::<OrderStatus>().unwrap(), OrderStatus::Paid);
    assert!("paid".parse::<OrderStatus>().is_err());
    assert_eq!(OrderStatus::Paid.to_string(), "PAID");
    assert_eq!(
        serde_json::to_string(&OrderStatus::Done).unwrap(),
        "\"DONE\""
    );
    assert_eq!(
        serde_json::from_str::<OrderStatus>("\"CANCELLED\"").unwrap(),
        OrderStatus::Cancelled
    );
    let next: Vec<_> = OrderStatus::Pending.next_states().collect();
    assert_eq!(next, [OrderStatus::Paid, OrderStatus::Cancelled]);
    assert_eq!(<OrderStatus as StateMachine>::EDGES.len(), 5);
}

idem::state_machine! {
    /// The states of `enum_orders`: a PostgreSQL enum type in the migration.
    pub enum OrderState {
        Pending = "PENDING",
        Paid = "PAID",
        Cancelled = "CANCELLED",
    }
    Pending -> Paid;
    Pending -> Cancelled;
}

/// On a state column of an enum type (read from the migration), text is cast to the type and
/// the state read back as text: without the casts PostgreSQL refuses `state IN ($4)` (no
/// operator compares an enum with text) and sqlx refuses to read the enum as a `String`.
mod enum_state {
    use super::*;

    #[idem::state_transition(
        table = "enum_orders",
        key = "order_no",
        state = "state",
        from = "PENDING",
        to = "PAID",
        guard = "amount_cents",
        machine = OrderState,
        migrations = "sql/enum_orders"
    )]
    pub async fn pay(
        db: &sqlx::PgPool,
        order_no: &str,
        amount_cents: i64,
    ) -> Result<Transition<(), OrderState>, Error>;

    #[idem::state_transition(
        table = "enum_orders",
        key = "order_no",
        state = "state",
        from = "PENDING",
        to = "CANCELLED",
        migrations = "sql/enum_orders"
    )]
    pub async fn cancel(db: &sqlx::PgPool, order_no: &str) -> Result<Transition, Error>;

    #[tokio::test]
    #[cfg_attr(
        not(idem_postgres),
        ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
    )]
    async fn outcomes_on_an_enum_state_column() {
        let url = common::pg_url();
        let schema = common::PgSchema::create(&url, 4).await;
        let pool = &schema.pool;
        sqlx::raw_sql(include_str!("sql/enum_orders/1_enum_orders.sql"))
            .execute(pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO enum_orders (order_no, amount_cents) VALUES ('A1', 250), ('B1', 10)",
        )
        .execute(pool)
        .await
        .unwrap();

        assert_eq!(pay(pool, "A1", 250).await.unwrap(), Transition::Applied(()));
        assert_eq!(
            pay(pool, "A1", 250).await.unwrap(),
            Transition::AlreadyApplied(())
        );
        assert_eq!(
            pay(pool, "B1", 11).await.unwrap(),
            Transition::GuardMismatch(())
        );
        assert_eq!(
            cancel(pool, "A1").await.unwrap(),
            Transition::Illegal {
                current: "PAID".to_string()
            }
        );
        assert_eq!(cancel(pool, "B1").await.unwrap(), Transition::Applied(()));
        assert_eq!(
            pay(pool, "B1", 10).await.unwrap(),
            Transition::Illegal {
                current: OrderState::Cancelled
            }
        );
        assert_eq!(pay(pool, "nope", 1).await.unwrap(), Transition::NotFound);
        let state: String =
            sqlx::query_scalar("SELECT state::text FROM enum_orders WHERE order_no = 'A1'")
                .fetch_one(pool)
                .await
                .unwrap();
        assert_eq!(state, "PAID");
    }
}
