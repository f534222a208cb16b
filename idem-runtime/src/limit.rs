//! A bound on how many new records a store creates, per instance or per principal.
//!
//! Every request with a new key leaves a record for its retention (24 hours by default), a
//! failing one too: without a bound, a flood of new keys grows the table as fast as it comes.
//! [`BoundedStore`] in front of any store gives each bucket (the whole instance, or each
//! principal) a budget of new records, refilled at a steady rate. A request over its budget is
//! refused before anything is written, with [`Error::TooManyNewKeys`] (HTTP 429 with
//! `Retry-After`); a request whose record exists already (a retry, a replay, a request in
//! progress) is always served.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::record::BeginOutcome;
use crate::store::{Operation, Reply, Store};

/// The most buckets kept at once: past it, the buckets whose budget is full again are dropped
/// (they are what a new bucket would be), then the least recently used half.
const MAX_BUCKETS: usize = 65_536;

type BucketFn = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// A store that bounds the new records it creates; see the [module](self) documentation.
///
/// ```
/// use idem::{BoundedStore, MemoryStore};
///
/// // 50 new records a second per instance, up to 500 at once.
/// let store = BoundedStore::new(MemoryStore::new(), 50.0).burst(500);
/// // Per principal, for the tower guard's scopes (`<namespace>:<METHOD>:<route>:<principal>`):
/// // each caller 5 new records a second, 100 at once.
/// let per_caller = BoundedStore::new(MemoryStore::new(), 5.0)
///     .burst(100)
///     .per(|scope| scope.rsplit(':').next().map(str::to_owned));
/// ```
///
/// Counted per instance: with several instances, each has its own budget. A claim counts when
/// the store answers it as a first attempt (a new record, or one claimed afresh after a
/// release). Not for transactional mode (`transaction = tx`), whose claim runs inside the
/// body's transaction.
pub struct BoundedStore<S> {
    shared: Arc<(S, Limit)>,
}

impl<S> Clone for BoundedStore<S> {
    fn clone(&self) -> Self {
        BoundedStore {
            shared: self.shared.clone(),
        }
    }
}

impl<S> fmt::Debug for BoundedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = &self.shared.1;
        f.debug_struct("BoundedStore")
            .field("per_second", &limit.rate)
            .field("burst", &limit.burst)
            .field("per_principal", &limit.by.is_some())
            .finish_non_exhaustive()
    }
}

struct Limit {
    rate: f64,
    burst: f64,
    by: Option<BucketFn>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Limit {
    /// The bucket's tokens now (refilled since it was last seen); a new bucket is full.
    fn refill(&self, b: &mut Bucket, now: Instant) {
        let gained = now.saturating_duration_since(b.at).as_secs_f64() * self.rate;
        b.tokens = (b.tokens + gained).min(self.burst);
        b.at = now;
    }

    /// Whether `bucket` has a new record left; when not, how long until it has.
    fn check(&self, bucket: &str) -> std::result::Result<(), Duration> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let Some(b) = buckets.get_mut(bucket) else {
            return Ok(());
        };
        self.refill(b, now);
        if b.tokens >= 1.0 {
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.rate))
        }
    }

    /// Counts a new record against `bucket` (which may go into debt under a race: the requests
    /// after it wait that much longer).
    fn take(&self, bucket: &str) {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if !buckets.contains_key(bucket) && buckets.len() >= MAX_BUCKETS {
            self.shrink(&mut buckets, now);
        }
        let b = buckets.entry(bucket.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        self.refill(b, now);
        b.tokens -= 1.0;
    }

    fn shrink(&self, buckets: &mut HashMap<String, Bucket>, now: Instant) {
        buckets.retain(|_, b| {
            self.refill(b, now);
            b.tokens < self.burst
        });
        if buckets.len() >= MAX_BUCKETS {
            let mut seen: Vec<Instant> = buckets.values().map(|b| b.at).collect();
            seen.sort_unstable();
            let cut = seen[seen.len() / 2];
            buckets.retain(|_, b| b.at > cut);
        }
    }
}

impl<S: Store> BoundedStore<S> {
    /// `store`, creating at most `per_second` new records a second (at least one every hour),
    /// up to one second's worth at once unless [`BoundedStore::burst`] says more; one budget
    /// for the whole instance unless [`BoundedStore::per`] splits it.
    pub fn new(store: S, per_second: f64) -> Self {
        let rate = if per_second.is_finite() {
            per_second.max(1.0 / 3600.0)
        } else {
            f64::MAX
        };
        BoundedStore {
            shared: Arc::new((
                store,
                Limit {
                    rate,
                    burst: rate.max(1.0),
                    by: None,
                    buckets: Mutex::new(HashMap::new()),
                },
            )),
        }
    }

    fn edit(self, f: impl FnOnce(&mut Limit)) -> Self {
        let (store, mut limit) = match Arc::try_unwrap(self.shared) {
            Ok(parts) => parts,
            Err(_) => unreachable!("a BoundedStore is configured before it is cloned"),
        };
        f(&mut limit);
        BoundedStore {
            shared: Arc::new((store, limit)),
        }
    }

    /// How many new records a bucket may create at once, after a quiet spell (at least one).
    pub fn burst(self, records: u32) -> Self {
        self.edit(|l| l.burst = f64::from(records.max(1)))
    }

    /// A budget per principal (or any part of a scope): `bucket` names a record's bucket from
    /// its scope, `None` for the instance's shared one. At most 65,536 buckets are kept; past
    /// that, the ones with their budget full again are forgotten first.
    pub fn per(self, bucket: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Self {
        self.edit(|l| l.by = Some(Arc::new(bucket)))
    }

    /// The store it bounds.
    pub fn inner(&self) -> &S {
        &self.shared.0
    }

    fn bucket(&self, scope: &str) -> String {
        self.shared
            .1
            .by
            .as_ref()
            .and_then(|by| by(scope))
            .unwrap_or_default()
    }
}

/// Whether `begin` answered a claim that counts as a new record.
fn is_new(outcome: &BeginOutcome) -> bool {
    matches!(outcome, BeginOutcome::Claimed(c) if c.attempt == 1 && !c.reclaimed)
}

impl<S: Store> Store for BoundedStore<S> {
    async fn call(&self, op: Operation<'_>) -> Result<Reply> {
        let (store, limit) = &*self.shared;
        let Operation::Begin(req) = op else {
            return store.call(op).await;
        };
        let bucket = self.bucket(req.scope);
        if let Err(retry_after) = limit.check(&bucket) {
            // Over its budget: only a request whose record exists already is served.
            if store.lookup(req.scope, req.key).await?.is_none() {
                crate::observe::limited();
                return Err(Error::TooManyNewKeys {
                    retry_after: retry_after.max(Duration::from_secs(1)),
                });
            }
        }
        let outcome = store.begin(req).await?;
        if is_new(&outcome) {
            limit.take(&bucket);
        }
        Ok(Reply::Begun(outcome))
    }

    fn defer(&self, write: crate::store::Deferred) {
        self.shared.0.defer(write)
    }

    fn changes(&self) -> Option<&crate::store::Changes> {
        self.shared.0.changes()
    }
}
