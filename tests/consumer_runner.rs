//! The consumer runner without a broker: every outcome and the acknowledgement it gets, the
//! lease renewed under a long handler, `#[idempotent]` handlers (separate and transactional), and
//! many tasks delivering one message at once.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::consumer::testing::{Said, TestDelivery};
use idem::consumer::{
    Backoff, Consumer, DEFAULT_MAX_DELIVERIES, HandlerError, Message, Settlement,
};
use idem::store::{Operation, Reply};
use idem::{ClaimInfo, MemoryStore, SqliteStore, Store, idempotent};

use common::bank::LossyBank;

fn consumer(store: MemoryStore) -> Consumer<MemoryStore> {
    Consumer::new("fulfilment", store)
        .unwrap()
        .backoff(Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(2),
        })
}

/// A handler that counts its runs and answers the payload's length.
fn counting(
    runs: &Arc<AtomicUsize>,
) -> impl Fn(Message, ClaimInfo) -> std::future::Ready<Result<usize, HandlerError>> + Send + Sync + use<>
{
    let runs = runs.clone();
    move |msg, _claim| {
        runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(msg.payload.len()))
    }
}

#[tokio::test]
async fn completed_then_redelivered_is_acked_once_run_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let c = consumer(MemoryStore::new());
    let h = c.guarded(counting(&runs));
    let first = TestDelivery::new("m-1", "hello");
    assert_eq!(c.handle(&first, &h).await, Settlement::Completed);
    assert_eq!(first.said(), vec![Said::Ack]);
    for n in 2..5 {
        let again = TestDelivery::new("m-1", "hello").delivered(n);
        assert_eq!(c.handle(&again, &h).await, Settlement::Replayed);
        assert_eq!(again.said(), vec![Said::Ack]);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let stats = c.stats();
    assert_eq!((stats.completed, stats.replayed, stats.acked()), (1, 3, 4));
}

#[tokio::test]
async fn another_consumers_live_claim_is_retried_after_the_remaining_lease() {
    let store = MemoryStore::new();
    let c = consumer(store.clone()).lease(Duration::from_secs(30));
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let gate = std::sync::Mutex::new(Some((entered_tx, release_rx)));
    let slow = c.guarded(move |_msg: Message, _claim| {
        let gate = gate.lock().unwrap().take();
        async move {
            if let Some((entered, release)) = gate {
                let _ = entered.send(());
                let _ = release.await;
            }
            Ok::<_, HandlerError>(1u8)
        }
    });
    let first = TestDelivery::new("m-busy", "x");
    let (settled, second) = tokio::join!(c.handle(&first, &slow), async {
        entered_rx.await.unwrap();
        let second = TestDelivery::new("m-busy", "x").delivered(2);
        let s = c.handle(&second, &slow).await;
        release_tx.send(()).unwrap();
        (s, second)
    });
    assert_eq!(settled, Settlement::Completed);
    let (s, second) = second;
    match s {
        Settlement::InProgress(d) => {
            assert!(
                d > Duration::from_secs(25) && d <= Duration::from_secs(30),
                "{d:?}"
            )
        }
        other => panic!("expected in progress, got {other:?}"),
    }
    assert!(matches!(second.said()[..], [Said::Retry(d)] if d > Duration::from_secs(25)));
    assert_eq!(c.stats().in_progress, 1);
}

#[tokio::test]
async fn a_retryable_error_releases_the_claim_and_retries_with_backoff() {
    let runs = Arc::new(AtomicUsize::new(0));
    let c = consumer(MemoryStore::new());
    let r = runs.clone();
    let flaky = c.guarded(move |_msg: Message, _claim| {
        let n = r.fetch_add(1, Ordering::SeqCst);
        async move {
            if n < 2 {
                Err(HandlerError::transient("the warehouse API timed out"))
            } else {
                Ok(n)
            }
        }
    });
    let d1 = TestDelivery::new("m-flaky", "x");
    assert_eq!(
        c.handle(&d1, &flaky).await,
        Settlement::Retry(Duration::from_millis(50))
    );
    let d2 = TestDelivery::new("m-flaky", "x").delivered(2);
    assert_eq!(
        c.handle(&d2, &flaky).await,
        Settlement::Retry(Duration::from_millis(100))
    );
    let d3 = TestDelivery::new("m-flaky", "x").delivered(3);
    assert_eq!(c.handle(&d3, &flaky).await, Settlement::Completed);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(c.stats().retried, 2);
}

#[tokio::test]
async fn final_errors_reused_ids_missing_ids_and_the_limit_are_dead_lettered() {
    let runs = Arc::new(AtomicUsize::new(0));
    let c = consumer(MemoryStore::new()).max_deliveries(3);
    let r = runs.clone();
    let h = c.guarded(move |msg: Message, _claim| {
        r.fetch_add(1, Ordering::SeqCst);
        async move {
            match &msg.payload[..] {
                b"poison" => Err(HandlerError::permanent("no such order")),
                b"flaky" => Err(HandlerError::transient("down")),
                _ => Ok(()),
            }
        }
    });
    // A final error: dead-lettered on the first attempt.
    let poison = TestDelivery::new("m-poison", "poison");
    assert_eq!(
        c.handle(&poison, &h).await,
        Settlement::DeadLetter("no such order".into())
    );
    // The same id with another payload: never run.
    assert_eq!(
        c.handle(&TestDelivery::new("m-ok", "a"), &h).await,
        Settlement::Completed
    );
    let reused = TestDelivery::new("m-ok", "b").delivered(2);
    match c.handle(&reused, &h).await {
        Settlement::DeadLetter(r) => assert!(r.contains("different payload"), "{r}"),
        other => panic!("{other:?}"),
    }
    // No id at all: never run.
    let anonymous = TestDelivery::without_key("a");
    assert!(matches!(
        c.handle(&anonymous, &h).await,
        Settlement::DeadLetter(r) if r.contains("no id")
    ));
    // Retryable until the limit, then dead-lettered with the last error.
    let last = TestDelivery::new("m-flaky", "flaky").delivered(3);
    match c.handle(&last, &h).await {
        Settlement::DeadLetter(r) => {
            assert!(
                r.contains("delivery limit reached (3 of 3)") && r.ends_with("down"),
                "{r}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "poison, m-ok, flaky");
    let stats = c.stats();
    assert_eq!((stats.dead_lettered, stats.completed), (4, 1));
}

#[tokio::test]
async fn a_long_handler_is_kept_alive_and_its_lease_renewed() {
    let store = MemoryStore::new();
    // A 300 ms lease, a handler that runs 1.2 s: without renewals a redelivery would take over.
    let c = consumer(store.clone()).lease(Duration::from_millis(300));
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let slow = c.guarded(move |_msg: Message, _claim| {
        r.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_millis(1200)).await;
            Ok::<_, HandlerError>(())
        }
    });
    let first = TestDelivery::new("m-long", "x").keep_alive_every(Duration::from_millis(200));
    let (settled, probes) = tokio::join!(c.handle(&first, &slow), async {
        let mut probes = Vec::new();
        for n in 2..6 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let d = TestDelivery::new("m-long", "x").delivered(n);
            probes.push(c.handle(&d, &slow).await);
        }
        probes
    });
    assert_eq!(settled, Settlement::Completed);
    assert!(
        probes
            .iter()
            .all(|p| matches!(p, Settlement::InProgress(_))),
        "{probes:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never taken over");
    let keep_alives = first
        .said()
        .iter()
        .filter(|s| **s == Said::KeepAlive)
        .count();
    assert!(keep_alives >= 4, "{:?}", first.said());
    assert_eq!(first.said().last(), Some(&Said::Ack));
    assert!(c.stats().renewals >= 4, "{:?}", c.stats());
}

#[tokio::test]
async fn at_the_limit_a_message_in_progress_elsewhere_is_waited_for_not_dead_lettered() {
    let store = MemoryStore::new();
    let c = consumer(store.clone()).lease(Duration::from_secs(30));
    let h = c.guarded(|_msg: Message, _claim| async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Ok::<_, HandlerError>(7u32)
    });
    let first = TestDelivery::new("m-limit", "x");
    let last = TestDelivery::new("m-limit", "x")
        .delivered(3)
        .max_deliveries(3)
        .keep_alive_every(Duration::from_millis(200));
    let (a, b) = tokio::join!(c.handle(&first, &h), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.handle(&last, &h).await
    });
    assert_eq!(a, Settlement::Completed);
    assert_eq!(b, Settlement::Replayed, "{:?}", last.said());
    assert_eq!(c.stats().dead_lettered, 0);
}

#[idempotent(scope = "ship:<msg.consumer>", key = msg.key, store = store, skip(runs), retain = "7d")]
async fn ship(
    store: &MemoryStore,
    runs: &AtomicUsize,
    msg: Message,
) -> Result<String, HandlerError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let order: serde_json::Value = msg.json()?;
    Ok(format!("shipment for {}", order["orderNo"]))
}

#[tokio::test]
async fn idempotent_functions_are_handlers_and_their_replays_are_seen() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let c = consumer(store.clone());
    let (s, r) = (store.clone(), runs.clone());
    let h = move |msg: Message| {
        let (s, r) = (s.clone(), r.clone());
        async move { ship(&s, &r, msg).await }
    };
    let payload = r#"{"orderNo":"ORD-1"}"#;
    assert_eq!(
        c.handle(&TestDelivery::new("7", payload), &h).await,
        Settlement::Completed
    );
    assert_eq!(
        c.handle(&TestDelivery::new("7", payload).delivered(2), &h)
            .await,
        Settlement::Replayed
    );
    // Not JSON: final, dead-lettered at once.
    assert!(matches!(
        c.handle(&TestDelivery::new("8", "{oops"), &h).await,
        Settlement::DeadLetter(r) if r.contains("not the expected JSON")
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Records of another consumer name are other records: that consumer runs it too.
    let other = Consumer::new("audit", store.clone()).unwrap();
    assert_eq!(
        other.handle(&TestDelivery::new("7", payload), &h).await,
        Settlement::Completed
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// No `retain` of its own: it keeps its records as long as the consumer calling it does.
#[idempotent(scope = "ship-plain:<msg.consumer>", key = msg.key, store = store, skip(runs))]
async fn ship_plain(
    store: &MemoryStore,
    runs: &AtomicUsize,
    msg: Message,
) -> Result<usize, HandlerError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + msg.payload.len())
}

/// Its own `retain` wins over the consumer's.
#[idempotent(scope = "ship-short:<msg.consumer>", key = msg.key, store = store, skip(runs), retain = "1h")]
async fn ship_short(
    store: &MemoryStore,
    runs: &AtomicUsize,
    msg: Message,
) -> Result<usize, HandlerError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + msg.payload.len())
}

#[tokio::test]
async fn idempotent_functions_under_a_consumer_keep_records_as_long_as_it_does() {
    let clock = idem::ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let c = Consumer::new("fulfilment", store.clone()).unwrap();
    let (plain, short) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s, p, q) = (store.clone(), plain.clone(), short.clone());
    let h = move |msg: Message| {
        let (s, p, q) = (s.clone(), p.clone(), q.clone());
        async move {
            ship_plain(&s, &p, msg.clone()).await?;
            ship_short(&s, &q, msg).await
        }
    };
    assert_eq!(
        c.handle(&TestDelivery::new("m-old", "x"), &h).await,
        Settlement::Completed
    );
    // Two days on: past the 24h default and the 1h of `ship_short`, within the consumer's 7 days.
    clock.advance(Duration::from_secs(2 * 86_400));
    c.handle(&TestDelivery::new("m-old", "x").delivered(2), &h)
        .await;
    assert_eq!(
        plain.load(Ordering::SeqCst),
        1,
        "replayed from the consumer's 7 days"
    );
    assert_eq!(
        short.load(Ordering::SeqCst),
        2,
        "its own retain of 1h ran out"
    );
    // Outside a consumer, the attribute's defaults: 24h.
    let runs = AtomicUsize::new(0);
    let msg = |id: &str| Message {
        key: idem::Key::parse(id).unwrap(),
        payload: b"x".to_vec().into(),
        consumer: "direct".into(),
        subject: "s".into(),
        delivered: 1,
    };
    ship_plain(&store, &runs, msg("m-direct")).await.unwrap();
    clock.advance(Duration::from_secs(2 * 86_400));
    ship_plain(&store, &runs, msg("m-direct")).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "expired after 24h");
}

#[idempotent(scope = "ledger:<msg.consumer>", key = msg.key, store = store, transaction = tx, retain = "7d")]
async fn book(store: &SqliteStore, msg: Message) -> Result<i64, HandlerError> {
    let cents: i64 = msg.json()?;
    if cents < 0 {
        return Err(HandlerError::permanent("negative amount"));
    }
    sqlx::query("INSERT INTO ledger (msg, cents) VALUES ($1, $2)")
        .bind(msg.key.as_str())
        .bind(cents)
        .execute(&mut **tx)
        .await
        .map_err(HandlerError::transient)?;
    Ok(cents)
}

/// Fails for now, inside its transaction, and says which attempt it was.
#[idempotent(scope = "flaky:<msg.consumer>", key = msg.key, store = store, transaction = tx, claim = claim, skip(attempts), retain = "7d")]
async fn book_fails(
    store: &SqliteStore,
    attempts: &std::sync::Mutex<Vec<u32>>,
    msg: Message,
) -> Result<(), HandlerError> {
    attempts.lock().unwrap().push(claim.attempt());
    sqlx::query("INSERT INTO ledger (msg, cents) VALUES ($1, 1)")
        .bind(msg.key.as_str())
        .execute(&mut **tx)
        .await
        .map_err(HandlerError::transient)?;
    Err(HandlerError::transient("the bank is down"))
}

#[tokio::test]
async fn the_record_counts_attempts_where_the_broker_cannot() {
    // Every delivery says it is the first: the limit is reached by the record's count, in
    // separate commits (the claim is released) and in a transaction (rolled back).
    let c = consumer(MemoryStore::new()).max_deliveries(3);
    let h = c.guarded(|_msg: Message, _claim| async {
        Err::<(), _>(HandlerError::transient("the warehouse API timed out"))
    });
    for _ in 0..2 {
        let d = TestDelivery::new("m-1", "x");
        assert!(matches!(c.handle(&d, &h).await, Settlement::Retry(_)));
    }
    match c.handle(&TestDelivery::new("m-1", "x"), &h).await {
        Settlement::DeadLetter(r) => assert!(r.contains("(3 of 3)"), "{r}"),
        other => panic!("{other:?}"),
    }

    let store = SqliteStore::in_memory().await.unwrap();
    sqlx::query("CREATE TABLE ledger (msg TEXT PRIMARY KEY, cents INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let c = Consumer::new("ledger", store.clone())
        .unwrap()
        .max_deliveries(3);
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (s, a) = (store.clone(), attempts.clone());
    let h = move |msg: Message| {
        let (s, a) = (s.clone(), a.clone());
        async move { book_fails(&s, &a, msg).await }
    };
    let mut settled = Vec::new();
    for _ in 0..3 {
        settled.push(c.handle(&TestDelivery::new("pay-1", "1"), &h).await);
    }
    assert!(
        matches!(&settled[..], [Settlement::Retry(_), Settlement::Retry(_), Settlement::DeadLetter(r)] if r.contains("(3 of 3)")),
        "{settled:?}"
    );
    assert_eq!(*attempts.lock().unwrap(), [1, 2, 3]);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(rows, 0, "every attempt rolled back");
}

#[tokio::test]
async fn transactional_handlers_ack_after_commit_and_roll_back_failures() {
    let store = SqliteStore::in_memory().await.unwrap();
    sqlx::query("CREATE TABLE ledger (msg TEXT PRIMARY KEY, cents INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let c = Consumer::new("ledger", store.clone()).unwrap();
    let s = store.clone();
    let h = move |msg: Message| {
        let s = s.clone();
        async move { book(&s, msg).await }
    };
    for n in 1..=3 {
        let d = TestDelivery::new("pay-1", "250").delivered(n);
        let expected = if n == 1 {
            Settlement::Completed
        } else {
            Settlement::Replayed
        };
        assert_eq!(c.handle(&d, &h).await, expected);
    }
    assert!(matches!(
        c.handle(&TestDelivery::new("pay-2", "-5"), &h).await,
        Settlement::DeadLetter(_)
    ));
    let rows: Vec<(String, i64)> = sqlx::query_as("SELECT msg, cents FROM ledger")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(rows, vec![("pay-1".to_owned(), 250)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_delivering_one_message_run_it_once() {
    for round in 0..20 {
        let store = MemoryStore::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let c = consumer(store);
        let h = Arc::new(c.guarded(counting(&runs)));
        let mut tasks = Vec::new();
        for n in 1..=32 {
            let (c, h) = (c.clone(), h.clone());
            tasks.push(tokio::spawn(async move {
                let d = TestDelivery::new(&format!("m-{round}"), "x").delivered(n);
                c.handle(&d, &*h).await
            }));
        }
        let mut acked = 0;
        for t in tasks {
            let s = t.await.unwrap();
            assert!(
                s.is_ack() || matches!(s, Settlement::InProgress(_)),
                "{s:?}"
            );
            acked += usize::from(s.is_ack());
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "round {round}");
        assert!(acked >= 1);
        let stats = c.stats();
        assert_eq!(stats.completed, 1);
        assert_eq!(stats.replayed + stats.in_progress, 31);
    }
}

#[tokio::test]
async fn a_dead_letter_the_broker_does_not_take_is_retried_not_dropped() {
    let c = consumer(MemoryStore::new());
    let h = c.guarded(|_msg: Message, _claim| async {
        Err::<(), _>(HandlerError::permanent("no such order"))
    });
    let d = TestDelivery::new("m-poison", "x").dead_letters_fail();
    assert_eq!(
        c.handle(&d, &h).await,
        Settlement::Retry(Duration::from_millis(50))
    );
    // Asked for again, to be dead-lettered when it comes back: never acked, never dropped.
    assert_eq!(
        d.said(),
        vec![
            Said::DeadLetter("no such order".into()),
            Said::Retry(Duration::from_millis(50))
        ]
    );
    let stats = c.stats();
    assert_eq!(
        (stats.dead_lettered, stats.retried, stats.ack_failures),
        (0, 1, 1)
    );
    let again = TestDelivery::new("m-poison", "x").delivered(2);
    assert_eq!(
        c.handle(&again, &h).await,
        Settlement::DeadLetter("no such order".into())
    );
}

/// A nested step with a lease much shorter than the consumer's (five minutes): renewed only at
/// the consumer's pace, it would run out while the step works.
#[idempotent(scope = "short-lease:<msg.consumer>", key = msg.key, store = store, lease = "1s", skip(runs))]
async fn short_lease_step(
    store: &MemoryStore,
    runs: &AtomicUsize,
    msg: Message,
) -> Result<usize, HandlerError> {
    let n = runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    Ok(n + msg.payload.len())
}

#[tokio::test]
async fn a_nested_claim_with_a_shorter_lease_is_renewed_in_time() {
    let store = MemoryStore::new();
    let c = consumer(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let (s, r) = (store.clone(), runs.clone());
    let h = move |msg: Message| {
        let (s, r) = (s.clone(), r.clone());
        async move { short_lease_step(&s, &r, msg).await }
    };
    let first = TestDelivery::new("m-short", "x");
    let (settled, second) = tokio::join!(c.handle(&first, &h), async {
        // Past the step's one-second lease: a redelivery now takes over an unrenewed claim.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        c.handle(&TestDelivery::new("m-short", "x").delivered(2), &h)
            .await
    });
    assert_eq!(settled, Settlement::Completed);
    assert!(matches!(second, Settlement::InProgress(_)), "{second:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the step ran twice");
}

/// A handler that runs `short_lease_step` on a task of its own, spawned with the consumer's
/// context (`idem::context::spawn`) or without it (`tokio::spawn`).
fn spawning_short_step(
    store: &MemoryStore,
    runs: &Arc<AtomicUsize>,
    carry: bool,
) -> impl Fn(Message) -> std::pin::Pin<Box<dyn Future<Output = Result<usize, HandlerError>> + Send>>
+ Send
+ Sync
+ use<> {
    let (store, runs) = (store.clone(), runs.clone());
    move |msg: Message| {
        let (s, r) = (store.clone(), runs.clone());
        let step = async move { short_lease_step(&s, &r, msg).await };
        Box::pin(async move {
            let task = if carry {
                idem::context::spawn(step)
            } else {
                tokio::spawn(step)
            };
            task.await.map_err(HandlerError::transient)?
        })
    }
}

#[tokio::test]
async fn a_task_spawned_with_the_context_keeps_its_claim_renewed() {
    let store = MemoryStore::new();
    let c = consumer(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let h = spawning_short_step(&store, &runs, true);
    let first = TestDelivery::new("m-spawned", "x");
    let (settled, second) = tokio::join!(c.handle(&first, &h), async {
        // Past the step's one-second lease: only a renewed claim holds the redelivery off.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        c.handle(&TestDelivery::new("m-spawned", "x").delivered(2), &h)
            .await
    });
    assert_eq!(settled, Settlement::Completed);
    assert!(matches!(second, Settlement::InProgress(_)), "{second:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the step ran twice");
    assert!(c.stats().renewals >= 1, "{:?}", c.stats());
}

#[tokio::test]
async fn a_task_spawned_without_the_context_is_not_renewed_and_runs_twice() {
    let store = MemoryStore::new();
    let c = consumer(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let h = spawning_short_step(&store, &runs, false);
    let first = TestDelivery::new("m-unwatched", "x");
    let (settled, second) = tokio::join!(c.handle(&first, &h), async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        c.handle(&TestDelivery::new("m-unwatched", "x").delivered(2), &h)
            .await
    });
    // Nobody renewed the step's claim: its lease ran out and the redelivery took it over.
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(second, Settlement::Completed);
    assert_eq!(c.stats().renewals, 0, "{:?}", c.stats());
    // The first attempt's completion found the record taken over: not acked.
    assert!(matches!(settled, Settlement::Retry(_)), "{settled:?}");
}

#[tokio::test]
async fn a_task_spawned_with_the_context_keeps_the_consumers_retention() {
    let clock = idem::ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let c = Consumer::new("fulfilment", store.clone()).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let (s, r) = (store.clone(), runs.clone());
    let h = move |msg: Message| {
        let (s, r) = (s.clone(), r.clone());
        async move {
            // Spawned with the context when the message says so, without it otherwise.
            let carry = msg.payload == "carry";
            let step = async move { ship_plain(&s, &r, msg).await };
            let task = if carry {
                idem::context::spawn(step)
            } else {
                tokio::spawn(step)
            };
            task.await.map_err(HandlerError::transient)?
        }
    };
    for (key, payload) in [("m-carried", "carry"), ("m-dropped", "drop")] {
        assert_eq!(
            c.handle(&TestDelivery::new(key, payload), &h).await,
            Settlement::Completed
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // A redelivery replays either way; only a carried context lets the consumer see it.
    let redeliver = |key: &'static str, payload: &'static str, n: u32| {
        let (c, h) = (&c, &h);
        async move {
            c.handle(&TestDelivery::new(key, payload).delivered(n), h)
                .await
        }
    };
    assert_eq!(
        redeliver("m-carried", "carry", 2).await,
        Settlement::Replayed
    );
    assert_eq!(
        redeliver("m-dropped", "drop", 2).await,
        Settlement::Completed,
        "a replay on a task without the context is not seen as one"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Two days on: past the 24h default, within the consumer's 7 days.
    clock.advance(Duration::from_secs(2 * 86_400));
    assert_eq!(
        redeliver("m-carried", "carry", 3).await,
        Settlement::Replayed
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "replayed from the consumer's 7 days"
    );
    assert_eq!(
        redeliver("m-dropped", "drop", 3).await,
        Settlement::Completed
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "without the context the record was kept 24h: the work ran again"
    );
}

#[tokio::test]
async fn a_handler_learns_its_claim_was_taken_over_and_is_not_acked() {
    let clock = idem::ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let c = consumer(store.clone())
        .lease(Duration::from_secs(10))
        .keep_alive(Duration::from_millis(50));
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let gate = std::sync::Mutex::new(Some(entered_tx));
    let learnt = Arc::new(AtomicUsize::new(0));
    let l = learnt.clone();
    let h = c.guarded(move |_msg: Message, claim: ClaimInfo| {
        let first = gate.lock().unwrap().take();
        let learnt = l.clone();
        async move {
            if let Some(entered) = first {
                let _ = entered.send(());
                // Works until told its claim is gone (or 5 s pass).
                if tokio::time::timeout(Duration::from_secs(5), claim.lost())
                    .await
                    .is_ok()
                {
                    assert!(claim.is_lost());
                    learnt.fetch_add(1, Ordering::SeqCst);
                }
                return Ok::<_, HandlerError>(1u8);
            }
            Ok(2)
        }
    });
    let first = TestDelivery::new("m-lost", "x");
    let started = std::time::Instant::now();
    let (settled, second) = tokio::join!(c.handle(&first, &h), async {
        entered_rx.await.unwrap();
        // The first attempt's lease runs out (its process stalled, say) and a redelivery takes
        // the record over.
        clock.advance(Duration::from_secs(11));
        c.handle(&TestDelivery::new("m-lost", "x").delivered(2), &h)
            .await
    });
    assert_eq!(second, Settlement::Completed);
    assert_eq!(
        learnt.load(Ordering::SeqCst),
        1,
        "the first attempt was told"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "told at the next renewal"
    );
    assert!(matches!(settled, Settlement::Retry(_)), "{settled:?}");
    assert!(!first.said().contains(&Said::Ack), "{:?}", first.said());
    // The redelivery of the first is answered by the record of the second.
    let again = TestDelivery::new("m-lost", "x").delivered(3);
    assert_eq!(c.handle(&again, &h).await, Settlement::Replayed);
}

/// A step that works 500 ms on its first run, and reports when it started.
#[idempotent(scope = "step:<msg.consumer>", key = msg.key, store = store, skip(entered))]
async fn slow_step(
    store: &MemoryStore,
    entered: Option<tokio::sync::oneshot::Sender<()>>,
    msg: Message,
) -> Result<usize, HandlerError> {
    if let Some(entered) = entered {
        let _ = entered.send(());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(msg.payload.len())
}

#[tokio::test]
async fn a_handler_that_swallows_the_loss_of_its_claim_is_not_acked() {
    let clock = idem::ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let c = consumer(store.clone())
        .lease(Duration::from_secs(10))
        .keep_alive(Duration::from_millis(50));
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let gate = Arc::new(std::sync::Mutex::new(Some(entered_tx)));
    let s = store.clone();
    // It ignores what its step says: the runner must look at the claims itself.
    let h = move |msg: Message| {
        let (s, entered) = (s.clone(), gate.lock().unwrap().take());
        async move {
            let _ = slow_step(&s, entered, msg).await;
            Ok::<_, HandlerError>(())
        }
    };
    let first = TestDelivery::new("m-swallow", "x");
    let (settled, ()) = tokio::join!(c.handle(&first, &h), async {
        entered_rx.await.unwrap();
        clock.advance(Duration::from_secs(11));
        // Another worker takes the step over and completes it.
        let msg = Message {
            key: idem::Key::parse("m-swallow").unwrap(),
            payload: b"x".to_vec().into(),
            consumer: "fulfilment".into(),
            subject: "test".into(),
            delivered: 2,
        };
        idem::flow::with_default_policy(
            idem::Policy::DEFAULT.lease(Duration::from_secs(10)),
            slow_step(&store, None, msg),
        )
        .await
        .unwrap();
    });
    assert!(matches!(settled, Settlement::Retry(_)), "{settled:?}");
    assert!(!first.said().contains(&Said::Ack), "{:?}", first.said());
}

/// A store whose completions fail as unavailable while it is "down"; everything else works.
#[derive(Clone)]
struct CompletionsDown {
    inner: MemoryStore,
    down: Arc<std::sync::atomic::AtomicBool>,
    refused: Arc<AtomicUsize>,
}

impl CompletionsDown {
    fn new() -> Self {
        CompletionsDown {
            inner: MemoryStore::new(),
            down: Arc::default(),
            refused: Arc::default(),
        }
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
}

impl idem::Store for CompletionsDown {
    async fn call(&self, op: Operation<'_>) -> idem::Result<Reply> {
        if let Operation::Complete { .. } = op
            && self.down.load(Ordering::SeqCst)
        {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(idem::Error::Unavailable("the store is down".into()));
        }
        self.inner.call(op).await
    }
    fn defer(&self, write: idem::store::Deferred) {
        self.inner.defer(write)
    }
}

#[tokio::test]
async fn a_completion_the_store_refused_is_retried_while_the_lease_lives() {
    let store = CompletionsDown::new();
    let c = Consumer::new("fulfilment", store.clone())
        .unwrap()
        .lease(Duration::from_secs(3));
    let runs = Arc::new(AtomicUsize::new(0));
    let h = c.guarded(counting(&runs));
    store.set_down(true);
    let d = TestDelivery::new("m-1", "hello");
    let (settled, ()) = tokio::join!(c.handle(&d, &h), async {
        // Down for a second and a half: longer than a brief retry, shorter than the lease.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        store.set_down(false);
    });
    assert_eq!(settled, Settlement::Completed);
    assert_eq!(d.said().last(), Some(&Said::Ack));
    assert!(store.refused.load(Ordering::SeqCst) > 3);
    let record = store.lookup(c.scope(), "m-1").await.unwrap().unwrap();
    assert_eq!(record.state, idem::RecordState::Completed);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_completion_that_could_not_be_stored_is_not_acked_and_runs_again_after_the_lease() {
    let store = CompletionsDown::new();
    let c = Consumer::new("fulfilment", store.clone())
        .unwrap()
        .lease(Duration::from_secs(1))
        .backoff(Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(2),
        });
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let a = attempts.clone();
    let h = c.guarded(move |_msg: Message, claim: ClaimInfo| {
        a.lock().unwrap().push(claim.attempt());
        async { Ok::<_, HandlerError>(7u8) }
    });
    store.set_down(true);
    let d = TestDelivery::new("m-1", "hello");
    let started = std::time::Instant::now();
    let settled = c.handle(&d, &h).await;
    // Retried for the lease's life (a second), then given up: never acked.
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(settled, Settlement::Retry(Duration::from_millis(50)));
    assert!(!d.said().contains(&Said::Ack), "{:?}", d.said());
    store.set_down(false);
    // The redelivery re-claims once the claim's lease ran out, and this time it is recorded.
    let mut n = 2;
    let settled = loop {
        let again = TestDelivery::new("m-1", "hello").delivered(n);
        match c.handle(&again, &h).await {
            Settlement::InProgress(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            other => break other,
        }
        n += 1;
    };
    assert_eq!(settled, Settlement::Completed);
    assert_eq!(*attempts.lock().unwrap(), vec![1, 2]);
}

/// A memory store whose releases fail: the connection went away between a body and its
/// release.
#[derive(Clone)]
struct ReleaseFails(MemoryStore);

impl Store for ReleaseFails {
    async fn call(&self, op: Operation<'_>) -> idem::Result<Reply> {
        match op {
            Operation::Release(_) => {
                Err(idem::Error::Unavailable("connection reset by peer".into()))
            }
            op => self.0.call(op).await,
        }
    }
    fn defer(&self, write: idem::store::Deferred) {
        self.0.defer(write)
    }
}

/// What a test's tracing subscriber wrote.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

#[tokio::test]
async fn a_release_that_fails_after_an_error_is_logged_with_its_error() {
    let logs = Logs::default();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .finish(),
    );
    let c = Consumer::new("fulfilment", ReleaseFails(MemoryStore::new()))
        .unwrap()
        .lease(Duration::from_secs(30));
    let h = c.guarded(|_msg: Message, _claim| async {
        Err::<(), _>(HandlerError::transient("the warehouse API timed out"))
    });
    assert!(matches!(
        c.handle(&TestDelivery::new("m-1", "x"), &h).await,
        Settlement::Retry(_)
    ));
    let text = logs.text();
    assert!(
        text.contains("could not release a claim after its body failed")
            && text.contains("connection reset by peer")
            && text.contains("m-1"),
        "{text}"
    );
    // What it costs: the claim stays, and the redelivery waits for its lease.
    assert!(matches!(
        c.handle(&TestDelivery::new("m-1", "x").delivered(2), &h).await,
        Settlement::InProgress(d) if d > Duration::from_secs(25)
    ));
}

fn stream_of(
    deliveries: &[TestDelivery],
) -> impl futures_util::Stream<Item = Result<TestDelivery, std::convert::Infallible>> + use<> {
    let owned: Vec<_> = deliveries.iter().cloned().map(Ok).collect();
    futures_util::stream::iter(owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_mode_runs_a_partition_in_order_and_holds_its_retries_in_place() {
    use common::partitions::{PartitionLog, events};
    let log = PartitionLog::default();
    let c = consumer(MemoryStore::new())
        .ordered(true)
        .keep_alive(Duration::from_millis(10));
    let h = c.guarded(log.handler());
    let deliveries: Vec<TestDelivery> = events("t", 3, 9)
        .iter()
        .map(|e| TestDelivery::new(&e.id, e.payload.clone()).partition(&e.partition_key))
        .collect();
    c.run(stream_of(&deliveries), h, 6).await;
    log.check(3, 9).unwrap();
    assert!(log.most_at_once() > 1, "partitions ran concurrently");
    // Every third event failed once: held and run again here, never given back to the broker
    // (which would let the partition's next delivery overtake it), then acked.
    for d in &deliveries {
        let said = d.said();
        assert!(
            !said.iter().any(|s| matches!(s, Said::Retry(_))),
            "{said:?}"
        );
        assert_eq!(said.last(), Some(&Said::Ack), "{said:?}");
    }
    let stats = c.stats();
    assert_eq!((stats.completed, stats.retried), (27, 9), "{stats:?}");
}

#[tokio::test]
async fn ordered_mode_lets_a_partition_go_on_after_a_dead_letter() {
    let c = consumer(MemoryStore::new()).ordered(true);
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let o = order.clone();
    let h = c.guarded(move |msg: Message, _claim| {
        o.lock().unwrap().push(msg.key.as_str().to_owned());
        async move {
            match &msg.payload[..] {
                b"poison" => Err(HandlerError::permanent("no such order")),
                _ => Ok(()),
            }
        }
    });
    let deliveries = [
        TestDelivery::new("m-0", "poison").partition("P"),
        TestDelivery::new("m-1", "ok").partition("P"),
    ];
    c.run(stream_of(&deliveries), h, 4).await;
    assert_eq!(*order.lock().unwrap(), ["m-0", "m-1"]);
    assert!(matches!(deliveries[0].said()[..], [Said::DeadLetter(_)]));
    assert_eq!(deliveries[1].said(), [Said::Ack]);
}

#[tokio::test]
async fn ordered_mode_counts_the_runs_it_holds_toward_the_delivery_limit() {
    let c = consumer(MemoryStore::new()).ordered(true).max_deliveries(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let h = c.guarded(move |_msg: Message, _claim| {
        r.fetch_add(1, Ordering::SeqCst);
        async { Err::<(), _>(HandlerError::transient("down")) }
    });
    let d = TestDelivery::new("m-1", "x").partition("P");
    match c.handle(&d, &h).await {
        Settlement::DeadLetter(r) => assert!(r.contains("(3 of 3)"), "{r}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert!(matches!(d.said().last(), Some(Said::DeadLetter(_))));
    assert!(!d.said().iter().any(|s| matches!(s, Said::Retry(_))));
}

#[tokio::test]
async fn a_message_that_keeps_failing_for_now_is_dead_lettered_at_the_default_limit() {
    // No `max_deliveries`: a broker that never stops redelivering (a JetStream consumer must
    // leave its own limit unlimited) would otherwise retry it for as long as it keeps it.
    let c = consumer(MemoryStore::new());
    let h = c.guarded(|_msg: Message, _claim| async {
        Err::<(), _>(HandlerError::transient("the warehouse API timed out"))
    });
    let mut settled = Vec::new();
    for n in 1..=100 {
        let s = c
            .handle(&TestDelivery::new("m-1", "x").delivered(n), &h)
            .await;
        let dead = matches!(s, Settlement::DeadLetter(_));
        settled.push(s);
        if dead {
            break;
        }
    }
    let limit = DEFAULT_MAX_DELIVERIES;
    match settled.last() {
        Some(Settlement::DeadLetter(r)) => {
            assert!(r.contains(&format!("({limit} of {limit})")), "{r}")
        }
        other => panic!("never dead-lettered in 100 deliveries: {other:?}"),
    }
    assert_eq!(settled.len(), limit as usize);
    assert!(
        settled[..settled.len() - 1]
            .iter()
            .all(|s| matches!(s, Settlement::Retry(_))),
        "{settled:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_mode_goes_on_with_other_partitions_while_one_waits_behind_a_failing_head() {
    // Two slots; partition A's head fails for now on every run, and nine more of A's wait
    // behind it; B's five come after all of them.
    let c = consumer(MemoryStore::new())
        .ordered(true)
        .keep_alive(Duration::from_millis(10))
        .backoff(Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(20),
        });
    let calls = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = calls.clone();
    let h = c.guarded(move |msg: Message, _claim| {
        log.lock().unwrap().push(msg.key.as_str().to_owned());
        async move {
            match msg.key.as_str() {
                "a-0" => Err(HandlerError::transient("the warehouse API timed out")),
                _ => Ok(()),
            }
        }
    });
    let mut deliveries: Vec<TestDelivery> = (0..10)
        .map(|i| TestDelivery::new(&format!("a-{i}"), "x").partition("A"))
        .collect();
    deliveries.extend((0..5).map(|i| TestDelivery::new(&format!("b-{i}"), "x").partition("B")));
    tokio::time::timeout(Duration::from_secs(20), c.run(stream_of(&deliveries), h, 2))
        .await
        .expect("every partition went on: A's head held its partition, not the runner");
    let calls = calls.lock().unwrap().clone();
    let last = |key: &str| calls.iter().rposition(|k| k == key).unwrap();
    let head_runs = calls.iter().filter(|k| *k == "a-0").count();
    // B ran while A's head was still being retried, not after it was given up.
    assert!(last("b-4") < last("a-0"), "{calls:?}");
    // A's head was dead-lettered at its limit, and A's others then ran, in order, once each.
    match deliveries[0].said().last() {
        Some(Said::DeadLetter(r)) => assert!(r.contains("delivery limit reached"), "{r}"),
        other => panic!("A's head: {other:?}"),
    }
    assert!(head_runs > 1, "{calls:?}");
    let rest: Vec<&String> = calls
        .iter()
        .filter(|k| k.starts_with("a-") && *k != "a-0")
        .collect();
    let expected: Vec<String> = (1..10).map(|i| format!("a-{i}")).collect();
    assert_eq!(rest, expected.iter().collect::<Vec<_>>());
    assert!(calls.iter().position(|k| k == "a-1").unwrap() > last("a-0"));
    for d in &deliveries[1..] {
        assert_eq!(d.said().last(), Some(&Said::Ack), "{:?}", d.said());
    }
}

#[tokio::test]
async fn an_unknown_outcome_is_never_acked_nor_dead_lettered_at_once_and_its_redelivery_resumes() {
    use idem::store::{RecordQuery, StoreAdmin};
    let store = MemoryStore::new();
    let c = consumer(store.clone()).max_deliveries(5);
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = attempts.clone();
    let h = c.guarded(move |_msg: Message, claim: ClaimInfo| {
        seen.lock().unwrap().push(claim.attempt());
        async move {
            if claim.attempt() == 1 {
                // The bank timed out: the transfer may have happened. Even an error the handler
                // calls permanent must not drop the message while its effect is unknown.
                claim.outcome_unknown("the bank timed out");
                return Err(HandlerError::permanent("the bank timed out"));
            }
            Ok(())
        }
    });
    let first = TestDelivery::new("m-unknown", "pay");
    let settled = c.handle(&first, &h).await;
    assert!(matches!(settled, Settlement::Retry(_)), "{settled:?}");
    assert!(!first.said().contains(&Said::Ack), "{:?}", first.said());
    let kept = store.list(&RecordQuery::new()).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].state, idem::lifecycle::State::InProgress);
    assert_eq!(kept[0].note.as_deref(), Some("the bank timed out"));
    let again = TestDelivery::new("m-unknown", "pay").delivered(2);
    assert_eq!(c.handle(&again, &h).await, Settlement::Completed);
    assert_eq!(
        *attempts.lock().unwrap(),
        [1, 2],
        "the redelivery resumed the claim"
    );
}

/// A guarded step inside a handler that says its outcome is unknown.
#[idempotent(scope = "unknown-step", key = msg.key, store = store, claim = claim)]
async fn unknown_step(store: &MemoryStore, msg: Message) -> Result<(), HandlerError> {
    claim.outcome_unknown("the gateway's answer was lost");
    Err(HandlerError::transient("the gateway's answer was lost"))
}

#[tokio::test]
async fn a_handler_that_swallows_an_unknown_outcome_is_not_acked() {
    let store = MemoryStore::new();
    let c = consumer(store.clone());
    let s = store.clone();
    let h = move |msg: Message| {
        let s = s.clone();
        async move {
            // The handler ignores the step's error and says it is done.
            let _ = unknown_step(&s, msg).await;
            Ok::<(), HandlerError>(())
        }
    };
    let d = TestDelivery::new("m-swallow", "x");
    let settled = c.handle(&d, &h).await;
    assert!(matches!(settled, Settlement::Retry(_)), "{settled:?}");
    assert!(!d.said().contains(&Said::Ack), "{:?}", d.said());
}

// ---- resumable consumers and the completer ----------------------------------------------------

/// Delivers `key` until the consumer's limit of three: each ends unknown, the last is
/// dead-lettered.
async fn deliver_until_dead_lettered<M, H: idem::consumer::Handler<M>>(
    c: &Consumer<MemoryStore>,
    h: &H,
    key: &str,
) {
    for n in 1..=3 {
        let d = TestDelivery::new(key, "250").delivered(n);
        let settled = c.handle(&d, h).await;
        if n < 3 {
            assert!(matches!(settled, Settlement::Retry(_)), "{n}: {settled:?}");
        } else {
            match settled {
                Settlement::DeadLetter(why) => assert!(why.contains("delivery limit"), "{why}"),
                other => panic!("{other:?}"),
            }
        }
        assert!(!d.said().contains(&Said::Ack), "{:?}", d.said());
    }
}

#[tokio::test]
async fn a_message_left_unknown_at_the_delivery_limit_is_finished_by_the_completer_once() {
    use idem::completer::Completer;
    use idem::lifecycle::State;
    use idem::store::StoreAdmin;
    let clock = idem::ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let bank = Arc::new(LossyBank::default());
    let handler = |c: &Consumer<MemoryStore>| {
        let bank = bank.clone();
        c.guarded(move |msg: Message, claim: ClaimInfo| {
            let paid = bank.pay(&claim, &msg.payload);
            async move { paid }
        })
    };
    let resumable = consumer(store.clone()).max_deliveries(3).resumable();
    let h = handler(&resumable);
    // A consumer that is not resumable, for comparison: its kept claim has nobody to finish it.
    let plain = Consumer::new("audit", store.clone())
        .unwrap()
        .max_deliveries(3);
    let plain_h = handler(&plain);
    deliver_until_dead_lettered(&resumable, &h, "m-1").await;
    deliver_until_dead_lettered(&plain, &plain_h, "m-2").await;
    assert_eq!((bank.runs(), bank.moves()), (6, 2));
    let kept = store
        .inspect("consumer:fulfilment", "m-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (kept.state, kept.attempt),
        (State::InProgress, 3),
        "{kept:?}"
    );
    assert!(
        kept.resumable,
        "the message is stored with the claim: {kept:?}"
    );

    // The broker gave up; the bank is back. The completer, given the consumer's own handler,
    // finishes the message once its resume delay has passed.
    bank.fix();
    let completer = Completer::new(store.clone()).consumer(&resumable, h.clone());
    assert_eq!(
        completer.run_once().await.unwrap().due,
        0,
        "not before its delay"
    );
    clock.advance(Duration::from_secs(10));
    let round = completer.run_once().await.unwrap();
    assert_eq!((round.due, round.completed), (1, 1), "{round:?}");
    assert_eq!(bank.runs(), 7, "the handler ran once more");
    assert_eq!(
        bank.moves(),
        2,
        "under the same downstream key: no second payment"
    );
    let done = store
        .inspect("consumer:fulfilment", "m-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.state, State::Completed, "{done:?}");
    assert_eq!(
        &done.response.unwrap().body[..],
        br#""paid 250 on attempt 4""#
    );
    assert_eq!(completer.run_once().await.unwrap().due, 0, "nothing left");

    // The dead letter, re-driven under its key, is a replay: acked, not run again.
    let redriven = TestDelivery::new("m-1", "250");
    assert_eq!(resumable.handle(&redriven, &h).await, Settlement::Replayed);
    assert_eq!(redriven.said(), vec![Said::Ack]);
    assert_eq!(bank.runs(), 7);
    // The consumer that is not resumable left its claim unfinished, and no completer can
    // finish it: only a delivery of the message can.
    let stuck = store
        .inspect("consumer:audit", "m-2")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stuck.state, State::InProgress, "{stuck:?}");
    assert!(!stuck.resumable);
}

/// A step of a handler, guarded by `#[idempotent]`: what most consumers write.
#[idempotent(scope = "pay:<msg.consumer>", key = msg.key, store = store, claim = claim, skip(bank))]
async fn pay_step(
    store: &MemoryStore,
    bank: &LossyBank,
    msg: Message,
) -> Result<String, HandlerError> {
    bank.pay(&claim, &msg.payload)
}

#[tokio::test]
async fn a_resumable_consumers_idempotent_handler_is_finished_by_the_completer_too() {
    use idem::completer::Completer;
    use idem::lifecycle::State;
    use idem::store::StoreAdmin;
    let clock = idem::ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let bank = Arc::new(LossyBank::default());
    let c = consumer(store.clone()).max_deliveries(3).resumable();
    let (s, b) = (store.clone(), bank.clone());
    // A closure the runner and the completer both run: the same code, no copy.
    let h = move |msg: Message| {
        let (s, b) = (s.clone(), b.clone());
        async move { pay_step(&s, &b, msg).await }
    };
    deliver_until_dead_lettered(&c, &h, "m-3").await;
    let kept = store
        .inspect("pay:fulfilment", "m-3")
        .await
        .unwrap()
        .unwrap();
    assert!(
        kept.resumable,
        "the message is stored with the step's claim: {kept:?}"
    );
    bank.fix();
    let completer = Completer::new(store.clone()).consumer(&c, h.clone());
    clock.advance(Duration::from_secs(10));
    let round = completer.run_once().await.unwrap();
    assert_eq!((round.due, round.completed), (1, 1), "{round:?}");
    assert_eq!((bank.runs(), bank.moves()), (4, 1));
    let done = store
        .inspect("pay:fulfilment", "m-3")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.state, State::Completed, "{done:?}");
    let redriven = TestDelivery::new("m-3", "250");
    assert_eq!(c.handle(&redriven, &h).await, Settlement::Replayed);
    assert_eq!(bank.runs(), 4);
}

#[tokio::test]
async fn a_resumable_consumers_message_past_its_size_cap_is_dead_lettered_unrun() {
    let runs = Arc::new(AtomicUsize::new(0));
    let c = consumer(MemoryStore::new())
        .resumable()
        .max_request(idem::RequestCap::new(64).unwrap());
    let h = c.guarded(counting(&runs));
    let small = TestDelivery::new("m-small", "a short one");
    assert_eq!(c.handle(&small, &h).await, Settlement::Completed);
    let large = TestDelivery::new("m-large", "x".repeat(100));
    match c.handle(&large, &h).await {
        Settlement::DeadLetter(why) => {
            assert!(why.contains("stores at most 64"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the large one never ran");
}

#[tokio::test]
async fn a_parked_messages_delivery_is_dead_lettered_at_once_saying_so() {
    use idem::completer::Completer;
    let clock = idem::ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let bank = Arc::new(LossyBank::default());
    let c = consumer(store.clone()).max_deliveries(3).resumable();
    let b = bank.clone();
    let h = c.guarded(move |msg: Message, claim: ClaimInfo| {
        let paid = b.pay(&claim, &msg.payload);
        async move { paid }
    });
    deliver_until_dead_lettered(&c, &h, "m-4").await;
    // A completer whose attempts are spent already parks it, for an operator.
    let completer = Completer::new(store.clone())
        .consumer(&c, h.clone())
        .max_attempts(3);
    clock.advance(Duration::from_secs(10));
    let round = completer.run_once().await.unwrap();
    assert_eq!((round.due, round.parked), (1, 1), "{round:?}");
    let redriven = TestDelivery::new("m-4", "250");
    match c.handle(&redriven, &h).await {
        Settlement::DeadLetter(why) => assert!(why.contains("parked"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(bank.runs(), 3, "parked work is never run by a delivery");
}
