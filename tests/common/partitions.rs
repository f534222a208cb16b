//! Ordered consumption under test: events of several partitions, a handler that fails the
//! first attempt at every third event of a partition (a retry that unordered consumption lets
//! the partition's next event overtake), and a log of what it did that says whether each
//! partition was handled one at a time and in order.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::ClaimInfo;
use idem::consumer::{HandlerError, Message};
use idem::outbox::Event;

/// Event `n` of partition `p` (ids `P<p>-<n>`), for `topic`.
pub fn event(topic: &str, p: usize, n: u32) -> Event {
    Event::new(
        format!("P{p}-{n}"),
        topic,
        format!("P{p}"),
        format!("{{\"p\":\"P{p}\",\"n\":{n}}}"),
    )
}

/// Every event of `partitions` partitions of `per` events, each partition's in order, the
/// partitions interleaved.
pub fn events(topic: &str, partitions: usize, per: u32) -> Vec<Event> {
    (0..per)
        .flat_map(|n| (0..partitions).map(move |p| event(topic, p, n)))
        .collect()
}

#[derive(Default)]
struct Log {
    running: HashMap<String, usize>,
    overlaps: Vec<String>,
    completed: HashMap<String, Vec<u32>>,
    now: usize,
    most: usize,
}

/// What the handler did, per partition.
#[derive(Clone, Default)]
pub struct PartitionLog(Arc<Mutex<Log>>);

impl PartitionLog {
    /// The handler: `{"p", "n"}` payloads; the first attempt at every third event fails for
    /// now; each run takes a few milliseconds, varying with `n`.
    pub fn handler(
        &self,
    ) -> impl Fn(
        Message,
        ClaimInfo,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>
    + Send
    + Sync
    + use<> {
        let log = self.clone();
        move |msg: Message, claim: ClaimInfo| {
            let log = log.clone();
            Box::pin(async move {
                let ev: serde_json::Value = msg.json()?;
                let (p, n) = (
                    ev["p"].as_str().unwrap_or("").to_owned(),
                    ev["n"].as_u64().unwrap_or(0) as u32,
                );
                log.start(&p);
                tokio::time::sleep(Duration::from_millis(u64::from(n * 7 % 5))).await;
                let fail = n % 3 == 0 && claim.attempt() == 1;
                log.end(&p, (!fail).then_some(n));
                if fail {
                    Err(HandlerError::transient("not yet"))
                } else {
                    Ok(())
                }
            })
        }
    }

    fn start(&self, p: &str) {
        let mut log = self.0.lock().unwrap();
        let running = log.running.entry(p.to_owned()).or_default();
        *running += 1;
        if *running > 1 {
            log.overlaps.push(p.to_owned());
        }
        log.now += 1;
        log.most = log.most.max(log.now);
    }

    fn end(&self, p: &str, completed: Option<u32>) {
        let mut log = self.0.lock().unwrap();
        *log.running.entry(p.to_owned()).or_default() -= 1;
        log.now -= 1;
        if let Some(n) = completed {
            log.completed.entry(p.to_owned()).or_default().push(n);
        }
    }

    /// How many events were completed.
    pub fn completed(&self) -> usize {
        self.0
            .lock()
            .unwrap()
            .completed
            .values()
            .map(Vec::len)
            .sum()
    }

    /// The most handler runs at once, over all partitions.
    pub fn most_at_once(&self) -> usize {
        self.0.lock().unwrap().most
    }

    /// Each of `partitions` partitions completed its `per` events once each, in order, never
    /// two at once; or what went wrong.
    pub fn check(&self, partitions: usize, per: u32) -> Result<(), String> {
        let log = self.0.lock().unwrap();
        if !log.overlaps.is_empty() {
            return Err(format!("ran two at once in {:?}", log.overlaps));
        }
        for p in 0..partitions {
            let done = log
                .completed
                .get(&format!("P{p}"))
                .cloned()
                .unwrap_or_default();
            if done != (0..per).collect::<Vec<_>>() {
                return Err(format!("P{p} completed {done:?}"));
            }
        }
        Ok(())
    }
}
