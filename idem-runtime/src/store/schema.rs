//! The DDL of the SQL stores' tables, as text a team that owns its migrations can copy.
//!
//! The SQL stores ([`SqliteStore`](crate::SqliteStore), [`PgStore`](crate::PgStore),
//! `MySqlStore`) create their records table, and the outboxes
//! ([`SqliteOutbox`](crate::outbox::SqliteOutbox), [`PgOutbox`](crate::outbox::PgOutbox),
//! `MySqlOutbox`) their outbox table, from exactly these statements, each with `IF NOT EXISTS`
//! (or `OR REPLACE`), so running them first changes nothing for the stores. The constants use
//! the default table names (`idem_records`, `idem_outbox`); [`records`] and [`outbox`] write
//! the same statements for another table name, which is how the stores use them. `idem schema
//! --store postgres|sqlite|mysql` prints them.
//!
//! A store built with `create_table(false)` (or an outbox never `migrate`d) expects the tables
//! to exist as written here. Tables created by earlier versions gain the columns added since
//! (`attempt`, `request`, `resume_at`, `note`, the `parked` state; the outbox's `failures`
//! and `parked_at`) when a store migrates. On PostgreSQL the records' states are a domain's
//! check (`<table>_state`), created first: a table of an earlier version, whose own check
//! listed them, is moved to the domain by the migration (which rewrites it once).
//!
//! Each records table names the format of its records, [`RECORDS_FORMAT`]: in the table's
//! comment on PostgreSQL and MySQL, in a comment of its definition on SQLite. A store refuses a
//! table that names a later format than its own; one that names none was created before formats
//! were named, and is format 1.
//!
//! ```
//! use idem::store::schema::{self, Database};
//!
//! let ddl = schema::records(Database::Postgres, "billing.idem_records")?;
//! assert!(ddl[0].contains("CREATE DOMAIN \"billing\".\"idem_records_state\" AS text"));
//! assert!(ddl[1].starts_with("CREATE TABLE IF NOT EXISTS \"billing\".\"idem_records\" ("));
//! assert_eq!(schema::records(Database::Sqlite, "idem_records")?, schema::SQLITE_RECORDS);
//! # Ok::<(), idem::Error>(())
//! ```

pub use crate::store::sql::ddl::{
    Database, MYSQL_OUTBOX, MYSQL_RECORDS, OUTBOX_TABLE, POSTGRES_OUTBOX, POSTGRES_OUTBOX_NOTIFY,
    POSTGRES_RECORDS, RECORDS_FORMAT, RECORDS_TABLE, SQLITE_OUTBOX, SQLITE_RECORDS, outbox,
    outbox_notify, records, script,
};
