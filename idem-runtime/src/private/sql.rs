//! The shims of the SQL macros (`#[state_transition]`, `#[versioned_update]`, `#[create_once]`)
//! that need a SQL driver: the executor, bound values, rows, the connection's database. Built
//! with a SQL store's feature (`sqlite`, `postgres`, `mysql`).

use std::marker::PhantomData;

use super::{Holds, Impossible, Never};
use crate::error::Error;

/// A driver error, sorted into "retry later" and "broken"; see [`crate::Error`].
pub fn sql_error(e: sqlx::Error) -> Error {
    crate::store::sql::map_err(e)
}

/// The first argument of a generated statement function.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an executor",
    label = "the first argument runs the statements",
    note = "take a `&PgPool`, a `&mut PgConnection`, a `&mut Transaction<'_, Postgres>` or an `impl sqlx::Acquire<'_, Database = Postgres>` (or their SQLite or MySQL counterparts) as the first argument"
)]
pub trait Executor<'c, M> {
    type Database: sqlx::Database;
    type Checked;
    fn checked(self) -> Self::Checked;
}

#[diagnostic::do_not_recommend]
impl<'c, A: sqlx::Acquire<'c>> Executor<'c, Holds> for A {
    type Database = A::Database;
    type Checked = A;
    fn checked(self) -> A {
        self
    }
}

/// Implemented by no type, as [`Impossible`]: where the second implementation of [`Executor`]
/// takes the database it must name.
pub trait ImpossibleExecutor: Impossible {
    type Database: sqlx::Database;
}

#[diagnostic::do_not_recommend]
impl<'c, A: ImpossibleExecutor> Executor<'c, Never> for A {
    type Database = <A as ImpossibleExecutor>::Database;
    type Checked = A;
    fn checked(self) -> A {
        self
    }
}

/// The executor, and its database: what every later check is against. When the argument is not
/// an executor, both are error types and nothing downstream reports the same mistake again.
pub fn executor<'c, A: Executor<'c, M>, M>(a: A) -> (A::Checked, PhantomData<A::Database>) {
    (a.checked(), PhantomData)
}

/// A column argument: its value is bound as a statement parameter.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be sent to {DB} as a column value",
    label = "this argument is bound as a statement parameter",
    note = "sqlx binds integers as `i16`, `i32` or `i64` (PostgreSQL has no unsigned integers), text as `&str` or `String`, and any type that implements `sqlx::Type` and `sqlx::Encode` for the database"
)]
pub trait Bind<'q, DB, M> {
    type Value;
    fn checked(self) -> Self::Value;
}

#[diagnostic::do_not_recommend]
impl<'q, DB: sqlx::Database, T> Bind<'q, DB, Holds> for T
where
    T: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    type Value = T;
    fn checked(self) -> T {
        self
    }
}

#[diagnostic::do_not_recommend]
impl<DB, T: Impossible> Bind<'_, DB, Never> for T {
    type Value = T;
    fn checked(self) -> T {
        self
    }
}

pub fn bind<'q, DB, T: Bind<'q, DB, M>, M>(_db: &PhantomData<DB>, value: T) -> T::Value {
    value.checked()
}

/// The `returning` type of a generated statement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be read from a row",
    label = "`returning` names the type each returned row is read into",
    note = "derive `sqlx::FromRow` for it: its fields are read from the columns of the same names"
)]
pub trait RowOf<DB: sqlx::Database, M>: Sized {
    fn decode(row: &DB::Row) -> Result<Self, sqlx::Error>;
}

#[diagnostic::do_not_recommend]
impl<DB: sqlx::Database, R> RowOf<DB, Holds> for R
where
    R: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    fn decode(row: &DB::Row) -> Result<Self, sqlx::Error> {
        R::from_row(row)
    }
}

#[diagnostic::do_not_recommend]
impl<DB: sqlx::Database, R: Impossible> RowOf<DB, Never> for R {
    #[allow(unreachable_code)]
    fn decode(_row: &DB::Row) -> Result<Self, sqlx::Error> {
        match R::never() {}
    }
}

/// The row type, checked, with the function that reads it: the statements after the check
/// need no bound of their own, so a type that fails it is reported once.
pub struct Rows<DB: sqlx::Database, R> {
    decode: fn(&DB::Row) -> Result<R, sqlx::Error>,
}

impl<DB: sqlx::Database, R> std::fmt::Debug for Rows<DB, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Rows")
    }
}

/// The row type `R` (from `row`), checked against the executor's database.
pub fn rows<R: RowOf<DB, M>, DB: sqlx::Database, M>(
    _db: &PhantomData<DB>,
    _row: PhantomData<R>,
) -> Rows<DB, R> {
    Rows { decode: R::decode }
}

/// A row read into the checked row type.
pub fn decode<DB: sqlx::Database, R>(rows: &Rows<DB, R>, row: &DB::Row) -> Result<R, Error> {
    (rows.decode)(row).map_err(sql_error)
}

/// The connection the generated statements run on: a pool's, or the caller's own.
#[allow(clippy::type_complexity)]
pub fn transition_acquire<'c, A: sqlx::Acquire<'c>>(
    executor: A,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<A::Connection, sqlx::Error>> + Send + 'c>,
> {
    executor.acquire()
}

pub use crate::store::schema::Database;

/// Which database a connection speaks (not `store`'s `Dialect`, which writes the stores' SQL).
#[diagnostic::on_unimplemented(
    message = "idem's generated SQL runs on PostgreSQL, SQLite and MySQL, not on `{Self}`",
    label = "the executor must be a PostgreSQL, SQLite or MySQL pool, connection or transaction"
)]
pub trait Backend {
    const DATABASE: Database;
}

#[cfg(feature = "postgres")]
impl Backend for sqlx::PgConnection {
    const DATABASE: Database = Database::Postgres;
}

#[cfg(feature = "sqlite")]
impl Backend for sqlx::SqliteConnection {
    const DATABASE: Database = Database::Sqlite;
}

#[cfg(feature = "mysql")]
impl Backend for sqlx::MySqlConnection {
    const DATABASE: Database = Database::Mysql;
}

/// The database `conn` speaks: which of the generated statements run on it.
pub fn database<C: Backend + ?Sized>(_conn: &C) -> Database {
    C::DATABASE
}

/// A flag the generated `SELECT` computes (`guards match`, `owner matches`): a boolean where
/// the database has them, an integer on MySQL, which has none.
pub fn flag<R: sqlx::Row>(row: &R, column: &str) -> Result<bool, Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'r> bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    match row.try_get::<bool, _>(column) {
        Ok(flag) => Ok(flag),
        Err(_) => row
            .try_get::<i64, _>(column)
            .map(|v| v != 0)
            .map_err(sql_error),
    }
}

/// Whether `e` says a unique index already holds the value (MySQL's duplicate key).
pub fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}
