//! The transactional flow of `#[idempotent(…, transaction = tx)]`: claim, body and completion in
//! one database transaction.

use crate::error::Error;
use crate::guard::Begun;
use crate::guard::begin as begin_separate;
use crate::observe::{self, Outcome};
use crate::private::{FromIdemError, IdemResult, Prepared, fail, note_replay, replay};
use crate::record::{BeginOutcome, BeginRequest, ClaimRef};
use crate::replay::{FinalError, Replay, decode_final, encode_final};
use crate::store::TxStore;
use crate::store::sql::map_err;

type Tx<S> = sqlx::Transaction<'static, <S as TxStore>::Database>;

enum Started<S: TxStore> {
    Claimed(Tx<S>, u64),
    Done(crate::record::StoredResponse),
}

async fn start<S: TxStore>(
    store: &S,
    scope: &str,
    key: &str,
    req: BeginRequest<'_>,
) -> Result<Started<S>, Error> {
    let mut tx = store.begin_transaction().await?;
    let outcome = store.begin_in(&mut tx, req).await;
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            observe::record(Outcome::StoreError, scope, key, 0);
            return Err(e);
        }
    };
    match outcome {
        BeginOutcome::Claimed(c) => {
            observe::record(Outcome::Claimed, scope, key, c.fence);
            Ok(Started::Claimed(tx, c.fence))
        }
        BeginOutcome::Replay(stored) => {
            observe::record(Outcome::Replayed, scope, key, 0);
            // Nothing was written: ending the transaction either way costs the same.
            tx.commit().await.map_err(map_err)?;
            Ok(Started::Done(stored))
        }
        BeginOutcome::InProgress { retry_after } => {
            observe::record(Outcome::InProgress, scope, key, 0);
            Err(Error::InProgress {
                retry_after: retry_after.max(std::time::Duration::from_secs(1)),
            })
        }
        BeginOutcome::KeyReused => {
            observe::record(Outcome::KeyReused, scope, key, 0);
            Err(Error::KeyReused)
        }
    }
}

/// Claim, body and completion in one transaction; an error or a panic rolls all of it back.
pub async fn run_transactional<S, R, M, F>(store: &S, prepared: Prepared, body: F) -> R
where
    S: TxStore,
    R: IdemResult,
    R::Ok: Replay<M>,
    R::Err: FromIdemError,
    F: AsyncFnOnce(&mut Tx<S>) -> R,
{
    let (scope, key, fp, policy) = match prepared.into_parts() {
        Ok(parts) => parts,
        Err(e) => return fail(e),
    };
    let req = BeginRequest {
        scope: &scope,
        key: key.as_str(),
        fingerprint: &fp,
        policy: &policy,
    };
    let (mut tx, fence) = match start(store, &scope, key.as_str(), req).await {
        Err(e) => return fail(e),
        Ok(Started::Done(stored)) => return replay::<R, M>(stored),
        Ok(Started::Claimed(tx, fence)) => (tx, fence),
    };
    match body(&mut tx).await.into_result() {
        Ok(v) => {
            let stored = match v.encode() {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            let claim = ClaimRef {
                scope: &scope,
                key: key.as_str(),
                fence,
            };
            if let Err(e) = store
                .complete_in(&mut tx, claim, &stored, policy.retain)
                .await
            {
                return fail(e);
            }
            match tx.commit().await {
                Ok(()) => {
                    observe::record(Outcome::Completed, &scope, key.as_str(), fence);
                    R::from_ok(v)
                }
                // Nothing was committed (or, if the connection dropped during COMMIT, everything
                // was): either way a retry with the same key gets the right answer.
                Err(e) => fail(map_err(e)),
            }
        }
        Err(e) => {
            let _ = tx.rollback().await;
            observe::record(Outcome::Released, &scope, key.as_str(), fence);
            R::from_err(e)
        }
    }
}

/// [`run_transactional`] for functions whose final errors are stored: the transaction rolls
/// back, then the error is recorded on its own, if the identity is still free.
pub async fn run_transactional_final<S, R, M, F>(store: &S, prepared: Prepared, body: F) -> R
where
    S: TxStore,
    R: IdemResult,
    R::Ok: Replay<M>,
    R::Err: FromIdemError + FinalError,
    F: AsyncFnOnce(&mut Tx<S>) -> R,
{
    let (scope, key, fp, policy) = match prepared.into_parts() {
        Ok(parts) => parts,
        Err(e) => return fail(e),
    };
    let req = BeginRequest {
        scope: &scope,
        key: key.as_str(),
        fingerprint: &fp,
        policy: &policy,
    };
    let (mut tx, fence) = match start(store, &scope, key.as_str(), req).await {
        Err(e) => return fail(e),
        Ok(Started::Done(stored)) if stored.is_error => {
            note_replay(&stored);
            return match decode_final::<R::Err>(stored) {
                Ok(e) => R::from_err(e),
                Err(e) => fail(e),
            };
        }
        Ok(Started::Done(stored)) => return replay::<R, M>(stored),
        Ok(Started::Claimed(tx, fence)) => (tx, fence),
    };
    match body(&mut tx).await.into_result() {
        Ok(v) => {
            let stored = match v.encode() {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            let claim = ClaimRef {
                scope: &scope,
                key: key.as_str(),
                fence,
            };
            if let Err(e) = store
                .complete_in(&mut tx, claim, &stored, policy.retain)
                .await
            {
                return fail(e);
            }
            match tx.commit().await {
                Ok(()) => R::from_ok(v),
                Err(e) => fail(map_err(e)),
            }
        }
        Err(e) => {
            let _ = tx.rollback().await;
            if e.is_final() {
                if let Ok(stored) = encode_final(&e) {
                    if let Ok(Begun::Claimed(guard)) =
                        begin_separate(store, scope, key, fp, policy).await
                    {
                        let _ = guard.complete(&stored).await;
                    }
                }
            }
            R::from_err(e)
        }
    }
}
