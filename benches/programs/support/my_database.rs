//! A MySQL database of a benchmark run's own, on the server a URL names: created when the run
//! starts, dropped with everything in it when the run ends. Runs side by side never see each
//! other's tables.

/// A database named `<prefix>_<process id>` on one server.
pub struct RunDatabase {
    /// The server's URL, without a database.
    server: String,
    /// The database's name.
    pub name: String,
}

impl RunDatabase {
    /// Creates the database on the server `url` names (any database in `url` is ignored).
    pub async fn create(url: &str, prefix: &str) -> Result<Self, sqlx::Error> {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let server = format!("mysql://{}", rest.split('/').next().unwrap_or(rest));
        let name = format!("{prefix}_{}", std::process::id());
        let admin = sqlx::MySqlPool::connect(&server).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&admin)
            .await?;
        admin.close().await;
        Ok(RunDatabase { server, name })
    }

    /// A URL whose connections use this database.
    pub fn url(&self) -> String {
        format!("{}/{}", self.server, self.name)
    }

    /// Drops the database and everything in it.
    pub async fn drop(self) -> Result<(), sqlx::Error> {
        let admin = sqlx::MySqlPool::connect(&self.server).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE `{}`",
            self.name
        )))
        .execute(&admin)
        .await?;
        admin.close().await;
        Ok(())
    }
}
