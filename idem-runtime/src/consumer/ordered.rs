//! The runner's ordered mode ([`Consumer::ordered`]): one delivery of a partition at a time, in
//! the order they arrived, and retries held in place.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::sync::{Semaphore, oneshot};

use crate::consumer::{Consumer, Delivery, Handler, Settlement, retry_delay};
use crate::context::ClaimWatch;
use crate::key::Key;
use crate::store::Store;

/// How many deliveries an ordered consumer holds at once per slot of its concurrency, running
/// or waiting for their turn: 16.
pub const ORDERED_IN_HAND_PER_SLOT: usize = 16;

/// Whose turn it is, per partition: the last delivery that took a turn, and the signal that
/// ends it.
#[derive(Default)]
struct Turns {
    last: Mutex<Last>,
}

#[derive(Default)]
struct Last {
    next_id: u64,
    by_partition: HashMap<String, (u64, oneshot::Receiver<()>)>,
}

/// A delivery's turn in its partition: it may run once the turn before it ended, and its own
/// ends when it is dropped (settled, or its future dropped).
struct Turn<'a> {
    turns: &'a Turns,
    partition: String,
    id: u64,
    before: Option<oneshot::Receiver<()>>,
    _ends: oneshot::Sender<()>,
}

impl Turns {
    /// The next turn in `partition`, behind every turn taken before it.
    fn take(&self, partition: &str) -> Turn<'_> {
        let (ends, ended) = oneshot::channel();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let id = last.next_id;
        last.next_id += 1;
        let before = last
            .by_partition
            .insert(partition.to_owned(), (id, ended))
            .map(|(_, before)| before);
        Turn {
            turns: self,
            partition: partition.to_owned(),
            id,
            before,
            _ends: ends,
        }
    }
}

impl Turn<'_> {
    /// Returns once the turn before this one ended.
    async fn come(&mut self) {
        if let Some(before) = self.before.take() {
            // A sender dropped without a word is an end too.
            let _ = before.await;
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut last = self.turns.last.lock().unwrap_or_else(|p| p.into_inner());
        // The last turn of its partition: nobody waits on it, forget the partition.
        if last
            .by_partition
            .get(&self.partition)
            .is_some_and(|(id, _)| *id == self.id)
        {
            last.by_partition.remove(&self.partition);
        }
    }
}

impl<S: Store> Consumer<S> {
    /// [`Consumer::run_until`] in ordered mode.
    pub(super) async fn run_ordered<D, E, St, M, H>(
        &self,
        deliveries: St,
        handler: &H,
        concurrency: usize,
        shutdown: impl Future<Output = ()>,
    ) where
        D: Delivery,
        E: fmt::Display,
        St: Stream<Item = Result<D, E>>,
        H: Handler<M>,
    {
        let turns = Turns::default();
        let turns = &turns;
        // The slots bound the handlers running; a delivery waiting for its turn, or for a
        // retry held in place, holds none, so a partition stuck behind its head cannot take
        // them all. What is in hand at once is bounded apart.
        let concurrency = concurrency.max(1);
        let slots = Semaphore::new(concurrency);
        let slots = &slots;
        deliveries
            .take_until(shutdown)
            .for_each_concurrent(
                concurrency.saturating_mul(ORDERED_IN_HAND_PER_SLOT),
                |delivery| {
                    // Taken as the stream yields the delivery, before any of it runs: turns
                    // follow the order of arrival.
                    let turn = match &delivery {
                        Ok(d) => d.partition_key().map(|p| turns.take(p)),
                        Err(_) => None,
                    };
                    async move {
                        match delivery {
                            Ok(d) => {
                                if let Some(mut turn) = turn {
                                    let every = self.keep_alive_every(&d);
                                    self.while_alive(&d, &ClaimWatch::new(), every, turn.come())
                                        .await;
                                    self.handle_in(&d, handler, Some(slots)).await;
                                    drop(turn);
                                } else {
                                    self.handle_in(&d, handler, Some(slots)).await;
                                }
                            }
                            Err(e) => {
                                tracing::warn!(target: "idem", consumer = %self.name, error = %e, "the broker's stream reported an error");
                            }
                        }
                    }
                },
            )
            .await
    }

    /// Keeps a delivery that `s` would give back to the broker for a retry, for the retry's
    /// delay, kept alive: an ordered consumer runs it again itself, so that the partition's
    /// later deliveries cannot overtake it.
    pub(super) async fn hold<D: Delivery>(
        &self,
        delivery: &D,
        key: &Key,
        every: Duration,
        s: &Settlement,
    ) {
        let delay = retry_delay(s).unwrap_or_default();
        tracing::debug!(target: "idem", consumer = %self.name, key = %key, settlement = ?s, ?delay, "ordered: holding a delivery to run it again");
        self.counters.settled(s);
        self.while_alive(
            delivery,
            &ClaimWatch::new(),
            every,
            tokio::time::sleep(delay),
        )
        .await;
    }
}
