//! The transactional flow of `#[idempotent(…, transaction = tx)]`: claim, body and completion in
//! one database transaction.
//!
//! The macro calls [`tx_start`], runs the body inline with `&mut` the claim's transaction, then
//! calls [`tx_finish`]: no closure, so nothing higher-ranked stands between the body and the
//! caller's `Send` checks.

use std::fmt;

use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::guard::{Begun, begin as begin_separate};
use crate::key::Key;
use crate::observe::{self, Outcome};
use crate::private::{FromIdemError, IdemResult, Prepared, fail, note_replay, replay};
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, Policy, StoredResponse};
use crate::replay::{FinalError, Replay, decode_final, encode_final};
use crate::store::TxStore;
use crate::store::sql::map_err;

type Tx<S> = sqlx::Transaction<'static, <S as TxStore>::Database>;

/// What [`tx_start`] found.
pub enum TxStart<S: TxStore, R> {
    /// Replayed or refused: return this.
    Done(R),
    /// Claimed inside an open transaction: run the body on it, then [`tx_finish`].
    Claimed(TxClaim<S>),
}

impl<S: TxStore, R> fmt::Debug for TxStart<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TxStart::Done(_) => f.write_str("Done"),
            TxStart::Claimed(c) => f.debug_tuple("Claimed").field(c).finish(),
        }
    }
}

/// A claim held inside an open transaction.
pub struct TxClaim<S: TxStore> {
    tx: Tx<S>,
    scope: String,
    key: Key,
    fingerprint: Fingerprint,
    policy: Policy,
    fence: u64,
}

impl<S: TxStore> fmt::Debug for TxClaim<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxClaim")
            .field("scope", &self.scope)
            .field("key", &self.key)
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl<S: TxStore> TxClaim<S> {
    /// The transaction the body runs in.
    pub fn transaction(&mut self) -> &mut Tx<S> {
        &mut self.tx
    }
}

/// Opens the transaction and claims inside it; a replay or a refusal ends it at once.
pub async fn tx_start<S, R, M>(store: &S, prepared: Prepared) -> TxStart<S, R>
where
    S: TxStore,
    R: IdemResult,
    R::Ok: Replay<M>,
    R::Err: FromIdemError,
{
    match start(store, prepared).await {
        Ok(Started::Claimed(c)) => TxStart::Claimed(c),
        Ok(Started::Done(stored)) => TxStart::Done(replay::<R, M>(stored)),
        Err(e) => TxStart::Done(fail(e)),
    }
}

/// [`tx_start`] for functions whose final errors are stored.
pub async fn tx_start_final<S, R, M>(store: &S, prepared: Prepared) -> TxStart<S, R>
where
    S: TxStore,
    R: IdemResult,
    R::Ok: Replay<M>,
    R::Err: FromIdemError + FinalError,
{
    match start(store, prepared).await {
        Ok(Started::Claimed(c)) => TxStart::Claimed(c),
        Ok(Started::Done(stored)) if stored.is_error => {
            note_replay(&stored);
            TxStart::Done(match decode_final::<R::Err>(stored) {
                Ok(e) => R::from_err(e),
                Err(e) => fail(e),
            })
        }
        Ok(Started::Done(stored)) => TxStart::Done(replay::<R, M>(stored)),
        Err(e) => TxStart::Done(fail(e)),
    }
}

enum Started<S: TxStore> {
    Claimed(TxClaim<S>),
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
            observe::record(Outcome::Claimed, &scope, key.as_str(), c.fence);
            Ok(Started::Claimed(TxClaim {
                tx,
                fence: c.fence,
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

/// Completes and commits on `Ok`, rolls back on `Err`.
pub async fn tx_finish<S, R, M>(store: &S, claim: TxClaim<S>, out: R) -> R
where
    S: TxStore,
    R: IdemResult,
    R::Ok: Replay<M>,
    R::Err: FromIdemError,
{
    match out.into_result() {
        Ok(v) => commit::<S, R, M>(store, claim, v).await,
        Err(e) => {
            rollback(claim).await;
            R::from_err(e)
        }
    }
}

/// [`tx_finish`] for functions whose final errors are stored: the transaction rolls back, then
/// the error is recorded on its own, if the identity is still free.
pub async fn tx_finish_final<S, R, M>(store: &S, claim: TxClaim<S>, out: R) -> R
where
    S: TxStore,
    R: IdemResult,
    R::Ok: Replay<M>,
    R::Err: FromIdemError + FinalError,
{
    match out.into_result() {
        Ok(v) => commit::<S, R, M>(store, claim, v).await,
        Err(e) => {
            let (scope, key, fingerprint, policy) = (
                claim.scope.clone(),
                claim.key.clone(),
                claim.fingerprint,
                claim.policy,
            );
            rollback(claim).await;
            if e.is_final() {
                if let Ok(stored) = encode_final(&e) {
                    if let Ok(Begun::Claimed(guard)) =
                        begin_separate(store, scope, key, fingerprint, policy).await
                    {
                        let _ = guard.complete(&stored).await;
                    }
                }
            }
            R::from_err(e)
        }
    }
}

async fn commit<S, R, M>(store: &S, mut claim: TxClaim<S>, v: R::Ok) -> R
where
    S: TxStore,
    R: IdemResult,
    R::Ok: Replay<M>,
    R::Err: FromIdemError,
{
    let stored = match v.encode() {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let c = ClaimRef {
        scope: &claim.scope,
        key: claim.key.as_str(),
        fence: claim.fence,
    };
    if let Err(e) = store
        .complete_in(&mut claim.tx, c, &stored, claim.policy.retain)
        .await
    {
        return fail(e);
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
        Err(e) => fail(map_err(e)),
    }
}

async fn rollback<S: TxStore>(claim: TxClaim<S>) {
    let _ = claim.tx.rollback().await;
    observe::record(
        Outcome::Released,
        &claim.scope,
        claim.key.as_str(),
        claim.fence,
    );
}
