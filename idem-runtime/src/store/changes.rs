//! Announcements that a running claim ended: what a waiting duplicate listens for between two
//! asks, so that it replays the first answer as soon as it is stored instead of at its next
//! poll.
//!
//! Every store that idem ships announces, within its process, each write through
//! [`Store::call`](crate::Store::call) that ends or pauses a running claim (a completion, a
//! release, a suspension, a park, an operator's release). Transactional completions are not
//! announced: their duplicates wait on the record's lock, not on announcements.
//! PostgreSQL and Redis can also announce across processes (`NOTIFY`, `PUBLISH`) when their
//! builder is told to ([`SqlStoreBuilder::notify`](crate::store::SqlStoreBuilder::notify),
//! [`RedisStoreBuilder::notify`](crate::store::redis::RedisStoreBuilder::notify)). An
//! announcement only wakes a waiter early: a waiter asks the store again on its own schedule
//! too, so an announcement that is lost (a dropped listener connection, a full buffer, a
//! publisher that fell behind, a store wrapped by one that does not pass
//! [`Store::changes`](crate::Store::changes) on) costs time, never an answer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, watch};

/// How many announcements a slow listener may fall behind before it misses some.
const BUFFER: usize = 256;

/// How many announcements to other processes may be on their way at once: past it (the
/// database or server is slow or gone) the next are not sent, rather than pile up tasks that
/// wait for connections live requests need.
const MAX_PUBLISHING: usize = 64;

type Publish = dyn Fn(u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;
/// One listening connection's life, from connecting to its end, answered with why it ended.
type Listen =
    dyn for<'a> Fn(&'a Hearing) -> Pin<Box<dyn Future<Output = String> + Send + 'a>> + Send + Sync;

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
    /// Created by the first listener: a store nobody waits on allocates no buffer.
    local: OnceLock<broadcast::Sender<u64>>,
    listening: AtomicUsize,
    /// Tells other processes (`NOTIFY`, `PUBLISH`).
    publish: Option<Box<Publish>>,
    /// How the task that hears other processes' announcements listens, started when none runs.
    listen: Option<Arc<Listen>>,
    hearing: AtomicBool,
    /// Announcements to other processes on their way.
    publishing: Arc<AtomicUsize>,
    /// Dropped with the store: tells the hearing task to end.
    gone: watch::Sender<()>,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            local: OnceLock::new(),
            listening: AtomicUsize::new(0),
            publish: None,
            listen: None,
            hearing: AtomicBool::new(false),
            publishing: Arc::default(),
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
    /// logged: waiters ask again anyway), and `listen` is one connection's life in the task
    /// that hears them (it hands each to [`Hearing::heard`], and answers why the connection
    /// ended). The task starts with the first listener, on its runtime, and listens again a
    /// second after each end until the store is gone; another starts with a later listener
    /// after that task ended with its runtime.
    #[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
    pub(crate) fn across(
        publish: impl Fn(u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync + 'static,
        listen: impl for<'a> Fn(&'a Hearing) -> Pin<Box<dyn Future<Output = String> + Send + 'a>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Changes {
            inner: Arc::new(Inner {
                publish: Some(Box::new(publish)),
                listen: Some(Arc::new(listen)),
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
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                return publish(id).await;
            };
            if inner.publishing.fetch_add(1, Ordering::AcqRel) >= MAX_PUBLISHING {
                inner.publishing.fetch_sub(1, Ordering::AcqRel);
                tracing::debug!(target: "idem", "announcements to other instances fell behind; this one is not sent (their waiters find it at their next ask)");
                return;
            }
            let telling = publish(id);
            // Counted down when the task ends, or is dropped with its runtime unrun.
            let in_flight = InFlight(inner.publishing.clone());
            drop(rt.spawn(async move {
                let _in_flight = in_flight;
                telling.await;
            }));
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
        let rx = inner
            .local
            .get_or_init(|| broadcast::channel(BUFFER).0)
            .subscribe();
        inner.listening.fetch_add(1, Ordering::Relaxed);
        if let Some(listen) = &inner.listen
            && !inner.hearing.swap(true, Ordering::AcqRel)
        {
            let hearing = Hearing {
                inner: Arc::downgrade(&self.inner),
                gone: inner.gone.subscribe(),
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(keep_listening(listen.clone(), hearing))),
                // Outside a runtime nobody can wait: the next listener, in one, starts it.
                Err(_) => drop(hearing),
            }
        }
        Listening {
            rx,
            id: Changes::identity(scope, key),
            changes: self.clone(),
        }
    }
}

/// The task that hears other processes: `listen` until the store is gone, again a second after
/// each end.
async fn keep_listening(listen: Arc<Listen>, hearing: Hearing) {
    loop {
        let ended = tokio::select! {
            () = hearing.gone() => return,
            ended = listen(&hearing) => ended,
        };
        tracing::debug!(target: "idem", error = %ended, "the connection listening for claims ended elsewhere failed; listening again in a second");
        tokio::select! {
            () = hearing.gone() => return,
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}

/// One announcement to other processes on its way ([`MAX_PUBLISHING`]).
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Inner {
    fn heard(&self, id: u64) {
        if self.listening.load(Ordering::Relaxed) > 0
            && let Some(local) = self.local.get()
        {
            // An error only says that nobody listens any more.
            let _ = local.send(id);
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
    /// Returns once the claim was announced ended. Never returns when it is not, or when its
    /// announcement was lost (this listener fell more than a buffer behind while it did not
    /// listen): race it with a timer, as a waiter's own asks do.
    pub async fn changed(&mut self) {
        loop {
            match self.rx.recv().await {
                Ok(id) if id == self.id => return,
                // Under a burst of announcements, waking every waiter to ask again would add
                // to the burst; its own schedule finds the answer.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
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

    #[tokio::test]
    async fn announcements_to_other_processes_are_bounded_in_flight() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicUsize;

        use crate::store::changes::MAX_PUBLISHING;

        let sent = Arc::new(AtomicUsize::new(0));
        let counted = sent.clone();
        // A publisher that never finishes: the server went away mid-send.
        let changes = Changes::across(
            move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
                Box::pin(std::future::pending())
            },
            |_| Box::pin(std::future::pending()),
        );
        for i in 0..(MAX_PUBLISHING + 36) {
            changes.announce("s", &format!("k{i}")).await;
        }
        assert_eq!(sent.load(Ordering::SeqCst), MAX_PUBLISHING);
        assert_eq!(
            changes.inner.publishing.load(Ordering::SeqCst),
            MAX_PUBLISHING
        );
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
