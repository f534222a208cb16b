//! The transactional mode of the SQL stores.

use std::future::Future;

use crate::error::Result;
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, StoredResponse};
use crate::store::Store;

/// A store that can claim and complete inside the caller's database transaction.
///
/// Claim, business writes and completion then commit together: one commit makes the record and
/// the effects durable, a rollback leaves neither, and a concurrent duplicate's claim waits on
/// the record's unique index until the first transaction ends, then replays (or claims, if it
/// rolled back). The mode adds no commit of its own.
///
/// `#[idempotent(…, transaction = tx)]` uses this trait; by hand:
///
/// ```no_run
/// # async fn f(store: idem::SqliteStore, req: idem::BeginRequest<'_>) -> idem::Result<()> {
/// use idem::{BeginOutcome, ClaimRef, StoredResponse, TxStore};
/// let mut tx = store.begin_transaction().await?;
/// if let BeginOutcome::Claimed(c) = store.begin_in(&mut tx, req).await? {
///     sqlx::query("INSERT INTO orders (order_no) VALUES ('A1')").execute(&mut *tx).await.ok();
///     let claim = ClaimRef { scope: req.scope, key: req.key, fence: c.fence };
///     store.complete_in(&mut tx, claim, &StoredResponse::ok(b"{}".to_vec())).await?;
///     tx.commit().await.map_err(|e| idem::Error::Unavailable(e.into()))?;
/// }
/// # Ok(()) }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a guarded body inside a database transaction",
    label = "not a transactional store",
    note = "`transaction = …` needs `idem::SqliteStore`, `idem::PgStore` or `idem::MySqlStore`"
)]
pub trait TxStore: Store {
    /// The sqlx database.
    type Database: sqlx::Database;

    /// Opens a transaction suited to a guarded body on this store's pool (SQLite:
    /// `BEGIN IMMEDIATE`, so that two writers cannot deadlock on a lock upgrade).
    fn begin_transaction(
        &self,
    ) -> impl Future<Output = Result<sqlx::Transaction<'static, Self::Database>>> + Send;

    /// The answer to `req` that a read outside any transaction can give: `Some` when the record
    /// as committed settles the request (a replay, a reused key, a claim held by another
    /// attempt), `None` when only a claim inside a transaction can tell (no record yet, or one to
    /// take over). The transactional flow asks it before it opens a transaction, so that a
    /// replay costs one read and never waits for, or holds, the writer.
    ///
    /// The default reads nothing and answers `None`. `SqliteStore` and `PgStore` read on
    /// their readers while recent claims found their record often enough to pay for the read
    /// (retries), and answer `None` without reading while claims are new keys, which then cost
    /// no statement more than a hand-written inbox.
    fn answer_first(
        &self,
        req: BeginRequest<'_>,
    ) -> impl Future<Output = Result<Option<BeginOutcome>>> + Send {
        let _ = req;
        std::future::ready(Ok(None))
    }

    /// [`Store::begin`], inside the caller's transaction. As there, a policy that fails
    /// [`Policy::check`](crate::Policy::check) is refused with
    /// [`Error::Config`](crate::Error::Config) before the store is asked (and so is
    /// [`answer_first`](Self::answer_first)'s).
    fn begin_in(
        &self,
        conn: &mut <Self::Database as sqlx::Database>::Connection,
        req: BeginRequest<'_>,
    ) -> impl Future<Output = Result<BeginOutcome>> + Send;

    /// [`Store::complete`], inside the caller's transaction.
    fn complete_in(
        &self,
        conn: &mut <Self::Database as sqlx::Database>::Connection,
        claim: ClaimRef<'_>,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<()>> + Send;
}
