//! Test support: isolated PostgreSQL schemas, SQLite files, Redis key prefixes, JetStream
//! streams, where the services are, and scenarios written once for several backends.

#![allow(dead_code)]

pub mod bank;
pub mod partitions;
pub mod proxy;
pub mod service;

use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

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

/// One `#[tokio::test]` per scenario for one backend: a scenario is written once as a generic
/// `async fn name<B>()` beside the module that invokes this, and each backend's module runs it
/// under the same name (`sqlite::name`, `postgres::name`).
///
/// Attributes before the backend go on every test, so a backend that needs a server is listed
/// as ignored where it is not configured, as the tests written for it alone were. A scenario
/// may name its runtime in parentheses, as `#[tokio::test(…)]` takes it.
///
/// ```ignore
/// mod postgres {
///     crate::backend_tests!(
///         #[cfg_attr(not(idem_postgres), ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…")]
///         idem::PgStore:
///         commits_together,
///         duplicates_insert_once(flavor = "multi_thread", worker_threads = 4),
///     );
/// }
/// ```
#[macro_export]
macro_rules! backend_tests {
    ($(#[$attr:meta])* $backend:ty: $($cases:tt)*) => {
        $crate::__backend_tests! { [$(#[$attr])*] $backend; $($cases)* }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __backend_tests {
    ([$($attr:tt)*] $backend:ty; $case:ident $(($($runtime:tt)*))? $(, $($rest:tt)*)?) => {
        #[tokio::test $(($($runtime)*))?]
        $($attr)*
        async fn $case() {
            super::$case::<$backend>().await
        }
        $crate::__backend_tests! { [$($attr)*] $backend; $($($rest)*)? }
    };
    ([$($attr:tt)*] $backend:ty;) => {};
}

/// One `#[tokio::test]` per SQL database for `scenario`, an `async fn scenario(url: &str)`
/// beside the invocation that runs against the database at `url`: `scenario::on_sqlite` (a file
/// of its own), `scenario::on_postgres` (a schema of its own) and `scenario::on_mysql` (a
/// database of its own), the last two listed as ignored where their server is not configured.
#[macro_export]
macro_rules! on_every_database {
    ($scenario:ident) => {
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_sqlite() {
                let file = $crate::common::SqliteFile::new();
                super::$scenario(&file.url).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[cfg_attr(
                not(idem_postgres),
                ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
            )]
            async fn on_postgres() {
                let schema = $crate::common::PgSchema::create(&$crate::common::pg_url(), 1).await;
                super::$scenario(&schema.scoped_url()).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[cfg_attr(
                not(idem_mysql),
                ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"
            )]
            async fn on_mysql() {
                let database =
                    $crate::common::MyDatabase::create(&$crate::common::mysql_url(), 1).await;
                super::$scenario(&database.url).await
            }
        }
    };
}

/// The one value the query `$sql` answers, with the `$arg`s bound, on the database at `$url`
/// (PostgreSQL, MySQL or MariaDB, else SQLite), through a pool of its own. `$sql` writes its
/// parameters `$1`, `$2`, … in the order they appear: MySQL is given `?` for each.
#[macro_export]
macro_rules! scalar_at {
    (@on $pool:ty, $url:expr, $sql:expr $(, $arg:expr)*) => {{
        let pool = <$pool>::connect($url).await.unwrap();
        let v = sqlx::query_scalar(sqlx::AssertSqlSafe($sql))
            $(.bind($arg))*
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        v
    }};
    ($url:expr, $sql:expr $(, $arg:expr)* $(,)?) => {{
        let (url, sql): (&str, &str) = (&$url, &$sql);
        if url.starts_with("postgres") {
            $crate::scalar_at!(@on sqlx::PgPool, url, sql.to_owned() $(, $arg)*)
        } else if url.starts_with("mysql") {
            $crate::scalar_at!(@on sqlx::MySqlPool, url, $crate::common::mysql_params(sql) $(, $arg)*)
        } else {
            $crate::scalar_at!(@on sqlx::SqlitePool, url, sql.to_owned() $(, $arg)*)
        }
    }};
}

/// `sql` with its parameters `$1`, `$2`, … written as MySQL writes them, `?` (bound in the
/// order they appear).
pub fn mysql_params(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

/// Waits until `done` holds, at most `limit`; whether it does.
pub async fn until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < end {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done()
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

    /// A connection URL whose sessions see only this schema (`search_path`), for a program
    /// that takes `DATABASE_URL`.
    pub fn scoped_url(&self) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}options=-c%20search_path%3D{}", self.url, self.name)
    }

    /// A new pool whose connections see only `schema` (through `search_path`).
    pub async fn pool_for(url: &str, schema: &str, max_connections: u32) -> PgPool {
        PgSchema::pool_with(url, schema, max_connections, &[]).await
    }

    /// A new pool of this schema's whose sessions also set each of `settings` (name, value),
    /// such as the planner's `enable_*`.
    pub async fn pool_with_settings(
        &self,
        max_connections: u32,
        settings: &[(&str, &str)],
    ) -> PgPool {
        PgSchema::pool_with(&self.url, &self.name, max_connections, settings).await
    }

    async fn pool_with(
        url: &str,
        schema: &str,
        max_connections: u32,
        settings: &[(&str, &str)],
    ) -> PgPool {
        let options = PgConnectOptions::from_str(url)
            .expect("DATABASE_URL")
            .options([("search_path", schema)])
            .options(settings.iter().copied());
        PgPoolOptions::new()
            .max_connections(max_connections)
            .connect_with(options)
            .await
            .expect("connect to PostgreSQL")
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        in_a_thread_of_its_own(async move {
            if let Ok(pool) = PgPool::connect(&url).await {
                let drop = format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE");
                let _ = sqlx::query(sqlx::AssertSqlSafe(drop)).execute(&pool).await;
                pool.close().await;
            }
        });
    }
}

/// Runs `cleanup` to its end on a runtime of its own, in a thread of its own: `Drop` cannot
/// await, and may run inside the test's runtime.
pub fn in_a_thread_of_its_own(cleanup: impl Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(cleanup)
    })
    .join();
}

/// The MySQL (or MariaDB) URL for tests: `IDEM_MYSQL_URL`.
///
/// Tests that call this carry `#[cfg_attr(not(idem_mysql), ignore = "…")]`: `build.rs` sets
/// `idem_mysql` when the variable is set, so without it they are listed as ignored.
pub fn mysql_url() -> String {
    match std::env::var("IDEM_MYSQL_URL") {
        Ok(url) if url.starts_with("mysql://") || url.starts_with("mariadb://") => {
            url.replacen("mariadb://", "mysql://", 1)
        }
        _ => panic!("this test needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://…"),
    }
}

/// A MySQL database of its own for one test: created on `create`, dropped (with everything in
/// it) when dropped, even when the test panics.
pub struct MyDatabase {
    pub name: String,
    /// A URL whose connections use this database.
    pub url: String,
    admin_url: String,
    pub pool: sqlx::MySqlPool,
}

impl MyDatabase {
    pub async fn create(url: &str, max_connections: u32) -> MyDatabase {
        let name = unique("idem_test");
        let admin = sqlx::MySqlPool::connect(url)
            .await
            .expect("connect to MySQL");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&admin)
            .await
            .expect("create test database");
        admin.close().await;
        // The URL's path is its database: this one instead.
        let (base, query) = url
            .split_once('?')
            .map_or((url, None), |(b, q)| (b, Some(q)));
        let server = match base.strip_prefix("mysql://") {
            Some(rest) => match rest.split_once('/') {
                Some((server, _)) => format!("mysql://{server}"),
                None => base.to_owned(),
            },
            None => base.to_owned(),
        };
        let url_here = match query {
            Some(q) => format!("{server}/{name}?{q}"),
            None => format!("{server}/{name}"),
        };
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(max_connections)
            .connect(&url_here)
            .await
            .expect("connect to MySQL");
        MyDatabase {
            name,
            url: url_here,
            admin_url: url.to_owned(),
            pool,
        }
    }
}

impl MyDatabase {
    /// A `MySqlStore` on this database's pool, its table created.
    pub async fn store(&self) -> idem::MySqlStore {
        idem::MySqlStore::builder()
            .build(self.pool.clone())
            .await
            .expect("create the table")
    }
}

impl Drop for MyDatabase {
    fn drop(&mut self) {
        let (url, name) = (self.admin_url.clone(), self.name.clone());
        in_a_thread_of_its_own(async move {
            if let Ok(pool) = sqlx::MySqlPool::connect(&url).await {
                let drop = format!("DROP DATABASE IF EXISTS `{name}`");
                let _ = sqlx::query(sqlx::AssertSqlSafe(drop)).execute(&pool).await;
                pool.close().await;
            }
        });
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

/// The standalone Redis (or Valkey) URL for tests: `IDEM_REDIS_URL`.
///
/// Tests that call this carry `#[cfg_attr(not(idem_redis), ignore = "…")]`: `build.rs` sets
/// `idem_redis` when the variable is set, so without it they are listed as ignored.
pub fn redis_url() -> String {
    match std::env::var("IDEM_REDIS_URL") {
        Ok(url) if url.starts_with("redis") || url.starts_with("valkey") => url,
        _ => panic!("this test needs Redis: set IDEM_REDIS_URL=redis://…"),
    }
}

/// A store on the standalone Redis of [`redis_url`], under a key prefix of the test's own, and
/// the prefix, whose keys go when it is dropped: keep it for as long as the store.
pub async fn redis_store() -> (RedisKeys, idem::RedisStore) {
    redis_store_with(|builder| builder).await
}

/// [`redis_store`] with the builder's other options set by `options` (the prefix is set here).
pub async fn redis_store_with(
    options: impl FnOnce(idem::RedisStoreBuilder) -> idem::RedisStoreBuilder,
) -> (RedisKeys, idem::RedisStore) {
    let url = redis_url();
    let keys = RedisKeys::new(std::slice::from_ref(&url));
    let store = options(idem::RedisStore::builder())
        .prefix(keys.prefix.clone())
        .connect(&url)
        .await
        .expect("connect to Redis");
    (keys, store)
}

/// The nodes of a Redis (or Valkey) Cluster for tests: `IDEM_REDIS_CLUSTER`, comma-separated
/// URLs. Tests that call this carry `#[cfg_attr(not(idem_redis_cluster), ignore = "…")]`.
pub fn redis_cluster() -> Vec<String> {
    let nodes: Vec<String> = std::env::var("IDEM_REDIS_CLUSTER")
        .unwrap_or_default()
        .split(',')
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    assert!(
        !nodes.is_empty(),
        "this test needs a Redis Cluster: set IDEM_REDIS_CLUSTER=redis://host:port,…"
    );
    nodes
}

/// A key prefix of its own for one test on a shared Redis server or cluster; every key under it
/// is deleted on drop, even when the test panics.
pub struct RedisKeys {
    pub prefix: String,
    /// The standalone server, or every primary of the cluster.
    nodes: Vec<String>,
}

impl RedisKeys {
    pub fn new(nodes: &[String]) -> RedisKeys {
        RedisKeys {
            prefix: format!("{}:", unique("idem-test")),
            nodes: nodes.to_vec(),
        }
    }

    /// How many keys exist under the prefix, on every node.
    pub async fn count(&self) -> usize {
        let mut n = 0;
        for node in &self.nodes {
            n += scan(node, &self.prefix).await.len();
        }
        n
    }
}

/// Every key under `prefix` on one node (a cluster node answers for its own slots).
async fn scan(node: &str, prefix: &str) -> Vec<Vec<u8>> {
    let Ok(client) = redis::Client::open(node) else {
        return Vec::new();
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let Ok((next, batch)): redis::RedisResult<(u64, Vec<Vec<u8>>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
        else {
            break;
        };
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys
}

impl Drop for RedisKeys {
    fn drop(&mut self) {
        let nodes = self.nodes.clone();
        let prefix = self.prefix.clone();
        in_a_thread_of_its_own(async move {
            for node in &nodes {
                let keys = scan(node, &prefix).await;
                let Ok(client) = redis::Client::open(node.as_str()) else {
                    continue;
                };
                let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
                    continue;
                };
                for key in keys {
                    let _: redis::RedisResult<i64> =
                        redis::cmd("DEL").arg(key).query_async(&mut conn).await;
                }
            }
        });
    }
}

/// The `redis-server` binary, for tests that run private servers (restarts, configurations the
/// shared server must not get). Tests that call this carry
/// `#[cfg_attr(not(idem_redis_server), ignore = "…")]`: `build.rs` sets it when the binary runs.
pub fn redis_server() -> &'static str {
    "redis-server"
}

/// The NATS URL for tests: `NATS_URL` (`#[cfg_attr(not(idem_nats), ignore = "…")]` otherwise).
pub fn nats_url() -> String {
    match std::env::var("NATS_URL") {
        Ok(url) if url.starts_with("nats://") => url,
        _ => panic!(
            "this test needs NATS with JetStream: set NATS_URL=nats://… (it is ignored when NATS_URL is unset at build time)"
        ),
    }
}

/// The RabbitMQ URL for tests: `AMQP_URL` (`#[cfg_attr(not(idem_amqp), ignore = "…")]`
/// otherwise).
pub fn amqp_url() -> String {
    match std::env::var("AMQP_URL") {
        Ok(url) if url.starts_with("amqp://") => url,
        _ => panic!(
            "this test needs RabbitMQ: set AMQP_URL=amqp://… (it is ignored when AMQP_URL is unset at build time)"
        ),
    }
}

/// JetStream streams of one test, named with a unique prefix, deleted (with their consumers)
/// when dropped, even when the test panics.
pub struct JsStreams {
    pub url: String,
    pub prefix: String,
    pub js: async_nats::jetstream::Context,
    names: std::sync::Mutex<Vec<String>>,
}

impl JsStreams {
    pub async fn new(url: &str) -> JsStreams {
        let client = async_nats::connect(url).await.expect("connect to NATS");
        JsStreams {
            url: url.to_owned(),
            prefix: unique("T").replace('_', "-"),
            js: async_nats::jetstream::new(client),
            names: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// A stream of this test capturing `<prefix>.<suffix>.>`, keeping messages an hour (less
    /// than consumers keep their records); returns its name and subject root.
    pub async fn stream(
        &self,
        suffix: &str,
        duplicate_window: Duration,
    ) -> (async_nats::jetstream::stream::Stream, String) {
        self.stream_with(
            suffix,
            async_nats::jetstream::stream::Config {
                duplicate_window,
                max_age: Duration::from_secs(3600),
                ..Default::default()
            },
        )
        .await
    }

    /// [`JsStreams::stream`] with the rest of its configuration from `config`.
    pub async fn stream_with(
        &self,
        suffix: &str,
        config: async_nats::jetstream::stream::Config,
    ) -> (async_nats::jetstream::stream::Stream, String) {
        let name = self.stream_name(suffix);
        let root = format!("{}.{suffix}", self.prefix);
        let stream = self
            .js
            .create_stream(async_nats::jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![format!("{root}.>")],
                ..config
            })
            .await
            .expect("create a stream");
        self.names.lock().unwrap().push(name);
        (stream, root)
    }

    /// The name of the stream [`JsStreams::stream`] makes for `suffix`.
    pub fn stream_name(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.prefix).replace(['.', '-'], "_")
    }
}

impl Drop for JsStreams {
    fn drop(&mut self) {
        let url = self.url.clone();
        let names = std::mem::take(&mut *self.names.lock().unwrap());
        in_a_thread_of_its_own(async move {
            if let Ok(client) = async_nats::connect(&url).await {
                let js = async_nats::jetstream::new(client);
                for name in names {
                    let _ = js.delete_stream(&name).await;
                }
            }
        });
    }
}

/// `sha256=<hex>`: the HMAC-SHA256 of `body` under `secret`, as the refund service's payment
/// gateway signs its callbacks (`X-Gateway-Signature`).
pub fn gateway_signature(secret: &[u8], body: &str) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(body.as_bytes());
    let tag = mac.finalize().into_bytes();
    format!(
        "sha256={}",
        tag.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// The binary of the example `name` of the `idem-examples` package. `cargo test --workspace`
/// builds it; when it is missing, or older than a source it is built from (a run of this
/// package's tests alone after an edit), cargo builds it here, so a test never starts an example
/// built from older sources.
pub fn example_binary(name: &str) -> std::path::PathBuf {
    static CHECKED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let mut checked = CHECKED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !checked.iter().any(|b| b == name) {
        let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let sources = [
            "examples",
            "src",
            "idem-runtime/src",
            "idem-macros/src",
            "idem-schema/src",
        ]
        .iter()
        .filter_map(|d| newest(&root.join(d)))
        .max();
        if built.is_none() || sources > built {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args(["build", "-q", "-p", "idem-examples", "--example", name])
                .status()
                .unwrap();
            assert!(status.success(), "could not build the example {name}");
        }
        checked.push(name.to_owned());
    }
    bin
}

/// The latest modification time of a file under `path`.
fn newest(path: &std::path::Path) -> Option<std::time::SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_file() {
        return meta.modified().ok();
    }
    std::fs::read_dir(path)
        .ok()?
        .filter_map(|e| newest(&e.ok()?.path()))
        .max()
}
