//! The SQL stores, written once: the statements, the row mapping, and the engine that runs them.
//! [`Dialect`] holds the only differences between the databases — the clock expression, column
//! types, how a table name may be qualified, the first-claim statement and the purge — and each
//! store (`postgres`, `sqlite`) adds only how it pools its connections.
//!
//! Every write after a claim is conditional on the record being exactly as its owner, or the
//! reader deciding a take-over, saw it: `fence` for the fenced writes, and `(fence, state, lease)`
//! for a take-over, so that what to do is decided in one place, `lifecycle::decide`, and the
//! statement only checks that nothing changed in between.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, SqlSafeStr as _, SqlStr};

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::lifecycle::{self, Decision, Seen, State};
use crate::record::{
    BeginOutcome, BeginRequest, ClaimRef, Claimed, Record, RecordState, StoredResponse, Unfinished,
};
use crate::store::schema::{self, Database};
use crate::store::sweeper::{DEFAULT_PURGE_EVERY, Sweeper, spawn_purges};
use crate::store::{
    ForcedRelease, Operation, RecordInfo, RecordQuery, Reply, Retried, StateCounts, StoreStats,
};

/// The default table name of the SQL stores.
pub(crate) const DEFAULT_TABLE: &str = "idem_records";

/// How often `begin` looks again when concurrent attempts keep changing the record under it.
pub(crate) const ATTEMPTS: usize = 8;

/// A value bound to a statement.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Text(&'a str),
    Bytes(&'a [u8]),
    OptBytes(Option<&'a [u8]>),
    Int(i64),
    OptInt4(Option<i32>),
    Bool(bool),
}

/// What differs between two SQL databases, and nothing else.
pub(crate) trait Dialect: Send + Sync + Sized + 'static {
    /// The sqlx database.
    type Db: sqlx::Database;
    /// Its rows.
    type Row: Columns + Send;

    /// Now, as the timestamp columns store it.
    const NOW: &'static str;
    /// Now in milliseconds since the Unix epoch: the first fence of a record.
    const NOW_MS: &'static str;
    /// Which database it is: the tables are created from its DDL in `store::schema`.
    const DATABASE: Database;
    /// The types of the columns added since the tables were first created.
    const TYPES: Types;
    /// The boolean `false` as a column default.
    const FALSE: &'static str;
    /// How many expired records one purge statement deletes: short enough that live traffic is
    /// never held behind it for long.
    const PURGE_BATCH: i64;
    /// Whether a table name may be `schema.table`.
    const QUALIFIED_TABLES: bool;
    /// The statement that opens a transaction for a guarded body, when the driver's default
    /// will not do.
    const BEGIN: Option<&'static str>;

    /// `Self::NOW` plus the milliseconds in parameter `param`.
    fn after(param: &str) -> String;
    /// The milliseconds from now until the timestamp column `col`, negative once it passed.
    fn ms_until(col: &str) -> String;
    /// The timestamp column `col` as an integer that changes whenever it does.
    fn stamp(col: &str) -> String;
    /// The statements that delete a batch of the records of table `t` for which `expired` (a
    /// condition on its columns) holds, the last one returning how many (`deleted`).
    fn purge(t: &str, expired: &str) -> Vec<SqlStr>;
    /// Widens the `state` check of a table created before `parked` was a state: a query whose
    /// `present` column is 1 when the check allows it already, and the statements that make
    /// it do (`states` is the list, written for the DDL).
    fn allow_states(t: &str, table: &str, states: &str) -> (SqlStr, Vec<SqlStr>);
    /// A statement run first in a migration's transaction, before any table is created: what
    /// serialises concurrent migrations where the transaction does not, and keeps them quiet.
    fn migration_start() -> Option<SqlStr>;
    /// Adds `column` (`definition` after its name) to a table created before it existed: the
    /// statement, and, where the database cannot say `IF NOT EXISTS`, a query whose `present`
    /// column counts the column if it is there already.
    fn add_column(t: &str, table: &str, column: &str, definition: &str) -> AddColumn;
    /// A query whose `present` column is 1 when table `t`, its index `index` and every column
    /// of `columns` exist already, read from the catalog without locking the table; `None`
    /// where migrating a table that is up to date takes no lock that could wait on its users.
    ///
    /// PostgreSQL's `CREATE INDEX IF NOT EXISTS` and `ALTER TABLE … ADD COLUMN IF NOT EXISTS`
    /// lock the table before they find there is nothing to do: an instance starting next to
    /// busy ones (a rolling restart, a restart after a crash) would queue every claim behind
    /// its migration, or deadlock with a claim in flight.
    fn up_to_date(_t: &str, _index: &str, _columns: &[&str]) -> Option<SqlStr> {
        None
    }

    /// The text of `col` up to its first `:` (all of it when there is none): a scope's prefix,
    /// as `StoreStats` counts it.
    fn scope_prefix(col: &str) -> String;

    /// Runs `sql` with `args` on `conn`: every row.
    fn fetch_all<'a>(
        conn: &'a mut <Self::Db as sqlx::Database>::Connection,
        sql: &'a SqlStr,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<Vec<Self::Row>>> + Send + 'a;

    /// Runs `sql` with `args` on `conn`: its first row, if any.
    fn fetch<'a>(
        conn: &'a mut <Self::Db as sqlx::Database>::Connection,
        sql: &'a SqlStr,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<Option<Self::Row>>> + Send + 'a;
}

/// A column added to tables created before it existed.
pub(crate) struct AddColumn {
    pub(crate) probe: Option<SqlStr>,
    pub(crate) alter: SqlStr,
}

/// Columns added since the table was first created, with their definitions: tables created
/// earlier get them when the store migrates.
const ADDED_COLUMNS: &[(&str, &str)] = &[
    ("attempt", "{int4} NOT NULL DEFAULT 1"),
    ("request", "{bytes}"),
    ("resume_at", "{timestamp}"),
    ("note", "{text}"),
];

/// The types of added columns, per dialect (the tables' DDL is in `store::schema`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Types {
    pub(crate) int4: &'static str,
    pub(crate) timestamp: &'static str,
    pub(crate) bytes: &'static str,
    pub(crate) text: &'static str,
}

/// Reading a column of a row, the same way for every database.
pub(crate) trait Columns {
    fn int8(&self, col: &str) -> Result<i64, sqlx::Error>;
    fn int4(&self, col: &str) -> Result<i32, sqlx::Error>;
    fn opt_int4(&self, col: &str) -> Result<Option<i32>, sqlx::Error>;
    fn opt_int8(&self, col: &str) -> Result<Option<i64>, sqlx::Error>;
    fn text(&self, col: &str) -> Result<String, sqlx::Error>;
    fn opt_text(&self, col: &str) -> Result<Option<String>, sqlx::Error>;
    fn bytes(&self, col: &str) -> Result<Vec<u8>, sqlx::Error>;
    fn opt_bytes(&self, col: &str) -> Result<Option<Vec<u8>>, sqlx::Error>;
    fn boolean(&self, col: &str) -> Result<bool, sqlx::Error>;
}

impl<R> Columns for R
where
    R: sqlx::Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn int8(&self, col: &str) -> Result<i64, sqlx::Error> {
        self.try_get(col)
    }
    fn int4(&self, col: &str) -> Result<i32, sqlx::Error> {
        self.try_get(col)
    }
    fn opt_int4(&self, col: &str) -> Result<Option<i32>, sqlx::Error> {
        self.try_get(col)
    }
    fn opt_int8(&self, col: &str) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(col)
    }
    fn text(&self, col: &str) -> Result<String, sqlx::Error> {
        self.try_get(col)
    }
    fn opt_text(&self, col: &str) -> Result<Option<String>, sqlx::Error> {
        self.try_get(col)
    }
    fn bytes(&self, col: &str) -> Result<Vec<u8>, sqlx::Error> {
        self.try_get(col)
    }
    fn opt_bytes(&self, col: &str) -> Result<Option<Vec<u8>>, sqlx::Error> {
        self.try_get(col)
    }
    fn boolean(&self, col: &str) -> Result<bool, sqlx::Error> {
        self.try_get(col)
    }
}

/// `sql` with `args` bound: the one way statements are prepared.
pub(crate) fn bound<'q, DB>(
    sql: &SqlStr,
    args: &'q [Arg<'_>],
) -> sqlx::query::Query<'q, DB, DB::Arguments>
where
    DB: sqlx::Database,
    for<'a> &'a str: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    for<'a> &'a [u8]: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    for<'a> Option<&'a [u8]>: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    for<'a> i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    for<'a> Option<i32>: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    for<'a> bool: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    let mut q = sqlx::query::<DB>(sql.clone());
    for arg in args {
        q = match *arg {
            Arg::Text(v) => q.bind(v),
            Arg::Bytes(v) => q.bind(v),
            Arg::OptBytes(v) => q.bind(v),
            Arg::Int(v) => q.bind(v),
            Arg::OptInt4(v) => q.bind(v),
            Arg::Bool(v) => q.bind(v),
        };
    }
    q
}

/// A dialect's `fetch` and `fetch_all` on its database: statements bound by [`bound`], their
/// errors sorted by [`map_err`].
macro_rules! run_statements {
    ($db:ty, $conn:ty, $row:ty) => {
        fn fetch_all<'a>(
            conn: &'a mut $conn,
            sql: &'a SqlStr,
            args: &'a [Arg<'a>],
        ) -> impl Future<Output = Result<Vec<$row>>> + Send + 'a {
            let q = sql::bound::<$db>(sql, args);
            async move { q.fetch_all(&mut *conn).await.map_err(sql::map_err) }
        }

        fn fetch<'a>(
            conn: &'a mut $conn,
            sql: &'a SqlStr,
            args: &'a [Arg<'a>],
        ) -> impl Future<Output = Result<Option<$row>>> + Send + 'a {
            let q = sql::bound::<$db>(sql, args);
            async move { q.fetch_optional(&mut *conn).await.map_err(sql::map_err) }
        }
    };
}
pub(crate) use run_statements;

fn sql(s: String) -> SqlStr {
    AssertSqlSafe(s).into_sql_str()
}

/// Every statement of one store, built once from its table name.
pub(crate) struct Statements {
    pub(crate) table: String,
    /// Deletes a batch of expired records; the last statement returns how many.
    pub(crate) purge: Vec<SqlStr>,
    /// A first claim alone: `INSERT … ON CONFLICT DO NOTHING RETURNING fence`, no row when the
    /// record exists (or a concurrent claim committed it while this one waited on the index).
    pub(crate) insert: SqlStr,
    /// The record's columns ([`CurRow`]), by scope and key.
    pub(crate) select: SqlStr,
    reclaim: SqlStr,
    complete: SqlStr,
    release: SqlStr,
    checkpoint: SqlStr,
    renew: SqlStr,
    lookup: SqlStr,
    suspend: SqlStr,
    due: SqlStr,
    park: SqlStr,
    /// What operators ask ([`crate::store::admin`]).
    admin: AdminStatements,
    migration: Migration,
}

/// The statements of the operators' operations; `List` writes its own from its filters.
pub(crate) struct AdminStatements {
    /// The columns of a `RecordInfo`, without the recovery point and answer.
    info_columns: String,
    /// `FROM` the table.
    table: String,
    /// `NOW_MS`, the table's clock in ms.
    now_ms: &'static str,
    inspect: SqlStr,
    force_release: SqlStr,
    retry: SqlStr,
    /// `force_release` of the claim with the fence `$3` only.
    force_release_fenced: SqlStr,
    count_expired: SqlStr,
    stats: SqlStr,
}

/// How a table is created, and brought up to date when it was created by an earlier version:
/// the same steps for the records' table and the outbox's.
pub(crate) struct Migration {
    /// `CREATE … IF NOT EXISTS` statements, in order.
    pub(crate) create: Vec<SqlStr>,
    /// Columns added since the table was first created.
    pub(crate) upgrade: Vec<AddColumn>,
    /// Statements run once the columns are there (an index on an added column).
    pub(crate) finish: Vec<SqlStr>,
    /// A check to widen, when the table was created before a value it must allow: a query
    /// whose `present` column is 1 when it allows it already, and what widens it.
    pub(crate) widen: Option<(SqlStr, Vec<SqlStr>)>,
    /// The dialect's catalog probe that finds the table up to date without locking it.
    pub(crate) up_to_date: Option<SqlStr>,
}

impl Migration {
    /// Creates what is missing, in one transaction opened by the dialect's `migration_start`; safe
    /// to run from many instances at once. A table found up to date by the probe is not
    /// touched.
    pub(crate) async fn run<D: Dialect>(&self, pool: &sqlx::Pool<D::Db>) -> Result<()> {
        if let Some(probe) = &self.up_to_date {
            let mut conn = pool.acquire().await.map_err(map_err)?;
            if let Some(row) = D::fetch(&mut conn, probe, &[]).await?
                && row.int8("present").map_err(map_err)? > 0
            {
                return Ok(());
            }
        }
        let mut tx = begin_on::<D>(pool).await?;
        for stmt in D::migration_start().iter().chain(&self.create) {
            D::fetch(&mut tx, stmt, &[]).await?;
        }
        for add in &self.upgrade {
            if let Some(probe) = &add.probe
                && let Some(row) = D::fetch(&mut tx, probe, &[]).await?
                && row.int8("present").map_err(map_err)? > 0
            {
                continue;
            }
            D::fetch(&mut tx, &add.alter, &[]).await?;
        }
        if let Some((probe, widen)) = &self.widen {
            let present = match D::fetch(&mut tx, probe, &[]).await? {
                Some(row) => row.int8("present").map_err(map_err)? > 0,
                None => false,
            };
            if !present {
                for stmt in widen {
                    D::fetch(&mut tx, stmt, &[]).await?;
                }
            }
        }
        for stmt in &self.finish {
            D::fetch(&mut tx, stmt, &[]).await?;
        }
        tx.commit().await.map_err(map_err)
    }
}

/// Opens a transaction on `pool` the way the dialect wants (`BEGIN IMMEDIATE` on SQLite).
pub(crate) async fn begin_on<D: Dialect>(
    pool: &sqlx::Pool<D::Db>,
) -> Result<sqlx::Transaction<'static, D::Db>> {
    match D::BEGIN {
        Some(stmt) => pool.begin_with(stmt).await,
        None => pool.begin().await,
    }
    .map_err(map_err)
}

impl Statements {
    pub(crate) fn new<D: Dialect>(table: &str) -> Result<Statements> {
        let t = quote_table(table, D::QUALIFIED_TABLES)?;
        let now = D::NOW;
        let types = D::TYPES;
        let (in_progress, completed, released, parked) = (
            State::InProgress.as_str(),
            State::Completed.as_str(),
            State::Released.as_str(),
            State::Parked.as_str(),
        );
        let holds = holds_work();
        let live = format!("(expires_at > {now} OR {holds})");
        // A fenced write applies only while its owner holds a live claim (`lifecycle::owns`).
        let owned = format!("fence = $3 AND state = '{in_progress}' AND {live}");
        // What ends a claim clears the work it held.
        let no_work = "request = NULL, resume_at = NULL, note = NULL";
        let states = [in_progress, completed, released, parked]
            .map(|s| format!("'{s}'"))
            .join(", ");
        // The completer's index is on a column that tables created earlier gain by migrating:
        // it is created once the columns are there.
        let mut create = schema::records(D::DATABASE, table)?;
        let finish: Vec<SqlStr> = create.split_off(2).into_iter().map(sql).collect();
        Ok(Statements {
            table: table.to_owned(),
            purge: D::purge(&t, &format!("expires_at <= {now} AND NOT {holds}")),
            // A resumable claim ($6) stores its request and is due to the completer once its
            // lease runs out.
            insert: sql(format!(
                "INSERT INTO {t} (scope, key, fingerprint, state, fence, lease_until, expires_at, \
                 request, resume_at, created_at, updated_at) \
                 VALUES ($1, $2, $3, '{in_progress}', {}, {}, {}, $6, \
                 CASE WHEN $6 IS NULL THEN NULL ELSE {now} END, {now}, {now}) \
                 ON CONFLICT (scope, key) DO NOTHING RETURNING fence",
                D::NOW_MS,
                D::after("$4"),
                D::after("$5"),
            )),
            select: sql(format!(
                "SELECT fence, fingerprint, state, response_status, response_error, response_body, \
                 (expires_at <= {now} AND NOT {holds}) AS expired, {} AS lease_left_ms, \
                 {} AS lease_stamp \
                 FROM {t} WHERE scope = $1 AND key = $2",
                D::ms_until("lease_until"),
                D::stamp("lease_until"),
            )),
            // A take-over applies only to the record exactly as it was read: what to do was
            // decided from that, and anything since (a completion, a release, a checkpoint, a
            // competing take-over) changed its fence, state or lease. One that continues the
            // same request ($6) keeps its work (its request, unless a new one comes with the
            // claim, $10, and why it did not finish); another starts without.
            reclaim: sql(format!(
                "UPDATE {t} SET fence = fence + 1, state = '{in_progress}', fingerprint = $3, \
                 lease_until = {}, expires_at = {}, \
                 recovery_point = CASE WHEN $6 THEN recovery_point END, \
                 attempt = CASE WHEN $6 THEN attempt + 1 ELSE 1 END, \
                 response_status = NULL, response_error = {}, response_body = NULL, \
                 request = COALESCE($10, CASE WHEN $6 THEN request END), \
                 resume_at = CASE WHEN $10 IS NOT NULL OR ($6 AND request IS NOT NULL) \
                   THEN {now} END, \
                 note = CASE WHEN $6 THEN note END, \
                 updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND fence = $7 AND state = $8 AND {} = $9 \
                 RETURNING fence, recovery_point, attempt",
                D::after("$4"),
                D::after("$5"),
                D::FALSE,
                D::stamp("lease_until"),
            )),
            // A completion whose reply was lost after the database committed it is retried
            // (`Guard::finish`): finding the record completed by this very fence with this very
            // answer, the retry succeeds rather than report the fence lost for a completion
            // that is in fact ours.
            complete: sql(format!(
                "UPDATE {t} SET state = '{completed}', response_status = $4, response_error = $5, \
                 response_body = $6, recovery_point = NULL, {no_work}, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND (({owned}) OR (fence = $3 \
                 AND state = '{completed}' AND expires_at > {now} \
                 AND response_status IS NOT DISTINCT FROM $4 AND response_error = $5 \
                 AND response_body = $6)) RETURNING fence"
            )),
            release: sql(format!(
                "UPDATE {t} SET state = '{released}', {no_work}, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND {owned} RETURNING fence"
            )),
            checkpoint: sql(format!(
                "UPDATE {t} SET recovery_point = $4, lease_until = {}, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND {owned} RETURNING fence",
                D::after("$5"),
            )),
            renew: sql(format!(
                "UPDATE {t} SET lease_until = {}, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND {owned} RETURNING fence",
                D::after("$4"),
            )),
            lookup: sql(format!(
                "SELECT fingerprint, state, fence, response_status, response_error, response_body, \
                 {} AS lease_left_ms \
                 FROM {t} WHERE scope = $1 AND key = $2 AND state <> '{released}' AND {live}",
                D::ms_until("lease_until"),
            )),
            // The lease ends now, so the same request's retry takes it over at once; the
            // completer waits $5 ms.
            suspend: sql(format!(
                "UPDATE {t} SET lease_until = {now}, note = $4, \
                 resume_at = CASE WHEN request IS NOT NULL THEN {} END, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND {owned} RETURNING fence",
                D::after("$5"),
            )),
            due: sql(format!(
                "SELECT scope, key, fence, attempt, fingerprint, request, note, \
                 {} AS resume_left_ms, {} AS lease_left_ms \
                 FROM {t} WHERE resume_at IS NOT NULL AND resume_at <= {now} \
                 AND state = '{in_progress}' AND lease_until <= {now} \
                 ORDER BY resume_at LIMIT $1",
                D::ms_until("resume_at"),
                D::ms_until("lease_until"),
            )),
            park: sql(format!(
                "UPDATE {t} SET state = '{parked}', note = $4, resume_at = NULL, \
                 updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = '{in_progress}' \
                 AND lease_until <= {now} RETURNING fence"
            )),
            admin: AdminStatements::new::<D>(&t),
            migration: Migration {
                create: create.into_iter().map(sql).collect(),
                upgrade: ADDED_COLUMNS
                    .iter()
                    .map(|(column, definition)| {
                        let definition = definition
                            .replace("{int4}", types.int4)
                            .replace("{bytes}", types.bytes)
                            .replace("{timestamp}", types.timestamp)
                            .replace("{text}", types.text);
                        D::add_column(&t, table, column, &definition)
                    })
                    .collect(),
                up_to_date: D::up_to_date(
                    &t,
                    &index_name(table, "resume_at"),
                    &ADDED_COLUMNS.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
                ),
                widen: Some(D::allow_states(&t, table, &states)),
                finish,
            },
        })
    }

    /// The arguments of the first claim: scope, key, fingerprint, lease, retention and the
    /// stored request.
    pub(crate) fn claim_args<'a>(req: &BeginRequest<'a>) -> [Arg<'a>; 6] {
        [
            Arg::Text(req.scope),
            Arg::Text(req.key),
            Arg::Bytes(req.fingerprint.as_bytes()),
            Arg::Int(ms(req.policy.lease)),
            Arg::Int(ms(req.policy.retain)),
            Arg::OptBytes(req.request),
        ]
    }
}

impl AdminStatements {
    fn new<D: Dialect>(t: &str) -> AdminStatements {
        let now = D::NOW;
        let (in_progress, released, parked) = (
            State::InProgress.as_str(),
            State::Released.as_str(),
            State::Parked.as_str(),
        );
        let holds = holds_work();
        let info_columns = format!(
            "scope, key, state, fence, attempt, fingerprint, {} AS now_ms, \
             {} AS lease_left_ms, {} AS expires_ms, note, \
             CASE WHEN request IS NULL THEN 0 ELSE 1 END AS resumable",
            D::NOW_MS,
            D::ms_until("lease_until"),
            D::ms_until("expires_at"),
        );
        let live = format!("(expires_at > {now} OR {holds})");
        let expired = format!("(expires_at <= {now} AND NOT {holds})");
        let unfinished = format!(
            "state = '{in_progress}' AND (request IS NOT NULL OR note IS NOT NULL) \
             AND lease_until <= {now}"
        );
        AdminStatements {
            inspect: sql(format!(
                "SELECT {info_columns}, recovery_point, response_status, response_error, \
                 response_body, request FROM {t} WHERE scope = $1 AND key = $2"
            )),
            // The fence moves on, so that the owner that is presumed gone cannot complete,
            // release or checkpoint over the next attempt if it wakes up. Parked work is
            // released the same way.
            force_release: sql(format!(
                "UPDATE {t} SET state = '{released}', fence = fence + 1, request = NULL, \
                 resume_at = NULL, note = NULL, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND state IN ('{in_progress}', '{parked}') \
                 AND {live} RETURNING fence"
            )),
            retry: sql(format!(
                "UPDATE {t} SET state = '{in_progress}', lease_until = {now}, attempt = 1, \
                 resume_at = CASE WHEN request IS NOT NULL THEN {now} END, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND state = '{parked}' RETURNING fence"
            )),
            // Only the claim the operator saw: a claim taken since keeps running.
            force_release_fenced: sql(format!(
                "UPDATE {t} SET state = '{released}', fence = fence + 1, request = NULL, \
                 resume_at = NULL, note = NULL, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND state IN ('{in_progress}', '{parked}') \
                 AND {live} AND fence = $3 RETURNING fence"
            )),
            count_expired: sql(format!("SELECT count(*) AS n FROM {t} WHERE {expired}")),
            stats: sql(format!(
                "SELECT {prefix} AS prefix, state, \
                 count(*) AS n, \
                 {oldest} AS oldest_fence, \
                 sum(CASE WHEN {expired} THEN 1 ELSE 0 END) AS expired, \
                 sum(CASE WHEN {live} AND {until} <= $1 THEN 1 ELSE 0 END) AS expiring, \
                 sum(CASE WHEN {unfinished} THEN 1 ELSE 0 END) AS unfinished, \
                 min(CASE WHEN {unfinished} THEN fence END) AS oldest_unfinished_fence, \
                 max({now_ms}) AS now_ms \
                 FROM {t} GROUP BY {prefix}, state",
                prefix = D::scope_prefix("scope"),
                oldest = format_args!(
                    "min(CASE WHEN state = '{in_progress}' AND {live} THEN fence END)"
                ),
                until = D::ms_until("expires_at"),
                now_ms = D::NOW_MS,
            )),
            info_columns,
            table: t.to_owned(),
            now_ms: D::NOW_MS,
        }
    }

    /// `List`'s statement and arguments, from its filters.
    fn list<'q>(&self, query: &'q RecordQuery) -> (SqlStr, Vec<Arg<'q>>) {
        let mut conditions = Vec::new();
        let mut args = Vec::new();
        if let Some(state) = query.state {
            args.push(Arg::Text(state.as_str()));
            conditions.push(format!("state = ${}", args.len()));
        }
        if let Some(prefix) = query.scope_prefix.as_deref() {
            args.push(Arg::Text(prefix));
            // By length, not LIKE: a prefix holding `%` or `_` means itself.
            conditions.push(format!(
                "substr(scope, 1, {}) = ${}",
                prefix.chars().count(),
                args.len()
            ));
        }
        if let Some(age) = query.older_than {
            args.push(Arg::Int(ms(age)));
            conditions.push(format!("fence < {} - ${}", self.now_ms, args.len()));
        }
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conditions.join(" AND "))
        };
        let statement = sql(format!(
            "SELECT {} FROM {}{filter} ORDER BY fence LIMIT {}",
            self.info_columns,
            self.table,
            query.limit.min(i64::MAX as usize),
        ));
        (statement, args)
    }
}

/// A `RecordInfo` from a row of `info_columns` (and, when `full`, the recovery point and
/// answer).
fn record_info(row: &impl Columns, full: bool) -> Result<RecordInfo> {
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
    fence: i64,
    fingerprint: Vec<u8>,
    state: String,
    response_status: Option<i32>,
    response_error: bool,
    response_body: Option<Vec<u8>>,
    expired: bool,
    lease_left_ms: i64,
    lease_stamp: i64,
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

/// `e`, saying which record it is about.
fn within(scope: &str, key: &str, e: Error) -> Error {
    Error::Store(format!("record (scope {scope:?}, key {key:?}): {e}").into())
}

/// Whether a claim reads the record on the readers before it writes. Reading first answers a
/// replay without the writer (one reader statement) and costs a new key a statement more (the
/// read that finds nothing, then the insert); inserting first is the reverse. Unless the
/// builder fixed it, the store reads first while recent claims found their record often
/// enough to pay for the reads: a score that a claim which found its record raises by
/// [`ReadFirst::FOUND`] and one that did not lowers by one, so reads stay on while more than
/// about one claim in `FOUND + 1` is a replay (or a refusal), and a run of new keys turns
/// them off within a few claims.
pub(crate) struct ReadFirst {
    always: Option<bool>,
    score: AtomicU32,
}

impl ReadFirst {
    const FOUND: u32 = 8;
    const CAP: u32 = 64;

    pub(crate) fn adaptive() -> ReadFirst {
        ReadFirst {
            always: None,
            score: AtomicU32::new(0),
        }
    }

    pub(crate) fn always(on: bool) -> ReadFirst {
        ReadFirst {
            always: Some(on),
            score: AtomicU32::new(0),
        }
    }

    /// Whether this claim should read first.
    pub(crate) fn now(&self) -> bool {
        self.always
            .unwrap_or_else(|| self.score.load(Ordering::Relaxed) > 0)
    }

    /// A claim found its record (on a reader, or under its insert).
    fn answered(&self) {
        if self.always.is_none() {
            let _ = self
                .score
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                    (s < Self::CAP).then(|| (s + Self::FOUND).min(Self::CAP))
                });
        }
    }

    /// A claim found no record to answer from.
    pub(crate) fn missed(&self) {
        if self.always.is_none() {
            let _ = self
                .score
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| s.checked_sub(1));
        }
    }
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
    purging: OnceLock<Sweeper>,
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
        let sweeper = spawn_purges(&rt, engine.sql.table.clone(), every, move || {
            let engine = weak.upgrade()?;
            Some(async move { engine.purge_expired().await })
        });
        let _ = engine.purging.set(sweeper);
        engine
    }

    pub(crate) async fn write_conn(&self) -> Result<PoolConnection<D::Db>> {
        self.writer.acquire().await.map_err(map_err)
    }

    pub(crate) async fn read_conn(&self) -> Result<PoolConnection<D::Db>> {
        self.reader.acquire().await.map_err(map_err)
    }

    /// Opens a transaction for a guarded body.
    pub(crate) async fn begin_transaction(&self) -> Result<sqlx::Transaction<'static, D::Db>> {
        begin_on::<D>(&self.writer).await
    }

    /// Creates the table and its index if missing; safe to run from many instances at once.
    pub(crate) async fn migrate(&self) -> Result<()> {
        self.sql.migration.run::<D>(&self.writer).await
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
        owned(D::fetch(conn, &self.sql.complete, &args).await?, claim)
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
        let mut conn = self.write_conn().await?;
        owned(D::fetch(&mut conn, &self.sql.release, &args).await?, claim)
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
        let mut conn = self.write_conn().await?;
        owned(
            D::fetch(&mut conn, &self.sql.checkpoint, &args).await?,
            claim,
        )
    }

    pub(crate) async fn renew(&self, claim: ClaimRef<'_>, lease: Duration) -> Result<()> {
        let [scope, key, fence] = fenced_args(claim);
        let args = [scope, key, fence, Arg::Int(ms(lease))];
        let mut conn = self.write_conn().await?;
        owned(D::fetch(&mut conn, &self.sql.renew, &args).await?, claim)
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
                let (statement, args) = self.sql.admin.list(query);
                let mut conn = self.read_conn().await?;
                let rows = D::fetch_all(&mut conn, &statement, &args).await?;
                rows.iter()
                    .map(|row| record_info(row, false))
                    .collect::<Result<_>>()
                    .map(Reply::Records)
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
                let mut conn = self.write_conn().await?;
                owned(D::fetch(&mut conn, &self.sql.suspend, &args).await?, claim)
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
                let mut conn = self.write_conn().await?;
                owned(D::fetch(&mut conn, &self.sql.park, &args).await?, claim)
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
                let args = [Arg::Int(ms(expiring_within))];
                let mut conn = self.read_conn().await?;
                let rows = D::fetch_all(&mut conn, &self.sql.admin.stats, &args).await?;
                let mut stats = StoreStats::default();
                for row in &rows {
                    let state = State::parse(&row.text("state").map_err(map_err)?)?;
                    let count = |col: &str| -> Result<u64> {
                        // SUM over no rows is NULL; a group has at least one.
                        let n = row.int8(col).map_err(map_err)?;
                        Ok(u64::try_from(n).unwrap_or(0))
                    };
                    let (n, expired, expiring) =
                        (count("n")?, count("expired")?, count("expiring")?);
                    stats.expired += expired;
                    stats.expiring_soon += expiring;
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
                Ok(Reply::Stats(Box::new(stats)))
            }
            Operation::Begin(_) => Err(Error::Store(
                "a SQL store answers `begin` itself, not through its engine".into(),
            )),
        }
    }

    async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>> {
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
    async fn purge_batch(&self) -> Result<u64> {
        let mut conn = self.write_conn().await?;
        let mut deleted = 0;
        for stmt in &self.sql.purge {
            if let Some(row) = D::fetch(&mut conn, stmt, &[]).await? {
                deleted = row.int8("deleted").map_err(map_err)?;
            }
        }
        Ok(u64::try_from(deleted).unwrap_or(0))
    }

    /// Runs a claim's write in the background, on the current Tokio runtime if there is one:
    /// for the engine's own callers (group commit), which hold it rather than a store.
    #[cfg(feature = "postgres")]
    pub(crate) fn defer(self: &Arc<Self>, write: crate::store::Deferred) {
        super::spawn_deferred(EngineStore(self.clone()), write)
    }
}

/// An engine as a store, for writes deferred by the engine's own callers: every operation but
/// `begin`, which each SQL store answers itself.
#[cfg(feature = "postgres")]
struct EngineStore<D: Dialect>(Arc<Engine<D>>);

#[cfg(feature = "postgres")]
impl<D: Dialect> crate::store::Store for EngineStore<D> {
    fn call<'a>(&'a self, op: Operation<'a>) -> impl Future<Output = Result<Reply>> + Send + 'a {
        self.0.call(op)
    }

    fn defer(&self, write: crate::store::Deferred) {
        self.0.defer(write)
    }
}

fn fenced_args<'a>(claim: ClaimRef<'a>) -> [Arg<'a>; 3] {
    [
        Arg::Text(claim.scope),
        Arg::Text(claim.key),
        Arg::Int(fence_to_db(claim.fence)),
    ]
}

/// A fenced write's answer: it returned the row (the claim was live and ours), or the fence is
/// lost.
fn owned<R>(row: Option<R>, claim: ClaimRef<'_>) -> Result<()> {
    match row {
        Some(_) => Ok(()),
        None => Err(Error::FenceLost { fence: claim.fence }),
    }
}

/// A row of the `due` statement, read exactly.
fn unfinished(row: &impl Columns) -> Result<Unfinished> {
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
fn record(row: &impl Columns) -> Result<Record> {
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

fn read_fingerprint(bytes: &[u8]) -> Result<Fingerprint> {
    Fingerprint::from_slice(bytes).ok_or_else(|| {
        Error::Store(format!("a fingerprint of {} bytes, not 32", bytes.len()).into())
    })
}

fn stored_response(
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

/// Checks that `name` is an identifier (`schema.table` where `qualified`) and returns it quoted.
///
/// Only `[A-Za-z_][A-Za-z0-9_]*` parts of at most 63 bytes are accepted, so the quoted form can
/// never contain a quote: a table name is configuration, but it is spliced into SQL text, and
/// nothing that could close a quote gets there.
pub(crate) fn quote_table(name: &str, qualified: bool) -> Result<String> {
    let parts: Vec<&str> = name.split('.').collect();
    let max_parts = if qualified { 2 } else { 1 };
    if parts.len() > max_parts || parts.iter().any(|p| !is_identifier(p)) {
        let shape = if qualified {
            ", optionally `schema.table`"
        } else {
            ""
        };
        return Err(Error::Config(format!(
            "table name {name:?} is not an identifier: use letters, digits and `_` (not first), at most 63 bytes{shape}"
        )));
    }
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
}

/// Whether `s` is a plain SQL identifier.
fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// The unquoted last part of a table name, for naming its indexes.
pub(crate) fn base_name(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

/// The name of the index on `expires_at` of table `name` (unquoted, in the table's schema).
/// The name of the records table's index on `column`, as `store::schema` names it.
fn index_name(name: &str, column: &str) -> String {
    format!("{}_{column}_idx", base_name(name))
}

/// Whether a row holds unfinished work, in SQL (`lifecycle::unfinished`): such a row never
/// expires.
pub(crate) fn holds_work() -> String {
    format!(
        "(state = '{}' OR (state = '{}' AND (request IS NOT NULL OR note IS NOT NULL)))",
        State::Parked.as_str(),
        State::InProgress.as_str()
    )
}

/// Sorts a driver error into "retry later" ([`Error::Unavailable`], HTTP 503) and "broken"
/// ([`Error::Store`], HTTP 500).
pub(crate) fn map_err(e: sqlx::Error) -> Error {
    let transient = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| is_transient_code(&c)),
        _ => false,
    };
    if transient {
        Error::Unavailable(Box::new(e))
    } else {
        Error::Store(Box::new(e))
    }
}

fn is_transient_code(code: &str) -> bool {
    // PostgreSQL SQLSTATEs: connection exceptions (08…), insufficient resources (53…), operator
    // intervention such as a shutdown (57P0…), serialization failure, deadlock, lock timeout.
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57P0")
        || matches!(code, "40001" | "40P01" | "55P03")
        // SQLite extended result codes whose primary code is SQLITE_BUSY (5) or SQLITE_LOCKED (6).
        || code.parse::<u32>().is_ok_and(|c| matches!(c & 0xFF, 5 | 6))
}

pub(crate) fn fence_from_db(fence: i64) -> Result<u64> {
    u64::try_from(fence).map_err(|_| Error::Store(format!("negative fence {fence}").into()))
}

pub(crate) fn fence_to_db(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}

pub(crate) fn ms(d: Duration) -> i64 {
    crate::clock::duration_ms(d)
}

/// Too many concurrent changes to one record in a row: report it as contention.
pub(crate) fn contention(scope: &str, key: &str) -> Error {
    Error::Unavailable(
        format!("the record ({scope}, {key}) changed under every attempt to claim it").into(),
    )
}

/// What every SQL store offers the same way, on its engine (`inner`): `Debug`, `builder`, `new`,
/// `table`, `migrate`, and the transactional methods that need no dialect.
macro_rules! engine_store_api {
    ($store:ident, $pool:ty, $db:ty, $conn:ty) => {
        impl fmt::Debug for $store {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($store))
                    .field("table", &self.inner.sql.table)
                    .finish_non_exhaustive()
            }
        }

        impl $store {
            /// A builder with the default table name, creating the table.
            pub fn builder() -> SqlStoreBuilder<$store> {
                SqlStoreBuilder::default()
            }

            /// A store on `pool`, with the default table. The table is not created: call
            #[doc = concat!("[`", stringify!($store), "::migrate`], or use the builder.")]
            /// Expired records are purged in the background once a minute, as with the
            /// builder's defaults (inside a Tokio runtime); everything else is the builder's
            /// default too.
            pub fn new(pool: $pool) -> $store {
                $store::on_engine(
                    Engine::new(pool.clone(), pool, sql::DEFAULT_TABLE)
                        .expect("the default table name is valid")
                        .start(Some(crate::store::sweeper::DEFAULT_PURGE_EVERY)),
                )
            }

            /// The table name.
            pub fn table(&self) -> &str {
                &self.inner.sql.table
            }

            /// Creates the table and its index if missing. Any number of processes may do it at
            /// once: PostgreSQL migrates under an advisory lock, SQLite under its write lock.
            pub async fn migrate(&self) -> Result<()> {
                self.inner.migrate().await
            }
        }

        impl TxStore for $store {
            type Database = $db;

            fn begin_transaction(
                &self,
            ) -> impl Future<Output = Result<sqlx::Transaction<'static, $db>>> + Send {
                self.inner.begin_transaction()
            }

            async fn answer_first(&self, req: BeginRequest<'_>) -> Result<Option<BeginOutcome>> {
                self.inner.answer_first_in_tx(&req).await
            }

            async fn begin_in(
                &self,
                conn: &mut $conn,
                req: BeginRequest<'_>,
            ) -> Result<BeginOutcome> {
                self.begin_in_transaction(conn, req).await
            }

            fn complete_in(
                &self,
                conn: &mut $conn,
                claim: ClaimRef<'_>,
                response: &StoredResponse,
            ) -> impl Future<Output = Result<()>> + Send {
                self.inner.complete_on(conn, claim, response)
            }
        }
    };
}
pub(crate) use engine_store_api;

/// Builds a SQL store: the table name, whether to create it, and how expired records are
/// purged. `PgStore::builder()` and `SqliteStore::builder()` start one; each store adds its own
/// `build` and `connect`.
///
/// # Retention
///
/// A record lives as long as its policy's retention (`retain`, 24 hours by default, set per
/// handler), then its identity is free again. The store built here deletes expired records in
/// the background: once a minute by default ([`purge_every`](Self::purge_every)), in batches
/// that give the database back to live requests in between (SQLite's one writer takes a claim
/// between two batches), on a task that starts with the store, is shared by all its clones and
/// ends when the last of them is dropped. A purge that fails is logged at `warn` and the next
/// one tries again. [`background_purge(false)`](Self::background_purge) turns it off, for a
/// database purged by other means (a job of its own, another service sharing the table).
#[derive(Debug, Clone)]
pub struct SqlStoreBuilder<S> {
    pub(crate) table: String,
    pub(crate) create_table: bool,
    pub(crate) read_first: Option<bool>,
    purge_every: Duration,
    background_purge: bool,
    #[cfg(feature = "postgres")]
    pub(crate) group_commit: Option<crate::store::group::GroupCommit>,
    #[cfg(feature = "postgres")]
    pub(crate) duplicate_wait: std::time::Duration,
    #[cfg(feature = "postgres")]
    pub(crate) waiting_duplicates: Option<usize>,
    store: PhantomData<fn() -> S>,
}

impl<S> Default for SqlStoreBuilder<S> {
    fn default() -> Self {
        SqlStoreBuilder {
            table: DEFAULT_TABLE.to_owned(),
            create_table: true,
            read_first: None,
            purge_every: DEFAULT_PURGE_EVERY,
            background_purge: true,
            #[cfg(feature = "postgres")]
            group_commit: Some(crate::store::group::GroupCommit::default()),
            #[cfg(feature = "postgres")]
            duplicate_wait: crate::store::postgres::DEFAULT_DUPLICATE_WAIT,
            #[cfg(feature = "postgres")]
            waiting_duplicates: None,
            store: PhantomData,
        }
    }
}

impl<S> SqlStoreBuilder<S> {
    /// Whether a claim always (`true`) or never (`false`) first reads the record on the
    /// readers (SQLite's reader pool, PostgreSQL's pool), and answers a replay or "in progress"
    /// from there without a write: a replay is then one `SELECT` that never waits for SQLite's
    /// writer, and in transactional mode no transaction opens for it. Inserting first makes a
    /// new key one statement, as in a hand-written guard, and an existing one an insert that
    /// does nothing and a read; reading first makes replays several times faster and new keys
    /// a statement dearer (a read, then the insert).
    ///
    /// By default the store chooses as it goes: it inserts first while claims are new keys,
    /// and reads first while recent claims found their record (more than about one in nine),
    /// in both modes. Fix it here for a workload known in advance. `BENCHMARKS.md` has all
    /// three. (PostgreSQL's group commit, when it batches, reads in its batch statement.)
    pub fn read_first(mut self, read_first: bool) -> Self {
        self.read_first = Some(read_first);
        self
    }

    /// The table holding the records (default `idem_records`): an identifier, checked
    /// (`schema.table` on PostgreSQL).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Whether to create the table and its index if missing (default: yes).
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// How often expired records are deleted in the background (default: once a minute).
    /// Longer than zero; see [Retention](Self#retention).
    pub fn purge_every(mut self, every: Duration) -> Self {
        self.purge_every = every;
        self
    }

    /// Whether the store deletes expired records in the background (default: yes). Without
    /// it, expired records are never answered (a read checks their retention) but stay in the
    /// table until [`Store::purge_expired`](crate::Store::purge_expired) is called.
    pub fn background_purge(mut self, on: bool) -> Self {
        self.background_purge = on;
        self
    }

    /// The engine on these pools, its table created if asked for, purging in the background
    /// unless told not to.
    pub(crate) async fn open<D: Dialect>(
        self,
        writer: sqlx::Pool<D::Db>,
        reader: sqlx::Pool<D::Db>,
    ) -> Result<Arc<Engine<D>>> {
        if self.background_purge && self.purge_every.is_zero() {
            return Err(Error::Config(
                "the background purge interval must be longer than zero".into(),
            ));
        }
        let mut engine = Engine::new(writer, reader, &self.table)?;
        if let Some(always) = self.read_first {
            engine.read_first = ReadFirst::always(always);
        }
        if self.create_table {
            engine.migrate().await?;
        }
        Ok(engine.start(self.background_purge.then_some(self.purge_every)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One claim as `Engine::begin` scores it: a read first while reads are on (which answers
    /// a found record), then the insert; whether it read first.
    fn claim(rf: &ReadFirst, found: bool) -> bool {
        let read = rf.now();
        if read {
            if found {
                rf.answered();
                return true;
            }
            rf.missed();
        }
        if found {
            rf.answered()
        } else {
            rf.missed()
        }
        read
    }

    /// Of `n` claims of which every `every`-th finds its record, how many read first.
    fn reads(rf: &ReadFirst, n: usize, every: usize) -> usize {
        (1..=n).filter(|i| claim(rf, i % every == 0)).count()
    }

    #[test]
    fn reading_first_follows_the_share_of_claims_that_find_their_record() {
        let rf = ReadFirst::adaptive();
        assert!(!rf.now(), "a new store inserts first");
        assert_eq!(reads(&rf, 100, usize::MAX), 0, "new keys never read first");
        rf.answered();
        assert!(rf.now(), "one record found turns reads on");
        for _ in 0..ReadFirst::FOUND {
            rf.missed();
        }
        assert!(!rf.now(), "as many new keys turn them off again");
        // Retries common (one in four, one in two, all): nearly every claim reads first.
        for every in [4, 2, 1] {
            let rf = ReadFirst::adaptive();
            let n = reads(&rf, 400, every);
            assert!(n >= 390, "one in {every}: {n} of 400 read first");
        }
        // Retries rare (one in twenty, one in a hundred): few reads.
        for every in [20, 100] {
            let rf = ReadFirst::adaptive();
            let n = reads(&rf, 400, every);
            assert!(n <= 400 / 4, "one in {every}: {n} of 400 read first");
        }
        // The score is capped: a long run of replays is undone by a bounded run of new keys.
        let rf = ReadFirst::adaptive();
        assert_eq!(reads(&rf, 1_000, 1), 999);
        assert!(reads(&rf, 1_000, usize::MAX) <= ReadFirst::CAP as usize);
        assert!(!rf.now());
        for (on, rf) in [
            (true, ReadFirst::always(true)),
            (false, ReadFirst::always(false)),
        ] {
            assert_eq!(reads(&rf, 100, 3), if on { 100 } else { 0 });
            assert_eq!(reads(&rf, 100, usize::MAX), if on { 100 } else { 0 });
        }
    }

    #[test]
    fn identifiers() {
        assert_eq!(
            quote_table("idem_records", true).unwrap(),
            "\"idem_records\""
        );
        assert_eq!(quote_table("app.idem", true).unwrap(), "\"app\".\"idem\"");
        assert!(quote_table("app.idem", false).is_err());
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "idem\"; DROP TABLE orders; --",
            "a.b.c",
            "a.",
            &"x".repeat(64),
        ] {
            assert!(quote_table(bad, true).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn transient_codes() {
        assert!(is_transient_code("08006"));
        assert!(is_transient_code("57P01"));
        assert!(is_transient_code("5"));
        assert!(is_transient_code("517"));
        assert!(!is_transient_code("23505"));
        assert!(!is_transient_code("42P01"));
        assert!(!is_transient_code("19"));
    }

    #[test]
    fn stored_statuses_are_read_exactly() {
        assert_eq!(
            stored_response(Some(201), false, Some(vec![]))
                .unwrap()
                .status,
            Some(201)
        );
        assert!(stored_response(Some(-1), false, Some(vec![])).is_err());
        assert!(stored_response(Some(70_000), false, Some(vec![])).is_err());
        assert!(stored_response(Some(201), false, None).is_err());
    }
}
