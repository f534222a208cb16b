//! Which store a command works on: its URL, from `--store`, else `IDEM_STORE_URL`, else
//! `DATABASE_URL`, and the store opened from it.

use idem::{MySqlStore, PgStore, RedisStore, SharedStore, SqliteStore};

use crate::Failure;

/// Where the store is, for every command that works on one.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StoreArgs {
    /// The store's URL: sqlite://FILE, postgres://…, mysql://…, redis://… (several, comma-separated, for a
    /// Redis Cluster). Default: IDEM_STORE_URL, else DATABASE_URL.
    #[arg(long, value_name = "URL")]
    pub(crate) store: Option<String>,
    /// The records table of a SQL store (`schema.table` on PostgreSQL, `database.table` on
    /// MySQL).
    #[arg(long, value_name = "NAME", default_value = idem::store::schema::RECORDS_TABLE)]
    pub(crate) table: String,
    /// The key prefix of a Redis store.
    #[arg(
        long = "redis-prefix",
        value_name = "PREFIX",
        env = "IDEM_STORE_PREFIX",
        default_value = idem::store::redis::DEFAULT_PREFIX
    )]
    pub(crate) redis_prefix: String,
}

/// The kinds of store a URL can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sqlite,
    Postgres,
    Mysql,
    Redis,
    RedisCluster,
}

/// The store's URL: `flag`, else `IDEM_STORE_URL`, else `DATABASE_URL` (empty values count as
/// unset).
pub(crate) fn resolve(flag: Option<&str>) -> Result<String, Failure> {
    let env = |name: &str| std::env::var(name).ok();
    [
        flag.map(str::to_owned),
        env("IDEM_STORE_URL"),
        env("DATABASE_URL"),
    ]
    .into_iter()
    .flatten()
    .map(|url| url.trim().to_owned())
    .find(|url| !url.is_empty())
    .ok_or_else(|| {
        Failure::Usage(
            "no store: pass --store URL, or set IDEM_STORE_URL or DATABASE_URL \
                 (sqlite://FILE, postgres://…, mysql://…, redis://…)"
                .into(),
        )
    })
}

/// The kind of store `url` names.
pub(crate) fn kind(url: &str) -> Result<Kind, Failure> {
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    match scheme.to_ascii_lowercase().as_str() {
        "sqlite" => Ok(Kind::Sqlite),
        "postgres" | "postgresql" => Ok(Kind::Postgres),
        "mysql" | "mariadb" => Ok(Kind::Mysql),
        "redis" | "rediss" | "valkey" | "valkeys" if url.contains(',') => Ok(Kind::RedisCluster),
        "redis" | "rediss" | "valkey" | "valkeys" => Ok(Kind::Redis),
        _ => Err(Failure::Usage(format!(
            "{} is not the URL of a store idem knows: use sqlite://FILE, postgres://…, \
             mysql://…, redis://… (or several, comma-separated, for a Redis Cluster)",
            redact(url)
        ))),
    }
}

/// `url` with any password replaced by `***`, for messages.
pub(crate) fn redact(url: &str) -> String {
    url.split(',')
        .map(|one| {
            let Some((scheme, rest)) = one.split_once("://") else {
                return one.to_owned();
            };
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            match authority.rsplit_once('@') {
                Some((user, host)) if user.contains(':') => {
                    let name = user.split(':').next().unwrap_or("");
                    format!("{scheme}://{name}:***@{host}{path}")
                }
                _ => one.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The store `args` name, opened to be looked at and maintained: a SQL store's table is never
/// created and nothing is purged in the background.
pub(crate) async fn open(args: &StoreArgs) -> Result<(SharedStore, String), Failure> {
    let url = resolve(args.store.as_deref())?;
    let shown = redact(&url);
    let store = match kind(&url)? {
        Kind::Sqlite => {
            let options = SqliteStore::connect_options(&url)?.create_if_missing(false);
            let pool = idem::sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await
                .map_err(|e| Failure::Failed(format!("could not open {shown}: {e}")))?;
            SharedStore::new(
                SqliteStore::builder()
                    .table(&args.table)
                    .create_table(false)
                    .background_purge(false)
                    .build(pool)
                    .await?,
            )
        }
        Kind::Postgres => SharedStore::new(
            PgStore::builder()
                .table(&args.table)
                .create_table(false)
                .background_purge(false)
                .connect(&url)
                .await?,
        ),
        Kind::Mysql => SharedStore::new(
            MySqlStore::builder()
                .table(&args.table)
                .create_table(false)
                .background_purge(false)
                .connect(&url.replacen("mariadb://", "mysql://", 1))
                .await?,
        ),
        // Looking at records and purging are safe on a server that may evict keys: the
        // refusal is for services that rely on their records staying.
        Kind::Redis => SharedStore::new(
            RedisStore::builder()
                .prefix(&args.redis_prefix)
                .allow_eviction(true)
                .connect(&url)
                .await?,
        ),
        Kind::RedisCluster => SharedStore::new(
            RedisStore::builder()
                .prefix(&args.redis_prefix)
                .allow_eviction(true)
                .connect_cluster(url.split(',').map(str::trim))
                .await?,
        ),
    };
    Ok((store, shown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        assert_eq!(kind("sqlite://a.db").unwrap(), Kind::Sqlite);
        assert_eq!(kind("postgresql://h/db").unwrap(), Kind::Postgres);
        assert_eq!(kind("mysql://root@h/db").unwrap(), Kind::Mysql);
        assert_eq!(kind("mariadb://root@h/db").unwrap(), Kind::Mysql);
        assert_eq!(kind("redis://h:6379").unwrap(), Kind::Redis);
        assert_eq!(kind("redis://a,redis://b").unwrap(), Kind::RedisCluster);
        assert!(matches!(kind("mongodb://h/db"), Err(Failure::Usage(_))));
        assert!(matches!(kind("idem.db"), Err(Failure::Usage(_))));
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(
            redact("redis://:pw@a,redis://b"),
            "redis://:***@a,redis://b"
        );
        assert_eq!(redact("postgres://app@db/x"), "postgres://app@db/x");
    }
}
