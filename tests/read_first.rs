//! SQLite's claims read on the readers first while retries are common, and insert first on the
//! writer while requests are new keys: seen from outside, a replay that does not wait for a
//! writer held by someone else, and one that does. In both modes, and with the order fixed by
//! `SqliteStoreBuilder::read_first`.

mod common;

use std::time::Duration;

use idem::{Error, SqliteStore, idempotent};

/// Claims on new keys that turn reading first off, however high the replays before pushed it.
const NEW_KEYS: i64 = 100;

fn db(e: sqlx::Error) -> Error {
    Error::Store(e.into())
}

/// A store on its own file, with an `orders` table on the writer.
async fn store(read_first: Option<bool>) -> (SqliteStore, common::SqliteFile) {
    let file = common::SqliteFile::new();
    let mut builder = SqliteStore::builder();
    if let Some(on) = read_first {
        builder = builder.read_first(on);
    }
    let store = builder.connect(&file.url).await.unwrap();
    sqlx::query("CREATE TABLE orders (sku INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    (store, file)
}

#[idempotent(scope = "order:<sku>", key = key, store = store, transaction = tx)]
async fn in_transaction(store: &SqliteStore, sku: i64, key: &str) -> Result<i64, Error> {
    sqlx::query("INSERT INTO orders (sku) VALUES ($1)")
        .bind(sku)
        .execute(&mut **tx)
        .await
        .map_err(db)?;
    Ok(sku)
}

#[idempotent(scope = "order:<sku>", key = key, store = store)]
async fn separate(store: &SqliteStore, sku: i64, key: &str) -> Result<i64, Error> {
    sqlx::query("INSERT INTO orders (sku) VALUES ($1)")
        .bind(sku)
        .execute(store.pool())
        .await
        .map_err(db)?;
    Ok(sku)
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Transactional,
    Separate,
}

async fn call(mode: Mode, store: &SqliteStore, sku: i64, key: &str) -> Result<i64, Error> {
    match mode {
        Mode::Transactional => in_transaction(store, sku, key).await,
        Mode::Separate => separate(store, sku, key).await,
    }
}

/// Whether a replay of order 1 is answered while another connection holds the one writer
/// connection; the replay's answer either way, once the writer is free again.
async fn replay_answers_past_a_held_writer(mode: Mode, store: &SqliteStore) -> bool {
    let writer = store.pool().acquire().await.unwrap();
    let replay = call(mode, store, 1, "k");
    tokio::pin!(replay);
    let answered = tokio::time::timeout(Duration::from_millis(500), &mut replay).await;
    let past = answered.is_ok();
    drop(writer);
    let answer = match answered {
        Ok(answer) => answer,
        Err(_) => tokio::time::timeout(Duration::from_secs(10), replay)
            .await
            .expect("the replay is answered once the writer is free"),
    };
    assert_eq!(
        answer.unwrap(),
        1,
        "{mode:?}: the replay gets the first answer"
    );
    past
}

async fn orders(store: &SqliteStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

async fn adapts_to_the_traffic(mode: Mode) {
    let (store, _file) = store(None).await;
    assert_eq!(call(mode, &store, 1, "k").await.unwrap(), 1);
    // Nothing found yet: the insert goes first, and a replay queues for the writer.
    assert!(
        !replay_answers_past_a_held_writer(mode, &store).await,
        "{mode:?}: a store that has seen only new keys reads nothing first"
    );
    // That replay was found under the insert: replays now read first, on the readers.
    for _ in 0..3 {
        assert!(
            replay_answers_past_a_held_writer(mode, &store).await,
            "{mode:?}: while retries are common, a replay does not wait for the writer"
        );
    }
    // A run of new keys turns reading first off again.
    for sku in 100..100 + NEW_KEYS {
        assert_eq!(call(mode, &store, sku, "new").await.unwrap(), sku);
    }
    assert!(
        !replay_answers_past_a_held_writer(mode, &store).await,
        "{mode:?}: after a run of new keys, claims insert first again"
    );
    assert_eq!(
        orders(&store).await,
        1 + NEW_KEYS,
        "{mode:?}: one row per key"
    );
}

async fn fixed_by_the_builder(mode: Mode) {
    for (on, expect) in [(true, true), (false, false)] {
        let (store, _file) = store(Some(on)).await;
        assert_eq!(call(mode, &store, 1, "k").await.unwrap(), 1);
        for round in 0..3 {
            assert_eq!(
                replay_answers_past_a_held_writer(mode, &store).await,
                expect,
                "{mode:?}: read_first({on}), replay {round}"
            );
        }
        for sku in 100..100 + NEW_KEYS {
            call(mode, &store, sku, "new").await.unwrap();
        }
        assert_eq!(
            replay_answers_past_a_held_writer(mode, &store).await,
            expect,
            "{mode:?}: read_first({on}) after new keys"
        );
        assert_eq!(orders(&store).await, 1 + NEW_KEYS);
    }
}

#[tokio::test]
async fn transactional_replays_read_first_while_retries_are_common() {
    adapts_to_the_traffic(Mode::Transactional).await;
}

#[tokio::test]
async fn separate_replays_read_first_while_retries_are_common() {
    adapts_to_the_traffic(Mode::Separate).await;
}

#[tokio::test]
async fn transactional_order_fixed_by_the_builder() {
    fixed_by_the_builder(Mode::Transactional).await;
}

#[tokio::test]
async fn separate_order_fixed_by_the_builder() {
    fixed_by_the_builder(Mode::Separate).await;
}
