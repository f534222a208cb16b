//! The database schema a crate's sqlx migrations leave, read with no database: the checker
//! behind idem's SQL macros, an ordinary library so that it is tested and documented as one.
//! It also holds [`Database`], the one value by which the runtime, the macros and this checker
//! name a SQL database; without its default feature `migrations` that is all it holds, so that
//! the runtime names it without building a SQL parser.
//!
//! [`load`] finds the migrations as `sqlx::migrate!()` does (the crate's `migrations/`, or
//! the `[migrate] migrations-dir` of its `sqlx.toml`, or an explicit directory or schema
//! file), replays their DDL in version order and returns a [`Catalog`] of the tables and
//! types they leave, or [`Migrations::None`] when there are none, in which case nothing is
//! checked.
//!
//! A check must never fail a correct program, so the catalog says how sure it is. A statement
//! that no SQL dialect can parse makes every table and type its text names uncertain
//! ([`Table::is_certain`], [`Column::is_certain`], [`TypeDef::is_certain`]); a CHECK that
//! cannot be read makes a column's [`AllowedValues`] `Unknown`, never empty. The macros turn
//! a problem with something uncertain into a warning.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! std::fs::create_dir(dir.path().join("migrations"))?;
//! std::fs::write(
//!     dir.path().join("migrations/20240101000000_orders.sql"),
//!     "CREATE TABLE orders (order_no TEXT NOT NULL, status TEXT CHECK (status IN ('PENDING', 'PAID')));",
//! )?;
//! let idem_schema::Migrations::Found(catalog) = idem_schema::load(dir.path(), None)? else {
//!     panic!("the migrations are found");
//! };
//! assert!(catalog.table("orders").found().is_some());
//! # Ok(()) }
//! ```

#![warn(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    rust_2018_idioms
)]
#![forbid(unsafe_code)]

mod database;

#[cfg(feature = "migrations")]
mod catalog;
#[cfg(feature = "migrations")]
mod check;
#[cfg(feature = "migrations")]
mod discover;
#[cfg(feature = "migrations")]
mod evidence;
#[cfg(feature = "migrations")]
mod lex;
#[cfg(feature = "migrations")]
mod load;
#[cfg(feature = "migrations")]
mod mysql;
#[cfg(feature = "migrations")]
mod replay;
#[cfg(feature = "migrations")]
mod suggest;
#[cfg(feature = "migrations")]
mod types;

#[cfg(feature = "migrations")]
pub use self::{
    catalog::{
        AllowedValues, Catalog, Column, DEFAULT_SCHEMA, Lookup, MigrationFile, MigrationKind,
        QualifiedName, Table, TypeDef, TypeKind, Unreadable, ValueSource,
    },
    load::{Migrations, SchemaError, load},
    suggest::nearest,
    types::TypeFamily,
};
pub use database::Database;

#[cfg(all(test, feature = "migrations"))]
mod tests;
