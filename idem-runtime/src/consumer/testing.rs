//! A delivery without a broker, for testing handlers and the runner: it records everything the
//! runner says to it.
//!
//! ```
//! use idem::consumer::testing::{Said, TestDelivery};
//! use idem::consumer::{Consumer, HandlerError, Message, Settlement};
//! use idem::MemoryStore;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let consumer = Consumer::new("c", MemoryStore::new())?;
//! let handler = consumer.guarded(|msg: Message, _claim| async move {
//!     Ok::<_, HandlerError>(msg.payload.len())
//! });
//! let first = TestDelivery::new("m-1", "hello");
//! assert_eq!(consumer.handle(&first, &handler).await, Settlement::Completed);
//! let again = TestDelivery::new("m-1", "hello").delivered(2);
//! assert_eq!(consumer.handle(&again, &handler).await, Settlement::Replayed);
//! assert_eq!(again.said(), vec![Said::Ack]);
//! # Ok::<(), idem::Error>(())
//! # }).unwrap();
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::consumer::Delivery;
use crate::error::BoxError;
use crate::key::Key;

/// What the runner said to a [`TestDelivery`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// Acked.
    Ack,
    /// Asked for a redelivery after this delay.
    Retry(Duration),
    /// Dead-lettered with this reason.
    DeadLetter(String),
    /// Kept alive.
    KeepAlive,
}

/// A delivery held in memory.
#[derive(Debug, Clone)]
pub struct TestDelivery {
    key: Option<String>,
    payload: Bytes,
    subject: String,
    partition: Option<String>,
    delivered: u32,
    max: Option<u32>,
    keep_alive_every: Option<Duration>,
    dead_letters_fail: bool,
    said: Arc<Mutex<Vec<Said>>>,
}

impl TestDelivery {
    /// The first delivery of `payload` with message id `key`.
    pub fn new(key: &str, payload: impl Into<Bytes>) -> Self {
        TestDelivery {
            key: Some(key.to_owned()),
            payload: payload.into(),
            subject: "test".into(),
            partition: None,
            delivered: 1,
            max: None,
            keep_alive_every: None,
            dead_letters_fail: false,
            said: Arc::default(),
        }
    }

    /// A delivery without a message id.
    pub fn without_key(payload: impl Into<Bytes>) -> Self {
        TestDelivery {
            key: None,
            ..TestDelivery::new("-", payload)
        }
    }

    /// The partition it belongs to (what its `Idem-Partition-Key` header would say).
    pub fn partition(mut self, key: &str) -> Self {
        self.partition = Some(key.to_owned());
        self
    }

    /// Which delivery this is.
    pub fn delivered(mut self, n: u32) -> Self {
        self.delivered = n;
        self
    }

    /// The broker's delivery limit.
    pub fn max_deliveries(mut self, max: u32) -> Self {
        self.max = Some(max);
        self
    }

    /// How often the broker needs to hear "still working".
    pub fn keep_alive_every(mut self, every: Duration) -> Self {
        self.keep_alive_every = Some(every);
        self
    }

    /// A broker that does not take dead letters (no queue or stream receives them): each one is
    /// recorded as said, and fails.
    pub fn dead_letters_fail(mut self) -> Self {
        self.dead_letters_fail = true;
        self
    }

    /// Everything the runner said, in order.
    pub fn said(&self) -> Vec<Said> {
        self.said.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn say(&self, what: Said) -> Result<(), BoxError> {
        self.said
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what);
        Ok(())
    }
}

impl Delivery for TestDelivery {
    fn key(&self) -> Result<Key, String> {
        match &self.key {
            Some(k) => Key::parse(k).map_err(|e| e.to_string()),
            None => Err("the message has no id".into()),
        }
    }
    fn payload(&self) -> Bytes {
        self.payload.clone()
    }
    fn subject(&self) -> &str {
        &self.subject
    }
    fn delivered(&self) -> u32 {
        self.delivered
    }
    fn max_deliveries(&self) -> Option<u32> {
        self.max
    }
    fn partition_key(&self) -> Option<&str> {
        self.partition.as_deref()
    }
    fn keep_alive_every(&self) -> Option<Duration> {
        self.keep_alive_every
    }
    async fn ack(&self) -> Result<(), BoxError> {
        self.say(Said::Ack)
    }
    async fn retry(&self, delay: Duration) -> Result<(), BoxError> {
        self.say(Said::Retry(delay))
    }
    async fn dead_letter(&self, reason: &str) -> Result<(), BoxError> {
        self.say(Said::DeadLetter(reason.to_owned()))?;
        if self.dead_letters_fail {
            return Err("no stream captures the dead letters' subject".into());
        }
        Ok(())
    }
    async fn keep_alive(&self) -> Result<(), BoxError> {
        self.say(Said::KeepAlive)
    }
}
