//! The SQL databases idem knows: one value that the runtime's stores, the SQL macros and the
//! schema checker all name.

/// A SQL database: what the stores keep their tables in, what the SQL macros generate
/// statements for, and what a schema's migrations are written for.
///
/// The runtime re-exports it as `idem::store::schema::Database`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Database {
    /// PostgreSQL.
    Postgres,
    /// SQLite.
    Sqlite,
    /// MySQL, or MariaDB.
    Mysql,
}

impl Database {
    /// Every database, in the order the tool lists them.
    pub const ALL: &'static [Database] = &[Database::Sqlite, Database::Postgres, Database::Mysql];

    /// Its name as people write it: `PostgreSQL`, `SQLite`, `MySQL`.
    pub fn title(self) -> &'static str {
        match self {
            Database::Postgres => "PostgreSQL",
            Database::Sqlite => "SQLite",
            Database::Mysql => "MySQL",
        }
    }

    /// The database's name: `postgres`, `sqlite` or `mysql`.
    pub fn as_str(self) -> &'static str {
        match self {
            Database::Postgres => "postgres",
            Database::Sqlite => "sqlite",
            Database::Mysql => "mysql",
        }
    }
}
