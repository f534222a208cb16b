//! `idem schema`: the DDL of the SQL stores' tables, for teams that own their migrations.

use idem::store::schema::{self, Database};
use serde_json::json;

use crate::store::{self, Kind};
use crate::{Failure, output};

/// `idem schema`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The database: `postgres`, `sqlite` or `mysql`, or a store URL naming one. Default: the
    /// database of IDEM_STORE_URL, else DATABASE_URL.
    #[arg(long, value_name = "postgres|sqlite|mysql")]
    store: Option<String>,
    /// The records table (`schema.table` on PostgreSQL and MySQL).
    #[arg(long, value_name = "NAME", default_value = schema::RECORDS_TABLE)]
    table: String,
    /// The outbox table (`schema.table` on PostgreSQL and MySQL).
    #[arg(long, value_name = "NAME", default_value = schema::OUTBOX_TABLE)]
    outbox_table: String,
    /// Print one JSON document: the statements of each table, in order.
    #[arg(long)]
    json: bool,
}

/// Prints the statements that create the records and outbox tables.
pub(crate) fn run(args: Args) -> Result<(), Failure> {
    let db = database(args.store.as_deref())?;
    let records = schema::records(db, &args.table)?;
    let outbox = schema::outbox(db, &args.outbox_table)?;
    let notify = match db {
        Database::Postgres => schema::outbox_notify(&args.outbox_table)?,
        _ => Vec::new(),
    };
    if args.json {
        return output::json(&json!({
            "database": db.as_str(),
            "records": records,
            "outbox": outbox,
            "outbox_notify": notify,
        }));
    }
    let name = db.title();
    let mut text = format!(
        "-- idem's tables on {name}: every statement is safe to run again, and the stores \
         create\n-- their tables from this very text.\n\n-- Idempotency records: one row per \
         (scope, key).\n{}",
        schema::script(&records)
    );
    text.push_str(&format!(
        "\n-- The transactional outbox: events enqueued with the state change, published by \
         relays.\n{}",
        schema::script(&outbox)
    ));
    if !notify.is_empty() {
        text.push_str(&format!(
            "\n-- Wakes outbox relays (LISTEN) when an enqueuing transaction commits.\n{}",
            schema::script(&notify)
        ));
    }
    print!("{text}");
    Ok(())
}

/// The database `--store` names, by name or by a URL (the default store URL when absent).
fn database(flag: Option<&str>) -> Result<Database, Failure> {
    match flag.map(str::to_ascii_lowercase).as_deref() {
        Some("postgres" | "postgresql" | "pg") => return Ok(Database::Postgres),
        Some("sqlite") => return Ok(Database::Sqlite),
        Some("mysql" | "mariadb") => return Ok(Database::Mysql),
        _ => {}
    }
    let url = store::resolve(flag).map_err(|_| {
        Failure::Usage(
            "say which database: --store postgres, --store sqlite or --store mysql".into(),
        )
    })?;
    match store::kind(&url)? {
        Kind::Postgres => Ok(Database::Postgres),
        Kind::Sqlite => Ok(Database::Sqlite),
        Kind::Mysql => Ok(Database::Mysql),
        Kind::Redis | Kind::RedisCluster => Err(Failure::Usage(
            "a Redis store has no schema to create: each record is a hash, created by the \
             store as it is used"
                .into(),
        )),
    }
}
