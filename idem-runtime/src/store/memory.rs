//! The in-memory store: for tests and single-process services.

use std::fmt;
use std::future::{Future, ready};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry as TableEntry;

use crate::clock::{Clock, SystemClock, duration_ms};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::lifecycle::unfinished;
use crate::lifecycle::{Decision, Seen, State, decide, next_attempt, owns};
use crate::record::{
    BeginOutcome, BeginRequest, ClaimRef, Claimed, Record, RecordState, StoredResponse, Unfinished,
};
use crate::store;
use crate::store::{
    Changes, ForcedRelease, Operation, RecordInfo, Reply, Retried, Store, StoreStats,
};

const SHARDS: usize = 64;

/// How often, at most, the store's use purges its expired records: once a minute of its clock.
const PURGE_EVERY_MS: i64 = 60_000;

/// A concurrent in-memory store.
///
/// Records are spread over 64 independently locked shards by a hash of `(scope, key)`; every
/// operation holds one shard lock for a few hundred nanoseconds and never across an `.await`.
/// Time comes from an injectable [`Clock`], so tests can expire leases and retention without
/// sleeping. Clones share the same records.
///
/// Expired records leave by themselves, as the store is used: at most once a minute (of its
/// clock), the first `begin` after the minute purges every shard's expired records, one shard
/// lock at a time, so a long-running process holds no more than its retention's worth of
/// records. No task and no runtime are needed; [`Store::purge_expired`] purges at once.
///
/// ```
/// # tokio_test_block_on(async {
/// use idem::store::memory::MemoryStore;
/// let store = MemoryStore::new();
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) { tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f); }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Mutex<HashTable<Entry>>]>,
    hasher: hashbrown::DefaultHashBuilder,
    clock: Arc<dyn Clock>,
    /// When the next `begin` purges expired records, in the clock's milliseconds.
    next_purge: AtomicI64,
    changes: Changes,
}

struct Entry {
    hash: u64,
    /// Scope then key: `ident.bytes()[..scope_len]` is the scope.
    ident: Ident,
    scope_len: usize,
    fingerprint: Fingerprint,
    state: State,
    fence: u64,
    lease_until: i64,
    expires_at: i64,
    recovery_point: Option<Vec<u8>>,
    attempt: u32,
    response: Option<StoredResponse>,
    /// What a resumable claim or an unknown outcome adds; most records have none.
    work: Option<Box<Work>>,
}

/// The unfinished work a record holds: its stored request, when the completer may resume it,
/// why its last attempt did not finish.
#[derive(Default)]
struct Work {
    request: Option<Vec<u8>>,
    resume_at: Option<i64>,
    note: Option<String>,
}

impl Entry {
    /// Whether it holds unfinished work, and so never expires (`lifecycle::unfinished`).
    fn holds_work(&self) -> bool {
        let (resumable, unknown) = self
            .work
            .as_ref()
            .map_or((false, false), |w| (w.request.is_some(), w.note.is_some()));
        unfinished(self.state, resumable, unknown)
    }

    /// Whether its retention ended at `now`: never while it holds unfinished work.
    fn expired(&self, now: i64) -> bool {
        self.expires_at <= now && !self.holds_work()
    }

    /// Whether the completer may take it at `now`.
    fn due_at(&self, now: i64) -> Option<i64> {
        let work = self.work.as_ref()?;
        let resume_at = work.resume_at?;
        (self.state == State::InProgress
            && work.request.is_some()
            && self.lease_until <= now
            && resume_at <= now)
            .then_some(resume_at.max(self.lease_until))
    }

    /// The record as an operator sees it at `now`; with its recovery point and answer when
    /// `full`.
    fn info(&self, now: i64, full: bool) -> RecordInfo {
        let (scope, key) = self.ident.bytes().split_at(self.scope_len);
        RecordInfo {
            // Both were `str`s, written one after the other: nothing is lost.
            scope: String::from_utf8_lossy(scope).into_owned(),
            key: String::from_utf8_lossy(key).into_owned(),
            state: self.state,
            fence: self.fence,
            attempt: self.attempt,
            fingerprint: self.fingerprint,
            age: RecordInfo::age_from(self.fence, now),
            lease_remaining: (self.state == State::InProgress)
                .then(|| RecordInfo::ms_left(self.lease_until.saturating_sub(now))),
            expires_in: RecordInfo::ms_left(self.expires_at.saturating_sub(now)),
            recovery_point: if full {
                self.recovery_point.clone()
            } else {
                None
            },
            response: if full { self.response.clone() } else { None },
            note: self.work.as_ref().and_then(|w| w.note.clone()),
            resumable: self.work.as_ref().is_some_and(|w| w.request.is_some()),
            request: if full {
                self.work.as_ref().and_then(|w| w.request.clone())
            } else {
                None
            },
        }
    }

    /// The record as [`Operation::Due`] lists it.
    fn unfinished(&self, now: i64) -> Unfinished {
        let (scope, key) = self.ident.bytes().split_at(self.scope_len);
        let work = self.work.as_deref();
        let since = self.due_at(now).unwrap_or(now);
        Unfinished::new(
            String::from_utf8_lossy(scope).into_owned(),
            String::from_utf8_lossy(key).into_owned(),
            self.fence,
            self.attempt,
            self.fingerprint,
            work.and_then(|w| w.request.clone()).unwrap_or_default(),
            work.and_then(|w| w.note.clone()),
            RecordInfo::ms_left(now.saturating_sub(since)),
        )
    }

    fn is(&self, scope: &str, key: &str) -> bool {
        let ident = self.ident.bytes();
        self.scope_len == scope.len()
            && ident.len() == scope.len() + key.len()
            && ident.starts_with(scope.as_bytes())
            && ident.ends_with(key.as_bytes())
    }
}

/// How many bytes of scope and key an entry holds without an allocation: a scope such as
/// `refund:ORD-1` and a UUID key (36) fit.
const INLINE_IDENT: usize = 62;

/// A record's identity, scope then key: inside the entry when it fits, in one allocation when
/// it does not.
enum Ident {
    Inline { len: u8, bytes: [u8; INLINE_IDENT] },
    Boxed(Box<[u8]>),
}

impl Ident {
    fn new(scope: &str, key: &str) -> Ident {
        let len = scope.len() + key.len();
        match u8::try_from(len) {
            Ok(short) if len <= INLINE_IDENT => {
                let mut bytes = [0; INLINE_IDENT];
                bytes[..scope.len()].copy_from_slice(scope.as_bytes());
                bytes[scope.len()..len].copy_from_slice(key.as_bytes());
                Ident::Inline { len: short, bytes }
            }
            _ => Ident::Boxed([scope.as_bytes(), key.as_bytes()].concat().into()),
        }
    }

    #[inline]
    fn bytes(&self) -> &[u8] {
        match self {
            Ident::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Ident::Boxed(b) => b,
        }
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.len())
            .finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        MemoryStore::with_clock(SystemClock)
    }

    /// An empty store on `clock` (a [`ManualClock`](crate::clock::ManualClock) in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        let next_purge = clock.now_ms().saturating_add(PURGE_EVERY_MS);
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
                hasher: hashbrown::DefaultHashBuilder::default(),
                clock: Arc::new(clock),
                next_purge: AtomicI64::new(next_purge),
                changes: Changes::new(),
            }),
        }
    }

    /// How many records are held, released and expired ones included until purged.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether no records are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn hash(&self, scope: &str, key: &str) -> u64 {
        let mut h = self.inner.hasher.build_hasher();
        scope.hash(&mut h);
        key.hash(&mut h);
        h.finish()
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, HashTable<Entry>> {
        // The high bits pick the shard; hashbrown uses the low bits and the top 7 for control.
        lock(&self.inner.shards[(hash >> 48) as usize % SHARDS])
    }

    /// Runs `f` on the live entry owned by `claim`, or reports the fence lost.
    fn with_owned<T>(
        &self,
        claim: ClaimRef<'_>,
        f: impl FnOnce(&mut Entry, i64) -> T,
    ) -> Result<T> {
        let now = self.inner.clock.now_ms();
        let hash = self.hash(claim.scope, claim.key);
        let mut shard = self.shard(hash);
        match shard.find_mut(hash, |e| e.is(claim.scope, claim.key)) {
            Some(e) if owns(claim.fence, e.fence, e.state, e.expired(now)) => Ok(f(e, now)),
            _ => Err(Error::FenceLost { fence: claim.fence }),
        }
    }

    /// Whether the live record of `claim` was completed by its fence with `response`.
    fn completed_by(&self, claim: ClaimRef<'_>, response: &StoredResponse) -> bool {
        let now = self.inner.clock.now_ms();
        let hash = self.hash(claim.scope, claim.key);
        let shard = self.shard(hash);
        shard
            .find(hash, |e| e.is(claim.scope, claim.key))
            .is_some_and(|e| {
                e.fence == claim.fence
                    && e.state == State::Completed
                    && !e.expired(now)
                    && e.response.as_ref() == Some(response)
            })
    }

    /// Deletes every record expired at `now`; returns how many.
    fn purge_at(&self, now: i64) -> u64 {
        let mut purged = 0u64;
        for shard in self.inner.shards.iter() {
            let mut shard = lock(shard);
            let before = shard.len();
            shard.retain(|e| !e.expired(now));
            purged += (before - shard.len()) as u64;
        }
        purged
    }

    /// Purges when the minute since the last purge is over: one caller purges, the others go
    /// on.
    fn purge_if_due(&self, now: i64) {
        let due = self.inner.next_purge.load(Ordering::Relaxed);
        if now >= due
            && self
                .inner
                .next_purge
                .compare_exchange(
                    due,
                    now.saturating_add(PURGE_EVERY_MS),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            self.purge_at(now);
        }
    }

    fn begin_now(&self, req: BeginRequest<'_>) -> BeginOutcome {
        let now = self.inner.clock.now_ms();
        self.purge_if_due(now);
        let lease = duration_ms(req.policy.lease);
        let retain = duration_ms(req.policy.retain);
        let hash = self.hash(req.scope, req.key);
        let mut shard = self.shard(hash);
        let entry = shard.entry(hash, |e| e.is(req.scope, req.key), |e| e.hash);
        let e = match entry {
            TableEntry::Vacant(v) => {
                let fence = first_fence(now);
                v.insert(Entry {
                    hash,
                    ident: Ident::new(req.scope, req.key),
                    scope_len: req.scope.len(),
                    fingerprint: *req.fingerprint,
                    state: State::InProgress,
                    fence,
                    lease_until: now.saturating_add(lease),
                    expires_at: now.saturating_add(retain),
                    recovery_point: None,
                    attempt: 1,
                    response: None,
                    work: req.request.map(|request| {
                        Box::new(Work {
                            request: Some(request.to_vec()),
                            resume_at: Some(now),
                            note: None,
                        })
                    }),
                });
                return BeginOutcome::Claimed(Claimed {
                    fence,
                    reclaimed: false,
                    recovery_point: None,
                    attempt: 1,
                });
            }
            TableEntry::Occupied(o) => o.into_mut(),
        };
        let seen = Seen {
            state: e.state,
            same_fingerprint: e.fingerprint == *req.fingerprint,
            expired: e.expired(now),
            lease_left_ms: e.lease_until - now,
        };
        let (reclaim, continues) = match decide(seen, req.policy) {
            Decision::Claim { reclaim, continues } => (reclaim, continues),
            Decision::Replay => {
                return BeginOutcome::Replay(
                    e.response
                        .clone()
                        .unwrap_or_else(|| StoredResponse::ok(Vec::new())),
                );
            }
            Decision::InProgress(retry_after) => return BeginOutcome::InProgress { retry_after },
            Decision::KeyReused => return BeginOutcome::KeyReused,
            Decision::Parked => return BeginOutcome::Parked,
        };
        // A fresh claim over an expired or released record, or a take-over of an abandoned one.
        // The fence keeps growing either way, so no earlier owner can write again.
        e.fence += 1;
        e.fingerprint = *req.fingerprint;
        e.state = State::InProgress;
        e.lease_until = now.saturating_add(lease);
        e.expires_at = now.saturating_add(retain);
        e.response = None;
        if !continues {
            e.recovery_point = None;
            // Another request, or one after the record's retention: its work is its own.
            e.work = None;
        }
        // A resumable claim stores its request; a take-over by a call that stores none keeps
        // the request of the work it continues, and the completer's turn with it.
        if let Some(request) = req.request {
            e.work.get_or_insert_with(Box::default).request = Some(request.to_vec());
        }
        if let Some(work) = e.work.as_mut().filter(|w| w.request.is_some()) {
            work.resume_at = Some(now);
        }
        e.attempt = next_attempt(continues, e.attempt);
        BeginOutcome::Claimed(Claimed {
            fence: e.fence,
            reclaimed: reclaim,
            recovery_point: e.recovery_point.clone(),
            attempt: e.attempt,
        })
    }
}

/// The fence of a record's first claim: the store's clock in milliseconds. A record purged and
/// claimed afresh thus starts far above any fence its previous life handed out (those grew by
/// one per take-over from a time at least a retention period earlier), so no owner of a purged
/// record can ever present a valid fence again.
fn first_fence(now_ms: i64) -> u64 {
    u64::try_from(now_ms).unwrap_or(0).max(1)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard lock cannot leave an entry half-written (every update is a
    // handful of plain assignments), so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store for MemoryStore {
    fn call<'a>(&'a self, op: Operation<'a>) -> impl Future<Output = Result<Reply>> + Send + 'a {
        ready(self.call_announced(op))
    }

    fn defer(&self, write: crate::store::Deferred) {
        // In memory, every write is immediate and cannot block.
        let _ = self.call_announced(write.operation());
    }

    fn changes(&self) -> Option<&Changes> {
        Some(&self.inner.changes)
    }
}

impl MemoryStore {
    /// [`MemoryStore::call_now`], announcing a claim it ended to this process's waiters.
    fn call_announced(&self, op: Operation<'_>) -> Result<Reply> {
        let ends = store::ends(&op);
        let reply = self.call_now(op);
        if let (Some((scope, key)), Ok(_)) = (ends, &reply) {
            self.inner.changes.announce_here(scope, key);
        }
        reply
    }

    /// Every operation is answered at once: the records are in this process.
    fn call_now(&self, op: Operation<'_>) -> Result<Reply> {
        match op {
            Operation::Begin(req) => Ok(Reply::Begun(self.begin_now(req))),
            Operation::Complete { claim, response } => self
                .with_owned(claim, |e, _now| {
                    e.state = State::Completed;
                    e.response = Some(response.clone());
                    e.recovery_point = None;
                    e.work = None;
                })
                .or_else(|lost| {
                    // The same completion again (a retry whose first reply was lost): done already.
                    if self.completed_by(claim, response) {
                        Ok(())
                    } else {
                        Err(lost)
                    }
                })
                .map(|()| Reply::Done),
            Operation::Release(claim) => self
                .with_owned(claim, |e, _| {
                    e.state = State::Released;
                    e.work = None;
                })
                .map(|()| Reply::Done),
            Operation::Suspend {
                claim,
                note,
                resume_in,
            } => self
                .with_owned(claim, |e, now| {
                    // A retry of the same request takes it over at once.
                    e.lease_until = now;
                    let work = e.work.get_or_insert_with(Box::default);
                    work.note = Some(note.to_owned());
                    if work.request.is_some() {
                        work.resume_at = Some(now.saturating_add(duration_ms(resume_in)));
                    }
                })
                .map(|()| Reply::Done),
            Operation::Due { limit } => {
                let now = self.inner.clock.now_ms();
                let mut due = Vec::new();
                self.each(|e| {
                    if let Some(since) = e.due_at(now) {
                        due.push((since, e.unfinished(now)));
                    }
                });
                due.sort_by_key(|(since, _)| *since);
                due.truncate(limit);
                Ok(Reply::Due(due.into_iter().map(|(_, u)| u).collect()))
            }
            Operation::Park { claim, note } => {
                let now = self.inner.clock.now_ms();
                let hash = self.hash(claim.scope, claim.key);
                let mut shard = self.shard(hash);
                match shard.find_mut(hash, |e| e.is(claim.scope, claim.key)) {
                    Some(e)
                        if e.state == State::InProgress
                            && e.fence == claim.fence
                            && e.lease_until <= now =>
                    {
                        e.state = State::Parked;
                        let work = e.work.get_or_insert_with(Box::default);
                        work.note = Some(note.to_owned());
                        work.resume_at = None;
                        Ok(Reply::Done)
                    }
                    _ => Err(Error::FenceLost { fence: claim.fence }),
                }
            }
            Operation::Retry { scope, key } => {
                let now = self.inner.clock.now_ms();
                let hash = self.hash(scope, key);
                let mut shard = self.shard(hash);
                let done = match shard.find_mut(hash, |e| e.is(scope, key)) {
                    None => Retried::NotFound,
                    Some(e) if e.state != State::Parked => Retried::NotParked(e.state),
                    Some(e) => {
                        e.state = State::InProgress;
                        e.lease_until = now;
                        e.attempt = 1;
                        if let Some(work) = e.work.as_mut().filter(|w| w.request.is_some()) {
                            work.resume_at = Some(now);
                        }
                        Retried::Retried { fence: e.fence }
                    }
                };
                Ok(Reply::Retried(done))
            }
            Operation::Checkpoint {
                claim,
                recovery_point,
                lease,
            } => self
                .with_owned(claim, |e, now| {
                    e.recovery_point = Some(recovery_point.to_vec());
                    e.lease_until = now.saturating_add(duration_ms(lease));
                })
                .map(|()| Reply::Done),
            Operation::Renew { claim, lease } => self
                .with_owned(claim, |e, now| {
                    e.lease_until = now.saturating_add(duration_ms(lease));
                })
                .map(|()| Reply::Done),
            Operation::Lookup { scope, key } => Ok(Reply::Found(self.lookup_now(scope, key))),
            Operation::PurgeExpired | Operation::PurgeBatch => {
                Ok(Reply::Purged(self.purge_at(self.inner.clock.now_ms())))
            }
            Operation::CountExpired => {
                let now = self.inner.clock.now_ms();
                let mut n = 0;
                self.each(|e| n += u64::from(e.expired(now)));
                Ok(Reply::Counted(n))
            }
            Operation::List(query) => {
                // As a SQL store reads: the records the listing's index offers, in its order,
                // at most `examine` of them.
                let now = self.inner.clock.now_ms();
                let order = query.order();
                let mut offered = Vec::new();
                self.each(|e| {
                    let info = e.info(now, false);
                    if query.offers(&info) {
                        offered.push(info);
                    }
                });
                offered.sort_by(|a, b| order.cmp(a, b));
                let exhausted = offered.len() <= query.examine;
                offered.truncate(query.examine);
                Ok(Reply::Listed(query.answer(offered, exhausted)))
            }
            Operation::Inspect { scope, key } => {
                let now = self.inner.clock.now_ms();
                let hash = self.hash(scope, key);
                let shard = self.shard(hash);
                let found = shard.find(hash, |e| e.is(scope, key));
                Ok(Reply::Records(
                    found.map(|e| e.info(now, true)).into_iter().collect(),
                ))
            }
            Operation::ForceRelease { scope, key, fence } => {
                let now = self.inner.clock.now_ms();
                let hash = self.hash(scope, key);
                let mut shard = self.shard(hash);
                let done = match shard.find_mut(hash, |e| e.is(scope, key)) {
                    None => ForcedRelease::NotFound,
                    Some(e) if e.expired(now) => ForcedRelease::NotFound,
                    Some(e) if fence.is_some_and(|f| f != e.fence) => ForcedRelease::FenceMoved {
                        fence: e.fence,
                        state: e.state,
                    },
                    Some(e) if !matches!(e.state, State::InProgress | State::Parked) => {
                        ForcedRelease::NotInProgress(e.state)
                    }
                    Some(e) => {
                        e.state = State::Released;
                        e.fence += 1;
                        e.work = None;
                        ForcedRelease::Released { fence: e.fence }
                    }
                };
                Ok(Reply::ForceReleased(done))
            }
            Operation::Stats { expiring_within } => {
                let now = self.inner.clock.now_ms();
                // Every record: the memory store holds no more than its process can walk.
                let mut stats = StoreStats::default();
                self.each(|e| stats.count(&e.info(now, false), expiring_within));
                stats.complete = true;
                Ok(Reply::Stats(Box::new(stats)))
            }
        }
    }

    /// Calls `f` on every record, one shard locked at a time.
    fn each(&self, mut f: impl FnMut(&Entry)) {
        for shard in self.inner.shards.iter() {
            lock(shard).iter().for_each(&mut f);
        }
    }

    fn lookup_now(&self, scope: &str, key: &str) -> Option<Record> {
        let now = self.inner.clock.now_ms();
        let hash = self.hash(scope, key);
        let shard = self.shard(hash);
        shard
            .find(hash, |e| e.is(scope, key))
            .filter(|e| !e.expired(now) && e.state != State::Released)
            .map(|e| Record {
                fingerprint: e.fingerprint,
                state: match e.state {
                    State::Completed => RecordState::Completed,
                    State::Parked => RecordState::Parked,
                    _ => RecordState::InProgress,
                },
                fence: e.fence,
                response: e.response.clone(),
                lease_remaining: (e.state == State::InProgress).then(|| {
                    Duration::from_millis(e.lease_until.saturating_sub(now).max(0) as u64)
                }),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Policy;

    fn begin(store: &MemoryStore, scope: &str, key: &str) -> BeginOutcome {
        store.begin_now(BeginRequest::new(
            scope,
            key,
            &Fingerprint::from_bytes([1; 32]),
            &Policy::DEFAULT,
        ))
    }

    /// Identities held in the entry and in an allocation of their own are told apart by where
    /// the scope ends, not only by their bytes.
    #[test]
    fn identities_inline_and_boxed() {
        let store = MemoryStore::new();
        let long = "k".repeat(INLINE_IDENT);
        let cases = [
            ("ab", "c".to_owned()),
            ("a", "bc".to_owned()),
            ("ab", long.clone()),
            ("a", format!("b{long}")),
        ];
        for (scope, key) in &cases {
            assert!(matches!(
                begin(&store, scope, key),
                BeginOutcome::Claimed(_)
            ));
        }
        for (scope, key) in &cases {
            assert!(matches!(
                begin(&store, scope, key),
                BeginOutcome::InProgress { .. }
            ));
            let found = store.lookup_now(scope, key).expect("claimed");
            assert_eq!(found.state, RecordState::InProgress);
        }
        assert_eq!(store.len(), cases.len());
        let mut listed = Vec::new();
        store.each(|e| listed.push(e.info(0, false)));
        for (scope, key) in &cases {
            assert!(listed.iter().any(|r| r.scope == *scope && r.key == *key));
        }
    }
}
