//! The engine of the SQL stores: its pools and statements, `begin` and the fenced writes, and the rows it reads.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::pool::PoolConnection;

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::lifecycle::{self, Decision, Seen, State};
use crate::record::{
    BeginOutcome, BeginRequest, ClaimRef, Claimed, Record, RecordState, StoredResponse, Unfinished,
};
use crate::store::sweeper::{Sweeper, spawn_purges};
use crate::store::{
    ForcedRelease, Listing, Operation, RecordInfo, Reply, Retried, StateCounts, StoreStats,
};

use super::*;
pub(crate) use crate::store::read_first::ReadFirst;

/// How often `begin` looks again when concurrent attempts keep changing the record under it.
pub(crate) const ATTEMPTS: usize = 8;

/// Opens a transaction on `pool` the way the dialect wants (`BEGIN IMMEDIATE` on SQLite).
pub(crate) async fn begin_on<D: Dialect>(
    pool: &sqlx::Pool<D::Db>,
) -> Result<sqlx::Transaction<'static, D::Db>> {
    begin_with::<D>(pool, D::BEGIN).await
}

/// Opens a transaction on `pool` with `stmt`, or the driver's `BEGIN` when `None`.
async fn begin_with<D: Dialect>(
    pool: &sqlx::Pool<D::Db>,
    stmt: Option<&'static str>,
) -> Result<sqlx::Transaction<'static, D::Db>> {
    match stmt {
        Some(stmt) => pool.begin_with(stmt).await,
        None => pool.begin().await,
    }
    .map_err(map_err)
}

/// A `RecordInfo` from a row of `info_columns` (and, when `full`, the recovery point and
/// answer).
pub(super) fn record_info(row: &impl Columns, full: bool) -> Result<RecordInfo> {
    let state = State::parse(&row.text("state").map_err(map_err)?)?;
    let fence = fence_from_db(row.int8("fence").map_err(map_err)?)?;
    let now_ms = row.int8("now_ms").map_err(map_err)?;
    let completed = state == State::Completed;
    Ok(RecordInfo {
        scope: row.text("scope").map_err(map_err)?,
        key: row.text("key").map_err(map_err)?,
        state,
        fence,
        attempt: u32::try_from(row.int4("attempt").map_err(map_err)?).unwrap_or(1),
        fingerprint: read_fingerprint(&row.bytes("fingerprint").map_err(map_err)?)?,
        age: RecordInfo::age_from(fence, now_ms),
        lease_remaining: (state == State::InProgress)
            .then(|| row.int8("lease_left_ms").map(RecordInfo::ms_left))
            .transpose()
            .map_err(map_err)?,
        expires_in: RecordInfo::ms_left(row.int8("expires_ms").map_err(map_err)?),
        recovery_point: if full {
            row.opt_bytes("recovery_point").map_err(map_err)?
        } else {
            None
        },
        response: if full && completed {
            Some(stored_response(
                row.opt_int4("response_status").map_err(map_err)?,
                row.boolean("response_error").map_err(map_err)?,
                row.opt_bytes("response_body").map_err(map_err)?,
            )?)
        } else {
            None
        },
        note: row.opt_text("note").map_err(map_err)?,
        resumable: row.int4("resumable").map_err(map_err)? != 0,
        request: if full {
            row.opt_bytes("request").map_err(map_err)?
        } else {
            None
        },
    })
}

/// The columns `begin` reads from an existing record, read the same way in every SQL store.
#[derive(Debug)]
pub(crate) struct CurRow {
    pub(super) fence: i64,
    pub(super) fingerprint: Vec<u8>,
    pub(super) state: String,
    pub(super) response_status: Option<i32>,
    pub(super) response_error: bool,
    pub(super) response_body: Option<Vec<u8>>,
    pub(super) expired: bool,
    pub(super) lease_left_ms: i64,
    pub(super) lease_stamp: i64,
}

impl CurRow {
    /// Reads the row of the record `(scope, key)`; an unreadable column (a NULL where a value
    /// must be, a value of another type) is an error naming the record.
    pub(crate) fn read(row: &impl Columns, scope: &str, key: &str) -> Result<CurRow> {
        let get = || -> Result<CurRow, sqlx::Error> {
            Ok(CurRow {
                fence: row.int8("fence")?,
                fingerprint: row.bytes("fingerprint")?,
                state: row.text("state")?,
                response_status: row.opt_int4("response_status")?,
                response_error: row.boolean("response_error")?,
                response_body: row.opt_bytes("response_body")?,
                expired: row.boolean("expired")?,
                lease_left_ms: row.int8("lease_left_ms")?,
                lease_stamp: row.int8("lease_stamp")?,
            })
        };
        get().map_err(|e| within(scope, key, map_err(e)))
    }
}

/// What a store does after reading an existing record: answer, or take it over.
pub(crate) enum Next {
    Answer(BeginOutcome),
    TakeOver { reclaim: bool, keep: bool },
}

/// Decides what to do with the record `cur` (see `lifecycle::decide`). A record idem cannot
/// read exactly is an error naming it, never something a body may run on.
pub(crate) fn next(req: &BeginRequest<'_>, cur: &CurRow) -> Result<Next> {
    let corrupt = |e: Error| within(req.scope, req.key, e);
    let fingerprint = read_fingerprint(&cur.fingerprint).map_err(corrupt)?;
    fence_from_db(cur.fence).map_err(corrupt)?;
    let seen = Seen {
        state: State::parse(&cur.state).map_err(corrupt)?,
        same_fingerprint: fingerprint == *req.fingerprint,
        expired: cur.expired,
        lease_left_ms: cur.lease_left_ms,
    };
    Ok(match lifecycle::decide(seen, req.policy) {
        Decision::Claim { reclaim, continues } => Next::TakeOver {
            reclaim,
            keep: continues,
        },
        Decision::Replay => Next::Answer(BeginOutcome::Replay(
            stored_response(
                cur.response_status,
                cur.response_error,
                cur.response_body.clone(),
            )
            .map_err(corrupt)?,
        )),
        Decision::InProgress(retry_after) => Next::Answer(BeginOutcome::InProgress { retry_after }),
        Decision::KeyReused => Next::Answer(BeginOutcome::KeyReused),
        Decision::Parked => Next::Answer(BeginOutcome::Parked),
    })
}

/// One SQL store: its pools and statements. `PgStore` and `SqliteStore` each hold one.
pub(crate) struct Engine<D: Dialect> {
    /// Writes and transactions.
    pub(crate) writer: sqlx::Pool<D::Db>,
    /// Reads that need not wait for the writer (the same pool where there is no reason to
    /// split).
    pub(crate) reader: sqlx::Pool<D::Db>,
    pub(crate) sql: Statements,
    /// Whether a claim reads on the readers before it writes (`SqlStoreBuilder::read_first`).
    pub(crate) read_first: ReadFirst,
    /// The background purge, when there is one: it ends when the engine is dropped, with the
    /// last handle of its store.
    pub(super) purging: OnceLock<Sweeper>,
    /// Where its writes that end a claim are announced to this process's waiting duplicates
    /// (PostgreSQL's store, which may announce across instances, keeps its own).
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    pub(crate) changes: crate::store::Changes,
    /// The statement that opens a guarded body's transaction: the dialect's
    /// ([`Dialect::BEGIN`]), or the driver's `BEGIN` on a pool whose sessions the store set up
    /// already (`SqlStoreBuilder::sessions_set_up`).
    pub(crate) begin: Option<&'static str>,
}

impl<D: Dialect> Engine<D> {
    pub(crate) fn new(
        writer: sqlx::Pool<D::Db>,
        reader: sqlx::Pool<D::Db>,
        table: &str,
    ) -> Result<Engine<D>> {
        Ok(Engine {
            writer,
            reader,
            sql: Statements::new::<D>(table)?,
            read_first: ReadFirst::adaptive(),
            purging: OnceLock::new(),
            changes: crate::store::Changes::new(),
            begin: D::BEGIN,
        })
    }

    /// The engine, shared by every handle of its store, purging its expired records every
    /// `purge_every` in the background on the current Tokio runtime (`None`: no background
    /// purge).
    ///
    /// The task holds the engine only weakly, between two rounds: the last handle dropped
    /// drops the engine and its pools, and stops the task.
    pub(crate) fn start(self, purge_every: Option<Duration>) -> Arc<Self> {
        let engine = Arc::new(self);
        let Some(every) = purge_every else {
            return engine;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                target: "idem",
                table = %engine.sql.table,
                "a SQL store was built outside a Tokio runtime: its expired records are not purged in the background (call purge_expired, or spawn_sweeper)"
            );
            return engine;
        };
        let weak = Arc::downgrade(&engine);
        let database = Some(D::DATABASE.as_str());
        let sweeper = spawn_purges(&rt, engine.sql.table.clone(), database, every, move || {
            let engine = weak.upgrade()?;
            Some(async move { engine.purge_expired().await })
        });
        let _ = engine.purging.set(sweeper);
        engine
    }

    /// A connection of the writer pool. The pool's `acquire` future is boxed: it can open a
    /// connection, so it is kilobytes large, and held inline it would make every future that
    /// awaits a statement as large, copied at each level a guarded call nests it in.
    pub(crate) async fn write_conn(&self) -> Result<PoolConnection<D::Db>> {
        Box::pin(self.writer.acquire()).await.map_err(map_err)
    }

    /// A connection of the reader pool, as [`write_conn`](Self::write_conn).
    pub(crate) async fn read_conn(&self) -> Result<PoolConnection<D::Db>> {
        Box::pin(self.reader.acquire()).await.map_err(map_err)
    }

    /// Opens a transaction for a guarded body.
    pub(crate) async fn begin_transaction(&self) -> Result<sqlx::Transaction<'static, D::Db>> {
        begin_with::<D>(&self.writer, self.begin).await
    }

    /// Creates the table and its index if missing; safe to run from many instances at once.
    pub(crate) async fn migrate(&self) -> Result<()> {
        self.sql.migration.run::<D>(&self.writer).await
    }

    /// Refuses a table of a later records format than this version's (see `migrate`).
    pub(crate) async fn check_format(&self) -> Result<()> {
        self.sql.migration.check_format::<D>(&self.writer).await
    }

    /// A first claim's row (`RETURNING fence`), as the claim it is.
    pub(crate) fn first_claim(row: &D::Row) -> Result<Claimed> {
        Ok(Claimed {
            fence: fence_from_db(row.int8("fence").map_err(map_err)?)?,
            reclaimed: false,
            recovery_point: None,
            attempt: 1,
        })
    }

    /// Takes over the record `cur` on `conn`, if it is still exactly as read: the claim, or
    /// `None` when another attempt changed it first (read it again).
    pub(crate) async fn take_over(
        &self,
        conn: &mut <D::Db as sqlx::Database>::Connection,
        req: &BeginRequest<'_>,
        cur: &CurRow,
        reclaim: bool,
        keep: bool,
    ) -> Result<Option<Claimed>> {
        let [scope, key, fp, lease, retain, request] = Statements::claim_args(req);
        let args = [
            scope,
            key,
            fp,
            lease,
            retain,
            Arg::Bool(keep),
            Arg::Int(cur.fence),
            Arg::Text(&cur.state),
            Arg::Int(cur.lease_stamp),
            request,
        ];
        let Some(row) = D::fetch(conn, &self.sql.reclaim, &args).await? else {
            return Ok(None);
        };
        Ok(Some(Claimed {
            fence: fence_from_db(row.int8("fence").map_err(map_err)?)?,
            reclaimed: reclaim,
            recovery_point: row.opt_bytes("recovery_point").map_err(map_err)?,
            attempt: u32::try_from(row.int4("attempt").map_err(map_err)?).map_err(|_| {
                within(
                    req.scope,
                    req.key,
                    Error::Store("an attempt number out of range".into()),
                )
            })?,
        }))
    }

    /// The answer the readers can give to `req` before anything is written: `Some` when the
    /// committed record settles it (a replay, a reused key, a claim in progress), `None` when a
    /// claim must be taken on the writer (no record, or one to take over).
    pub(crate) async fn answer_on_reader(
        &self,
        req: &BeginRequest<'_>,
    ) -> Result<Option<BeginOutcome>> {
        let mut reader = self.read_conn().await?;
        let key = [Arg::Text(req.scope), Arg::Text(req.key)];
        let Some(row) = D::fetch(&mut reader, &self.sql.select, &key).await? else {
            self.read_first.missed();
            return Ok(None);
        };
        Ok(match next(req, &CurRow::read(&row, req.scope, req.key)?)? {
            Next::Answer(outcome) => {
                self.read_first.answered();
                Some(outcome)
            }
            Next::TakeOver { .. } => {
                self.read_first.missed();
                None
            }
        })
    }

    /// [`crate::store::TxStore::answer_first`]: the readers' answer while claims read first
    /// ([`ReadFirst`]), `None` at once while they do not.
    pub(crate) async fn answer_first_in_tx(
        &self,
        req: &BeginRequest<'_>,
    ) -> Result<Option<BeginOutcome>> {
        if !self.read_first.now() {
            return Ok(None);
        }
        self.answer_on_reader(req).await
    }

    /// [`crate::Store::begin`]: on the readers first while claims read first ([`ReadFirst`]),
    /// then on the writer (`tx`, when it is the caller's transaction's connection).
    pub(crate) async fn begin(
        &self,
        tx: Option<&mut <D::Db as sqlx::Database>::Connection>,
        req: &BeginRequest<'_>,
    ) -> Result<BeginOutcome> {
        if tx.is_none()
            && self.read_first.now()
            && let Some(outcome) = self.answer_on_reader(req).await?
        {
            return Ok(outcome);
        }
        // A new key, or one to take over: on the writer.
        match tx {
            Some(conn) => self.claim_on(conn, req).await,
            None => {
                let mut writer = self.write_conn().await?;
                self.claim_on(&mut writer, req).await
            }
        }
    }

    /// `begin` on `conn`, the insert first: a first claim is one statement, as in a hand-written
    /// inbox. When the key exists, it is read on the same connection and decided on; a
    /// take-over applies only to the record as read, and when something changed it first, the
    /// loop reads again. Inside a transaction, the insert waits on the unique index for a
    /// concurrent claim's transaction, then finds its committed record (or claims, if it rolled
    /// back).
    pub(crate) async fn claim_on(
        &self,
        conn: &mut <D::Db as sqlx::Database>::Connection,
        req: &BeginRequest<'_>,
    ) -> Result<BeginOutcome> {
        let args = Statements::claim_args(req);
        let key = [Arg::Text(req.scope), Arg::Text(req.key)];
        for attempt in 0..ATTEMPTS {
            if let Some(row) = D::fetch(conn, &self.sql.insert, &args).await? {
                if attempt == 0 {
                    self.read_first.missed();
                }
                return Ok(BeginOutcome::Claimed(Self::first_claim(&row)?));
            }
            if attempt == 0 {
                self.read_first.answered();
            }
            // It exists: read it. Gone again (purged in between): insert again.
            let Some(row) = D::fetch(conn, &self.sql.select, &key).await? else {
                continue;
            };
            let cur = CurRow::read(&row, req.scope, req.key)?;
            let (reclaim, keep) = match next(req, &cur)? {
                Next::Answer(outcome) => return Ok(outcome),
                Next::TakeOver { reclaim, keep } => (reclaim, keep),
            };
            if let Some(claimed) = self.take_over(conn, req, &cur, reclaim, keep).await? {
                return Ok(BeginOutcome::Claimed(claimed));
            }
        }
        Err(contention(req.scope, req.key))
    }

    /// [`crate::Store::complete`] on `conn` (the pool's, or a transaction's).
    pub(crate) async fn complete_on(
        &self,
        conn: &mut <D::Db as sqlx::Database>::Connection,
        claim: ClaimRef<'_>,
        response: &StoredResponse,
    ) -> Result<()> {
        let args = [
            Arg::Text(claim.scope),
            Arg::Text(claim.key),
            Arg::Int(fence_to_db(claim.fence)),
            Arg::OptInt4(response.status.map(i32::from)),
            Arg::Bool(response.is_error),
            Arg::Bytes(&response.body),
        ];
        if D::write_fenced(conn, &self.sql.complete, &args).await? {
            return Ok(());
        }
        // Not a live claim of this fence: the fence is lost, unless this very completion was
        // made already and only its reply was lost (`Guard::finish` retries it then). Asked
        // only here, so that a completion's own statement carries no second condition.
        let made = D::fetch(conn, &self.sql.completed, &args).await?;
        owned(made.is_some(), claim)
    }

    /// Runs the fenced write `stmt` with `args` on the writer: done when it matched the
    /// claim's live record, [`Error::FenceLost`] when it did not.
    async fn write_owned(&self, stmt: &Stmt, args: &[Arg<'_>], claim: ClaimRef<'_>) -> Result<()> {
        let mut conn = self.write_conn().await?;
        owned(D::write_fenced(&mut conn, stmt, args).await?, claim)
    }

    pub(crate) async fn complete(
        &self,
        claim: ClaimRef<'_>,
        response: &StoredResponse,
    ) -> Result<()> {
        let mut conn = self.write_conn().await?;
        self.complete_on(&mut conn, claim, response).await
    }

    pub(crate) async fn release(&self, claim: ClaimRef<'_>) -> Result<()> {
        let args = fenced_args(claim);
        self.write_owned(&self.sql.release, &args, claim).await
    }

    pub(crate) async fn checkpoint(
        &self,
        claim: ClaimRef<'_>,
        recovery_point: &[u8],
        lease: Duration,
    ) -> Result<()> {
        let [scope, key, fence] = fenced_args(claim);
        let args = [
            scope,
            key,
            fence,
            Arg::Bytes(recovery_point),
            Arg::Int(ms(lease)),
        ];
        self.write_owned(&self.sql.checkpoint, &args, claim).await
    }

    pub(crate) async fn renew(&self, claim: ClaimRef<'_>, lease: Duration) -> Result<()> {
        let [scope, key, fence] = fenced_args(claim);
        let args = [scope, key, fence, Arg::Int(ms(lease))];
        self.write_owned(&self.sql.renew, &args, claim).await
    }

    /// Every operation but `begin`, where the databases differ and each store answers itself:
    /// what a SQL store's [`Store::call`](crate::Store::call) hands to its engine.
    pub(crate) async fn call(&self, op: Operation<'_>) -> Result<Reply> {
        match op {
            Operation::Complete { claim, response } => {
                self.complete(claim, response).await.map(|()| Reply::Done)
            }
            Operation::Release(claim) => self.release(claim).await.map(|()| Reply::Done),
            Operation::Checkpoint {
                claim,
                recovery_point,
                lease,
            } => self
                .checkpoint(claim, recovery_point, lease)
                .await
                .map(|()| Reply::Done),
            Operation::Renew { claim, lease } => {
                self.renew(claim, lease).await.map(|()| Reply::Done)
            }
            Operation::Lookup { scope, key } => self.lookup(scope, key).await.map(Reply::Found),
            Operation::PurgeExpired => self.purge_expired().await.map(Reply::Purged),
            Operation::PurgeBatch => self.purge_batch().await.map(Reply::Purged),
            Operation::CountExpired => {
                let mut conn = self.read_conn().await?;
                let row = D::fetch(&mut conn, &self.sql.admin.count_expired, &[]).await?;
                let n = row.map(|r| r.int8("n")).transpose().map_err(map_err)?;
                Ok(Reply::Counted(
                    n.map_or(0, |n| u64::try_from(n).unwrap_or(0)),
                ))
            }
            Operation::List(query) => {
                let end = query.scope_prefix.as_deref().and_then(prefix_end);
                let list = self.sql.admin.list::<D>(query, end.as_deref());
                let mut conn = self.read_conn().await?;
                let rows = D::fetch_all(&mut conn, &list.rows, &list.args).await?;
                let records = rows
                    .iter()
                    .map(|row| record_info(row, false))
                    .collect::<Result<Vec<_>>>()?;
                // Fewer than asked for: all there is, unless the listing stopped examining.
                let complete = records.len() < query.limit && {
                    let range = &list.args[..list.range_args];
                    let row = D::fetch(&mut conn, &list.examined, range).await?;
                    let examined = row.map(|r| r.int8("n")).transpose().map_err(map_err)?;
                    examined.is_some_and(|n| usize::try_from(n).unwrap_or(0) < query.examine)
                };
                Ok(Reply::Listed(Listing::new(records, complete)))
            }
            Operation::Inspect { scope, key } => {
                let found = self.inspect(scope, key).await?;
                Ok(Reply::Records(found.into_iter().collect()))
            }
            Operation::ForceRelease { scope, key, fence } => {
                let admin = &self.sql.admin;
                let mut conn = self.write_conn().await?;
                let row = match fence {
                    None => {
                        let args = [Arg::Text(scope), Arg::Text(key)];
                        D::fetch(&mut conn, &admin.force_release, &args).await?
                    }
                    Some(f) => {
                        let args = [Arg::Text(scope), Arg::Text(key), Arg::Int(fence_to_db(f))];
                        D::fetch(&mut conn, &admin.force_release_fenced, &args).await?
                    }
                };
                drop(conn);
                let done = match row {
                    Some(row) => ForcedRelease::Released {
                        fence: fence_from_db(row.int8("fence").map_err(map_err)?)?,
                    },
                    // Not released: say why, from the record as it is now.
                    None => match self.inspect(scope, key).await? {
                        Some(r) if r.expires_in.is_zero() && !r.holds_work() => {
                            ForcedRelease::NotFound
                        }
                        Some(r) if fence.is_some_and(|f| f != r.fence) => {
                            ForcedRelease::FenceMoved {
                                fence: r.fence,
                                state: r.state,
                            }
                        }
                        Some(r) => ForcedRelease::NotInProgress(r.state),
                        None => ForcedRelease::NotFound,
                    },
                };
                Ok(Reply::ForceReleased(done))
            }
            Operation::Suspend {
                claim,
                note,
                resume_in,
            } => {
                let [scope, key, fence] = fenced_args(claim);
                let args = [scope, key, fence, Arg::Text(note), Arg::Int(ms(resume_in))];
                self.write_owned(&self.sql.suspend, &args, claim)
                    .await
                    .map(|()| Reply::Done)
            }
            Operation::Due { limit } => {
                let args = [Arg::Int(i64::try_from(limit).unwrap_or(i64::MAX))];
                let mut conn = self.read_conn().await?;
                let rows = D::fetch_all(&mut conn, &self.sql.due, &args).await?;
                rows.iter()
                    .map(unfinished)
                    .collect::<Result<_>>()
                    .map(Reply::Due)
            }
            Operation::Park { claim, note } => {
                let [scope, key, fence] = fenced_args(claim);
                let args = [scope, key, fence, Arg::Text(note)];
                self.write_owned(&self.sql.park, &args, claim)
                    .await
                    .map(|()| Reply::Done)
            }
            Operation::Retry { scope, key } => {
                let args = [Arg::Text(scope), Arg::Text(key)];
                let mut conn = self.write_conn().await?;
                let row = D::fetch(&mut conn, &self.sql.admin.retry, &args).await?;
                drop(conn);
                let done = match row {
                    Some(row) => Retried::Retried {
                        fence: fence_from_db(row.int8("fence").map_err(map_err)?)?,
                    },
                    None => match self.inspect(scope, key).await? {
                        Some(r) => Retried::NotParked(r.state),
                        None => Retried::NotFound,
                    },
                };
                Ok(Reply::Retried(done))
            }
            Operation::Stats { expiring_within } => {
                let bound = Arg::Int(i64::try_from(StoreStats::BOUND).unwrap_or(i64::MAX));
                let mut conn = self.read_conn().await?;
                let admin = &self.sql.admin;
                let rows = D::fetch_all(&mut conn, &admin.stats, &[bound]).await?;
                let args = [bound, Arg::Int(ms(expiring_within))];
                let bounded = D::fetch(&mut conn, &admin.stats_bounded, &args).await?;
                let mut stats = StoreStats::default();
                if let Some(row) = bounded {
                    let count = |col: &str| row.int8(col).map_err(map_err);
                    stats.expired = u64::try_from(count("expired")?).unwrap_or(0);
                    stats.expiring_soon = u64::try_from(count("expiring")?).unwrap_or(0);
                }
                // Rows read of each part: a part that read as many as it may stopped there.
                let (mut newest, mut work) = (0, 0);
                for row in &rows {
                    let state = State::parse(&row.text("state").map_err(map_err)?)?;
                    let count = |col: &str| -> Result<u64> {
                        // SUM over no rows is NULL; a group has at least one.
                        let n = row.int8(col).map_err(map_err)?;
                        Ok(u64::try_from(n).unwrap_or(0))
                    };
                    let (n, expired) = (count("n")?, count("expired")?);
                    match row.text("part").map_err(map_err)?.as_str() {
                        "work" => work += n,
                        _ => newest += n,
                    }
                    let live = n - expired.min(n);
                    stats.states.add(state, live);
                    if live > 0 {
                        let prefix = row.text("prefix").map_err(map_err)?;
                        match stats.by_prefix.iter_mut().find(|(p, _)| *p == prefix) {
                            Some((_, counts)) => counts.add(state, live),
                            None => {
                                let mut counts = StateCounts::default();
                                counts.add(state, live);
                                stats.by_prefix.push((prefix, counts));
                            }
                        }
                    }
                    let now_ms = row.int8("now_ms").map_err(map_err)?;
                    if let Some(oldest) = row.opt_int8("oldest_fence").map_err(map_err)? {
                        let age = RecordInfo::age_from(fence_from_db(oldest)?, now_ms);
                        stats.oldest_in_progress = stats.oldest_in_progress.max(Some(age));
                    }
                    stats.unfinished += count("unfinished")?;
                    if let Some(oldest) =
                        row.opt_int8("oldest_unfinished_fence").map_err(map_err)?
                    {
                        let age = RecordInfo::age_from(fence_from_db(oldest)?, now_ms);
                        stats.oldest_unfinished = stats.oldest_unfinished.max(Some(age));
                    }
                }
                stats.by_prefix.sort_by(|a, b| a.0.cmp(&b.0));
                stats.counted = newest + work;
                stats.complete = newest < StoreStats::BOUND && work < StoreStats::BOUND;
                Ok(Reply::Stats(Box::new(stats)))
            }
            Operation::Begin(_) => Err(Error::Store(
                "a SQL store answers `begin` itself, not through its engine".into(),
            )),
        }
    }

    pub(super) async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>> {
        let mut conn = self.read_conn().await?;
        let args = [Arg::Text(scope), Arg::Text(key)];
        let row = D::fetch(&mut conn, &self.sql.admin.inspect, &args).await?;
        row.map(|row| record_info(&row, true).map_err(|e| within(scope, key, e)))
            .transpose()
    }

    pub(crate) async fn lookup(&self, scope: &str, key: &str) -> Result<Option<Record>> {
        let mut conn = self.read_conn().await?;
        let row = D::fetch(
            &mut conn,
            &self.sql.lookup,
            &[Arg::Text(scope), Arg::Text(key)],
        )
        .await?;
        row.map(|row| record(&row).map_err(|e| within(scope, key, e)))
            .transpose()
    }

    pub(crate) async fn purge_expired(&self) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let deleted = self.purge_batch().await?;
            total += deleted;
            if deleted < D::PURGE_BATCH.unsigned_abs() {
                return Ok(total);
            }
        }
    }

    /// One batch of the purge, on a connection of its own: on SQLite the writer is one
    /// connection, and live claims and completions take their turn on it between two batches
    /// instead of waiting for the whole purge.
    pub(super) async fn purge_batch(&self) -> Result<u64> {
        let mut conn = self.write_conn().await?;
        let mut deleted = 0;
        for stmt in &self.sql.purge {
            if let Some(row) = D::fetch(&mut conn, stmt, &[]).await? {
                deleted = row.int8("deleted").map_err(map_err)?;
            }
        }
        Ok(u64::try_from(deleted).unwrap_or(0))
    }
}

pub(super) fn fenced_args<'a>(claim: ClaimRef<'a>) -> [Arg<'a>; 3] {
    [
        Arg::Text(claim.scope),
        Arg::Text(claim.key),
        Arg::Int(fence_to_db(claim.fence)),
    ]
}

/// A fenced write's answer: it matched the record (the claim was live and ours), or the fence
/// is lost.
pub(super) fn owned(matched: bool, claim: ClaimRef<'_>) -> Result<()> {
    match matched {
        true => Ok(()),
        false => Err(Error::FenceLost { fence: claim.fence }),
    }
}

/// A row of the `due` statement, read exactly.
pub(super) fn unfinished(row: &impl Columns) -> Result<Unfinished> {
    let scope = row.text("scope").map_err(map_err)?;
    let key = row.text("key").map_err(map_err)?;
    let read = || -> Result<Unfinished> {
        let left = row
            .int8("resume_left_ms")
            .map_err(map_err)?
            .max(row.int8("lease_left_ms").map_err(map_err)?);
        Ok(Unfinished::new(
            scope.clone(),
            key.clone(),
            fence_from_db(row.int8("fence").map_err(map_err)?)?,
            u32::try_from(row.int4("attempt").map_err(map_err)?).unwrap_or(1),
            read_fingerprint(&row.bytes("fingerprint").map_err(map_err)?)?,
            row.opt_bytes("request")
                .map_err(map_err)?
                .ok_or_else(|| Error::Store("a due record without its request".into()))?,
            row.opt_text("note").map_err(map_err)?,
            RecordInfo::ms_left(left.saturating_neg()),
        ))
    };
    read().map_err(|e| within(&scope, &key, e))
}

/// A lookup's row, read exactly: an unreadable record is an error.
pub(super) fn record(row: &impl Columns) -> Result<Record> {
    let fingerprint = read_fingerprint(&row.bytes("fingerprint").map_err(map_err)?)?;
    let state = State::parse(&row.text("state").map_err(map_err)?)?;
    let fence = fence_from_db(row.int8("fence").map_err(map_err)?)?;
    Ok(match state {
        State::Completed => Record {
            fingerprint,
            state: RecordState::Completed,
            fence,
            response: Some(stored_response(
                row.opt_int4("response_status").map_err(map_err)?,
                row.boolean("response_error").map_err(map_err)?,
                row.opt_bytes("response_body").map_err(map_err)?,
            )?),
            lease_remaining: None,
        },
        State::Parked => Record {
            fingerprint,
            state: RecordState::Parked,
            fence,
            response: None,
            lease_remaining: None,
        },
        // The lookup statement leaves released records out.
        State::InProgress | State::Released => Record {
            fingerprint,
            state: RecordState::InProgress,
            fence,
            response: None,
            lease_remaining: Some(Duration::from_millis(
                u64::try_from(row.int8("lease_left_ms").map_err(map_err)?).unwrap_or(0),
            )),
        },
    })
}

pub(super) fn read_fingerprint(bytes: &[u8]) -> Result<Fingerprint> {
    Fingerprint::from_slice(bytes).ok_or_else(|| {
        Error::Store(format!("a fingerprint of {} bytes, not 32", bytes.len()).into())
    })
}

pub(super) fn stored_response(
    status: Option<i32>,
    is_error: bool,
    body: Option<Vec<u8>>,
) -> Result<StoredResponse> {
    let status = status
        .map(|s| {
            u16::try_from(s)
                .map_err(|_| Error::Store(format!("stored status {s} is not a status").into()))
        })
        .transpose()?;
    // A completed record without its answer is broken, never an empty answer to replay.
    let body =
        body.ok_or_else(|| Error::Store("a completed record whose response body is NULL".into()))?;
    Ok(StoredResponse {
        status,
        is_error,
        body: bytes::Bytes::from(body),
    })
}
