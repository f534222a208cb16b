//! The metrics a dashboard reads: the refund service's `/metrics` in the Prometheus text
//! format, and the counters of the background purge and the consumer runner, by name.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::completer::{Completer, Resumption};
use idem::consumer::testing::TestDelivery;
use idem::consumer::{Consumer, HandlerError, Message, Settlement};
use idem::{
    Begun, Fingerprint, Key, ManualClock, MemoryStore, MySqlStore, Policy, SqliteStore, Store,
    StoredResponse, idempotent,
};

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

crate::on_every_database!(the_refund_service_serves_its_counters_in_the_prometheus_text_format);

/// The refund service on the database at `url`: a first run, its replay and a reused key, as
/// its `/metrics` counts them.
async fn the_refund_service_serves_its_counters_in_the_prometheus_text_format(url: &str) {
    let mut child = Command::new(common::example_binary("refund_service"))
        .env("IDEM_ADDR", "127.0.0.1:0")
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .env_remove("NATS_URL")
        .env_remove("IDEM_STORE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the example");
    let mut line = String::new();
    // Kept open while the service runs: it logs to stdout (a warning for the reused key).
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut line).unwrap();
    let _process = Process(child);
    let base = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    // A first run, its replay, and the key reused for another body.
    for body in [
        r#"{"skuId": 1, "qty": 1}"#,
        r#"{"skuId": 1, "qty": 1}"#,
        r#"{"skuId": 2, "qty": 1}"#,
    ] {
        c.post(format!("{base}/api/orders"))
            .header("Idempotency-Key", "metrics-key")
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
    }
    let res = c.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let kind = res.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(kind.starts_with("text/plain"), "{kind}");
    let text = res.text().await.unwrap();
    for (outcome, n) in [
        ("claimed", 1),
        ("completed", 1),
        ("replayed", 1),
        ("key_reused", 1),
    ] {
        let sample = format!("idem_outcomes_total{{outcome=\"{outcome}\"}} {n}");
        assert!(
            text.lines().any(|l| l == sample),
            "no {sample:?} in\n{text}"
        );
    }
    assert!(
        text.contains("# TYPE idem_outcomes_total counter"),
        "{text}"
    );
}

/// Counter values and gauges by name and labels (`name{label="value"}`), from a recorder of
/// our own.
#[derive(Clone, Default)]
struct Counters(
    Arc<Mutex<BTreeMap<String, u64>>>,
    Arc<Mutex<BTreeMap<String, f64>>>,
);

struct Count(String, Counters);

impl metrics::CounterFn for Count {
    fn increment(&self, value: u64) {
        *self.1.0.lock().unwrap().entry(self.0.clone()).or_default() += value;
    }
    fn absolute(&self, value: u64) {
        self.1.0.lock().unwrap().insert(self.0.clone(), value);
    }
}

struct Level(String, Counters);

impl metrics::GaugeFn for Level {
    fn increment(&self, value: f64) {
        *self.1.1.lock().unwrap().entry(self.0.clone()).or_default() += value;
    }
    fn decrement(&self, value: f64) {
        *self.1.1.lock().unwrap().entry(self.0.clone()).or_default() -= value;
    }
    fn set(&self, value: f64) {
        self.1.1.lock().unwrap().insert(self.0.clone(), value);
    }
}

/// `name{label="value",…}`, as the recorder files a metric.
fn label(key: &metrics::Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}=\"{}\"", l.key(), l.value()))
        .collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl metrics::Recorder for Counters {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(Arc::new(Count(label(key), self.clone())))
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(Arc::new(Level(label(key), self.clone())))
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

impl Counters {
    fn get(&self, name: &str) -> u64 {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }

    /// A gauge's value, `None` while it was never set.
    fn level(&self, name: &str) -> Option<f64> {
        self.1.lock().unwrap().get(name).copied()
    }

    /// What `run` counts. The recorder is the thread's: `run` goes on a current-thread runtime,
    /// which runs every task on this thread.
    fn of<F: Future<Output = ()>>(run: impl FnOnce() -> F) -> Counters {
        let counters = Counters::default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        metrics::with_local_recorder(&counters, || rt.block_on(run()));
        counters
    }
}

#[test]
fn the_background_purge_and_the_consumer_count_what_they_did() {
    let counters = Counters::of(|| async {
        let store = SqliteStore::builder()
            .purge_every(Duration::from_millis(50))
            .connect("sqlite::memory:")
            .await
            .unwrap();
        two_records_expire(&store).await;

        let consumer = Consumer::new("metrics", MemoryStore::new()).unwrap();
        let handler = consumer.guarded(|msg: Message, _claim| async move {
            Ok::<_, HandlerError>(msg.payload.len())
        });
        let first = TestDelivery::new("m-1", "hello");
        assert_eq!(
            consumer.handle(&first, &handler).await,
            Settlement::Completed
        );
        let again = TestDelivery::new("m-1", "hello").delivered(2);
        assert_eq!(
            consumer.handle(&again, &handler).await,
            Settlement::Replayed
        );
    });
    assert_eq!(
        counters.get("idem_purged_records_total{store=\"idem_records\",database=\"sqlite\"}"),
        2,
        "{:?}",
        counters.0.lock().unwrap()
    );
    for settlement in ["completed", "replayed"] {
        assert_eq!(
            counters.get(&format!(
                "idem_consumer_settlements_total{{settlement=\"{settlement}\"}}"
            )),
            1,
            "{settlement}"
        );
    }
}

/// A refund whose gateway answer is lost while `lost` says so; resumable.
#[idempotent(scope = "refund:<order_no>", key = key, store = store, claim = claim, skip(lost), resumable)]
async fn refund(
    store: &MemoryStore,
    lost: &AtomicBool,
    order_no: u32,
    key: String,
) -> Result<u32, idem::Error> {
    if lost.load(Ordering::SeqCst) {
        claim.outcome_unknown("the gateway's answer was lost");
        return Err(idem::Error::Unavailable(
            "the gateway's answer was lost".into(),
        ));
    }
    Ok(order_no)
}

/// The same, not resumable: only its client's retry can finish it.
#[idempotent(scope = "ship:<order_no>", key = key, store = store, claim = claim)]
async fn ship(store: &MemoryStore, order_no: u32, key: String) -> Result<u32, idem::Error> {
    claim.outcome_unknown("the carrier's answer was lost");
    Err(idem::Error::Unavailable(
        "the carrier's answer was lost".into(),
    ))
}

#[test]
fn the_completer_counts_what_it_resumed_and_parked_and_gauges_all_unfinished_work() {
    let counters = Counters::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let lost = Arc::new(AtomicBool::new(true));
    let unknown = |r: Result<u32, idem::Error>| assert!(r.is_err(), "{r:?}");
    metrics::with_local_recorder(&counters, || {
        rt.block_on(async {
            // Two resumable refunds whose answers were lost, one of them twice, and, ten
            // seconds later, a shipment that is not resumable.
            unknown(refund(&store, &lost, 1, "k-1".into()).await);
            unknown(refund(&store, &lost, 2, "k-2".into()).await);
            unknown(refund(&store, &lost, 2, "k-2".into()).await);
            clock.advance(Duration::from_secs(10));
            unknown(ship(&store, 3, "k-3".into()).await);
            clock.advance(Duration::from_secs(90));
            lost.store(false, Ordering::SeqCst);

            // One due claim a round; refund 2 has spent its two attempts.
            let (s, l) = (store.clone(), lost.clone());
            let completer = Completer::new(store.clone())
                .resume("refund:<order_no>", move |r: Resumption| {
                    let (s, l) = (s.clone(), l.clone());
                    async move { refund(&s, &l, r.arg("order_no")?, r.key().to_string()).await }
                })
                .batch(1)
                .max_attempts(2)
                .count_every(Duration::ZERO);
            completer.run_once().await.unwrap();
            // Every unfinished claim, not one batch; the oldest's age from its first claim.
            assert_eq!(counters.level("idem_unfinished_claims{}"), Some(3.0));
            assert_eq!(
                counters.level("idem_unfinished_oldest_seconds{}"),
                Some(100.0)
            );
            assert_eq!(counters.level("idem_parked_claims{}"), Some(0.0));
            completer.run_once().await.unwrap();
            completer.run_once().await.unwrap();
            // Refund 1 completed, refund 2 parked; the shipment waits for its client.
            assert_eq!(counters.level("idem_unfinished_claims{}"), Some(1.0));
            assert_eq!(
                counters.level("idem_unfinished_oldest_seconds{}"),
                Some(90.0)
            );
            assert_eq!(counters.level("idem_parked_claims{}"), Some(1.0));
        })
    });
    assert_eq!(
        counters.get("idem_completer_resumed_total{result=\"completed\"}"),
        1
    );
    assert_eq!(counters.get("idem_completer_parked_total{}"), 1);
}

/// Two records kept 200 ms, completed on `store`, and the time for its background purge
/// (every 50 ms) to delete them.
async fn two_records_expire<S: Store>(store: &S) {
    for key in ["a", "b"] {
        let begun = idem::begin(
            store,
            "purge".into(),
            Key::parse(key).unwrap(),
            Fingerprint::of(&key).unwrap(),
            Policy::DEFAULT
                .lease(Duration::from_millis(200))
                .retain(Duration::from_millis(200)),
        )
        .await
        .unwrap();
        let Begun::Claimed(guard) = begun else {
            panic!("claimed before")
        };
        guard
            .complete(&StoredResponse::ok(b"ok".to_vec()))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// A MySQL store's purge counts under its table, as PostgreSQL's and SQLite's do, and under its
/// database, which tells them apart.
#[test]
#[cfg_attr(
    not(idem_mysql),
    ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
)]
fn the_background_purge_of_a_mysql_store_counts_under_its_table_and_database() {
    let counters = Counters::of(|| async {
        let database = common::MyDatabase::create(&common::mysql_url(), 4).await;
        let store = MySqlStore::builder()
            .purge_every(Duration::from_millis(50))
            .build(database.pool.clone())
            .await
            .unwrap();
        two_records_expire(&store).await;
    });
    assert_eq!(
        counters.get("idem_purged_records_total{store=\"idem_records\",database=\"mysql\"}"),
        2,
        "{:?}",
        counters.0.lock().unwrap()
    );
}
