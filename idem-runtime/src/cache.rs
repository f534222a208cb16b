//! A bounded in-process cache of completed records, in front of any store.
//!
//! A completed record never changes before it expires, so replaying it from memory is as
//! correct as reading it from the database, and much cheaper. Records in progress are never
//! cached: their state is exactly what must be read from the shared store.

use std::collections::VecDeque;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hashbrown::HashTable;

use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::record::{BeginOutcome, StoredResponse};
use crate::store::{Operation, Reply, Store};

const SHARDS: usize = 16;

/// A store with a bounded cache of completed records in front of it. Off unless you wrap a store
/// in it.
///
/// Entries live at most `ttl` (one minute unless set) and never longer than the retention the
/// record was completed with; when a shard is full, its oldest entry goes first.
///
/// ```
/// use std::time::Duration;
/// use idem::{CachedStore, MemoryStore};
///
/// let store = CachedStore::new(MemoryStore::new(), 10_000).ttl(Duration::from_secs(30));
/// ```
pub struct CachedStore<S> {
    // One pointer: the macro clones the store on every call.
    shared: Arc<(S, Cache)>,
}

impl<S> Clone for CachedStore<S> {
    fn clone(&self) -> Self {
        CachedStore {
            shared: self.shared.clone(),
        }
    }
}

struct Cache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    ttl: Duration,
    hasher: hashbrown::DefaultHashBuilder,
}

#[derive(Default)]
struct Shard {
    table: HashTable<Entry>,
    order: VecDeque<(u64, u64)>,
    next_seq: u64,
}

struct Entry {
    hash: u64,
    seq: u64,
    scope: Box<str>,
    key: Box<str>,
    fingerprint: Fingerprint,
    response: StoredResponse,
    until: Instant,
}

impl<S> fmt::Debug for CachedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedStore")
            .field("capacity", &(self.shared.1.per_shard * SHARDS))
            .field("ttl", &self.shared.1.ttl)
            .finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<S: Store> CachedStore<S> {
    /// Caches up to `capacity` completed records (at least one per shard) in front of `inner`.
    pub fn new(inner: S, capacity: usize) -> Self {
        CachedStore {
            shared: Arc::new((
                inner,
                Cache::new(capacity.div_ceil(SHARDS).max(1), Duration::from_secs(60)),
            )),
        }
    }

    /// The store behind the cache.
    pub fn inner(&self) -> &S {
        &self.shared.0
    }

    fn cache(&self) -> &Cache {
        &self.shared.1
    }

    /// How many records are cached.
    pub fn cached(&self) -> usize {
        self.cache()
            .shards
            .iter()
            .map(|s| lock(s).table.len())
            .sum()
    }
}

impl<S: Store + Clone> CachedStore<S> {
    /// Sets how long an entry may be served from memory.
    pub fn ttl(self, ttl: Duration) -> Self {
        let per_shard = self.shared.1.per_shard;
        let inner = match Arc::try_unwrap(self.shared) {
            Ok((inner, _)) => inner,
            Err(shared) => shared.0.clone(),
        };
        CachedStore {
            shared: Arc::new((inner, Cache::new(per_shard, ttl))),
        }
    }
}

impl Cache {
    fn new(per_shard: usize, ttl: Duration) -> Cache {
        Cache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard,
            ttl,
            hasher: hashbrown::DefaultHashBuilder::default(),
        }
    }

    fn hash(&self, scope: &str, key: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        scope.hash(&mut h);
        key.hash(&mut h);
        h.finish()
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        lock(&self.shards[(hash >> 48) as usize % SHARDS])
    }

    fn get(&self, scope: &str, key: &str, fp: &Fingerprint) -> Option<BeginOutcome> {
        let hash = self.hash(scope, key);
        let mut shard = self.shard(hash);
        let now = Instant::now();
        let found = shard
            .table
            .find_entry(hash, |e| &*e.scope == scope && &*e.key == key)
            .ok()?;
        if found.get().until <= now {
            found.remove();
            return None;
        }
        let e = found.get();
        Some(if e.fingerprint == *fp {
            BeginOutcome::Replay(e.response.clone())
        } else {
            BeginOutcome::KeyReused
        })
    }

    fn put(
        &self,
        scope: &str,
        key: &str,
        fp: Fingerprint,
        response: StoredResponse,
        retain: Duration,
    ) {
        let hash = self.hash(scope, key);
        let until = Instant::now() + retain.min(self.ttl);
        let mut shard = self.shard(hash);
        let shard = &mut *shard;
        if let Ok(mut e) = shard
            .table
            .find_entry(hash, |e| &*e.scope == scope && &*e.key == key)
        {
            e.get_mut().until = until;
            return;
        }
        while shard.table.len() >= self.per_shard {
            let Some((old_hash, old_seq)) = shard.order.pop_front() else {
                break;
            };
            if let Ok(e) = shard.table.find_entry(old_hash, |e| e.seq == old_seq) {
                e.remove();
            }
        }
        let seq = shard.next_seq;
        shard.next_seq += 1;
        shard.order.push_back((hash, seq));
        shard.table.insert_unique(
            hash,
            Entry {
                hash,
                seq,
                scope: scope.into(),
                key: key.into(),
                fingerprint: fp,
                response,
                until,
            },
            |e| e.hash,
        );
    }
}

impl<S: Store> Store for CachedStore<S> {
    async fn call(&self, op: Operation<'_>) -> Result<Reply> {
        let Operation::Begin(req) = op else {
            // A completion is not cached here: the fingerprint is not part of a claim. The first
            // replay caches it.
            return self.inner().call(op).await;
        };
        if let Some(hit) = self.cache().get(req.scope, req.key, req.fingerprint) {
            return Ok(Reply::Begun(hit));
        }
        let outcome = self.inner().begin(req).await?;
        if let BeginOutcome::Replay(stored) = &outcome {
            self.cache().put(
                req.scope,
                req.key,
                *req.fingerprint,
                stored.clone(),
                req.policy.retain,
            );
        }
        Ok(Reply::Begun(outcome))
    }

    fn defer(&self, write: crate::store::Deferred) {
        self.inner().defer(write)
    }

    fn changes(&self) -> Option<&crate::store::Changes> {
        self.inner().changes()
    }
}
