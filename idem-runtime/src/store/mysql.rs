//! The MySQL store, for MySQL 8 and MariaDB 10.6 and later: shared by any number of service
//! instances, as PostgreSQL's is.
//!
//! MySQL has no `RETURNING` on `UPDATE` (MariaDB has it on `INSERT` and `DELETE` only), no
//! `ON CONFLICT … DO NOTHING`, and numbers no placeholders. Its dialect writes the engine's
//! statements in its terms, and each write answers from the server's reply to it, in the same
//! round trip: a fenced write matched its row (`CLIENT_FOUND_ROWS`, which sqlx always sets, so
//! a write that changed nothing still counts its row) and answers its own fence; a write that
//! sets the fence sets it through `LAST_INSERT_ID(…)`, which the reply carries; a first claim
//! is `INSERT … ON DUPLICATE KEY UPDATE` that resets it when the key exists. Only a take-over,
//! which answers more than its fence, reads its row after the write, on the same connection.
//!
//! In a transaction, a claim must not wait on a record another transaction holds for longer
//! than the duplicates' bound: on MariaDB its insert is sent with a lock wait of zero
//! (`SET STATEMENT … FOR`), on MySQL 8 a `FOR UPDATE NOWAIT` read goes first (`TxClaims`).

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{Executor as _, Row as _, ValueRef as _};

use crate::error::{Error, Result};
use crate::record::{BeginOutcome, BeginRequest, ClaimRef, StoredResponse};
use crate::store::schema::Database;
use crate::store::sql::{
    self, AddColumn, Arg, Columns, Dialect, DuplicateWaits, Engine, FenceFrom, RecordIndexes,
    Returns, SqlKind, SqlStoreBuilder, Stmt, Types, WaitingRoom, map_err,
};
use crate::store::{Operation, Reply, Store, TxStore};

/// The server's clock in milliseconds since the Unix epoch, in UTC whatever the session's
/// time zone.
const NOW: &str = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)";

/// The operators' index of unfinished work orders this virtual column: a record's fence when
/// it may hold work (a stored request, a note), else `NULL` (as in `MYSQL_RECORDS`).
const WORK_FENCE: &str =
    "BIGINT AS (CASE WHEN request IS NOT NULL OR note IS NOT NULL THEN fence END) VIRTUAL";

/// MySQL's side of the SQL stores: its clock in integer milliseconds, `?` placeholders and
/// backquoted identifiers, writes answered from the server's reply.
pub(crate) struct My;

impl Dialect for My {
    type Db = sqlx::MySql;
    type Row = MyRow;

    const NOW: &'static str = NOW;
    const NOW_MS: &'static str = NOW;
    // A purge holds row locks on what it deletes, and InnoDB's on the index range it reads.
    const PURGE_BATCH: i64 = 1_000;
    const DATABASE: Database = Database::Mysql;
    const TYPES: Types = Types {
        int4: "INT",
        timestamp: "BIGINT",
        bytes: "LONGBLOB",
        text: "TEXT",
    };
    const FALSE: &'static str = "FALSE";
    // Scopes are VARBINARY: compared by their bytes.
    const BYTE_ORDER: &'static str = "";
    const QUALIFIED_TABLES: bool = true;
    // A guarded body's transaction reads committed rows and locks no gaps, whatever the
    // session's level (MySQL's default, REPEATABLE READ, would lock the gap where an absent
    // key's record goes, and hold up every other key's first claim into it).
    const BEGIN: Option<&'static str> =
        Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION");
    // `connect`'s sessions are `READ COMMITTED` from the start: a plain `BEGIN` (one statement
    // where the server parsed and ran two).
    const BEGIN_SET_UP: Option<&'static str> = None;
    const NULL_SAFE_EQ: &'static str = "<=>";
    // No partial indexes: a virtual column, `NULL` but where a record may hold work.
    const WORK: &'static str = "work_fence IS NOT NULL";
    const WORK_ORDER: &'static str = "work_fence";

    fn stmt(sql: String) -> Stmt {
        let (text, binds) = render(&sql);
        let mut stmt = Stmt::plain(text);
        stmt.binds = Some(binds.into());
        stmt
    }

    fn returning(update: String, t: &str, columns: &str, fence: FenceFrom) -> Stmt {
        let mut stmt = Self::stmt(update);
        stmt.returns = match (columns, fence) {
            ("fence", FenceFrom::Arg(n)) => Returns::FenceArg(n - 1),
            ("fence", FenceFrom::Set) => Returns::InsertId,
            // More than the fence: read on the same connection, by the fence the write set.
            (columns, _) => Returns::Then(Box::new(Self::stmt(format!(
                "SELECT {columns} FROM {t} WHERE scope = $1 AND key = $2 \
                 AND fence = LAST_INSERT_ID()"
            )))),
        };
        stmt
    }

    fn set_fence(expr: &str) -> String {
        format!("LAST_INSERT_ID({expr})")
    }

    fn insert_new(insert: String) -> Stmt {
        // When the key exists, the update sets nothing (the fence to itself) and the insert
        // id back to 0: the reply says whether a row was inserted.
        let mut stmt = Self::stmt(format!(
            "{insert} ON DUPLICATE KEY UPDATE fence = fence + LAST_INSERT_ID(0)"
        ));
        stmt.returns = Returns::InsertId;
        stmt
    }

    fn after(param: &str) -> String {
        format!("({NOW} + {param})")
    }

    fn ms_until(col: &str) -> String {
        format!("({col} - {NOW})")
    }

    fn stamp(col: &str) -> String {
        col.to_owned()
    }

    fn purge(t: &str, expired: &str) -> Vec<Stmt> {
        let mut stmt = Self::stmt(format!(
            "DELETE FROM {t} WHERE {expired} LIMIT {}",
            Self::PURGE_BATCH
        ));
        stmt.returns = Returns::Affected;
        vec![stmt]
    }

    fn update_state_check(_t: &str, _table: &str) -> Option<(Stmt, Vec<Stmt>)> {
        // Every MySQL table was created with today's states.
        None
    }

    fn migration_start() -> Option<Stmt> {
        // DDL commits on its own in MySQL, and concurrent `CREATE TABLE IF NOT EXISTS` wait on
        // the table's metadata lock: nothing to serialise.
        None
    }

    fn add_column(t: &str, table: &str, column: &str, definition: &str) -> AddColumn {
        // `table` is a checked identifier and `column` one of ours: they can stand in string
        // literals.
        AddColumn {
            probe: Some(Self::stmt(format!(
                "SELECT count(*) AS present FROM information_schema.columns \
                 WHERE {} AND column_name = '{column}'",
                in_schema(table)
            ))),
            alter: Self::stmt(format!("ALTER TABLE {t} ADD COLUMN {column} {definition}")),
        }
    }

    fn upgrade_indexes(t: &str, table: &str, indexes: &RecordIndexes) -> Vec<AddColumn> {
        // `table` is a checked identifier, the index names made of it: they can stand in string
        // literals.
        let work = &indexes.work;
        vec![
            Self::add_column(t, table, "work_fence", WORK_FENCE),
            AddColumn {
                probe: Some(Self::stmt(format!(
                    "SELECT count(*) AS present FROM information_schema.statistics \
                     WHERE {} AND index_name = '{work}'",
                    in_schema(table)
                ))),
                alter: Self::stmt(format!(
                    "ALTER TABLE {t} ADD INDEX \"{work}\" (work_fence, created_at)"
                )),
            },
            reorder(t, table, &indexes.resume, "resume_at"),
            reorder(t, table, work, "work_fence"),
        ]
    }

    fn up_to_date(t: &str, indexes: &[String], columns: &[&str]) -> Option<Stmt> {
        // From the catalog, so that an instance starting next to busy ones waits on no lock of
        // the table. `t` is a checked identifier, quoted: without its quotes it can stand in
        // string literals.
        let table = t.replace('"', "");
        let names: Vec<String> = columns.iter().map(|c| format!("'{c}'")).collect();
        let has_columns = if names.is_empty() {
            "TRUE".to_owned()
        } else {
            format!(
                "(SELECT count(*) FROM information_schema.columns WHERE {} \
                 AND column_name IN ({})) = {}",
                in_schema(&table),
                names.join(", "),
                columns.len()
            )
        };
        let index_names: Vec<String> = indexes.iter().map(|i| format!("'{i}'")).collect();
        // Each index also ends in `created_at` (see `MYSQL_RECORDS`): one of an older table
        // that does not is rebuilt.
        Some(Self::stmt(format!(
            "SELECT CASE WHEN (SELECT count(DISTINCT index_name) FROM information_schema.statistics \
               WHERE {schema} AND index_name IN ({names})) = {n} \
             AND (SELECT count(DISTINCT index_name) FROM information_schema.statistics \
               WHERE {schema} AND index_name IN ({names}) AND column_name = 'created_at') = {n} \
             AND {has_columns} THEN 1 ELSE 0 END AS present",
            schema = in_schema(&table),
            names = index_names.join(", "),
            n = indexes.len()
        )))
    }

    fn format_note(t: &str, _table: &str) -> Stmt {
        Self::stmt(format!(
            "SELECT table_comment AS note FROM information_schema.tables WHERE {}",
            in_schema(&t.replace('"', ""))
        ))
    }

    fn scope_prefix(col: &str) -> String {
        format!("SUBSTRING_INDEX({col}, ':', 1)")
    }

    async fn fetch_all<'a>(
        conn: &'a mut MySqlConnection,
        stmt: &'a Stmt,
        args: &'a [Arg<'a>],
    ) -> Result<Vec<MyRow>> {
        {
            match &stmt.returns {
                Returns::Rows => {
                    let rows = sql::bound::<sqlx::MySql>(stmt, args)
                        .fetch_all(&mut *conn)
                        .await
                        .map_err(my_err)?;
                    Ok(rows.into_iter().map(MyRow::Db).collect())
                }
                _ => Ok(Self::fetch(conn, stmt, args).await?.into_iter().collect()),
            }
        }
    }

    async fn fetch<'a>(
        conn: &'a mut MySqlConnection,
        stmt: &'a Stmt,
        args: &'a [Arg<'a>],
    ) -> Result<Option<MyRow>> {
        {
            let q = sql::bound::<sqlx::MySql>(stmt, args);
            if let Returns::Rows = stmt.returns {
                let row = q.fetch_optional(&mut *conn).await.map_err(my_err)?;
                return Ok(row.map(MyRow::Db));
            }
            let done = q.execute(&mut *conn).await.map_err(my_err)?;
            let matched = done.rows_affected() > 0;
            Ok(match &stmt.returns {
                Returns::Rows => unreachable!("read above"),
                Returns::Affected => Some(MyRow::Value(
                    "deleted",
                    i64::try_from(done.rows_affected()).unwrap_or(i64::MAX),
                )),
                Returns::FenceArg(i) => match (matched, args.get(*i)) {
                    (false, _) => None,
                    (true, Some(Arg::Int(fence))) => Some(MyRow::Value("fence", *fence)),
                    (true, other) => {
                        return Err(Error::Store(
                            format!("a fenced write's fence argument is {other:?}").into(),
                        ));
                    }
                },
                Returns::InsertId => (matched && done.last_insert_id() > 0).then(|| {
                    MyRow::Value(
                        "fence",
                        i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX),
                    )
                }),
                Returns::Then(read) => match matched {
                    false => None,
                    true => sql::bound::<sqlx::MySql>(read, args)
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(my_err)?
                        .map(MyRow::Db),
                },
            })
        }
    }

    sql::run_statements!(execute: sqlx::MySql, MySqlConnection, my_err);
}

/// Rebuilds `index` on `(column, created_at)` where a table created before it ended in
/// `created_at` has it on `column` alone (see `MYSQL_RECORDS`): dropped and added in one
/// `ALTER TABLE`. MySQL and MariaDB build the new index while the table takes writes, but the
/// statement waits for the transactions running on the table when it starts and ends, and the
/// migration returns only once the index is built.
fn reorder(t: &str, table: &str, index: &str, column: &str) -> AddColumn {
    // `table` is a checked identifier, `index` one made of it: they can stand in string
    // literals.
    AddColumn {
        probe: Some(My::stmt(format!(
            "SELECT count(*) AS present FROM information_schema.statistics \
             WHERE {} AND index_name = '{index}' AND column_name = 'created_at'",
            in_schema(table)
        ))),
        alter: My::stmt(format!(
            "ALTER TABLE {t} DROP INDEX \"{index}\", ADD INDEX \"{index}\" ({column}, created_at)"
        )),
    }
}

/// `information_schema`'s condition for the table `table` (`name` or `database.name`), in the
/// connection's database when it names none.
fn in_schema(table: &str) -> String {
    match table.rsplit_once('.') {
        Some((database, name)) => {
            format!("table_schema = '{database}' AND table_name = '{name}'")
        }
        None => format!("table_schema = DATABASE() AND table_name = '{table}'"),
    }
}

/// A statement written as the engine writes them, in MySQL's terms: each `$n` becomes `?`
/// (with `n - 1` where its argument is), each `"identifier"` a backquoted one, and the column
/// `key`, a reserved word in MySQL, is backquoted. String literals and backquoted identifiers
/// are copied as they are.
pub(crate) fn render(sql: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut binds = Vec::new();
    let mut chars = sql.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '\'' | '`' => {
                out.push(c);
                while let Some((_, inner)) = chars.next() {
                    out.push(inner);
                    if inner == c {
                        // A doubled quote is the quote itself, inside.
                        if chars.peek().is_some_and(|&(_, n)| n == c) {
                            out.push(chars.next().expect("peeked").1);
                            continue;
                        }
                        break;
                    }
                }
            }
            '"' => {
                out.push('`');
                for (_, inner) in chars.by_ref() {
                    if inner == '"' {
                        break;
                    }
                    out.push(inner);
                }
                out.push('`');
            }
            '$' if chars.peek().is_some_and(|&(_, n)| n.is_ascii_digit()) => {
                let mut n = 0usize;
                while let Some(&(_, d)) = chars.peek() {
                    let Some(digit) = d.to_digit(10) else { break };
                    n = n * 10 + digit as usize;
                    chars.next();
                }
                out.push('?');
                binds.push(n.saturating_sub(1));
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut end = at + c.len_utf8();
                while let Some(&(i, n)) = chars.peek() {
                    if !(n.is_ascii_alphanumeric() || n == '_') {
                        break;
                    }
                    end = i + n.len_utf8();
                    chars.next();
                }
                let word = &sql[at..end];
                // Only where it is an identifier: `PRIMARY KEY`, `DUPLICATE KEY` are written
                // in capitals.
                if word == "key" {
                    out.push_str("`key`");
                } else {
                    out.push_str(word);
                }
            }
            c => out.push(c),
        }
    }
    (out, binds)
}

/// A driver error sorted: MySQL's lock wait timeout (1205) and deadlock (1213) are
/// contention, as PostgreSQL's are; the rest as for every SQL store.
fn my_err(e: sqlx::Error) -> Error {
    if let sqlx::Error::Database(db) = &e
        && let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        && matches!(my.number(), 1205 | 1213)
    {
        return Error::Unavailable(Box::new(e));
    }
    map_err(e)
}

/// A row MySQL answered, or the one a write's reply stands for (its fence, or how many rows it
/// deleted).
pub(crate) enum MyRow {
    Db(MySqlRow),
    Value(&'static str, i64),
}

impl MyRow {
    fn db(&self, col: &str) -> Result<&MySqlRow, sqlx::Error> {
        match self {
            MyRow::Db(row) => Ok(row),
            MyRow::Value(..) => Err(sqlx::Error::ColumnNotFound(col.to_owned())),
        }
    }

    /// An integer column of any width, or a boolean expression (which MySQL answers as one).
    fn integer(&self, col: &str) -> Result<Option<i64>, sqlx::Error> {
        if let MyRow::Value(name, value) = self {
            return match *name == col {
                true => Ok(Some(*value)),
                false => Err(sqlx::Error::ColumnNotFound(col.to_owned())),
            };
        }
        let row = self.db(col)?;
        if row.try_get_raw(col)?.is_null() {
            return Ok(None);
        }
        if let Ok(v) = row.try_get::<i64, _>(col) {
            return Ok(Some(v));
        }
        if let Ok(v) = row.try_get::<i32, _>(col) {
            return Ok(Some(v.into()));
        }
        if let Ok(v) = row.try_get::<i8, _>(col) {
            return Ok(Some(v.into()));
        }
        if let Ok(v) = row.try_get::<bool, _>(col) {
            return Ok(Some(v.into()));
        }
        let v = row.try_get::<u64, _>(col)?;
        i64::try_from(v)
            .map(Some)
            .map_err(|e| sqlx::Error::ColumnDecode {
                index: col.to_owned(),
                source: Box::new(e),
            })
    }

    /// A text column, which may be a `VARBINARY` one holding UTF-8.
    fn string(&self, col: &str) -> Result<Option<String>, sqlx::Error> {
        let row = self.db(col)?;
        if let Ok(v) = row.try_get::<Option<String>, _>(col) {
            return Ok(v);
        }
        match row.try_get::<Option<Vec<u8>>, _>(col)? {
            None => Ok(None),
            Some(bytes) => {
                String::from_utf8(bytes)
                    .map(Some)
                    .map_err(|e| sqlx::Error::ColumnDecode {
                        index: col.to_owned(),
                        source: Box::new(e),
                    })
            }
        }
    }
}

fn present<T>(col: &str, v: Option<T>) -> Result<T, sqlx::Error> {
    v.ok_or_else(|| sqlx::Error::ColumnDecode {
        index: col.to_owned(),
        source: "NULL where a value was expected".into(),
    })
}

impl Columns for MyRow {
    fn int8(&self, col: &str) -> Result<i64, sqlx::Error> {
        present(col, self.integer(col)?)
    }

    fn int4(&self, col: &str) -> Result<i32, sqlx::Error> {
        let v = self.int8(col)?;
        i32::try_from(v).map_err(|e| sqlx::Error::ColumnDecode {
            index: col.to_owned(),
            source: Box::new(e),
        })
    }

    fn opt_int4(&self, col: &str) -> Result<Option<i32>, sqlx::Error> {
        self.integer(col)?
            .map(|v| {
                i32::try_from(v).map_err(|e| sqlx::Error::ColumnDecode {
                    index: col.to_owned(),
                    source: Box::new(e),
                })
            })
            .transpose()
    }

    fn opt_int8(&self, col: &str) -> Result<Option<i64>, sqlx::Error> {
        self.integer(col)
    }

    fn text(&self, col: &str) -> Result<String, sqlx::Error> {
        present(col, self.string(col)?)
    }

    fn opt_text(&self, col: &str) -> Result<Option<String>, sqlx::Error> {
        self.string(col)
    }

    fn bytes(&self, col: &str) -> Result<Vec<u8>, sqlx::Error> {
        self.db(col)?.try_get::<Vec<u8>, _>(col)
    }

    fn opt_bytes(&self, col: &str) -> Result<Option<Vec<u8>>, sqlx::Error> {
        self.db(col)?.try_get::<Option<Vec<u8>>, _>(col)
    }

    fn boolean(&self, col: &str) -> Result<bool, sqlx::Error> {
        Ok(self.int8(col)? != 0)
    }
}

/// A store on MySQL 8 or MariaDB 10.6 and later (tested on MariaDB 10.11).
///
/// Leases and retention are read against the server's clock, in UTC, so instances with skewed
/// clocks agree. `begin` inserts first: a new key is one `INSERT … ON DUPLICATE KEY UPDATE`
/// that writes nothing when the key exists, then a `SELECT`; while recent claims keep finding
/// their record (retries), it reads first. `complete`, `release` and `checkpoint` are one
/// `UPDATE … WHERE fence = ?` each, answered from the server's reply. A guarded body's
/// transaction runs `READ COMMITTED`, so that InnoDB locks the rows a statement touches and not
/// the gaps between them: the store's own pool ([`connect`](Self::connect)) sets its sessions so
/// once and opens each transaction with a plain `BEGIN`; on a pool of your own
/// ([`build`](crate::store::SqlStoreBuilder::build)) each transaction sets it as it starts. The
/// own pool also runs strict SQL mode, so that nothing it writes is cut short.
///
/// Expired records are deleted in the background, once a minute by default, in batches of
/// 1,000 (`DELETE … LIMIT`); see [Retention](SqlStoreBuilder#retention).
///
/// ```no_run
/// # async fn f() -> idem::Result<()> {
/// let store = idem::MySqlStore::connect("mysql://root@127.0.0.1/app").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MySqlStore {
    // One pointer: the macro clones the store on every call.
    inner: Arc<Engine<My>>,
    /// How transactional claims meet a duplicate's transaction.
    tx: Arc<TxClaims>,
}

pub use crate::store::sql::waits::DEFAULT_DUPLICATE_WAIT;

/// Builds a [`MySqlStore`]: table name, whether to create the table, how transactional
/// duplicates wait.
pub type MySqlStoreBuilder = SqlStoreBuilder<MySqlStore>;

/// What a [`MySqlStoreBuilder`] sets that other SQL stores do not have: the transactional
/// duplicates' wait, set through the builder's methods.
#[derive(Debug, Clone, Default)]
pub struct MySqlOptions {
    waits: DuplicateWaits,
    probe_first: bool,
}

impl sql::sealed::Sealed for MySqlStore {}

impl SqlKind for MySqlStore {
    type Options = MySqlOptions;
}

impl sql::sealed::WaitingKind for MySqlStore {
    fn waits(options: &mut MySqlOptions) -> &mut DuplicateWaits {
        &mut options.waits
    }
}

/// Transactional claims: a transaction's claim takes the record's lock without waiting for it
/// (on MariaDB the insert itself, with a lock wait of zero; on MySQL a `FOR UPDATE NOWAIT` read
/// before it). A record another transaction inserted or holds is locked: the duplicate then
/// waits for it within a bound (`innodb_lock_wait_timeout`, set for
/// that read only), and only so many at once, instead of waiting on the row for as long as the
/// first transaction runs while holding a pool connection.
struct TxClaims {
    /// The read that does not wait, and the one that waits.
    probe: Stmt,
    wait_for: Stmt,
    /// On MariaDB, the first claim itself with a lock wait of zero (`SET STATEMENT
    /// innodb_lock_wait_timeout = 0 FOR INSERT …`), in place of the probe: a new key is one
    /// round trip, as in a hand-written inbox, and a record another transaction inserted or
    /// holds refuses the insert at once, as it refuses the probe. MySQL has no statement-scoped
    /// setting of the wait, nor a wait of zero: it reads with the probe first.
    claim_at_once: Option<Stmt>,
    room: WaitingRoom,
}

impl TxClaims {
    fn new(table: &str, room: WaitingRoom, claim_at_once: Option<Stmt>) -> Result<TxClaims> {
        let t = sql::quote_table(table, true)?;
        Ok(TxClaims {
            claim_at_once,
            probe: My::stmt(format!(
                "SELECT 1 AS held FROM {t} WHERE scope = $1 AND key = $2 FOR UPDATE NOWAIT"
            )),
            wait_for: My::stmt(format!(
                "SELECT 1 AS held FROM {t} WHERE scope = $1 AND key = $2 FOR UPDATE"
            )),
            room,
        })
    }
}

/// Whether `e` (a driver error, as the store's errors carry it) is InnoDB's deadlock, which
/// rolled the transaction back.
fn is_deadlock(e: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    e.downcast_ref::<sqlx::Error>().is_some_and(|e| {
        matches!(e, sqlx::Error::Database(db)
            if db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|my| my.number() == 1213))
    })
}

/// `insert` (the first claim) with a lock wait of zero, on MariaDB: it fails at once (1205),
/// its statement alone rolled back, where it would wait for another transaction's lock.
fn claim_without_waiting(insert: &Stmt) -> Stmt {
    use sqlx::SqlSafeStr as _;
    Stmt {
        sql: sqlx::AssertSqlSafe(format!(
            "SET STATEMENT innodb_lock_wait_timeout = 0 FOR {}",
            insert.sql.as_str()
        ))
        .into_sql_str(),
        binds: insert.binds.clone(),
        returns: insert.returns.clone(),
    }
}

/// [`lock_not_granted`], for a driver error as the store's errors carry it.
fn not_granted(e: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    e.downcast_ref::<sqlx::Error>()
        .is_some_and(lock_not_granted)
}

/// Whether `e` says a row lock was not granted: at once (`NOWAIT`: MySQL's 3572, MariaDB's
/// 1205) or within the wait (1205).
fn lock_not_granted(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|my| matches!(my.number(), 1205 | 3572)))
}

impl SqlStoreBuilder<MySqlStore> {
    /// A store on an existing pool. Its connections must run in strict SQL mode
    /// (`STRICT_TRANS_TABLES` or `STRICT_ALL_TABLES`, the default since MySQL 5.7 and MariaDB
    /// 10.2.4): without it, MySQL cuts a value too long for its column short instead of
    /// refusing it. A server with `innodb_rollback_on_timeout=ON` is refused too: a lock wait
    /// that runs out would end the caller's transaction, not just its statement.
    pub async fn build(self, pool: MySqlPool) -> Result<MySqlStore> {
        let (mode, rollback_on_timeout, version): (String, i64, String) = sqlx::query_as(
            "SELECT @@SESSION.sql_mode, CAST(@@GLOBAL.innodb_rollback_on_timeout AS SIGNED), \
             VERSION()",
        )
        .fetch_one(&pool)
        .await
        .map_err(my_err)?;
        if rollback_on_timeout != 0 {
            return Err(Error::Config(
                "the MySQL server runs with innodb_rollback_on_timeout=ON: a transactional duplicate's bounded wait would roll back the caller's whole transaction, and what followed would commit outside it; turn it off".into(),
            ));
        }
        if !mode.contains("STRICT_TRANS_TABLES") && !mode.contains("STRICT_ALL_TABLES") {
            return Err(Error::Config(format!(
                "the MySQL pool's sql_mode is {mode:?}: idem needs strict mode (add STRICT_TRANS_TABLES), or values too long for their column would be cut short"
            )));
        }
        let room = WaitingRoom::new(&self.options.waits, pool.options().get_max_connections())?;
        let probe_first = self.options.probe_first || !version.contains("MariaDB");
        let (inner, _) = self.open(pool.clone(), pool).await?;
        let claim_at_once = (!probe_first).then(|| claim_without_waiting(&inner.sql.insert));
        let tx = Arc::new(TxClaims::new(&inner.sql.table, room, claim_at_once)?);
        Ok(MySqlStore { inner, tx })
    }

    /// Tests only: a transactional claim reads the record with its probe first on MariaDB too,
    /// as it does on MySQL, so that one server tests both ways.
    #[doc(hidden)]
    pub fn probe_first(mut self, probe_first: bool) -> Self {
        self.options.probe_first = probe_first;
        self
    }

    /// Connects a pool of up to 16 connections to `url` with
    /// [`MySqlStore::connect_options`] and builds the store on it.
    ///
    /// The pool pings a connection before lending it only when it has been idle for half a
    /// second or more: a connection used more recently is lent as it is, which saves a round
    /// trip per statement on a busy pool. One that the server closed in between (a restart
    /// within that half second) fails the statement it is lent for with
    /// [`Error::Unavailable`](crate::Error::Unavailable), which the caller retries, and is
    /// dropped. A pool of your own, passed to [`build`](Self::build), keeps its own settings;
    /// [`ping_when_idle`](crate::store::ping_when_idle) gives it the same.
    pub async fn connect(self, url: &str) -> Result<MySqlStore> {
        let pool = sql::ping_when_idle(MySqlPoolOptions::new())
            .max_connections(16)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    conn.execute(
                        "SET SESSION sql_mode = IF(@@SESSION.sql_mode = '', 'STRICT_ALL_TABLES', \
                         CONCAT(@@SESSION.sql_mode, ',STRICT_ALL_TABLES'))",
                    )
                    .await?;
                    Ok(())
                })
            })
            .connect_with(MySqlStore::connect_options(url)?)
            .await
            .map_err(my_err)?;
        let mut builder = self;
        builder.sessions_set_up = true;
        builder.build(pool).await
    }
}

impl MySqlStore {
    /// A store on `inner`, with the transactional duplicates' defaults.
    fn on_engine(inner: Arc<Engine<My>>) -> MySqlStore {
        let room = WaitingRoom::default_for(inner.writer.options().get_max_connections());
        let tx = TxClaims::new(&inner.sql.table, room, None)
            .expect("the engine's table name was checked");
        MySqlStore {
            inner,
            tx: Arc::new(tx),
        }
    }

    /// Connects to `url` (`mysql://user:password@host/database`) and creates the table if
    /// missing.
    pub async fn connect(url: &str) -> Result<MySqlStore> {
        MySqlStore::builder().connect(url).await
    }

    /// The options idem connects with: those of `url`.
    pub fn connect_options(url: &str) -> Result<MySqlConnectOptions> {
        MySqlConnectOptions::from_str(url)
            .map_err(|e| Error::Config(format!("invalid MySQL URL: {e}")))
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.inner.writer
    }
}

impl MySqlStore {
    /// `begin` inside the caller's transaction: the first claim sent with a lock wait of zero
    /// (MariaDB), or the record read with a lock that does not wait and then claimed as outside
    /// a transaction (MySQL); the transaction holds the record's lock from then on. A record
    /// another transaction holds is waited for within the bound.
    async fn begin_in_transaction(
        &self,
        conn: &mut MySqlConnection,
        req: BeginRequest<'_>,
    ) -> Result<BeginOutcome> {
        if let Some(claim) = &self.tx.claim_at_once {
            let args = sql::Statements::claim_args(&req);
            return match My::fetch(conn, claim, &args).await {
                Ok(Some(row)) => Ok(BeginOutcome::Claimed(Engine::<My>::first_claim(&row)?)),
                // The record exists and this transaction now holds its lock: decided on as
                // after the probe.
                Ok(None) => self.claim_in(conn, &req).await,
                Err(Error::Unavailable(e) | Error::Store(e)) if not_granted(&*e) => {
                    self.wait_for_claimer(conn, &req).await
                }
                Err(Error::Unavailable(e)) if is_deadlock(&*e) => Ok(self.tx.room.busy()),
                Err(e) => Err(e),
            };
        }
        let key = [Arg::Text(req.scope), Arg::Text(req.key)];
        match sql::bound::<sqlx::MySql>(&self.tx.probe, &key)
            .fetch_optional(&mut *conn)
            .await
        {
            Ok(_) => self.claim_in(conn, &req).await,
            Err(e) if lock_not_granted(&e) => self.wait_for_claimer(conn, &req).await,
            Err(e) => Err(my_err(e)),
        }
    }

    /// The claim itself, in the transaction. First claims of one key racing in several
    /// transactions can deadlock in InnoDB (each waits on the other's insert of the same key):
    /// the one InnoDB rolls back is a duplicate of a request that is running, and is told so.
    async fn claim_in(
        &self,
        conn: &mut MySqlConnection,
        req: &BeginRequest<'_>,
    ) -> Result<BeginOutcome> {
        match self.inner.begin(Some(conn), req).await {
            Err(Error::Unavailable(e)) if is_deadlock(&*e) => Ok(self.tx.room.busy()),
            other => other,
        }
    }

    /// Another transaction holds the record: wait for it within the bound (one of at most
    /// `waiting_duplicates`), then claim or replay as its end decides; "in progress" when the
    /// bound runs out or too many wait already.
    async fn wait_for_claimer(
        &self,
        conn: &mut MySqlConnection,
        req: &BeginRequest<'_>,
    ) -> Result<BeginOutcome> {
        let busy = self.tx.room.busy();
        let Some(_waiting) = self.tx.room.enter(req) else {
            return Ok(busy);
        };
        // The bound applies to this wait only: the caller's setting comes back after it.
        let wait = self.tx.room.wait;
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        sqlx::query(
            "SET @idem_lock_wait = @@SESSION.innodb_lock_wait_timeout, \
             SESSION innodb_lock_wait_timeout = ?",
        )
        .bind(seconds)
        .execute(&mut *conn)
        .await
        .map_err(my_err)?;
        let key = [Arg::Text(req.scope), Arg::Text(req.key)];
        let waited = sql::bound::<sqlx::MySql>(&self.tx.wait_for, &key)
            .fetch_optional(&mut *conn)
            .await;
        sqlx::query("SET SESSION innodb_lock_wait_timeout = @idem_lock_wait")
            .execute(&mut *conn)
            .await
            .map_err(my_err)?;
        match waited {
            // The first transaction ended: its record is committed (a replay, or one to take
            // over), or gone with its rollback (claim).
            Ok(_) => self.claim_in(conn, req).await,
            Err(e) if lock_not_granted(&e) => Ok(busy),
            Err(e) => Err(my_err(e)),
        }
    }
}

sql::engine_store_api!(
    MySqlStore,
    MySqlPool,
    sqlx::MySql,
    MySqlConnection,
    engine_calls
);

#[cfg(test)]
mod tests {
    use super::render;

    /// A table migrated from before the index of unfinished work gets the column the table
    /// is created with.
    #[test]
    fn the_work_column_is_the_one_the_table_is_created_with() {
        let ddl = crate::store::schema::MYSQL_RECORDS[0];
        assert!(
            ddl.contains(&format!("work_fence {},", super::WORK_FENCE)),
            "{ddl}"
        );
    }

    #[test]
    fn placeholders_become_positional_and_identifiers_backquoted() {
        let (sql, binds) = render(
            "UPDATE \"app\".\"recs\" SET fence = $3, note = '$1 \"x\" key''s' \
             WHERE scope = $1 AND key = $2 AND fence = $3 AND `key` = $10",
        );
        assert_eq!(
            sql,
            "UPDATE `app`.`recs` SET fence = ?, note = '$1 \"x\" key''s' \
             WHERE scope = ? AND `key` = ? AND fence = ? AND `key` = ?"
        );
        assert_eq!(binds, [2, 0, 1, 2, 9]);
    }

    #[test]
    fn words_that_hold_key_and_capitals_stay() {
        let (sql, binds) =
            render("INSERT INTO t (keys, monkey) VALUES (1, 2) ON DUPLICATE KEY UPDATE a = a");
        assert_eq!(
            sql,
            "INSERT INTO t (keys, monkey) VALUES (1, 2) ON DUPLICATE KEY UPDATE a = a"
        );
        assert!(binds.is_empty());
    }
}
