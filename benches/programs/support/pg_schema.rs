//! A PostgreSQL schema of a benchmark run's own: created when the run starts, its tables reached
//! through `search_path`, dropped with everything in it when the run ends. Runs side by side never
//! see each other's tables.

use sqlx::postgres::{PgConnectOptions, PgPool};

/// A schema named `<prefix>_<process id>`, and the connection that created it.
pub struct RunSchema {
    admin: PgPool,
    /// The schema's name.
    pub name: String,
}

impl RunSchema {
    /// Creates the schema on the database at `url`.
    pub async fn create(url: &str, prefix: &str) -> Result<Self, sqlx::Error> {
        let name = format!("{prefix}_{}", std::process::id());
        let admin = PgPool::connect(url).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
            .execute(&admin)
            .await?;
        Ok(RunSchema { admin, name })
    }

    /// Options for connections to `url` whose unqualified tables are this schema's.
    pub fn connect_options(&self, url: &str) -> Result<PgConnectOptions, sqlx::Error> {
        let options: PgConnectOptions = url.parse()?;
        Ok(options.options([("search_path", self.name.as_str())]))
    }

    /// Drops the schema and everything in it.
    pub async fn drop(self) -> Result<(), sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA {} CASCADE",
            self.name
        )))
        .execute(&self.admin)
        .await?;
        Ok(())
    }
}
