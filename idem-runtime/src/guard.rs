//! The record lifecycle as a guard: `begin`, then `complete` or `release`, with `checkpoint` in
//! between and a release on drop.
//!
//! This is the API `#[idempotent]` expands to, and the one to call by hand when a guarded
//! operation does not fit a function.
//!
//! ```
//! use idem_runtime::{begin, Begun, Fingerprint, Key, MemoryStore, Policy, StoredResponse};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let key = Key::parse("0b2c1c6e-1f7b-4f0f-9d3a-8f2f6f0a1111")?;
//! let fp = Fingerprint::of(&("ORD-1", 250))?;
//!
//! match begin(&store, "refund:ORD-1".into(), key.clone(), fp, Policy::DEFAULT).await? {
//!     Begun::Claimed(guard) => {
//!         // Move the money, passing guard.downstream_key("charge") to the gateway.
//!         guard.complete(&StoredResponse::ok(b"{\"refunded\":250}".to_vec())).await?;
//!     }
//!     Begun::Replay(_) => unreachable!("first time"),
//! }
//! // The retry replays the stored bytes and does not move money again.
//! match begin(&store, "refund:ORD-1".into(), key, fp, Policy::DEFAULT).await? {
//!     Begun::Replay(stored) => assert_eq!(stored.body, &b"{\"refunded\":250}"[..]),
//!     Begun::Claimed(_) => unreachable!("already done"),
//! }
//! # Ok::<(), idem_runtime::Error>(())
//! # }).unwrap();
//! ```

use std::fmt;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::observe::{self, Outcome};
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, Policy, StoredResponse};
use crate::store::Store;

/// What [`begin`] hands back when the request may proceed or is already done.
pub enum Begun<'s, S: Store> {
    /// First run (or a take-over of an abandoned one): run the side effect, then complete.
    Claimed(Guard<'s, S>),
    /// Already done: return these bytes and do nothing else.
    Replay(StoredResponse),
}

impl<S: Store> fmt::Debug for Begun<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Begun::Claimed(g) => f.debug_tuple("Claimed").field(g).finish(),
            Begun::Replay(r) => f.debug_tuple("Replay").field(r).finish(),
        }
    }
}

/// Begins a guarded operation on `(scope, key)`.
///
/// A live claim by someone else is [`Error::InProgress`]; a completed or live record with
/// another fingerprint is [`Error::KeyReused`].
pub async fn begin<S: Store>(
    store: &S,
    scope: String,
    key: Key,
    fingerprint: Fingerprint,
    policy: Policy,
) -> Result<Begun<'_, S>> {
    let outcome = store
        .begin(BeginRequest {
            scope: &scope,
            key: key.as_str(),
            fingerprint: &fingerprint,
            policy: &policy,
        })
        .await;
    begun(store, scope, key, policy, outcome)
}

/// What `begin` answers, given what the store found (shared with the macro's flow, which awaits
/// the store itself to keep its future small).
pub(crate) fn begun<S: Store>(
    store: &S,
    scope: String,
    key: Key,
    policy: Policy,
    outcome: Result<BeginOutcome>,
) -> Result<Begun<'_, S>> {
    match outcome {
        Ok(BeginOutcome::Claimed(c)) => {
            let what = if c.reclaimed {
                Outcome::Reclaimed
            } else {
                Outcome::Claimed
            };
            observe::record(what, &scope, key.as_str(), c.fence);
            Ok(Begun::Claimed(Guard {
                store,
                scope,
                key,
                fence: c.fence,
                reclaimed: c.reclaimed,
                recovery_point: c.recovery_point,
                policy,
                armed: true,
            }))
        }
        Ok(BeginOutcome::Replay(stored)) => {
            observe::record(Outcome::Replayed, &scope, key.as_str(), 0);
            Ok(Begun::Replay(stored))
        }
        Ok(BeginOutcome::InProgress { retry_after }) => {
            observe::record(Outcome::InProgress, &scope, key.as_str(), 0);
            Err(Error::InProgress {
                retry_after: retry_after.max(Duration::from_secs(1)),
            })
        }
        Ok(BeginOutcome::KeyReused) => {
            observe::record(Outcome::KeyReused, &scope, key.as_str(), 0);
            Err(Error::KeyReused)
        }
        Err(e) => {
            observe::record(Outcome::StoreError, &scope, key.as_str(), 0);
            Err(e)
        }
    }
}

/// A claim on a record. Complete it with the response, or release it so a retry can run.
///
/// Dropping a guard that was neither completed nor released (a panic in the body, a cancelled
/// future, a client that hung up) releases the claim at once, in the background, rather than
/// leaving it until the lease runs out.
pub struct Guard<'s, S: Store> {
    store: &'s S,
    scope: String,
    key: Key,
    fence: u64,
    reclaimed: bool,
    recovery_point: Option<Vec<u8>>,
    policy: Policy,
    armed: bool,
}

impl<S: Store> fmt::Debug for Guard<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("scope", &self.scope)
            .field("key", &self.key)
            .field("fence", &self.fence)
            .field("reclaimed", &self.reclaimed)
            .finish_non_exhaustive()
    }
}

impl<'s, S: Store> Guard<'s, S> {
    /// The scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The fence this claim holds.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Whether this claim took over an abandoned one: a previous attempt may have done part of
    /// the work (see [`Guard::recovery_point`]).
    pub fn is_reclaim(&self) -> bool {
        self.reclaimed
    }

    /// How far a previous attempt of this request got, as it recorded with
    /// [`Guard::checkpoint`].
    pub fn recovery_point(&self) -> Option<&[u8]> {
        self.recovery_point.as_deref()
    }

    /// A key for a call to the outside world, derived from `(scope, key, step)`: the same for
    /// every attempt of this request, different for each step. Pass it as the gateway's own
    /// idempotency key, so a call that a take-over repeats is deduplicated there.
    pub fn downstream_key(&self, step: &str) -> String {
        downstream_key(&self.scope, self.key.as_str(), step)
    }

    /// What the body may know about its claim, owned: see [`ClaimInfo`].
    pub fn info(&self) -> ClaimInfo {
        ClaimInfo {
            scope: self.scope.clone(),
            key: self.key.clone(),
            fence: self.fence,
            reclaimed: self.reclaimed,
            recovery_point: self.recovery_point.clone(),
        }
    }

    pub(crate) fn claim(&self) -> ClaimRef<'_> {
        ClaimRef {
            scope: &self.scope,
            key: self.key.as_str(),
            fence: self.fence,
        }
    }

    /// Records how far the side effect got (any bytes), and renews the lease.
    pub async fn checkpoint(&mut self, recovery_point: &[u8]) -> Result<()> {
        let result = self
            .store
            .checkpoint(self.claim(), recovery_point, self.policy.lease)
            .await;
        if let Err(Error::FenceLost { .. }) = result {
            self.armed = false;
            observe::record(
                Outcome::FenceLost,
                &self.scope,
                self.key.as_str(),
                self.fence,
            );
        }
        result
    }

    /// Stores `response` for replay and ends the claim.
    ///
    /// [`Error::FenceLost`] means a newer attempt took the record over: nothing was written.
    /// Any other error leaves the claim in place (not released: the side effect happened, so a
    /// retry must not run it again); it is re-claimed when its lease runs out.
    pub async fn complete(self, response: &StoredResponse) -> Result<()> {
        let mut result = self.store.complete(self.claim(), response).await;
        if let Err(Error::Unavailable(_)) = result {
            result = self.retry_complete(response).await;
        }
        self.completed(result)
    }

    /// Retries a completion lost to an unavailable store. Boxed: it is rare, and keeping it out
    /// of line keeps the common path's future small.
    pub(crate) fn retry_complete<'a>(
        &'a self,
        response: &'a StoredResponse,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + 'a>> {
        Box::pin(retry_complete(self.store, self.claim(), response))
    }

    /// Ends the guard after its completion was attempted.
    pub(crate) fn completed(mut self, result: Result<()>) -> Result<()> {
        self.armed = false;
        let outcome = match &result {
            Ok(()) => Outcome::Completed,
            Err(Error::FenceLost { .. }) => Outcome::FenceLost,
            Err(_) => Outcome::StoreError,
        };
        observe::record(outcome, &self.scope, self.key.as_str(), self.fence);
        result
    }

    /// Ends this guard without writing: the claim stays until its lease runs out. For when the
    /// side effect happened but its answer cannot be stored.
    pub(crate) fn keep_claimed(mut self) {
        self.armed = false;
    }

    /// Gives the claim up so that a retry runs the body again (the body failed, and only
    /// successes are worth replaying).
    pub async fn release(self) -> Result<()> {
        let result = self.store.release(self.claim()).await;
        self.released(result)
    }

    /// Ends the guard after its release was attempted.
    pub(crate) fn released(mut self, result: Result<()>) -> Result<()> {
        self.armed = false;
        let outcome = match &result {
            Ok(()) => Outcome::Released,
            Err(Error::FenceLost { .. }) => Outcome::FenceLost,
            Err(_) => Outcome::StoreError,
        };
        observe::record(outcome, &self.scope, self.key.as_str(), self.fence);
        result
    }
}

/// A completion lost to a dropped connection is retried briefly: the side effect has happened,
/// and the alternative is a claim that waits out its lease.
async fn retry_complete<S: Store>(
    store: &S,
    claim: ClaimRef<'_>,
    response: &StoredResponse,
) -> Result<()> {
    let mut result = Err(Error::Unavailable("not attempted".into()));
    for backoff_ms in [20, 100, 400] {
        tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
        result = store.complete(claim, response).await;
        if !matches!(result, Err(Error::Unavailable(_))) {
            break;
        }
    }
    result
}

impl<S: Store> Drop for Guard<'_, S> {
    fn drop(&mut self) {
        if self.armed {
            observe::record(
                Outcome::Released,
                &self.scope,
                self.key.as_str(),
                self.fence,
            );
            self.store.release_in_background(
                std::mem::take(&mut self.scope),
                self.key.as_str().to_owned(),
                self.fence,
            );
        }
    }
}

/// The downstream key for `(scope, key, step)`; see [`Guard::downstream_key`].
pub fn downstream_key(scope: &str, key: &str, step: &str) -> String {
    let mut h = Sha256::new();
    for part in [scope, key, step] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut out = String::with_capacity(37);
    out.push_str("idem-");
    for b in &digest[..16] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// What a guarded body knows about its claim: `#[idempotent(…, claim = c)]` hands it to the body
/// as `c`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimInfo {
    pub(crate) scope: String,
    pub(crate) key: Key,
    pub(crate) fence: u64,
    pub(crate) reclaimed: bool,
    pub(crate) recovery_point: Option<Vec<u8>>,
}

impl ClaimInfo {
    /// The scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The fence this claim holds.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Whether this claim took over an abandoned one.
    pub fn is_reclaim(&self) -> bool {
        self.reclaimed
    }

    /// How far a previous attempt got, if it recorded it.
    pub fn recovery_point(&self) -> Option<&[u8]> {
        self.recovery_point.as_deref()
    }

    /// The downstream key for `step`: see [`Guard::downstream_key`].
    pub fn downstream_key(&self, step: &str) -> String {
        downstream_key(&self.scope, self.key.as_str(), step)
    }
}
