//! End-to-end: migration directories on disk, replayed into a catalog.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use super::*;

/// A crate directory holding `files` (paths relative to the crate).
fn crate_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (path, text) in files {
        let path = dir.path().join(path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create dirs");
        }
        fs::write(path, text).expect("write file");
    }
    dir
}

fn read_catalog(dir: &Path) -> Arc<Catalog> {
    catalog_at(dir, None)
}

fn catalog_at(dir: &Path, explicit: Option<&str>) -> Arc<Catalog> {
    match load(dir, explicit.map(Path::new)) {
        Ok(Migrations::Found(c)) => c,
        other => panic!("expected a catalog, got {other:?}"),
    }
}

fn table<'a>(catalog: &'a Catalog, name: &str) -> &'a Table {
    match catalog.table(name) {
        Lookup::Found(t) => t,
        other => panic!("table {name}: {other:?}"),
    }
}

fn column<'a>(table: &'a Table, name: &str) -> &'a Column {
    match table.column(name) {
        Lookup::Found(c) => c,
        other => panic!("column {name} of {}: {other:?}", table.name()),
    }
}

fn names(table: &Table) -> Vec<&str> {
    table.column_names().collect()
}

fn values(allowed: &AllowedValues) -> Option<Vec<&str>> {
    match allowed {
        AllowedValues::Only { values, .. } => Some(values.iter().map(String::as_str).collect()),
        _ => None,
    }
}

fn file_names(catalog: &Catalog) -> Vec<String> {
    catalog.files().map(MigrationFile::file_name).collect()
}

const PG_INIT_UP: &str = r#"
-- Orders and their refunds.
CREATE TYPE order_status AS ENUM ('PENDING', 'PAID', 'REFUNDED');

CREATE TABLE orders (
    id           BIGSERIAL PRIMARY KEY,
    order_no     TEXT NOT NULL UNIQUE,
    status       order_status NOT NULL DEFAULT 'PENDING',
    amount_cents BIGINT NOT NULL CHECK (amount_cents >= 0),
    currency     CHAR(3) NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE refunds (
    id         UUID PRIMARY KEY,
    order_no   TEXT NOT NULL REFERENCES orders (order_no),
    state      TEXT NOT NULL,
    amount     NUMERIC(12, 2) NOT NULL,
    CONSTRAINT refund_state CHECK (state IN ('REQUESTED', 'SENT', 'FAILED'))
);

CREATE INDEX refunds_by_order ON refunds (order_no);
INSERT INTO orders (order_no, amount_cents, currency) VALUES ('seed-1', 100, 'EUR');
"#;

const PG_INIT_DOWN: &str = "DROP TABLE refunds;\nDROP TABLE orders;\nDROP TYPE order_status;\n";

const PG_PAYMENTS: &str = r#"
ALTER TABLE orders ADD COLUMN paid_at TIMESTAMPTZ;
ALTER TABLE orders RENAME COLUMN created_at TO placed_at;
ALTER TYPE order_status ADD VALUE 'SHIPPED' AFTER 'PAID';

CREATE FUNCTION touch_order() RETURNS trigger AS $$
BEGIN
    -- Not DDL: a body that runs later, whatever it says.
    NEW.placed_at = now();
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER orders_touch BEFORE UPDATE ON orders
    FOR EACH ROW EXECUTE FUNCTION touch_order();

COMMENT ON COLUMN orders.paid_at IS 'when the payment callback arrived';
"#;

fn postgres_project() -> tempfile::TempDir {
    crate_with(&[
        ("migrations/20240101000000_init.up.sql", PG_INIT_UP),
        ("migrations/20240101000000_init.down.sql", PG_INIT_DOWN),
        ("migrations/20240102000000_payments.sql", PG_PAYMENTS),
        ("migrations/README.md", "not a migration"),
    ])
}

#[test]
fn postgres_migrations_replay_into_tables_columns_and_states() {
    let dir = postgres_project();
    let catalog = read_catalog(dir.path());

    assert_eq!(
        file_names(&catalog),
        vec!["20240101000000_init.up.sql", "20240102000000_payments.sql"],
        "the down migration is never applied"
    );
    assert!(
        catalog.unreadable().is_empty(),
        "{:?}",
        catalog.unreadable()
    );
    assert_eq!(catalog.database(), Some(Database::Postgres));

    let orders = table(&catalog, "orders");
    assert!(orders.is_certain());
    assert_eq!(
        names(orders),
        vec![
            "id",
            "order_no",
            "status",
            "amount_cents",
            "currency",
            "placed_at",
            "paid_at"
        ]
    );
    assert_eq!(orders.created_in().version, Some(20240101000000));
    assert_eq!(orders.created_in().description, "init");
    assert_eq!(orders.created_in().kind, MigrationKind::ReversibleUp);
    assert_eq!(
        orders.altered_in().map(MigrationFile::file_name).as_deref(),
        Some("20240102000000_payments.sql")
    );
    assert_eq!(orders.primary_key(), ["id".to_owned()]);
    assert!(orders.is_unique(&["order_no"]));
    assert!(!orders.is_unique(&["currency"]));
    // A key that includes a unique set of columns finds one row at most.
    assert!(orders.has_unique_within(&["order_no", "currency"]));
    assert!(orders.has_unique_within(&["id"]));
    assert!(!orders.has_unique_within(&["currency"]));
    assert!(!orders.has_unique_within(&[]));

    let status = column(orders, "status");
    let order_status = QualifiedName::new("public", "order_status");
    assert_eq!(
        status.family(Database::Postgres),
        TypeFamily::Enum(order_status.clone())
    );
    assert!(status.not_null() && status.has_default() && status.is_certain());
    assert_eq!(
        status.allowed_values(),
        &AllowedValues::Only {
            values: ["PENDING", "PAID", "SHIPPED", "REFUNDED"]
                .map(String::from)
                .to_vec(),
            sources: vec![ValueSource::EnumType(order_status)],
        },
        "ADD VALUE … AFTER places the label where PostgreSQL does"
    );
    assert_eq!(status.allowed_values().permits("SHIPPED"), Some(true));
    assert_eq!(status.allowed_values().permits("paid"), Some(false));

    let id = column(orders, "id");
    assert_eq!(id.family(Database::Postgres), TypeFamily::Int64);
    assert!(id.not_null() && id.has_default());
    let amount = column(orders, "amount_cents");
    assert_eq!(amount.family(Database::Postgres), TypeFamily::Int64);
    assert_eq!(
        amount.allowed_values(),
        &AllowedValues::Unknown,
        "`amount_cents >= 0` restricts the column in a way no list describes"
    );
    assert_eq!(column(orders, "currency").declared_type(), "CHAR(3)");
    assert_eq!(
        column(orders, "currency").family(Database::Postgres),
        TypeFamily::Text
    );
    assert_eq!(
        column(orders, "order_no").allowed_values(),
        &AllowedValues::Any
    );
    let paid_at = column(orders, "paid_at");
    assert_eq!(paid_at.family(Database::Postgres), TypeFamily::TimestampTz);
    assert!(!paid_at.not_null());
    assert!(matches!(
        orders.column("created_at"),
        Lookup::Missing { certain: true }
    ));

    let refunds = table(&catalog, "refunds");
    let state = column(refunds, "state");
    assert_eq!(
        values(state.allowed_values()),
        Some(vec!["REQUESTED", "SENT", "FAILED"])
    );
    assert!(matches!(
        state.allowed_values(),
        AllowedValues::Only { sources, .. } if sources == &[ValueSource::Check("refund_state".into())]
    ));
    assert_eq!(
        column(refunds, "id").family(Database::Postgres),
        TypeFamily::Uuid
    );
    assert_eq!(
        column(refunds, "amount").family(Database::Postgres),
        TypeFamily::Numeric
    );
    assert!(
        !refunds.is_unique(&["order_no"]),
        "a plain index is not a unique key"
    );

    match catalog.type_def("order_status") {
        Lookup::Found(t) => {
            assert!(t.is_certain());
            assert_eq!(t.defined_in().file_name(), "20240101000000_init.up.sql");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn lookups_report_case_mismatches_and_suggest_names() {
    let dir = postgres_project();
    let catalog = read_catalog(dir.path());
    let orders = table(&catalog, "orders");

    assert!(matches!(catalog.table("Orders"), Lookup::OtherCase(t) if t.name().name == "orders"));
    assert!(matches!(catalog.table("public.orders"), Lookup::Found(_)));
    assert!(matches!(
        catalog.table("app.orders"),
        Lookup::Missing { certain: true }
    ));
    assert!(matches!(
        catalog.table("order"),
        Lookup::Missing { certain: true }
    ));
    assert!(matches!(orders.column("Status"), Lookup::OtherCase(c) if c.name() == "status"));

    assert_eq!(
        nearest("amount_cent", orders.column_names()),
        Some("amount_cents")
    );
    assert_eq!(nearest("created_at", orders.column_names()), None);
    let tables = catalog.table_names();
    assert_eq!(
        nearest("order", tables.iter().map(String::as_str)),
        Some("orders")
    );
    assert_eq!(
        nearest("customers", tables.iter().map(String::as_str)),
        None
    );
}

#[test]
fn sqlite_migrations_read_with_sqlite_types() {
    let dir = crate_with(&[
        (
            "migrations/1_init.sql",
            r#"
            CREATE TABLE orders (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                order_no TEXT NOT NULL UNIQUE,
                status TEXT NOT NULL CHECK (status IN ('PENDING', 'PAID')),
                receipt BLOB,
                total REAL NOT NULL DEFAULT 0,
                created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP
            );
            CREATE TABLE untyped (a, b TEXT);
            CREATE VIRTUAL TABLE search USING fts5(order_no, note);
            CREATE TRIGGER orders_audit AFTER UPDATE ON orders BEGIN
                INSERT INTO audit (order_no, status) VALUES (NEW.order_no, NEW.status);
                UPDATE counters SET n = n + 1 WHERE name = 'updates';
            END;
            "#,
        ),
        (
            "migrations/2_notes.sql",
            "ALTER TABLE orders ADD COLUMN note TEXT;\nALTER TABLE orders RENAME TO purchases;\n",
        ),
    ]);
    let catalog = read_catalog(dir.path());
    assert_eq!(catalog.database(), Some(Database::Sqlite));
    assert!(matches!(
        catalog.table("orders"),
        Lookup::Missing { certain: true }
    ));
    let purchases = table(&catalog, "purchases");
    assert!(purchases.is_certain(), "{:?}", catalog.unreadable());
    assert_eq!(
        names(purchases),
        vec![
            "id",
            "order_no",
            "status",
            "receipt",
            "total",
            "created_at",
            "note"
        ]
    );
    let id = column(purchases, "id");
    assert_eq!(id.family(Database::Sqlite), TypeFamily::Int64);
    assert_eq!(id.family(Database::Postgres), TypeFamily::Int32);
    assert!(id.has_default(), "INTEGER PRIMARY KEY fills itself in");
    assert_eq!(
        column(purchases, "receipt").family(Database::Sqlite),
        TypeFamily::Bytes
    );
    assert_eq!(
        column(purchases, "total").family(Database::Sqlite),
        TypeFamily::Float64
    );
    assert_eq!(
        column(purchases, "created_at").family(Database::Sqlite),
        TypeFamily::Timestamp
    );
    assert_eq!(
        column(purchases, "order_no").family(Database::Sqlite),
        TypeFamily::Text
    );
    assert_eq!(
        values(column(purchases, "status").allowed_values()),
        Some(vec!["PENDING", "PAID"])
    );
    assert_eq!(
        purchases.altered_in().map(|f| f.version),
        Some(Some(2)),
        "renaming is an alteration"
    );
    // PostgreSQL's grammar rejects a column without a type; SQLite's reads it.
    let untyped = table(&catalog, "untyped");
    assert!(untyped.is_certain());
    assert_eq!(
        column(untyped, "a").family(Database::Sqlite),
        TypeFamily::Other(String::new())
    );
    assert_eq!(
        column(untyped, "b").family(Database::Sqlite),
        TypeFamily::Text
    );
    // A virtual table exists, but its module decides its columns.
    let search = table(&catalog, "search");
    assert!(!search.is_certain());
    assert!(matches!(
        search.column("note"),
        Lookup::Missing { certain: false }
    ));
}

#[test]
fn an_unreadable_statement_makes_exactly_what_it_names_uncertain() {
    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "CREATE TYPE mood AS ENUM ('OK', 'SAD');\n\
         CREATE TABLE kept (id INT PRIMARY KEY, state TEXT CHECK (state IN ('A', 'B')));\n\
         CREATE TABLE touched (id INT PRIMARY KEY, state TEXT CHECK (state IN ('A', 'B')), m mood);\n\
         ALTER TABLE touched FROBNICATE COLUMN state WITH MAGIC;\n\
         FROBNICATE EVERYTHING NOW;\n\
         ALTER TYPE mood FROBNICATE;\n\
         CREATE TABLE other (m mood);\n",
    )]);
    let catalog = read_catalog(dir.path());
    let lines: Vec<usize> = catalog.unreadable().iter().map(|u| u.line).collect();
    assert_eq!(lines, vec![4, 5, 6]);
    assert!(catalog.unreadable().iter().all(|u| !u.error.is_empty()));

    let kept = table(&catalog, "kept");
    assert!(kept.is_certain());
    assert_eq!(
        values(column(kept, "state").allowed_values()),
        Some(vec!["A", "B"])
    );
    assert!(matches!(
        kept.column("nope"),
        Lookup::Missing { certain: true }
    ));

    let touched = table(&catalog, "touched");
    assert!(!touched.is_certain());
    assert!(!column(touched, "state").is_certain());
    assert_eq!(
        column(touched, "state").allowed_values(),
        &AllowedValues::Unknown
    );
    assert!(matches!(
        touched.column("nope"),
        Lookup::Missing { certain: false }
    ));

    // The statement that names nothing leaves unknown tables certainly unknown.
    assert!(matches!(
        catalog.table("absent"),
        Lookup::Missing { certain: true }
    ));

    // The type's labels may have changed: its columns' values are unknown, not empty.
    let other = table(&catalog, "other");
    assert!(other.is_certain());
    let m = column(other, "m");
    assert!(!m.is_certain());
    assert_eq!(m.allowed_values(), &AllowedValues::Unknown);
    assert!(matches!(catalog.type_def("mood"), Lookup::Found(t) if !t.is_certain()));

    // A type known only from an unreadable statement may be an enum: its columns' values are
    // unknown, and its family is left to the declared name.
    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "CREATE TYPE feeling AS ENUM ('OK') FROBNICATE;\nCREATE TABLE t (f feeling);\n",
    )]);
    let catalog = read_catalog(dir.path());
    let f = column(table(&catalog, "t"), "f");
    assert!(!f.is_certain());
    assert_eq!(f.allowed_values(), &AllowedValues::Unknown);
    assert_eq!(
        f.family(Database::Postgres),
        TypeFamily::Other("feeling".into())
    );
}

#[test]
fn an_unreadable_statement_that_creates_a_table_adds_it_uncertain() {
    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "DO $$ BEGIN\n  CREATE TABLE IF NOT EXISTS app.jobs (id INT);\nEND $$;\n\
         CREATE TABLE (broken INT);\n",
    )]);
    let catalog = read_catalog(dir.path());
    let jobs = table(&catalog, "app.jobs");
    assert!(!jobs.is_certain());
    assert!(matches!(
        jobs.column("id"),
        Lookup::Missing { certain: false }
    ));
    // `CREATE TABLE` with no readable name could have made any table.
    assert!(matches!(
        catalog.table("absent"),
        Lookup::Missing { certain: false }
    ));
}

#[test]
fn alterations_follow_postgres() {
    let dir = crate_with(&[
        (
            "migrations/1_init.sql",
            r#"
            CREATE TYPE kind AS ENUM ('A', 'B');
            CREATE TABLE t (
                id INT,
                status TEXT CHECK (status = 'NEW' OR status = 'DONE' OR status IS NULL),
                k kind,
                gone INT,
                note TEXT NOT NULL,
                total INT GENERATED ALWAYS AS (id * 2) STORED
            );
            CREATE TABLE dropped (id INT);
            CREATE TABLE renamed (id INT);
            "#,
        ),
        (
            "migrations/2_alter.sql",
            r#"
            ALTER TABLE t ALTER COLUMN note DROP NOT NULL;
            ALTER TABLE t ALTER COLUMN id SET NOT NULL;
            ALTER TABLE t ALTER COLUMN id TYPE BIGINT;
            ALTER TABLE t DROP COLUMN gone;
            ALTER TABLE t ADD CONSTRAINT t_status_narrow CHECK (status IN ('NEW', 'DONE', 'LOST'));
            ALTER TABLE t ADD CONSTRAINT t_pk PRIMARY KEY (id);
            ALTER TABLE t DROP CONSTRAINT t_status_check;
            ALTER TYPE kind RENAME VALUE 'B' TO 'C';
            ALTER TYPE kind RENAME TO sort;
            DROP TABLE dropped;
            ALTER TABLE renamed RENAME TO kept_name;
            ALTER TABLE IF EXISTS never_was ADD COLUMN x INT;
            "#,
        ),
    ]);
    let catalog = read_catalog(dir.path());
    assert!(
        catalog.unreadable().is_empty(),
        "{:?}",
        catalog.unreadable()
    );
    let t = table(&catalog, "t");
    assert_eq!(names(t), vec!["id", "status", "k", "note", "total"]);
    let id = column(t, "id");
    assert!(id.not_null());
    assert_eq!(id.declared_type(), "BIGINT");
    assert_eq!(id.family(Database::Postgres), TypeFamily::Int64);
    assert!(!column(t, "note").not_null());
    assert!(column(t, "total").is_generated());
    assert_eq!(t.primary_key(), ["id".to_owned()]);
    // The generated-name CHECK was dropped; the named one that replaced it is what is left.
    assert_eq!(
        column(t, "status").allowed_values(),
        &AllowedValues::Only {
            values: ["NEW", "DONE", "LOST"].map(String::from).to_vec(),
            sources: vec![ValueSource::Check("t_status_narrow".into())],
        }
    );
    // The column follows its type through the rename.
    let k = column(t, "k");
    assert_eq!(
        k.family(Database::Postgres),
        TypeFamily::Enum(QualifiedName::new("public", "sort"))
    );
    assert_eq!(values(k.allowed_values()), Some(vec!["A", "C"]));
    assert!(matches!(
        catalog.type_def("kind"),
        Lookup::Missing { certain: true }
    ));

    assert!(matches!(
        catalog.table("dropped"),
        Lookup::Missing { certain: true }
    ));
    assert!(matches!(
        catalog.table("renamed"),
        Lookup::Missing { certain: true }
    ));
    assert_eq!(names(table(&catalog, "kept_name")), vec!["id"]);
    assert!(matches!(
        catalog.table("never_was"),
        Lookup::Missing { certain: true }
    ));
}

#[test]
fn a_check_list_and_an_enum_narrow_each_other() {
    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "CREATE TYPE st AS ENUM ('A', 'B', 'C');\n\
         CREATE TABLE t (s st CHECK (s IN ('B', 'C', 'D')), u TEXT, CHECK (lower(u) = u));\n\
         DROP TYPE st CASCADE;\n",
    )]);
    let catalog = read_catalog(dir.path());
    let t = table(&catalog, "t");
    assert_eq!(
        names(t),
        vec!["u"],
        "DROP TYPE … CASCADE drops the columns of that type"
    );
    assert_eq!(column(t, "u").allowed_values(), &AllowedValues::Unknown);

    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "CREATE TYPE st AS ENUM ('A', 'B', 'C');\n\
         CREATE TABLE t (s st CHECK (s IN ('B', 'C', 'D')));\n",
    )]);
    let catalog = read_catalog(dir.path());
    let s = column(table(&catalog, "t"), "s");
    assert_eq!(values(s.allowed_values()), Some(vec!["B", "C"]));
}

#[test]
fn schemas_quoting_and_search_path() {
    let dir = crate_with(&[
        (
            "migrations/1_init.sql",
            r#"
            CREATE SCHEMA app;
            CREATE TABLE app.orders (id INT);
            CREATE TABLE public.orders (id INT);
            CREATE TABLE "Mixed" ("Col" INT, Other INT);
            SET search_path TO app, public;
            CREATE TABLE invoices (id INT);
            "#,
        ),
        // Each migration starts on the default search path again.
        ("migrations/2_more.sql", "CREATE TABLE ledgers (id INT);\n"),
    ]);
    let catalog = read_catalog(dir.path());
    assert!(matches!(catalog.table("orders"), Lookup::Ambiguous(ts) if ts.len() == 2));
    assert!(matches!(catalog.table("app.orders"), Lookup::Found(t) if t.name().schema == "app"));
    assert!(matches!(catalog.table("invoices"), Lookup::Found(t) if t.name().schema == "app"));
    assert!(matches!(
        catalog.table("public.invoices"),
        Lookup::Missing { .. }
    ));
    assert!(matches!(catalog.table("ledgers"), Lookup::Found(t) if t.name().schema == "public"));

    let mixed = table(&catalog, "Mixed");
    assert!(matches!(catalog.table("mixed"), Lookup::OtherCase(_)));
    assert!(matches!(mixed.column("Col"), Lookup::Found(_)));
    assert!(
        matches!(mixed.column("other"), Lookup::Found(_)),
        "unquoted names fold"
    );
    assert!(matches!(mixed.column("Other"), Lookup::OtherCase(_)));
    assert_eq!(
        catalog.table_names(),
        vec!["app.invoices", "app.orders", "Mixed", "ledgers", "orders"]
    );
}

#[test]
fn a_file_postgres_rejects_is_read_statement_by_statement() {
    // `FROBNICATE` fails the whole file for every dialect; the statements around it still count.
    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "CREATE TABLE a (x TEXT DEFAULT 'semi;colon');\nFROBNICATE;\n\
         CREATE FUNCTION f() RETURNS int AS $body$ SELECT 1; $body$ LANGUAGE sql;\n\
         CREATE TABLE b (y INT);\n",
    )]);
    let catalog = read_catalog(dir.path());
    assert_eq!(catalog.unreadable().len(), 1);
    assert_eq!(catalog.unreadable()[0].line, 2);
    assert_eq!(names(table(&catalog, "a")), vec!["x"]);
    assert_eq!(names(table(&catalog, "b")), vec!["y"]);
    assert!(table(&catalog, "a").is_certain() && table(&catalog, "b").is_certain());
}

#[test]
fn versions_order_numerically() {
    let dir = crate_with(&[
        ("migrations/9_create.sql", "CREATE TABLE t (a INT);\n"),
        (
            "migrations/10_extend.sql",
            "ALTER TABLE t ADD COLUMN b INT;\n",
        ),
        (
            "migrations/0011_extend_more.sql",
            "ALTER TABLE t ADD COLUMN c INT;\n",
        ),
    ]);
    let catalog = read_catalog(dir.path());
    let versions: Vec<Option<i64>> = catalog.files().map(|f| f.version).collect();
    assert_eq!(versions, vec![Some(9), Some(10), Some(11)]);
    let t = table(&catalog, "t");
    assert!(t.is_certain());
    assert_eq!(names(t), vec!["a", "b", "c"]);
    assert_eq!(
        t.altered_in().map(|f| f.description.as_str()),
        Some("extend more")
    );
}

#[test]
fn no_migrations_is_none() {
    let empty = crate_with(&[("Cargo.toml", "[package]\n")]);
    assert!(matches!(load(empty.path(), None), Ok(Migrations::None)));

    let only_others = crate_with(&[
        ("migrations/README.md", "notes"),
        ("migrations/1_init.down.sql", "DROP TABLE t;"),
        ("migrations/nounderscore.sql", "CREATE TABLE t (a INT);"),
    ]);
    assert!(matches!(
        load(only_others.path(), None),
        Ok(Migrations::None)
    ));
}

#[test]
fn a_version_that_is_not_a_number_is_an_error_as_in_sqlx() {
    let dir = crate_with(&[("migrations/v1_init.sql", "CREATE TABLE t (a INT);")]);
    match load(dir.path(), None) {
        Err(SchemaError::BadFileName { path }) => assert!(path.ends_with("v1_init.sql")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn sqlx_toml_chooses_the_directory() {
    let dir = crate_with(&[
        (
            "sqlx.toml",
            "[migrate]\nmigrations-dir = \"db/migrations\"\n",
        ),
        (
            "db/migrations/1_init.sql",
            "CREATE TABLE configured (a INT);\n",
        ),
        (
            "migrations/1_init.sql",
            "CREATE TABLE default_dir (a INT);\n",
        ),
    ]);
    let catalog = read_catalog(dir.path());
    assert!(matches!(catalog.table("configured"), Lookup::Found(_)));
    assert!(matches!(
        catalog.table("default_dir"),
        Lookup::Missing { .. }
    ));
    let inputs: Vec<&Path> = catalog.inputs().collect();
    assert_eq!(
        inputs,
        vec![
            dir.path().join("sqlx.toml").as_path(),
            dir.path().join("db/migrations/1_init.sql").as_path()
        ]
    );

    // A sqlx.toml without the key keeps the default directory.
    let dir = crate_with(&[
        ("sqlx.toml", "[common]\ndatabase-url-var = \"APP_DB\"\n"),
        (
            "migrations/1_init.sql",
            "CREATE TABLE default_dir (a INT);\n",
        ),
    ]);
    assert!(matches!(
        catalog_at(dir.path(), None).table("default_dir"),
        Lookup::Found(_)
    ));

    // A configured directory that does not exist holds no migrations.
    let dir = crate_with(&[("sqlx.toml", "[migrate]\nmigrations-dir = \"nowhere\"\n")]);
    assert!(matches!(load(dir.path(), None), Ok(Migrations::None)));
}

#[test]
fn a_malformed_sqlx_toml_is_an_error() {
    for text in [
        "[migrate\nmigrations-dir = 1",
        "[migrate]\nmigrations-dir = 5\n",
        "migrate = \"db\"\n",
    ] {
        let dir = crate_with(&[("sqlx.toml", text), ("migrations/1_a.sql", "SELECT 1;")]);
        assert!(
            matches!(load(dir.path(), None), Err(SchemaError::Config { .. })),
            "{text}"
        );
    }
}

#[test]
fn an_explicit_schema_file_or_directory() {
    let dir = crate_with(&[
        ("db/schema.sql", "CREATE TABLE from_file (a INT);\n"),
        ("other/1_init.sql", "CREATE TABLE from_dir (a INT);\n"),
        (
            "migrations/1_init.sql",
            "CREATE TABLE default_dir (a INT);\n",
        ),
    ]);
    let catalog = catalog_at(dir.path(), Some("db/schema.sql"));
    assert!(
        matches!(catalog.table("from_file"), Lookup::Found(t) if t.created_in().kind == MigrationKind::Schema)
    );
    assert!(matches!(
        catalog.table("default_dir"),
        Lookup::Missing { .. }
    ));
    assert_eq!(file_names(&catalog), vec!["schema.sql"]);

    let catalog = catalog_at(dir.path(), Some("other"));
    assert!(matches!(catalog.table("from_dir"), Lookup::Found(_)));

    match load(dir.path(), Some(Path::new("missing.sql"))) {
        Err(SchemaError::NotFound { path }) => assert!(path.ends_with("missing.sql")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_cache_never_changes_an_answer() {
    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "CREATE TABLE t (state TEXT CHECK (state IN ('PAID')));\n",
    )]);
    let first = read_catalog(dir.path());
    let again = read_catalog(dir.path());
    assert!(
        Arc::ptr_eq(&first, &again),
        "an unchanged directory is not parsed again"
    );

    // Same length, so only the contents tell the versions apart.
    let path = dir.path().join("migrations/1_init.sql");
    fs::write(
        &path,
        "CREATE TABLE t (state TEXT CHECK (state IN ('PAYD')));\n",
    )
    .expect("rewrite");
    let changed = read_catalog(dir.path());
    assert!(!Arc::ptr_eq(&first, &changed));
    assert_eq!(
        values(column(table(&changed, "t"), "state").allowed_values()),
        Some(vec!["PAYD"])
    );

    // A new migration is seen too.
    fs::write(
        dir.path().join("migrations/2_more.sql"),
        "ALTER TABLE t ADD COLUMN n INT;\n",
    )
    .expect("add");
    let grown = read_catalog(dir.path());
    assert_eq!(names(table(&grown, "t")), vec!["state", "n"]);
}

#[test]
fn an_unreadable_statement_names_what_it_touches() {
    use super::replay::{Touched, touched};
    let name = |schema: Option<&str>, name: &str| (schema.map(String::from), name.to_owned());
    let cases = [
        (
            "ALTER TABLE IF EXISTS ONLY app.\"Orders\" FROBNICATE",
            vec![name(Some("app"), "Orders")],
            vec![],
        ),
        (
            "DROP TABLE IF EXISTS a, b.c WITH MAGIC",
            vec![name(None, "a"), name(Some("b"), "c")],
            vec![],
        ),
        (
            "ALTER TABLE t SET SCHEMA app",
            vec![name(None, "t"), name(Some("app"), "t")],
            vec![],
        ),
        (
            "ALTER TABLE t RENAME TO u FROB",
            vec![name(None, "t"), name(None, "u")],
            vec![],
        ),
        (
            "ALTER TYPE mood RENAME TO feeling FROB",
            vec![],
            vec![name(None, "mood"), name(None, "feeling")],
        ),
        (
            "ALTER TABLE t ALTER COLUMN c TYPE x FROB",
            vec![name(None, "t")],
            vec![],
        ),
        (
            "CREATE DOMAIN app.cents AS bigint FROB",
            vec![],
            vec![name(Some("app"), "cents")],
        ),
        ("UPDATE t SET x = 'CREATE TABLE y' FROB", vec![], vec![]),
        ("PRAGMA foreign_keys = ON", vec![], vec![]),
    ];
    for (sql, tables, types) in cases {
        assert_eq!(
            touched(sql),
            Touched {
                tables,
                types,
                nameless_table: false
            },
            "{sql}"
        );
    }
    assert!(touched("CREATE TABLE (a INT)").nameless_table);
}

#[test]
fn dropping_a_schema_with_cascade_drops_its_tables() {
    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "CREATE SCHEMA app;\nCREATE SCHEMA keep;\n\
         CREATE TABLE app.a (x INT);\nCREATE TABLE keep.b (x INT);\n\
         CREATE TYPE app.e AS ENUM ('A');\n\
         DROP SCHEMA app CASCADE;\nDROP SCHEMA keep;\n",
    )]);
    let catalog = read_catalog(dir.path());
    assert!(matches!(
        catalog.table("app.a"),
        Lookup::Missing { certain: true }
    ));
    assert!(matches!(
        catalog.type_def("app.e"),
        Lookup::Missing { certain: true }
    ));
    assert!(matches!(catalog.table("keep.b"), Lookup::Found(_)));
}

#[test]
fn views_and_select_into_exist_with_unknown_columns() {
    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "CREATE TABLE orders (id INT, status TEXT);\n\
         CREATE VIEW open_orders AS SELECT * FROM orders WHERE status = 'OPEN';\n\
         SELECT id INTO archived_orders FROM orders;\n\
         CREATE VIEW gone AS SELECT 1;\nDROP VIEW gone;\n",
    )]);
    let catalog = read_catalog(dir.path());
    for name in ["open_orders", "archived_orders"] {
        let t = table(&catalog, name);
        assert!(!t.is_certain(), "{name}");
        assert!(matches!(t.column("id"), Lookup::Missing { certain: false }));
    }
    assert!(matches!(
        catalog.table("gone"),
        Lookup::Missing { certain: true }
    ));
    assert!(table(&catalog, "orders").is_certain());
}

#[test]
fn sqlite_names_in_another_case_still_find_their_column() {
    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "CREATE TABLE \"Jobs\" (\"State\" TEXT CHECK (\"State\" IN ('A', 'B')), \"N\" INT);\n\
         ALTER TABLE jobs RENAME COLUMN state TO phase;\n\
         ALTER TABLE JOBS DROP COLUMN n;\n",
    )]);
    let catalog = read_catalog(dir.path());
    // Created quoted, altered unquoted: one table to SQLite, which compares names ignoring case.
    let jobs = table(&catalog, "Jobs");
    assert_eq!(names(jobs), vec!["phase"]);
    assert_eq!(
        values(column(jobs, "phase").allowed_values()),
        Some(vec!["A", "B"])
    );
}

#[test]
fn dropping_a_column_drops_every_check_that_mentions_it() {
    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "CREATE TABLE t (status TEXT, reason TEXT,\n\
           CHECK (status IN ('A', 'B') AND reason IS NOT NULL),\n\
           CHECK (status IN ('A', 'B', 'C')));\n\
         ALTER TABLE t DROP COLUMN reason;\n",
    )]);
    let catalog = read_catalog(dir.path());
    assert_eq!(
        values(column(table(&catalog, "t"), "status").allowed_values()),
        Some(vec!["A", "B", "C"])
    );
}

const MYSQL_INIT: &str = r#"
-- Orders: the states are the column's ENUM; refunds keep theirs in a CHECK.
CREATE TABLE `orders` (
  `id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  `order_no` VARCHAR(64) NOT NULL,
  `user_id` BIGINT NOT NULL,
  `status` ENUM('PENDING', 'PAID', 'SHIPPED') NOT NULL DEFAULT 'PENDING',
  `amount_cents` BIGINT NOT NULL,
  `express` TINYINT(1) NOT NULL DEFAULT 0,
  `note` TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin COMMENT 'the customer\'s; words',
  `created_at` DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (`id`),
  UNIQUE KEY `orders_order_no` (`order_no`),
  KEY `orders_by_user` (`user_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE refunds (
  id INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  order_no VARCHAR(64) NOT NULL,
  state VARCHAR(16) NOT NULL,
  CONSTRAINT refund_state CHECK (state IN ('REQUESTED', 'SENT', 'FAILED'))
) ENGINE=InnoDB;
"#;

#[test]
fn mysql_migrations_replay_into_tables_columns_and_states() {
    let dir = crate_with(&[("migrations/1_init.sql", MYSQL_INIT)]);
    let catalog = read_catalog(dir.path());
    assert!(
        catalog.unreadable().is_empty(),
        "{:?}",
        catalog.unreadable()
    );
    assert_eq!(catalog.database(), Some(Database::Mysql));

    let orders = table(&catalog, "orders");
    assert!(orders.is_certain());
    assert_eq!(
        names(orders),
        vec![
            "id",
            "order_no",
            "user_id",
            "status",
            "amount_cents",
            "express",
            "note",
            "created_at"
        ]
    );
    assert_eq!(orders.primary_key(), ["id".to_owned()]);
    assert!(
        orders.is_unique(&["order_no"]),
        "UNIQUE KEY in CREATE TABLE"
    );
    assert!(!orders.is_unique(&["user_id"]), "a KEY is no unique key");

    let status = column(orders, "status");
    assert_eq!(status.family(Database::Mysql), TypeFamily::Text);
    assert_eq!(
        status.allowed_values(),
        &AllowedValues::Only {
            values: ["PENDING", "PAID", "SHIPPED"].map(String::from).to_vec(),
            sources: vec![ValueSource::InlineEnum],
        }
    );
    let id = column(orders, "id");
    assert!(id.has_default(), "AUTO_INCREMENT fills it in");
    assert_eq!(id.family(Database::Mysql), TypeFamily::Int64);
    assert_eq!(
        column(orders, "express").family(Database::Mysql),
        TypeFamily::Int8
    );
    assert_eq!(
        column(orders, "created_at").family(Database::Mysql),
        TypeFamily::Timestamp
    );
    assert_eq!(column(orders, "note").allowed_values(), &AllowedValues::Any);

    let refunds = table(&catalog, "refunds");
    assert_eq!(refunds.primary_key(), ["id".to_owned()]);
    assert!(column(refunds, "id").has_default());
    assert!(matches!(
        column(refunds, "state").allowed_values(),
        AllowedValues::Only { values, sources }
            if values == &["REQUESTED", "SENT", "FAILED"]
                && sources == &[ValueSource::Check("refund_state".into())]
    ));
}

#[test]
fn mysql_modify_change_and_rename_columns() {
    let dir = crate_with(&[
        ("migrations/1_init.sql", MYSQL_INIT),
        (
            "migrations/2_refunding.sql",
            r#"
            -- The ENUM grows a state; the note becomes required and moves.
            ALTER TABLE orders MODIFY COLUMN status
                ENUM('PENDING', 'PAID', 'SHIPPED', 'REFUNDED') NOT NULL DEFAULT 'PENDING';
            ALTER TABLE orders MODIFY note VARCHAR(200) NOT NULL AFTER order_no;
            ALTER TABLE orders CHANGE COLUMN amount_cents amount BIGINT NOT NULL FIRST;
            ALTER TABLE orders CHANGE order_no order_number VARCHAR(64) NOT NULL;
            ALTER TABLE refunds RENAME COLUMN state TO phase;
            ALTER TABLE refunds CHANGE phase phase VARCHAR(16) NULL;
            "#,
        ),
    ]);
    let catalog = read_catalog(dir.path());
    assert!(
        catalog.unreadable().is_empty(),
        "{:?}",
        catalog.unreadable()
    );
    let orders = table(&catalog, "orders");
    assert!(orders.is_certain());
    assert_eq!(
        names(orders),
        vec![
            "amount",
            "id",
            "order_number",
            "note",
            "user_id",
            "status",
            "express",
            "created_at"
        ]
    );
    assert_eq!(
        values(column(orders, "status").allowed_values()),
        Some(vec!["PENDING", "PAID", "SHIPPED", "REFUNDED"]),
        "MODIFY defines the ENUM anew"
    );
    let note = column(orders, "note");
    assert!(note.not_null());
    assert_eq!(note.declared_type(), "VARCHAR(200)");
    assert!(
        orders.is_unique(&["order_number"]),
        "a key follows its column's new name"
    );
    assert!(matches!(
        orders.column("order_no"),
        Lookup::Missing { certain: true }
    ));

    // The CHECK follows the column through both renames; `NULL` loosens it.
    let refunds = table(&catalog, "refunds");
    let phase = column(refunds, "phase");
    assert!(!phase.not_null());
    assert_eq!(
        values(phase.allowed_values()),
        Some(vec!["REQUESTED", "SENT", "FAILED"])
    );

    // A MODIFY to a type that is no ENUM drops the list; the column's own CHECK goes with its
    // old definition, as MariaDB drops it.
    let dir = crate_with(&[
        ("migrations/1_init.sql", MYSQL_INIT),
        (
            "migrations/2_free.sql",
            "ALTER TABLE orders MODIFY status VARCHAR(16) NOT NULL;\n\
             ALTER TABLE refunds ADD COLUMN reason VARCHAR(8) CHECK (reason IN ('LATE', 'LOST'));\n\
             ALTER TABLE refunds MODIFY reason VARCHAR(16);\n",
        ),
    ]);
    let catalog = read_catalog(dir.path());
    assert_eq!(
        column(table(&catalog, "orders"), "status").allowed_values(),
        &AllowedValues::Any
    );
    assert_eq!(
        column(table(&catalog, "refunds"), "reason").allowed_values(),
        &AllowedValues::Any
    );
}

/// Unique keys declared every way MySQL has, named and not; `batch` has a plain KEY of that
/// name too, so the unique key on it is named `batch_2`.
const MYSQL_PAYMENTS: &str = r#"
CREATE TABLE `payments` (
  `id` BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  `ref` VARCHAR(64) NOT NULL UNIQUE,
  `provider` VARCHAR(16) NOT NULL,
  `external_id` VARCHAR(64) NOT NULL,
  `batch` INT NOT NULL,
  KEY `batch` (`batch`),
  UNIQUE (`batch`),
  UNIQUE KEY `by_provider` (`provider`, `external_id`)
) ENGINE=InnoDB;
ALTER TABLE payments ADD UNIQUE (provider);
"#;

#[test]
fn mysql_unique_keys_come_and_go_by_their_names() {
    let dir = crate_with(&[
        ("migrations/1_init.sql", MYSQL_INIT),
        ("migrations/2_keys.sql", MYSQL_PAYMENTS),
        (
            "migrations/3_more_keys.sql",
            r#"
            ALTER TABLE payments ADD UNIQUE KEY payments_external (external_id);
            ALTER TABLE payments ADD CONSTRAINT payments_id_batch UNIQUE (id, batch);
            CREATE TABLE tickets (id SERIAL, code TEXT);
            "#,
        ),
    ]);
    let catalog = read_catalog(dir.path());
    assert!(
        catalog.unreadable().is_empty(),
        "{:?}",
        catalog.unreadable()
    );
    let payments = table(&catalog, "payments");
    for key in [
        &["ref"][..],
        &["batch"],
        &["provider", "external_id"],
        &["provider"],
        &["external_id"],
        &["id", "batch"],
    ] {
        assert!(payments.is_unique(key), "{key:?}");
    }
    assert!(
        payments.is_unique(&["Provider"]),
        "MySQL compares column names ignoring case"
    );
    let tickets = table(&catalog, "tickets");
    assert!(tickets.is_unique(&["id"]), "SERIAL is UNIQUE on MySQL");
    assert!(column(tickets, "id").not_null() && column(tickets, "id").has_default());

    let dir = crate_with(&[
        ("migrations/1_init.sql", MYSQL_INIT),
        ("migrations/2_keys.sql", MYSQL_PAYMENTS),
        (
            "migrations/3_drop.sql",
            r#"
            -- By the name given; by the name MySQL gave (the first column's); `batch` names the
            -- plain KEY, so the unique key on it stays.
            ALTER TABLE payments DROP INDEX by_provider;
            DROP INDEX `ref` ON payments;
            ALTER TABLE payments DROP INDEX batch;
            ALTER TABLE payments DROP INDEX provider;
            DROP INDEX orders_order_no ON `orders`;
            "#,
        ),
    ]);
    let catalog = read_catalog(dir.path());
    assert!(
        catalog.unreadable().is_empty(),
        "{:?}",
        catalog.unreadable()
    );
    let payments = table(&catalog, "payments");
    assert!(!payments.is_unique(&["provider", "external_id"]));
    assert!(!payments.is_unique(&["ref"]));
    assert!(!payments.is_unique(&["provider"]));
    assert!(payments.is_unique(&["batch"]));
    assert!(!table(&catalog, "orders").is_unique(&["order_no"]));
}

#[test]
fn mysql_table_names_keep_their_case() {
    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "CREATE TABLE Orders (id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, Status TEXT);\n\
         ALTER TABLE Orders ADD COLUMN Note TEXT;\n",
    )]);
    let catalog = read_catalog(dir.path());
    assert_eq!(catalog.database(), Some(Database::Mysql));
    let orders = table(&catalog, "Orders");
    assert!(matches!(catalog.table("orders"), Lookup::OtherCase(_)));
    // Column names are the same name in any case on MySQL: they are folded as elsewhere.
    assert_eq!(names(orders), vec!["id", "status", "note"]);

    // Without a word of MySQL's, names fold as PostgreSQL folds them.
    let dir = crate_with(&[("migrations/1_init.sql", "CREATE TABLE Orders (id INT);\n")]);
    let catalog = read_catalog(dir.path());
    assert!(matches!(catalog.table("orders"), Lookup::Found(_)));
}

#[test]
fn mysql_table_options_change_nothing_and_what_cannot_be_read_is_uncertain() {
    let dir = crate_with(&[
        ("migrations/1_init.sql", MYSQL_INIT),
        (
            "migrations/2_options.sql",
            "ALTER TABLE orders ENGINE=InnoDB;\n\
             ALTER TABLE `orders` CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;\n\
             ALTER TABLE refunds AUTO_INCREMENT = 1000, COMMENT = 'refunds; by order';\n\
             ALTER TABLE refunds DROP CHECK refund_state;\n",
        ),
    ]);
    let catalog = read_catalog(dir.path());
    let lines: Vec<usize> = catalog.unreadable().iter().map(|u| u.line).collect();
    assert_eq!(lines, vec![4], "{:?}", catalog.unreadable());
    assert!(table(&catalog, "orders").is_certain());
    let refunds = table(&catalog, "refunds");
    assert!(!refunds.is_certain(), "`DROP CHECK` is not read");
    assert_eq!(
        column(refunds, "state").allowed_values(),
        &AllowedValues::Unknown
    );
}

#[test]
fn a_mysql_file_the_parser_rejects_is_split_as_mysql_reads_it() {
    // A backslash escapes the quote, `#` starts a comment: neither `;` ends a statement.
    let dir = crate_with(&[(
        "migrations/1_init.sql",
        "CREATE TABLE `a` (x TEXT COMMENT 'it\\'s; here');\n\
         # a comment; with a semicolon\n\
         ALTER TABLE a DROP KEY k;\n\
         CREATE TABLE b (y INT UNSIGNED);\n",
    )]);
    let catalog = read_catalog(dir.path());
    let lines: Vec<usize> = catalog.unreadable().iter().map(|u| u.line).collect();
    assert_eq!(lines, vec![3], "{:?}", catalog.unreadable());
    assert!(!table(&catalog, "a").is_certain(), "`DROP KEY` is not read");
    assert_eq!(names(table(&catalog, "a")), vec!["x"]);
    assert_eq!(names(table(&catalog, "b")), vec!["y"]);
    assert!(table(&catalog, "b").is_certain());
}
