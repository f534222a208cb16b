//! Announcements that a running claim ended: what a waiting duplicate listens for between two
//! asks, so that it replays the first answer as soon as it is stored instead of at its next
//! poll.
//!
//! Every store that idem ships announces, within its process, each write that ends or pauses
//! a running claim (a completion, a release, a suspension, a park, an operator's release).
//! PostgreSQL and Redis can also announce across processes (`NOTIFY`, `PUBLISH`) when their
//! builder is told to ([`SqlStoreBuilder::notify`](crate::store::SqlStoreBuilder::notify),
//! [`RedisStoreBuilder::notify`](crate::store::redis::RedisStoreBuilder::notify)). An
//! announcement only wakes a waiter early: a waiter asks the store again on its own schedule
//! too, so an announcement that is lost (a dropped listener connection, a full buffer, a
//! store wrapped by one that does not pass [`Store::changes`](crate::Store::changes) on) costs
//! time, never an answer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, watch};

/// How many announcements a slow listener may fall behind before it is woken to ask anyway.
const BUFFER: usize = 1024;

type Publish = dyn Fn(u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;
type Start = dyn Fn(Hearing) + Send + Sync;

/// Where a store announces that a running claim ended, and where waiting duplicates listen.
///
/// Cheap to clone (one pointer). An announcement when nobody listens in this process and no
/// other process is told costs one atomic load.
///
/// ```
/// use idem::store::Changes;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let changes = Changes::new();
/// let mut listening = changes.listen("refund:A-1", "key-1");
/// changes.announce("refund:A-1", "key-1").await;
/// listening.changed().await; // returns at once: the claim ended
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Changes {
    inner: Arc<Inner>,
}

struct Inner {
    local: broadcast::Sender<u64>,
    listening: AtomicUsize,
    /// Tells other processes (`NOTIFY`, `PUBLISH`).
    publish: Option<Box<Publish>>,
    /// Starts the task that hears other processes' announcements, when none runs.
    start: Option<Box<Start>>,
    hearing: AtomicBool,
    /// Dropped with the store: tells the hearing task to end.
    gone: watch::Sender<()>,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            local: broadcast::channel(BUFFER).0,
            listening: AtomicUsize::new(0),
            publish: None,
            start: None,
            hearing: AtomicBool::new(false),
            gone: watch::channel(()).0,
        }
    }
}

impl fmt::Debug for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Changes")
            .field("listening", &self.inner.listening.load(Ordering::Relaxed))
            .field("across_processes", &self.inner.publish.is_some())
            .finish()
    }
}

impl Changes {
    /// Announcements within this process only.
    pub fn new() -> Self {
        Changes::default()
    }

    /// Announcements across processes: `publish` tells the others (its failure is only
    /// logged: waiters ask again anyway), and `start` spawns the task that hears them and hands
    /// each to [`Hearing::heard`]. `start` is called on the first listener, and again on a
    /// later one after that task ended (its [`Hearing`] dropped).
    #[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
    pub(crate) fn across(
        publish: impl Fn(u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync + 'static,
        start: impl Fn(Hearing) + Send + Sync + 'static,
    ) -> Self {
        Changes {
            inner: Arc::new(Inner {
                publish: Some(Box::new(publish)),
                start: Some(Box::new(start)),
                ..Inner::default()
            }),
        }
    }

    /// The number an announcement of `(scope, key)` carries: the same in every process, so
    /// that it can cross a wire (`NOTIFY`'s payload, a Redis message) in 16 hex digits.
    pub fn identity(scope: &str, key: &str) -> u64 {
        let mut h = Sha256::new();
        h.update((scope.len() as u64).to_be_bytes());
        h.update(scope.as_bytes());
        h.update(key.as_bytes());
        let digest = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_be_bytes(first)
    }

    /// Announces that the running claim on `(scope, key)` ended or paused: wakes this
    /// process's listeners on it, and tells other processes when the store does.
    pub async fn announce(&self, scope: &str, key: &str) {
        let inner = &*self.inner;
        if inner.listening.load(Ordering::Relaxed) == 0 && inner.publish.is_none() {
            return;
        }
        let id = Changes::identity(scope, key);
        self.heard(id);
        if let Some(publish) = &inner.publish {
            // On a task of its own: the caller's completion is done, and waits for no one's
            // announcement of it (a database that just went away would hold it for as long as
            // its pool waits for a connection).
            let telling = publish(id);
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(telling)),
                Err(_) => telling.await,
            }
        }
    }

    /// [`Changes::announce`] within this process only: for a store whose records live in it.
    pub(crate) fn announce_here(&self, scope: &str, key: &str) {
        if self.inner.listening.load(Ordering::Relaxed) > 0 {
            self.heard(Changes::identity(scope, key));
        }
    }

    /// Wakes this process's listeners on the identity `id`.
    fn heard(&self, id: u64) {
        self.inner.heard(id)
    }

    /// Listens for the end of the running claim on `(scope, key)`. Listen before the last
    /// ask of the store, so that an end between that ask and the wait is not missed.
    pub fn listen(&self, scope: &str, key: &str) -> Listening {
        let inner = &*self.inner;
        let rx = inner.local.subscribe();
        inner.listening.fetch_add(1, Ordering::Relaxed);
        if let Some(start) = &inner.start
            && !inner.hearing.swap(true, Ordering::AcqRel)
        {
            start(Hearing {
                inner: Arc::downgrade(&self.inner),
                gone: inner.gone.subscribe(),
            });
        }
        Listening {
            rx,
            id: Changes::identity(scope, key),
            changes: self.clone(),
        }
    }
}

impl Inner {
    fn heard(&self, id: u64) {
        if self.listening.load(Ordering::Relaxed) > 0 {
            // An error only says that nobody listens any more.
            let _ = self.local.send(id);
        }
    }
}

/// The task that hears other processes' announcements holds this: it hands on what it hears,
/// and learns when the store is gone. When it is dropped (the task ended, or its runtime shut
/// down), the next listener starts another task.
#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
pub(crate) struct Hearing {
    inner: Weak<Inner>,
    gone: watch::Receiver<()>,
}

#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
impl Hearing {
    /// Wakes this process's listeners on `id`.
    pub(crate) fn heard(&self, id: u64) {
        if let Some(inner) = self.inner.upgrade() {
            inner.heard(id);
        }
    }

    /// Returns once the store is gone: the task should end.
    pub(crate) async fn gone(&self) {
        // Nothing is ever sent: this returns when the sender is dropped with the store.
        let mut gone = self.gone.clone();
        while gone.changed().await.is_ok() {}
    }
}

impl Drop for Hearing {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            inner.hearing.store(false, Ordering::Release);
        }
    }
}

/// One waiter's ear on one claim ([`Changes::listen`]).
#[derive(Debug)]
pub struct Listening {
    rx: broadcast::Receiver<u64>,
    id: u64,
    changes: Changes,
}

impl Listening {
    /// Returns once the claim was announced ended (or once announcements were lost, since one
    /// of them may have been this claim's). Never returns when neither happens: race it with
    /// a timer.
    pub async fn changed(&mut self) {
        loop {
            match self.rx.recv().await {
                Ok(id) if id == self.id => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            }
        }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.changes.inner.listening.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use crate::store::changes::Changes;

    #[tokio::test]
    async fn a_listener_hears_its_claim_and_no_other() {
        let changes = Changes::new();
        let mut mine = changes.listen("s", "k1");
        changes.announce("s", "k2").await;
        let early = tokio::time::timeout(Duration::from_millis(50), mine.changed()).await;
        assert!(early.is_err(), "woken by another key's announcement");
        changes.announce("s", "k1").await;
        tokio::time::timeout(Duration::from_secs(5), mine.changed())
            .await
            .expect("not woken by its own key's announcement");
    }

    #[test]
    fn identities_separate_scope_from_key() {
        assert_ne!(Changes::identity("ab", "c"), Changes::identity("a", "bc"));
        assert_eq!(Changes::identity("a", "b"), Changes::identity("a", "b"));
    }

    #[test]
    fn listeners_are_counted_while_they_listen() {
        let changes = Changes::new();
        let a = changes.listen("s", "k");
        let b = changes.listen("s", "k");
        assert_eq!(changes.inner.listening.load(Ordering::Relaxed), 2);
        drop(a);
        drop(b);
        assert_eq!(changes.inner.listening.load(Ordering::Relaxed), 0);
    }
}
