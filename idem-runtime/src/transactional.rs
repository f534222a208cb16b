//! The transactional flow of `#[idempotent(…, transaction = tx)]`: claim, body and completion in
//! one database transaction.
//!
//! The macro calls [`tx_start`], runs the body inline on the transaction it opened (no closure,
//! so nothing higher-ranked stands between the body and the caller's `Send` checks), then
//! [`tx_finish`], which is the one call that needs the return type's bounds.

use std::fmt;

use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::guard::{Begun, begin as begin_separate};
use crate::key::Key;
use crate::observe::{self, Outcome};
use crate::private::{Direct, ErrorOps, IdemResult, Pointer, Prepared, replay};
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, Policy, StoredResponse};
use crate::replay::Replay;
use crate::store::TxStore;
use crate::store::sql::map_err;

type Tx<S> = sqlx::Transaction<'static, <S as TxStore>::Database>;

/// A value that gives a transactional store; see [`crate::private::IsStore`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a guarded body inside a database transaction",
    label = "not a transactional store",
    note = "`transaction = …` needs `idem::SqliteStore` or `idem::PgStore` (or a pointer to one)"
)]
pub trait IsTxStore<M> {
    /// The store.
    type Handle: TxStore + Clone;
    /// The store.
    fn into_handle(self) -> Self::Handle;
}

impl<S: TxStore + Clone> IsTxStore<Direct> for S {
    type Handle = S;
    fn into_handle(self) -> S {
        self
    }
}

impl<P, S> IsTxStore<Pointer> for P
where
    P: std::ops::Deref<Target = S>,
    S: TxStore + Clone,
{
    type Handle = S;
    fn into_handle(self) -> S {
        (*self).clone()
    }
}

/// Checks that `s` gives a transactional store; see [`crate::private::store`].
pub fn tx_store<S: IsTxStore<M>, M>(s: S) -> S::Handle {
    s.into_handle()
}

/// What [`tx_start`] found: a claim inside an open transaction, or the end of the story (a
/// replay, or a refusal).
pub struct TxStart<T> {
    state: Result<TxClaim<T>, Result<StoredResponse, Error>>,
}

impl<T> fmt::Debug for TxStart<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            Ok(c) => f.debug_tuple("Claimed").field(c).finish(),
            Err(done) => f.debug_tuple("Done").field(done).finish(),
        }
    }
}

impl<T> TxStart<T> {
    /// The transaction to run the body in, when the claim was taken.
    pub fn transaction(&mut self) -> Option<&mut T> {
        self.state.as_mut().ok().map(|c| &mut c.tx)
    }

    /// The transaction and what the body may know about its claim, when the claim was taken.
    pub fn claimed(&mut self) -> Option<(&mut T, crate::guard::ClaimInfo)> {
        self.state.as_mut().ok().map(|c| {
            let info = crate::guard::ClaimInfo {
                scope: c.scope.clone(),
                key: c.key.clone(),
                fence: c.fence,
                reclaimed: c.reclaimed,
                recovery_point: c.recovery_point.clone(),
            };
            (&mut c.tx, info)
        })
    }
}

/// A claim held inside the open transaction `T`.
pub struct TxClaim<T> {
    tx: T,
    scope: String,
    key: Key,
    fingerprint: Fingerprint,
    policy: Policy,
    fence: u64,
    reclaimed: bool,
    recovery_point: Option<Vec<u8>>,
}

impl<T> fmt::Debug for TxClaim<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxClaim")
            .field("scope", &self.scope)
            .field("key", &self.key)
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

/// Opens the transaction and claims inside it; a replay or a refusal ends it at once.
pub async fn tx_start<S: TxStore>(store: &S, prepared: Prepared) -> TxStart<Tx<S>> {
    TxStart {
        state: match start(store, prepared).await {
            Ok(Started::Claimed(c)) => Ok(c),
            Ok(Started::Done(stored)) => Err(Ok(stored)),
            Err(e) => Err(Err(e)),
        },
    }
}

enum Started<S: TxStore> {
    Claimed(TxClaim<Tx<S>>),
    Done(StoredResponse),
}

async fn start<S: TxStore>(store: &S, prepared: Prepared) -> Result<Started<S>, Error> {
    let (scope, key, fingerprint, policy) = prepared.into_parts()?;
    let mut tx = store.begin_transaction().await?;
    let req = BeginRequest {
        scope: &scope,
        key: key.as_str(),
        fingerprint: &fingerprint,
        policy: &policy,
    };
    let outcome = store.begin_in(&mut tx, req).await.inspect_err(|_| {
        observe::record(Outcome::StoreError, &scope, key.as_str(), 0);
    })?;
    match outcome {
        BeginOutcome::Claimed(c) => {
            let what = if c.reclaimed {
                Outcome::Reclaimed
            } else {
                Outcome::Claimed
            };
            observe::record(what, &scope, key.as_str(), c.fence);
            Ok(Started::Claimed(TxClaim {
                tx,
                fence: c.fence,
                reclaimed: c.reclaimed,
                recovery_point: c.recovery_point,
                scope,
                key,
                fingerprint,
                policy,
            }))
        }
        BeginOutcome::Replay(stored) => {
            observe::record(Outcome::Replayed, &scope, key.as_str(), 0);
            // Nothing was written: ending the transaction either way costs the same.
            tx.commit().await.map_err(map_err)?;
            Ok(Started::Done(stored))
        }
        BeginOutcome::InProgress { retry_after } => {
            observe::record(Outcome::InProgress, &scope, key.as_str(), 0);
            Err(Error::InProgress {
                retry_after: retry_after.max(std::time::Duration::from_secs(1)),
            })
        }
        BeginOutcome::KeyReused => {
            observe::record(Outcome::KeyReused, &scope, key.as_str(), 0);
            Err(Error::KeyReused)
        }
    }
}

/// The function's return value. For a claim, with the body's `out`: completes and commits on
/// `Ok`; on `Err` rolls back, then records a final error on its own if the function stores
/// final errors and the identity is still free. Otherwise the replay, or the refusal.
pub async fn tx_finish<S, R, M>(
    store: &S,
    start: TxStart<Tx<S>>,
    errors: ErrorOps<R::Err>,
    out: Option<R>,
) -> R
where
    S: TxStore,
    R: IdemResult,
    R::Ok: Replay<M>,
{
    let (claim, out) = match (start.state, out) {
        (Ok(claim), Some(out)) => (claim, out),
        (Err(Ok(stored)), _) => return replay::<R, M>(stored, &errors),
        (Err(Err(e)), _) => return errors.fail(e),
        (Ok(claim), None) => {
            // Unreachable from generated code: a claim always runs the body.
            rollback::<S>(claim).await;
            return errors.fail(Error::Config("the guarded body did not run".into()));
        }
    };
    match out.into_result() {
        Ok(v) => commit::<S, R, M>(store, claim, v, &errors).await,
        Err(e) => {
            let (scope, key, fingerprint, policy) = (
                claim.scope.clone(),
                claim.key.clone(),
                claim.fingerprint,
                claim.policy,
            );
            rollback::<S>(claim).await;
            if let Some(finals) = &errors.finals
                && (finals.is_final)(&e)
                && let Ok(stored) = (finals.encode)(&e)
                && let Ok(Begun::Claimed(guard)) =
                    begin_separate(store, scope, key, fingerprint, policy).await
            {
                let _ = guard.complete(&stored).await;
            }
            R::from_err(e)
        }
    }
}

async fn commit<S, R, M>(
    store: &S,
    mut claim: TxClaim<Tx<S>>,
    v: R::Ok,
    errors: &ErrorOps<R::Err>,
) -> R
where
    S: TxStore,
    R: IdemResult,
    R::Ok: Replay<M>,
{
    let stored = match v.encode() {
        Ok(s) => s,
        Err(e) => return errors.fail(e),
    };
    let c = ClaimRef {
        scope: &claim.scope,
        key: claim.key.as_str(),
        fence: claim.fence,
    };
    if let Err(e) = store.complete_in(&mut claim.tx, c, &stored).await {
        return errors.fail(e);
    }
    match claim.tx.commit().await {
        Ok(()) => {
            observe::record(
                Outcome::Completed,
                &claim.scope,
                claim.key.as_str(),
                claim.fence,
            );
            R::from_ok(v)
        }
        // Nothing was committed (or, if the connection dropped during COMMIT, everything was):
        // either way a retry with the same key gets the right answer.
        Err(e) => errors.fail(map_err(e)),
    }
}

async fn rollback<S: TxStore>(claim: TxClaim<Tx<S>>) {
    // Errors are moot: a connection that is gone has rolled the transaction back too.
    let _ = claim.tx.rollback().await;
    observe::record(
        Outcome::Released,
        &claim.scope,
        claim.key.as_str(),
        claim.fence,
    );
}
