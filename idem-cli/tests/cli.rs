//! The `idem` binary, run as an operator runs it, against stores made by the library: a SQLite
//! file in a temporary directory, PostgreSQL when `DATABASE_URL` points at one, and Redis when
//! `IDEM_REDIS_URL` does (each test under a key prefix of its own).

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use idem::store::schema::{OUTBOX_TABLE, RECORDS_TABLE};
use idem::{Begun, Error, Fingerprint, Key, Policy, SqliteStore, Store, StoredResponse};

/// `idem args…`, with no store in its environment but what the test gives it.
fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_STORE_URL")
        .env_remove("DATABASE_URL")
        .env_remove("IDEM_STORE_PREFIX")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("the idem binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", stdout(o), stderr(o)))
}

/// `idem_cli_<tag>_<process>_<nanoseconds>`: a name no other run on this server takes.
#[cfg(any(idem_postgres, idem_mysql))]
fn unique_name(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("idem_cli_{tag}_{}_{nanos}", std::process::id())
}

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("records.db").display())
}

/// Claims `(scope, key)` in `store`.
async fn claimed<'s, S: Store>(store: &'s S, scope: &str, key: &str) -> idem::Guard<'s, S> {
    let fp = Fingerprint::of(&(scope, key)).unwrap();
    let begun = idem::begin(
        store,
        scope.into(),
        Key::parse(key).unwrap(),
        fp,
        Policy::DEFAULT,
    )
    .await
    .unwrap();
    let Begun::Claimed(guard) = begun else {
        panic!("{scope}/{key} was claimed before")
    };
    guard
}

/// Claims `(scope, key)` in `store` and completes it with `status` and `body`.
async fn completed<S: Store>(store: &S, scope: &str, key: &str, status: u16, body: &[u8]) {
    claimed(store, scope, key)
        .await
        .complete(&StoredResponse {
            status: Some(status),
            is_error: false,
            body: body.to_vec().into(),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn records_show_prints_a_completed_record_for_people_and_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let store = SqliteStore::connect(&url).await.unwrap();
    completed(&store, "refund:A1", "k-1", 201, br#"{"refundNo":"R-1"}"#).await;

    let out = idem(&["records", "show", "refund:A1", "k-1", "--store", &url]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for line in [
        "scope        refund:A1",
        "state        completed",
        "status       201",
        "stored as    a success",
        "body         18 bytes",
        r#"{"refundNo":"R-1"}"#,
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }

    let out = idem(&[
        "records",
        "show",
        "refund:A1",
        "k-1",
        "--json",
        "--store",
        &url,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["state"], "completed");
    assert_eq!(v["key"], "k-1");
    assert!(v["fence"].as_u64().is_some_and(|f| f > 0), "{v}");
    assert_eq!(
        v["fingerprint"],
        Fingerprint::of(&("refund:A1", "k-1")).unwrap().to_string()
    );
    assert_eq!(v["response"]["status"], 201);
    assert_eq!(v["response"]["body"], r#"{"refundNo":"R-1"}"#);
    assert_eq!(v["response"]["body_truncated"], false);
}

#[tokio::test]
async fn records_show_truncates_long_bodies_unless_asked_and_finds_in_progress_claims() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let store = SqliteStore::connect(&url).await.unwrap();
    let long = "x".repeat(2000);
    completed(&store, "order:u1", "long", 200, long.as_bytes()).await;

    let v = json(&idem(&[
        "records", "show", "order:u1", "long", "--json", "--store", &url,
    ]));
    assert_eq!(v["response"]["body_truncated"], true);
    assert_eq!(v["response"]["body"].as_str().map(str::len), Some(512));
    assert_eq!(v["response"]["body_bytes"], 2000);
    let v = json(&idem(&[
        "records", "show", "order:u1", "long", "--json", "--full", "--store", &url,
    ]));
    assert_eq!(v["response"]["body"].as_str(), Some(long.as_str()));

    // A claim still running: in progress, with its lease.
    let fp = Fingerprint::of(&"running").unwrap();
    let begun = idem::begin(
        &store,
        "order:u1".into(),
        Key::parse("running").unwrap(),
        fp,
        Policy::DEFAULT.lease(Duration::from_secs(300)),
    )
    .await
    .unwrap();
    let out = idem(&[
        "records", "show", "order:u1", "running", "--json", "--store", &url,
    ]);
    let v = json(&out);
    assert_eq!(v["state"], "in_progress");
    let lease = v["lease_remaining_ms"].as_u64().unwrap();
    assert!(lease > 200_000 && lease <= 300_000, "{v}");
    assert!(v["response"].is_null(), "{v}");
    drop(begun);
}

/// Bytes a terminal would act on: control characters (a line break aside, where asked) and
/// the overrides that reorder a line.
fn terminal_controls(text: &str, lines: bool) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            (c.is_control() && !(lines && c == '\n'))
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

/// A stored body, a scope and a recovery point that carry escape sequences (clear the screen,
/// colour, set the window's title), a carriage return, a NUL, a bidirectional override, and
/// bytes that are not UTF-8: what people read shows them escaped, `--json` stays JSON that
/// gives them back exactly.
#[tokio::test]
async fn stored_bytes_never_reach_the_terminal_raw() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let store = SqliteStore::connect(&url).await.unwrap();
    let scope = "refund:\u{1b}]0;owned\u{7}A1";
    let body = "{\"note\":\"ok\u{1b}[2J\u{1b}[31mred\rover\0nul \u{202e}evil\"}\nsecond line";
    completed(&store, scope, "k-text", 200, body.as_bytes()).await;
    let binary: &[u8] = b"\x1b[31m\xff\xfe\x00";
    completed(&store, scope, "k-binary", 200, binary).await;
    let begun = idem::begin(
        &store,
        scope.into(),
        Key::parse("k-running").unwrap(),
        Fingerprint::of(&"running").unwrap(),
        Policy::DEFAULT,
    )
    .await
    .unwrap();
    let Begun::Claimed(mut running) = begun else {
        panic!("claimed before")
    };
    running.checkpoint(b"step\x1b[2K\r1").await.unwrap();

    let out = idem(&["records", "show", scope, "k-text", "--store", &url]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(
        terminal_controls(&text, true),
        Vec::<char>::new(),
        "{text:?}"
    );
    for shown in [
        r"refund:\x1b]0;owned\x07A1",
        r#"{"note":"ok\x1b[2J\x1b[31mred\rover\0nul \u{202e}evil"}"#,
        "\nsecond line",
    ] {
        assert!(text.contains(shown), "no {shown:?} in\n{text}");
    }
    let v = json(&idem(&[
        "records", "show", scope, "k-text", "--json", "--store", &url,
    ]));
    assert_eq!(v["scope"], scope);
    assert_eq!(v["response"]["body"], body, "JSON gives the bytes back");

    let out = idem(&["records", "show", scope, "k-binary", "--store", &url]);
    let text = stdout(&out);
    assert_eq!(
        terminal_controls(&text, true),
        Vec::<char>::new(),
        "{text:?}"
    );
    assert!(
        text.contains("not UTF-8: hex") && text.contains("1b5b33316dfffe00"),
        "{text}"
    );
    let v = json(&idem(&[
        "records", "show", scope, "k-binary", "--json", "--store", &url,
    ]));
    assert_eq!(v["response"]["body_hex"], "1b5b33316dfffe00");

    let out = idem(&["records", "show", scope, "k-running", "--store", &url]);
    let text = stdout(&out);
    assert_eq!(
        terminal_controls(&text, true),
        Vec::<char>::new(),
        "{text:?}"
    );
    assert!(
        text.contains(r"recovery point  10 bytes: step\x1b[2K\r1"),
        "{text}"
    );

    let out = idem(&["records", "list", "--store", &url]);
    let text = stdout(&out);
    assert_eq!(
        terminal_controls(&text, true),
        Vec::<char>::new(),
        "{text:?}"
    );
    assert_eq!(
        text.matches(r"refund:\x1b]0;owned\x07A1").count(),
        3,
        "{text}"
    );
    let v = json(&idem(&["records", "list", "--json", "--store", &url]));
    assert_eq!(v[0]["scope"], scope);

    // An error that names the record.
    let out = idem(&["records", "show", scope, "k-none", "--store", &url]);
    assert_eq!(
        terminal_controls(&stderr(&out), true),
        Vec::<char>::new(),
        "{}",
        stderr(&out)
    );
    drop(running);
}

#[tokio::test]
async fn an_unknown_record_fails_with_exit_code_1() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let _store = SqliteStore::connect(&url).await.unwrap();
    let out = idem(&["records", "show", "refund:A1", "nope", "--store", &url]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no record"), "{}", stderr(&out));
    let out = idem(&[
        "records",
        "show",
        "refund:A1",
        "nope",
        "--json",
        "--store",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(json(&out).is_null());
}

#[tokio::test]
async fn purge_deletes_expired_records() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let store = SqliteStore::builder()
        .background_purge(false)
        .connect(&url)
        .await
        .unwrap();
    for key in ["a", "b"] {
        let begun = idem::begin(
            &store,
            "s".into(),
            Key::parse(key).unwrap(),
            Fingerprint::of(&key).unwrap(),
            Policy::DEFAULT
                .lease(Duration::from_millis(300))
                .retain(Duration::from_millis(300)),
        )
        .await
        .unwrap();
        let Begun::Claimed(guard) = begun else {
            panic!("claimed before")
        };
        guard
            .complete(&StoredResponse::ok(b"ok".to_vec()))
            .await
            .unwrap();
    }
    completed(&store, "s", "kept", 200, b"ok").await;
    tokio::time::sleep(Duration::from_millis(400)).await;

    let out = idem(&["purge", "--json", "--store", &url]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["purged"], 2);
    let out = idem(&["purge", "--store", &url]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("purged 0 expired records from {url}\n")
    );
    assert!(
        idem(&["records", "show", "s", "kept", "--store", &url])
            .status
            .success()
    );
}

#[test]
fn the_store_comes_from_the_flag_then_idem_store_url_then_database_url() {
    let dir = tempfile::tempdir().unwrap();
    let missing = sqlite_url(dir.path());
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
        cmd.env_remove("IDEM_STORE_URL").env_remove("DATABASE_URL");
        cmd.args(["records", "show", "s", "k"]).args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    // None: a usage error.
    let out = run(&[], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no store"), "{}", stderr(&out));
    // An unknown scheme: a usage error naming it.
    let out = run(&[("DATABASE_URL", "mongodb://db/app")], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("mongodb://db/app"),
        "{}",
        stderr(&out)
    );
    // IDEM_STORE_URL wins over DATABASE_URL, and the flag over both: each is the one opened
    // (a SQLite file that does not exist is not created, and the error names it).
    let out = run(
        &[
            ("IDEM_STORE_URL", &missing),
            ("DATABASE_URL", "mongodb://db/app"),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("records.db"), "{}", stderr(&out));
    assert!(!dir.path().join("records.db").exists());
    let out = run(
        &[("IDEM_STORE_URL", "mongodb://db/app")],
        &["--store", &missing],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

/// `sqlite_master` of the database at `url`, every object in name order.
async fn sqlite_catalog(url: &str) -> Vec<(String, String, String, Option<String>)> {
    use idem::sqlx::Connection as _;
    let mut conn = idem::sqlx::SqliteConnection::connect(url).await.unwrap();
    idem::sqlx::query_as("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")
        .fetch_all(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_printed_sqlite_schema_is_what_the_stores_create() {
    let dir = tempfile::tempdir().unwrap();
    // The stores' own migrations.
    let made = format!("sqlite://{}", dir.path().join("made.db").display());
    let store = SqliteStore::connect(&made).await.unwrap();
    idem::outbox::SqliteOutbox::new(store.pool().clone())
        .migrate()
        .await
        .unwrap();
    drop(store);
    // The printed text, run as it is.
    let out = idem(&["schema", "--store", "sqlite"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("printed.db").display()
    );
    {
        use idem::sqlx::Connection as _;
        let mut conn = idem::sqlx::SqliteConnection::connect(&printed)
            .await
            .unwrap();
        idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(stdout(&out)))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let made = sqlite_catalog(&made).await;
    assert!(made.iter().any(|(_, name, ..)| name == RECORDS_TABLE));
    assert!(made.iter().any(|(_, name, ..)| name == OUTBOX_TABLE));
    assert_eq!(sqlite_catalog(&printed).await, made);
}

#[test]
fn schema_names_other_tables_and_refuses_redis() {
    let out = idem(&[
        "schema",
        "--store",
        "postgres",
        "--table",
        "billing.records",
        "--outbox-table",
        "billing.events",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["database"], "postgres");
    let all = v.to_string();
    assert!(!all.contains("idem_"), "{all}");
    assert!(
        all.contains(r#"ON \"billing\".\"records\" (expires_at)"#),
        "{all}"
    );
    assert!(all.contains("pg_notify('events_wake'"), "{all}");
    // The database from the store URL.
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["schema", "--json"])
        .env_remove("IDEM_STORE_URL")
        .env("DATABASE_URL", "sqlite://app.db")
        .output()
        .unwrap();
    assert_eq!(json(&out)["database"], "sqlite");
    let out = idem(&["schema", "--store", "redis://127.0.0.1:6379"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no schema"), "{}", stderr(&out));
    let out = idem(&["schema", "--store", "sqlite", "--table", "a;b"]);
    assert_eq!(out.status.code(), Some(2));
}

#[cfg(idem_postgres)]
mod postgres {
    use super::*;
    use idem::PgStore;
    use idem::sqlx::{Connection as _, PgConnection};

    /// A schema of its own in the test database, dropped at the end.
    struct Schema {
        url: String,
        name: String,
    }

    impl Schema {
        async fn new(tag: &str) -> Schema {
            let url = std::env::var("DATABASE_URL").unwrap();
            let name = unique_name(tag);
            let mut conn = PgConnection::connect(&url).await.unwrap();
            idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
                .execute(&mut conn)
                .await
                .unwrap();
            Schema { url, name }
        }

        async fn drop(self) {
            let mut conn = PgConnection::connect(&self.url).await.unwrap();
            idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA {} CASCADE",
                self.name
            )))
            .execute(&mut conn)
            .await
            .unwrap();
        }
    }

    /// What PostgreSQL's catalog says of the tables, indexes, constraints, triggers and
    /// functions in `schema`, with the schema's name taken out.
    async fn catalog(url: &str, schema: &str) -> Vec<String> {
        let mut conn = PgConnection::connect(url).await.unwrap();
        let queries = [
            "SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable \
               || ' ' || coalesce(column_default, '-') || ' ' || is_identity \
               || ' ' || coalesce(domain_name, '-') \
             FROM information_schema.columns WHERE table_schema = $1 \
             ORDER BY table_name, ordinal_position",
            "SELECT indexname || ': ' || indexdef FROM pg_indexes WHERE schemaname = $1 \
             ORDER BY indexname",
            "SELECT c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '-') \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relkind = 'r' ORDER BY c.relname",
            "SELECT conrelid::regclass::text || ' ' || contype::text || ' ' || pg_get_constraintdef(oid) \
             FROM pg_constraint WHERE connamespace = $1::regnamespace ORDER BY 1",
            "SELECT trigger_name || ' ' || event_manipulation || ' ' || action_timing || ' ' \
               || action_orientation || ' ' || action_statement \
             FROM information_schema.triggers WHERE trigger_schema = $1 ORDER BY 1",
            "SELECT p.proname || ' ' || p.prosrc FROM pg_proc p \
             WHERE p.pronamespace = $1::regnamespace ORDER BY 1",
        ];
        let mut out = Vec::new();
        for q in queries {
            let rows: Vec<(String,)> = idem::sqlx::query_as(q)
                .bind(schema)
                .fetch_all(&mut conn)
                .await
                .unwrap();
            out.extend(rows.into_iter().map(|(r,)| r.replace(schema, "<schema>")));
        }
        out
    }

    #[tokio::test]
    async fn the_printed_postgres_schema_is_what_the_stores_create() {
        let made = Schema::new("made").await;
        let printed = Schema::new("printed").await;
        let table = |s: &Schema, t: &str| format!("{}.{t}", s.name);

        let store = PgStore::builder()
            .table(table(&made, RECORDS_TABLE))
            .background_purge(false)
            .connect(&made.url)
            .await
            .unwrap();
        idem::outbox::PgOutbox::with_table(store.pool().clone(), &table(&made, OUTBOX_TABLE))
            .unwrap()
            .migrate()
            .await
            .unwrap();
        drop(store);

        let out = idem(&[
            "schema",
            "--store",
            "postgres",
            "--table",
            &table(&printed, RECORDS_TABLE),
            "--outbox-table",
            &table(&printed, OUTBOX_TABLE),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let mut conn = PgConnection::connect(&printed.url).await.unwrap();
        idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(stdout(&out)))
            .execute(&mut conn)
            .await
            .unwrap();

        let from_store = catalog(&made.url, &made.name).await;
        let from_text = catalog(&printed.url, &printed.name).await;
        made.drop().await;
        printed.drop().await;
        assert!(
            from_store.iter().any(|l| l.contains("fillfactor=80")),
            "{from_store:#?}"
        );
        assert!(
            from_store
                .iter()
                .any(|l| l.starts_with("idem_outbox_notify")),
            "{from_store:#?}"
        );
        assert_eq!(from_text, from_store);
    }

    #[tokio::test]
    async fn every_record_command_on_postgres() {
        let s = Schema::new("ops").await;
        let table = format!("{}.{RECORDS_TABLE}", s.name);
        let store = PgStore::builder()
            .table(&table)
            .background_purge(false)
            .connect(&s.url)
            .await
            .unwrap();
        let target = Target {
            url: s.url.clone(),
            flags: vec!["--table".into(), table],
            keeps_expired: true,
        };
        every_command(&store, &target).await;
        s.drop().await;
    }

    #[tokio::test]
    async fn records_show_reads_postgres() {
        let s = Schema::new("show").await;
        let table = format!("{}.{RECORDS_TABLE}", s.name);
        let store = PgStore::builder()
            .table(&table)
            .background_purge(false)
            .connect(&s.url)
            .await
            .unwrap();
        let begun = idem::begin(
            &store,
            "refund:P1".into(),
            Key::parse("pg-1").unwrap(),
            Fingerprint::of(&1).unwrap(),
            Policy::DEFAULT,
        )
        .await
        .unwrap();
        let Begun::Claimed(guard) = begun else {
            panic!("claimed before")
        };
        guard
            .complete(&StoredResponse::ok(b"{\"ok\":true}".to_vec()))
            .await
            .unwrap();
        let out = idem(&[
            "records",
            "show",
            "refund:P1",
            "pg-1",
            "--json",
            "--store",
            &s.url,
            "--table",
            &table,
        ]);
        let result = (out.status.success(), stdout(&out), stderr(&out));
        s.drop().await;
        assert!(result.0, "{}", result.2);
        let v: serde_json::Value = serde_json::from_str(&result.1).unwrap();
        assert_eq!(v["state"], "completed");
        assert_eq!(v["response"]["body"], "{\"ok\":true}");
        assert_eq!(v["response"]["status"], serde_json::Value::Null);
    }
}

/// Listed as ignored where PostgreSQL is not configured, never as passed.
#[cfg(not(idem_postgres))]
#[test]
#[ignore = "needs PostgreSQL: set DATABASE_URL=postgres://postgres@127.0.0.1:5432/test"]
fn postgres_schema_and_records() {}

#[cfg(idem_mysql)]
mod mysql {
    use super::*;
    use idem::MySqlStore;
    use idem::sqlx::{Connection as _, MySqlConnection};

    /// A database of its own on the test server, dropped at the end.
    struct Database {
        /// The server's URL, without a database.
        server: String,
        name: String,
    }

    impl Database {
        async fn new(tag: &str) -> Database {
            let url = std::env::var("IDEM_MYSQL_URL").unwrap();
            let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
            let server = format!("mysql://{}", rest.split('/').next().unwrap());
            let name = unique_name(tag);
            let mut conn = MySqlConnection::connect(&server).await.unwrap();
            idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut conn)
                .await
                .unwrap();
            Database { server, name }
        }

        fn url(&self) -> String {
            format!("{}/{}", self.server, self.name)
        }

        async fn drop(self) {
            let mut conn = MySqlConnection::connect(&self.server).await.unwrap();
            idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(format!(
                "DROP DATABASE {}",
                self.name
            )))
            .execute(&mut conn)
            .await
            .unwrap();
        }
    }

    /// The records table as the server describes it.
    async fn described(url: &str, table: &str) -> String {
        let mut conn = MySqlConnection::connect(url).await.unwrap();
        let (_, ddl): (String, String) = idem::sqlx::query_as(idem::sqlx::AssertSqlSafe(format!(
            "SHOW CREATE TABLE {table}"
        )))
        .fetch_one(&mut conn)
        .await
        .unwrap();
        ddl
    }

    #[tokio::test]
    async fn the_printed_mysql_schema_is_what_the_store_creates() {
        let made = Database::new("made").await;
        let printed = Database::new("printed").await;
        let store = MySqlStore::builder()
            .background_purge(false)
            .connect(&made.url())
            .await
            .unwrap();
        idem::outbox::MySqlOutbox::new(store.pool().clone())
            .migrate()
            .await
            .unwrap();
        drop(store);
        let out = idem(&["schema", "--store", "mysql"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        let mut conn = MySqlConnection::connect(&printed.url()).await.unwrap();
        idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(text))
            .execute(&mut conn)
            .await
            .unwrap();
        let mut tables = Vec::new();
        for table in [RECORDS_TABLE, OUTBOX_TABLE] {
            let from_store = described(&made.url(), table).await;
            let from_text = described(&printed.url(), table).await;
            tables.push((from_store, from_text));
        }
        made.drop().await;
        printed.drop().await;
        assert!(
            tables[0].0.contains("`scope` varbinary(1024)"),
            "{}",
            tables[0].0
        );
        assert!(
            tables[1].0.contains("`partition_key` varbinary(255)"),
            "{}",
            tables[1].0
        );
        for (from_store, from_text) in tables {
            assert_eq!(from_text, from_store);
        }
    }

    #[tokio::test]
    async fn every_record_command_on_mysql() {
        let db = Database::new("ops").await;
        let store = MySqlStore::builder()
            .background_purge(false)
            .connect(&db.url())
            .await
            .unwrap();
        let target = Target {
            url: db.url(),
            flags: vec![],
            keeps_expired: true,
        };
        every_command(&store, &target).await;
        db.drop().await;
    }
}

/// Listed as ignored where MySQL is not configured, never as passed.
#[cfg(not(idem_mysql))]
#[test]
#[ignore = "needs MySQL or MariaDB: set IDEM_MYSQL_URL=mysql://root@127.0.0.1:3306/test"]
fn mysql_schema_and_records() {}

// ---- every record command, on every store --------------------------------------------------

/// A store as the tool is pointed at it: its URL, and the flags that name its table or key
/// prefix.
struct Target {
    url: String,
    flags: Vec<String>,
    /// Whether records past their retention stay until a purge (the SQL stores), rather than
    /// vanish on their own (Redis's key expiry).
    keeps_expired: bool,
}

impl Target {
    fn sqlite(dir: &Path) -> Target {
        Target {
            url: sqlite_url(dir),
            flags: Vec::new(),
            keeps_expired: true,
        }
    }

    /// `idem args… --store URL flags…`.
    fn run(&self, args: &[&str]) -> Output {
        let mut all = args.to_vec();
        all.extend(["--store", &self.url]);
        all.extend(self.flags.iter().map(String::as_str));
        idem(&all)
    }

    /// The same, which must succeed.
    fn ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "idem {args:?}: {}\n{}",
            stdout(&out),
            stderr(&out)
        );
        out
    }
}

/// The keys of a JSON array of records, in order.
fn keys(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect()
}

/// Lists, shows, counts, releases and purges the records the library made in `store`, as
/// `target` reaches it; the stuck claim's owner is refused its late completion.
async fn every_command<S: Store>(store: &S, target: &Target) {
    // One record past its retention, two completed, one claim stuck in progress with a
    // recovery point (its owner "crashed": the guard is kept, never completed).
    let begun = idem::begin(
        store,
        "order:1".into(),
        Key::parse("k-old").unwrap(),
        Fingerprint::of(&"old").unwrap(),
        Policy::DEFAULT
            .lease(Duration::from_millis(300))
            .retain(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let Begun::Claimed(guard) = begun else {
        panic!("claimed before")
    };
    guard
        .complete(&StoredResponse::ok(b"old".to_vec()))
        .await
        .unwrap();
    // A record's age, and so the order of the list, is counted in milliseconds from its first
    // claim: one apart at least.
    let tick = || tokio::time::sleep(Duration::from_millis(5));
    tick().await;
    completed(store, "order:1", "k-done", 201, br#"{"orderNo":"ORD-1"}"#).await;
    tick().await;
    completed(store, "refund:ORD-1", "k-refund", 200, b"{}").await;
    tick().await;
    let begun = idem::begin(
        store,
        "order:1".into(),
        Key::parse("k-stuck").unwrap(),
        Fingerprint::of(&"stuck").unwrap(),
        Policy::DEFAULT.lease(Duration::from_secs(300)),
    )
    .await
    .unwrap();
    let Begun::Claimed(mut stuck) = begun else {
        panic!("claimed before")
    };
    stuck.checkpoint(b"charged").await.unwrap();
    let stuck_fence = stuck.fence();
    tokio::time::sleep(Duration::from_millis(400)).await;

    // records list: oldest first, filtered by state, scope prefix and age, limited.
    let all = json(&target.ok(&["records", "list", "--json"]));
    let mut expected = vec!["k-done", "k-refund", "k-stuck"];
    if target.keeps_expired {
        expected.insert(0, "k-old");
    }
    assert_eq!(keys(&all), expected, "{all}");
    let stuck_json = &all.as_array().unwrap()[expected.len() - 1];
    assert_eq!(stuck_json["state"], "in_progress");
    assert_eq!(stuck_json["attempt"], 1);
    assert_eq!(stuck_json["fence"], stuck_fence);
    let in_progress = json(&target.ok(&["records", "list", "--state", "in_progress", "--json"]));
    assert_eq!(keys(&in_progress), ["k-stuck"]);
    let refunds = json(&target.ok(&["records", "list", "--prefix", "refund:", "--json"]));
    assert_eq!(keys(&refunds), ["k-refund"]);
    let old = json(&target.ok(&["records", "list", "--older-than", "1h", "--json"]));
    assert_eq!(keys(&old), Vec::<String>::new());
    let out = target.ok(&["records", "list", "--older-than", "1h"]);
    assert!(
        stdout(&out).starts_with("no records match"),
        "{}",
        stdout(&out)
    );
    let out = target.ok(&["records", "list", "--state", "in_progress"]);
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("scope    key      state        attempt  age"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("order:1  k-stuck  in_progress  1        "),
        "{text}"
    );
    let out = target.ok(&["records", "list", "--limit", "1"]);
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));
    assert!(stderr(&out).contains("--limit"), "{}", stderr(&out));
    let out = target.run(&["records", "list", "--state", "stuck"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // records show: the stuck claim in full, its recovery point included.
    let out = target.ok(&["records", "show", "order:1", "k-stuck"]);
    let text = stdout(&out);
    for line in [
        "state           in_progress",
        &format!("fence           {stuck_fence}"),
        "attempt         1",
        "recovery point  7 bytes: charged",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
    assert!(text.contains("lease left      4m 5"), "{text}");
    let v = json(&target.ok(&["records", "show", "order:1", "k-done", "--json"]));
    assert_eq!(v["state"], "completed");
    assert_eq!(v["response"]["status"], 201);
    assert_eq!(v["response"]["body"], r#"{"orderNo":"ORD-1"}"#);
    assert!(v["expires_in_ms"].as_u64().unwrap() > 3_600_000, "{v}");

    // stats: live records by state and prefix, the stuck claim's age.
    let v = json(&target.ok(&["stats", "--expiring-within", "2d", "--json"]));
    assert_eq!(
        v["states"],
        serde_json::json!({"in_progress": 1, "completed": 2, "released": 0, "parked": 0}),
        "{v}"
    );
    assert_eq!(v["expired"], u64::from(target.keeps_expired), "{v}");
    assert_eq!(v["expiring_soon"], 3, "{v}");
    assert!(v["oldest_in_progress_ms"].as_u64().unwrap() >= 400, "{v}");
    assert_eq!(v["by_prefix"][0]["prefix"], "order", "{v}");
    assert_eq!(v["by_prefix"][0]["counts"]["in_progress"], 1, "{v}");
    assert_eq!(v["by_prefix"][1]["prefix"], "refund", "{v}");
    let text = stdout(&target.ok(&["stats"]));
    for line in [
        "live records        3",
        "in_progress         1",
        "expiring within 1h  0",
        "prefix  in_progress  completed  released",
        "order   1            1          0",
        "refund  0            1          0",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }

    // records release: refused without a terminal and without --yes; then done, the fence
    // moving on, and the stuck owner's late completion refused.
    let out = target.run(&["records", "release", "order:1", "k-stuck"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));
    // Released only while it has the fence the operator saw.
    let v = json(&target.ok(&[
        "records",
        "release",
        "order:1",
        "k-stuck",
        "--fence",
        &stuck_fence.to_string(),
        "--yes",
        "--json",
    ]));
    assert_eq!(v["released"], true, "{v}");
    let fence = v["fence"].as_u64().unwrap();
    assert!(fence > stuck_fence, "{v}");
    let late = stuck.complete(&StoredResponse::ok(b"late".to_vec())).await;
    assert!(matches!(late, Err(Error::FenceLost { .. })), "{late:?}");
    let v = json(&target.ok(&["records", "show", "order:1", "k-stuck", "--json"]));
    assert_eq!(v["state"], "released", "{v}");
    assert_eq!(v["fence"], fence, "{v}");
    let out = target.run(&["records", "release", "order:1", "k-stuck", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is released, not in progress"),
        "{}",
        stderr(&out)
    );
    let out = target.run(&["records", "release", "order:1", "k-never", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("no record"), "{}", stderr(&out));
    // Not released: said on stdout as JSON, and by the exit code.
    let out = target.run(&["records", "release", "order:1", "k-done", "--yes", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        json(&out),
        serde_json::json!({"released": false, "reason": "not_in_progress", "state": "completed"})
    );
    // The next request with the key claims it: the retry runs.
    let begun = idem::begin(
        store,
        "order:1".into(),
        Key::parse("k-stuck").unwrap(),
        Fingerprint::of(&"stuck").unwrap(),
        Policy::DEFAULT,
    )
    .await
    .unwrap();
    let Begun::Claimed(retry) = begun else {
        panic!("the released claim is not claimed again")
    };
    assert!(retry.fence() > fence);
    // A release decided on what was seen before (the stuck claim's fence) leaves the retry's
    // claim alone, and says what the record is now.
    let stale = stuck_fence.to_string();
    let out = target.run(&[
        "records", "release", "order:1", "k-stuck", "--fence", &stale, "--yes",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "has fence {} now (in_progress), not {stale}",
            retry.fence()
        )),
        "{}",
        stderr(&out)
    );
    let out = target.run(&[
        "records", "release", "order:1", "k-stuck", "--fence", &stale, "--yes", "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        json(&out),
        serde_json::json!({"released": false, "reason": "fence_moved", "fence": retry.fence(), "state": "in_progress"})
    );
    let out = target.run(&[
        "records", "release", "order:1", "k-stuck", "--fence", "soon",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    retry
        .complete(&StoredResponse::ok(b"once".to_vec()))
        .await
        .unwrap();

    // purge: counted, then deleted.
    let expired = u64::from(target.keeps_expired);
    let v = json(&target.ok(&["purge", "--dry-run", "--json"]));
    assert_eq!(v["expired"], expired, "{v}");
    assert_eq!(
        stdout(&target.ok(&["purge", "--dry-run"])),
        format!(
            "{expired} expired records would be purged from {} (none deleted)\n",
            target.url
        )
    );
    assert_eq!(json(&target.ok(&["purge", "--json"]))["purged"], expired);
    assert_eq!(
        json(&target.ok(&["purge", "--dry-run", "--json"]))["expired"],
        0
    );
    let all = json(&target.ok(&["records", "list", "--json"]));
    assert_eq!(keys(&all), ["k-done", "k-refund", "k-stuck"], "{all}");
}

#[tokio::test]
async fn every_record_command_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target::sqlite(dir.path());
    let store = SqliteStore::builder()
        .background_purge(false)
        .connect(&target.url)
        .await
        .unwrap();
    every_command(&store, &target).await;
}

#[test]
fn purge_lines_its_progress_when_not_on_a_terminal() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target = Target::sqlite(dir.path());
    rt.block_on(async {
        let store = SqliteStore::builder()
            .background_purge(false)
            .connect(&target.url)
            .await
            .unwrap();
        for i in 0..3 {
            let key = format!("k-{i}");
            let begun = idem::begin(
                &store,
                "s".into(),
                Key::parse(&key).unwrap(),
                Fingerprint::of(&i).unwrap(),
                Policy::DEFAULT
                    .lease(Duration::from_millis(100))
                    .retain(Duration::from_millis(100)),
            )
            .await
            .unwrap();
            let Begun::Claimed(guard) = begun else {
                panic!("claimed before")
            };
            guard
                .complete(&StoredResponse::ok(b"x".to_vec()))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    });
    let out = target.ok(&["purge"]);
    assert_eq!(
        stdout(&out),
        format!("purged 3 expired records from {}\n", target.url)
    );
    assert!(
        stderr(&out).contains("idem: purged 3 of 3"),
        "{}",
        stderr(&out)
    );
}

#[cfg_attr(
    not(idem_redis),
    ignore = "needs Redis: set IDEM_REDIS_URL=redis://127.0.0.1:6379"
)]
#[tokio::test]
async fn every_record_command_on_redis() {
    let url = std::env::var("IDEM_REDIS_URL").expect("IDEM_REDIS_URL");
    let prefix = format!(
        "idem-cli-test-{}-{}:",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let store = idem::RedisStore::builder()
        .prefix(&prefix)
        .connect(&url)
        .await
        .unwrap();
    let target = Target {
        url,
        flags: vec!["--redis-prefix".into(), prefix.clone()],
        keeps_expired: false,
    };
    let _cleanup = RedisKeys {
        url: target.url.clone(),
        prefix: prefix.clone(),
    };
    every_command(&store, &target).await;
}

/// Deletes every key under `prefix` on drop, even when the test panics.
struct RedisKeys {
    url: String,
    prefix: String,
}

impl Drop for RedisKeys {
    fn drop(&mut self) {
        let (url, prefix) = (self.url.clone(), self.prefix.clone());
        // Drop cannot await, and runs inside the test's runtime: clean up from a thread.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let client = redis::Client::open(url.as_str()).unwrap();
                let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
                    .arg(format!("{prefix}*"))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                for key in keys {
                    let _: redis::RedisResult<i64> =
                        redis::cmd("DEL").arg(key).query_async(&mut conn).await;
                }
            });
        })
        .join();
    }
}

#[tokio::test]
async fn parked_work_is_listed_shown_and_retried() {
    use idem::store::StoreAdmin as _;
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let store = SqliteStore::connect(&url).await.unwrap();
    // A resumable call whose outcome stayed unknown until its attempts ran out: parked.
    let request = idem::StoredRequest::new("refund:<order_no>", &br#"{"order_no":"ORD-7"}"#[..])
        .unwrap()
        .with_policy(&Policy::DEFAULT);
    let fp = Fingerprint::of(&"ORD-7").unwrap();
    let begun = idem::flow::begin_resumable(
        &store,
        "refund:ORD-7".into(),
        Key::parse("k-parked").unwrap(),
        fp,
        Policy::DEFAULT,
        &request,
    )
    .await
    .unwrap();
    let Begun::Claimed(guard) = begun else {
        panic!("claimed before")
    };
    let fence = guard.fence();
    guard.suspend("the bank timed out").await.unwrap();
    let claim = idem::ClaimRef {
        scope: "refund:ORD-7",
        key: "k-parked",
        fence,
    };
    store
        .park(
            claim,
            "gave up after 8 attempts; last: the bank timed out\x1b[2J",
        )
        .await
        .unwrap();
    completed(&store, "refund:ORD-8", "k-done", 201, b"{}").await;

    let listed = json(&idem(&[
        "records", "list", "--state", "parked", "--json", "--store", &url,
    ]));
    let keys: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["k-parked"], "{listed}");
    let shown = idem(&[
        "records",
        "show",
        "refund:ORD-7",
        "k-parked",
        "--store",
        &url,
    ]);
    let text = stdout(&shown);
    let row = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).filter(|r| r.starts_with(' ')))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name} row in\n{text}"))
            .to_owned()
    };
    assert_eq!(row("state"), "parked");
    assert!(
        row("note").starts_with("gave up after 8 attempts"),
        "{text}"
    );
    assert!(
        !text.contains('\x1b'),
        "the note's escape is not printed raw: {text:?}"
    );
    assert!(
        row("request").ends_with("bytes stored: a completer can resume it"),
        "{text}"
    );
    let bad = idem(&["records", "list", "--state", "stuck", "--store", &url]);
    assert!(
        stderr(&bad).contains("in_progress, completed, released, parked, or unfinished"),
        "{}",
        stderr(&bad)
    );

    // Retry it: in progress again, due to a completer at once.
    let retried = json(&idem(&[
        "records",
        "retry",
        "refund:ORD-7",
        "k-parked",
        "--json",
        "--store",
        &url,
    ]));
    assert_eq!(retried["retried"], true, "{retried}");
    let record = store
        .inspect("refund:ORD-7", "k-parked")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, idem::lifecycle::State::InProgress);
    assert_eq!(
        store.due(10).await.unwrap().len(),
        1,
        "due to a completer now"
    );
    // Retrying what is not parked changes nothing, and says so with exit code 1.
    let again = idem(&[
        "records",
        "retry",
        "refund:ORD-7",
        "k-parked",
        "--store",
        &url,
    ]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("is in_progress, not parked"),
        "{}",
        stderr(&again)
    );
    let done = idem(&[
        "records",
        "retry",
        "refund:ORD-8",
        "k-done",
        "--json",
        "--store",
        &url,
    ]);
    assert_eq!(json(&done)["reason"], "not_parked");
    let none = idem(&["records", "retry", "refund:ORD-9", "nope", "--store", &url]);
    assert_eq!(none.status.code(), Some(1));
    assert!(stderr(&none).contains("no record"), "{}", stderr(&none));
}

#[tokio::test]
async fn unfinished_work_is_listed_apart_from_claims_still_running() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let store = SqliteStore::connect(&url).await.unwrap();
    // One claim whose outcome is unknown (the gateway timed out), one still running, one done.
    claimed(&store, "refund:ORD-1", "k-unknown")
        .await
        .suspend("the gateway timed out")
        .await
        .unwrap();
    let running = claimed(&store, "refund:ORD-1", "k-running").await;
    completed(&store, "refund:ORD-2", "k-done", 201, b"{}").await;

    let keys_of = |state: &str| {
        let listed = json(&idem(&[
            "records", "list", "--state", state, "--json", "--store", &url,
        ]));
        let mut keys: Vec<String> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["key"].as_str().unwrap().to_owned())
            .collect();
        keys.sort();
        keys
    };
    assert_eq!(keys_of("in_progress"), ["k-running", "k-unknown"]);
    assert_eq!(keys_of("unfinished"), ["k-unknown"]);
    let table = stdout(&idem(&[
        "records",
        "list",
        "--state",
        "unfinished",
        "--store",
        &url,
    ]));
    assert!(
        table.contains("k-unknown") && !table.contains("k-running"),
        "{table}"
    );
    drop(running);
}
