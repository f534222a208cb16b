//! Test support: isolated PostgreSQL schemas, SQLite files, and where PostgreSQL is.

#![allow(dead_code)]

use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// The PostgreSQL URL for tests: `DATABASE_URL`.
///
/// Tests that call this carry `#[cfg_attr(not(idem_postgres), ignore = "…")]`: `build.rs` sets
/// `idem_postgres` when `DATABASE_URL` points at PostgreSQL, so without it they are listed as
/// ignored and never get here (unless asked to with `--ignored`).
pub fn pg_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => url,
        _ => panic!(
            "this test needs PostgreSQL: set DATABASE_URL=postgres://… (it is ignored when DATABASE_URL is unset at build time)"
        ),
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A unique name for this process and call.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A PostgreSQL schema of its own for one test: created on `create`, dropped (with everything
/// in it) when dropped, even when the test panics.
pub struct PgSchema {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
}

impl PgSchema {
    pub async fn create(url: &str, max_connections: u32) -> PgSchema {
        let name = unique("idem_test");
        let admin = PgPool::connect(url).await.expect("connect to PostgreSQL");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{name}\"")))
            .execute(&admin)
            .await
            .expect("create test schema");
        admin.close().await;
        let pool = PgSchema::pool_for(url, &name, max_connections).await;
        PgSchema {
            name,
            url: url.to_owned(),
            pool,
        }
    }

    /// A new pool whose connections see only `schema` (through `search_path`).
    pub async fn pool_for(url: &str, schema: &str, max_connections: u32) -> PgPool {
        let options = PgConnectOptions::from_str(url)
            .expect("DATABASE_URL")
            .options([("search_path", schema)]);
        PgPoolOptions::new()
            .max_connections(max_connections)
            .connect_with(options)
            .await
            .expect("connect to PostgreSQL")
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let url = self.url.clone();
        let name = self.name.clone();
        // Drop cannot await, and may run inside a runtime: clean up from a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(pool) = PgPool::connect(&url).await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP SCHEMA IF EXISTS \"{name}\" CASCADE"
                    )))
                    .execute(&pool)
                    .await;
                    pool.close().await;
                }
            });
        })
        .join();
    }
}

/// A SQLite database file in a temporary directory, removed on drop.
pub struct SqliteFile {
    pub dir: tempfile::TempDir,
    pub url: String,
}

impl SqliteFile {
    pub fn new() -> SqliteFile {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("idem.db").display());
        SqliteFile { dir, url }
    }
}
