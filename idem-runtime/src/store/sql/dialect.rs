//! What differs between the SQL databases ([`Dialect`]), the values bound to statements, and reading columns.

use std::future::Future;
use std::time::Duration;

use sqlx::{AssertSqlSafe, SqlSafeStr as _, SqlStr};

use super::ddl::Database;
use crate::error::{Error, Result};

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

/// A statement written for one database ([`Dialect::stmt`]): its text, which argument each
/// placeholder binds where the database numbers none, and how a write's result is read where
/// the database returns no row from it.
#[derive(Debug, Clone)]
pub(crate) struct Stmt {
    pub(crate) sql: SqlStr,
    /// The argument (0-based) each `?` binds, in order; `None` where placeholders are numbered
    /// (`$1`) and the arguments are bound as given.
    pub(crate) binds: Option<Box<[usize]>>,
    #[cfg_attr(not(feature = "sql-replies"), allow(dead_code))]
    pub(crate) returns: Returns,
}

/// How the row a statement answers is read.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "sql-replies"), allow(dead_code))]
pub(crate) enum Returns {
    /// The statement's own rows: a query, or a write with `RETURNING`.
    Rows,
    /// A write that returns nothing: when it matched a row, one row whose `fence` is argument
    /// `.0` (0-based).
    FenceArg(usize),
    /// A write that sets the fence through `LAST_INSERT_ID(…)` ([`Dialect::set_fence`]): when
    /// it matched (an insert: inserted) a row, one row whose `fence` is the value it set.
    InsertId,
    /// A write: one row whose `deleted` is how many rows it changed.
    Affected,
    /// A write, then, when it matched a row, this query on the same connection, with the
    /// write's arguments.
    Then(Box<Stmt>),
}

impl Stmt {
    /// `sql` as written, its own rows read.
    pub(crate) fn plain(sql: impl Into<String>) -> Stmt {
        Stmt {
            sql: AssertSqlSafe(sql.into()).into_sql_str(),
            binds: None,
            returns: Returns::Rows,
        }
    }
}

impl From<SqlStr> for Stmt {
    fn from(sql: SqlStr) -> Stmt {
        Stmt {
            sql,
            binds: None,
            returns: Returns::Rows,
        }
    }
}

/// Where the fence a write returns comes from ([`Dialect::returning`]).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "sql-replies"), allow(dead_code))]
pub(crate) enum FenceFrom {
    /// It is the argument `$n` (a fenced write, which leaves it as it is).
    Arg(usize),
    /// The write sets it, with [`Dialect::set_fence`].
    Set,
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
    /// What follows a text column in a comparison that must be one of bytes (UTF-8's order of
    /// code points), and that the records' primary key, created in that order, serves.
    const BYTE_ORDER: &'static str;
    /// Whether a table name may be `schema.table`.
    const QUALIFIED_TABLES: bool;
    /// The statement that opens a transaction for a guarded body, when the driver's default
    /// will not do.
    const BEGIN: Option<&'static str>;
    /// The same on a pool of the store's own, whose sessions it set up when connecting (what
    /// `BEGIN` sets per transaction may already be the session's).
    const BEGIN_SET_UP: Option<&'static str> = Self::BEGIN;

    /// `IS NOT DISTINCT FROM`: equality that holds between two NULLs.
    const NULL_SAFE_EQ: &'static str = "IS NOT DISTINCT FROM";

    /// The rows the operators' index of unfinished work holds (a stored request or a note:
    /// every record that holds work, [`holds_work`](super::holds_work), and none other), as a
    /// condition that index serves.
    const WORK: &'static str = "(request IS NOT NULL OR note IS NOT NULL)";
    /// What that index orders its rows by: their fence.
    const WORK_ORDER: &'static str = "fence";

    /// A statement written as the engine writes them (`$n` placeholders, `"quoted"`
    /// identifiers) in this database's terms.
    fn stmt(sql: String) -> Stmt {
        Stmt::plain(sql)
    }

    /// The write `update` (an `UPDATE` or `DELETE` that matches at most one row), answering
    /// `columns` of the row it wrote (`fence` among them, coming from `fence`) when it
    /// matched one. `t` is its table.
    fn returning(update: String, _t: &str, columns: &str, _fence: FenceFrom) -> Stmt {
        Self::stmt(format!("{update} RETURNING {columns}"))
    }

    /// The value `expr` as a write sets the fence to it, so that [`returning`](Self::returning)
    /// with [`FenceFrom::Set`] can answer it.
    fn set_fence(expr: &str) -> String {
        expr.to_owned()
    }

    /// `insert` (an `INSERT` of one record, with its fence set through
    /// [`set_fence`](Self::set_fence)) made a first claim: it answers the row's `fence` when it
    /// inserted it, nothing when the key exists.
    fn insert_new(insert: String) -> Stmt {
        Self::stmt(format!(
            "{insert} ON CONFLICT (scope, key) DO NOTHING RETURNING fence"
        ))
    }

    /// `Self::NOW` plus the milliseconds in parameter `param`.
    fn after(param: &str) -> String;
    /// The milliseconds from now until the timestamp column `col`, negative once it passed.
    fn ms_until(col: &str) -> String;
    /// The timestamp column `col` as an integer that changes whenever it does.
    fn stamp(col: &str) -> String;
    /// The statements that delete a batch of the records of table `t` for which `expired` (a
    /// condition on its columns) holds, the last one returning how many (`deleted`).
    fn purge(t: &str, expired: &str) -> Vec<Stmt>;
    /// Brings the check of the `state` column of a table created by an earlier version to
    /// today's DDL (a state added since, such as `parked`; the form of the check): a query whose
    /// `present` column is 1 when the table has today's check already, and the statements that
    /// give it.
    fn update_state_check(t: &str, table: &str) -> Option<(Stmt, Vec<Stmt>)>;
    /// A statement run first in a migration's transaction, before any table is created: what
    /// serialises concurrent migrations where the transaction does not, and keeps them quiet.
    fn migration_start() -> Option<Stmt>;
    /// Adds `column` (`definition` after its name) to a table created before it existed: the
    /// statement, and, where the database cannot say `IF NOT EXISTS`, a query whose `present`
    /// column counts the column if it is there already.
    fn add_column(t: &str, table: &str, column: &str, definition: &str) -> AddColumn;
    /// What an older records table needs to reach this version's indexes, beyond the
    /// statements of its DDL that a migration runs again (none where each index is a
    /// `CREATE INDEX IF NOT EXISTS` of them): the index of unfinished work where it was created
    /// before it, and an index rebuilt where its columns changed. `indexes` names them.
    fn upgrade_indexes(_t: &str, _table: &str, _indexes: &RecordIndexes) -> Vec<AddColumn> {
        Vec::new()
    }

    /// A query whose `present` column is 1 when table `t`, each of its `indexes` and every
    /// column of `columns` exist already, read from the catalog without locking the table;
    /// `None` where migrating a table that is up to date takes no lock that could wait on its
    /// users.
    ///
    /// PostgreSQL's `CREATE INDEX IF NOT EXISTS` and `ALTER TABLE … ADD COLUMN IF NOT EXISTS`
    /// lock the table before they find there is nothing to do: an instance starting next to
    /// busy ones (a rolling restart, a restart after a crash) would queue every claim behind
    /// its migration, or deadlock with a claim in flight.
    fn up_to_date(_t: &str, _indexes: &[String], _columns: &[&str]) -> Option<Stmt> {
        None
    }

    /// A query of the catalog whose `note` column holds the text in which the table `t` (quoted;
    /// `table` as given) names its records' format: its comment, or its definition where the
    /// database keeps no comment. No row, or `NULL`, when the table does not exist or has none.
    fn format_note(t: &str, table: &str) -> Stmt;

    /// The text of `col` up to its first `:` (all of it when there is none): a scope's prefix,
    /// as `StoreStats` counts it.
    fn scope_prefix(col: &str) -> String;

    /// Runs `sql` with `args` on `conn`: every row.
    fn fetch_all<'a>(
        conn: &'a mut <Self::Db as sqlx::Database>::Connection,
        sql: &'a Stmt,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<Vec<Self::Row>>> + Send + 'a;

    /// Runs `sql` with `args` on `conn`: its first row, if any.
    fn fetch<'a>(
        conn: &'a mut <Self::Db as sqlx::Database>::Connection,
        sql: &'a Stmt,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<Option<Self::Row>>> + Send + 'a;

    /// Runs the write `sql` with `args` on `conn`: how many rows it matched.
    fn execute<'a>(
        conn: &'a mut <Self::Db as sqlx::Database>::Connection,
        sql: &'a Stmt,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<u64>> + Send + 'a;

    /// Runs the fenced write `sql` (made by [`returning`](Self::returning) with
    /// [`FenceFrom::Arg`]) with `args` on `conn`: whether it matched its record.
    fn write_fenced<'a>(
        conn: &'a mut <Self::Db as sqlx::Database>::Connection,
        sql: &'a Stmt,
        args: &'a [Arg<'a>],
    ) -> impl Future<Output = Result<bool>> + Send + 'a {
        let row = Self::fetch(conn, sql, args);
        async move { Ok(row.await?.is_some()) }
    }
}

/// A step that brings a table created earlier up to date (a column or an index it lacks): the
/// statement, and, where it cannot say `IF NOT EXISTS`, a query whose `present` column is
/// non-zero when there is nothing to do.
pub(crate) struct AddColumn {
    pub(crate) probe: Option<Stmt>,
    pub(crate) alter: Stmt,
}

/// The names of the records table's indexes that a dialect may have to upgrade.
pub(crate) struct RecordIndexes {
    /// The index on `resume_at` the completer reads.
    pub(crate) resume: String,
    /// The index of unfinished work, on `work_fence`.
    pub(crate) work: String,
}

/// Columns added since the table was first created, with their definitions: tables created
/// earlier get them when the store migrates.
pub(super) const ADDED_COLUMNS: &[(&str, &str)] = &[
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
    stmt: &Stmt,
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
    let mut q = sqlx::query::<DB>(stmt.sql.clone());
    let order: Box<dyn Iterator<Item = usize>> = match &stmt.binds {
        Some(binds) => Box::new(binds.iter().copied()),
        None => Box::new(0..args.len()),
    };
    for i in order {
        // A statement that names an argument it was not given binds NULL, which no condition
        // matches; the statements are ours, and their tests bind every one.
        let Some(arg) = args.get(i) else {
            q = q.bind(None::<i32>);
            continue;
        };
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

/// A dialect's `fetch`, `fetch_all` and `execute` on its database: statements bound by
/// [`bound`], their errors sorted by [`map_err`]; for the databases whose writes return their
/// rows. With `execute:`, only `execute`, its errors sorted by `$sort`: for a dialect that
/// reads the rows of its writes its own way.
macro_rules! run_statements {
    ($db:ty, $conn:ty, $row:ty) => {
        fn fetch_all<'a>(
            conn: &'a mut $conn,
            sql: &'a sql::Stmt,
            args: &'a [Arg<'a>],
        ) -> impl Future<Output = Result<Vec<$row>>> + Send + 'a {
            let q = sql::bound::<$db>(sql, args);
            async move { q.fetch_all(&mut *conn).await.map_err(sql::map_err) }
        }

        fn fetch<'a>(
            conn: &'a mut $conn,
            sql: &'a sql::Stmt,
            args: &'a [Arg<'a>],
        ) -> impl Future<Output = Result<Option<$row>>> + Send + 'a {
            let q = sql::bound::<$db>(sql, args);
            async move { q.fetch_optional(&mut *conn).await.map_err(sql::map_err) }
        }

        $crate::store::sql::run_statements!(execute: $db, $conn, sql::map_err);
    };
    (execute: $db:ty, $conn:ty, $sort:path) => {
        fn execute<'a>(
            conn: &'a mut $conn,
            sql: &'a sql::Stmt,
            args: &'a [Arg<'a>],
        ) -> impl Future<Output = Result<u64>> + Send + 'a {
            let q = sql::bound::<$db>(sql, args);
            async move {
                q.execute(&mut *conn)
                    .await
                    .map(|done| done.rows_affected())
                    .map_err($sort)
            }
        }
    };
}
pub(crate) use run_statements;

pub(crate) fn fence_from_db(fence: i64) -> Result<u64> {
    u64::try_from(fence).map_err(|_| Error::Store(format!("negative fence {fence}").into()))
}

pub(crate) fn fence_to_db(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}

pub(crate) fn ms(d: Duration) -> i64 {
    crate::clock::duration_ms(d)
}
