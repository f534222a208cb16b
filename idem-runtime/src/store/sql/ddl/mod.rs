//! The DDL of the SQL stores' tables: one file per database, and what writes it for another
//! table name. Public as [`crate::store::schema`]; the engine creates its tables from it.

mod mysql;
mod postgres;
mod sqlite;

use super::ident::{base_name, quote_table};
use crate::error::{Error, Result};

pub use self::mysql::*;
pub use self::postgres::*;
pub use self::sqlite::*;

/// The default name of the records table.
pub const RECORDS_TABLE: &str = "idem_records";

/// The format of the records the SQL stores keep: which columns a record has and what each
/// holds. A records table names its format in its own definition (PostgreSQL's and MySQL's
/// comment on the table, a comment in SQLite's `CREATE TABLE`), so that a later version can
/// tell a table of an earlier format and migrate it, and an earlier version refuses to open a
/// table of a later one instead of misreading it. A table that names no format was created
/// before formats were named, and is format 1 once migrated.
pub const RECORDS_FORMAT: u32 = 1;

/// How a records table's definition names its format: this text, then the number.
pub(crate) const FORMAT_MARK: &str = "idem records, format ";

/// The format a records table's comment or definition names, if it names one.
pub(crate) fn format_in(text: &str) -> Option<u32> {
    let (_, after) = text.split_once(FORMAT_MARK)?;
    let digits = after.bytes().take_while(u8::is_ascii_digit).count();
    after[..digits].parse().ok()
}

/// The default name of the outbox table.
pub const OUTBOX_TABLE: &str = "idem_outbox";

/// The completers' index: resumable claims in progress, by when they may be resumed (the column
/// is set only on those).
pub(super) const RESUME_INDEX: &str = "CREATE INDEX IF NOT EXISTS \"idem_records_resume_at_idx\" ON \"idem_records\" (resume_at) WHERE resume_at IS NOT NULL";

/// The operators' index of unfinished work: the records that may hold it (a stored request, a
/// note), by their first claim. A completion of a claim that held none changes no column it
/// names, so on PostgreSQL it stays a heap-only update.
pub(super) const WORK_INDEX: &str = "CREATE INDEX IF NOT EXISTS \"idem_records_work_idx\" ON \"idem_records\" (fence) WHERE request IS NOT NULL OR note IS NOT NULL";

pub(super) const PENDING_INDEX: &str = "CREATE INDEX IF NOT EXISTS \"idem_outbox_pending_idx\" ON \"idem_outbox\" (partition_key, seq) WHERE sent_at IS NULL";
pub(super) const SENT_INDEX: &str = "CREATE INDEX IF NOT EXISTS \"idem_outbox_sent_idx\" ON \"idem_outbox\" (sent_at) WHERE sent_at IS NOT NULL";
pub(super) const PARKED_INDEX: &str = "CREATE INDEX IF NOT EXISTS \"idem_outbox_parked_idx\" ON \"idem_outbox\" (seq) WHERE parked_at IS NOT NULL AND sent_at IS NULL";

// The one value by which the stores, the SQL macros and their schema checker name a database.
pub use idem_schema::Database;

/// `db`'s tables' DDL, with the default names; `None` for a database this version has no
/// tables for.
fn tables(db: Database) -> Option<Tables> {
    Some(match db {
        Database::Postgres => Tables {
            records: POSTGRES_RECORDS,
            outbox: POSTGRES_OUTBOX,
            qualified: true,
            quote: '"',
        },
        Database::Sqlite => Tables {
            records: SQLITE_RECORDS,
            outbox: SQLITE_OUTBOX,
            qualified: false,
            quote: '"',
        },
        Database::Mysql => Tables {
            records: MYSQL_RECORDS,
            outbox: MYSQL_OUTBOX,
            qualified: true,
            quote: '`',
        },
        _ => return None,
    })
}

/// One database's tables, as its file writes them.
struct Tables {
    records: &'static [&'static str],
    outbox: &'static [&'static str],
    /// Whether a table name may be `schema.table`.
    qualified: bool,
    /// What quotes an identifier in its DDL.
    quote: char,
}

/// The statements that create the records table `table` (an identifier, checked;
/// `schema.table` on PostgreSQL) and its indexes.
pub fn records(db: Database, table: &str) -> Result<Vec<String>> {
    let Tables {
        records: statements,
        qualified,
        quote: q,
        ..
    } = tables(db).ok_or_else(|| no_tables(db))?;
    // Identifiers are checked: none holds a quote of either kind.
    let quoted = quote_table(table, qualified)?.replace('"', &q.to_string());
    let base = base_name(table);
    let state_domain = state_domain(table, q);
    Ok(statements
        .iter()
        .map(|s| {
            rename(s, q, |ident, _| match ident {
                RECORDS_TABLE => Some(quoted.clone()),
                "idem_records_state" => Some(state_domain.clone()),
                "idem_records_expires_at_idx" => Some(format!("{q}{base}_expires_at_idx{q}")),
                "idem_records_resume_at_idx" => Some(format!("{q}{base}_resume_at_idx{q}")),
                "idem_records_work_idx" => Some(format!("{q}{base}_work_idx{q}")),
                _ => None,
            })
        })
        .collect())
}

/// The domain of the `state` column of the records table `table` (checked), quoted, in the
/// table's schema: `<table>_state`. Only PostgreSQL's DDL names one.
pub(crate) fn state_domain(table: &str, q: char) -> String {
    let (schema, base) = match table.rsplit_once('.') {
        Some((schema, base)) => (Some(schema), base),
        None => (None, table),
    };
    let name = format!("{q}{base}_state{q}");
    match schema {
        Some(schema) => format!("{q}{schema}{q}.{name}"),
        None => name,
    }
}

/// The statements that create the outbox table `table` (an identifier, checked; `schema.table`
/// on PostgreSQL and MySQL) and its indexes, the parked events' index last where it is a
/// statement of its own (a migration creates it once the columns it covers are there; MySQL
/// declares its indexes in the table). PostgreSQL adds [`outbox_notify`].
pub fn outbox(db: Database, table: &str) -> Result<Vec<String>> {
    let Tables {
        outbox: statements,
        qualified,
        quote: q,
        ..
    } = tables(db).ok_or_else(|| no_tables(db))?;
    let quoted = quote_table(table, qualified)?.replace('"', &q.to_string());
    let base = base_name(table);
    Ok(statements
        .iter()
        .map(|s| {
            rename(s, q, |ident, _| match ident {
                OUTBOX_TABLE => Some(quoted.clone()),
                "idem_outbox_pending_idx" => Some(format!("{q}{base}_pending_idx{q}")),
                "idem_outbox_sent_idx" => Some(format!("{q}{base}_sent_idx{q}")),
                "idem_outbox_parked_idx" => Some(format!("{q}{base}_parked_idx{q}")),
                _ => None,
            })
        })
        .collect())
}

fn no_tables(db: Database) -> Error {
    Error::Config(format!("idem has no tables for {} yet", db.title()))
}

/// PostgreSQL's `NOTIFY` function and trigger ([`POSTGRES_OUTBOX_NOTIFY`]) for the outbox table
/// `table`: the function `<table>_notify` in the table's schema, the channel `<base>_wake`,
/// where `<base>` is the table's name without its schema.
pub fn outbox_notify(table: &str) -> Result<Vec<String>> {
    let quoted = quote_table(table, true)?;
    let base = base_name(table);
    let function = match table.rsplit_once('.') {
        Some((schema, base)) => format!("\"{schema}\".\"{base}_notify\""),
        None => format!("\"{table}_notify\""),
    };
    let channel = notify_channel(table);
    Ok(POSTGRES_OUTBOX_NOTIFY
        .iter()
        .map(|s| {
            rename(s, '"', |ident, called| match (ident, called) {
                (OUTBOX_TABLE, _) => Some(quoted.clone()),
                ("idem_outbox_notify", true) => Some(function.clone()),
                ("idem_outbox_notify", false) => Some(format!("\"{base}_notify\"")),
                _ => None,
            })
            // A channel is a string literal; identifiers never hold a quote, so the only one
            // is the template's own.
            .replace("'idem_outbox_wake'", &format!("'{channel}'"))
        })
        .collect())
}

/// The `NOTIFY` channel of the outbox table `table`.
pub(crate) fn notify_channel(table: &str) -> String {
    format!("{}_wake", base_name(table))
}

/// `statements` as one script: each ends with `;`, a blank line between two.
pub fn script<S: AsRef<str>>(statements: &[S]) -> String {
    statements
        .iter()
        .map(|s| format!("{};\n", s.as_ref()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `template` with each identifier quoted by `quote` (`"name"`, or `` `name` `` on MySQL)
/// replaced by `rename(name, called)` (kept
/// when it answers `None`), where `called` says whether a `(` follows it (a function). One
/// pass, so a replacement is never renamed again.
fn rename(template: &str, quote: char, rename: impl Fn(&str, bool) -> Option<String>) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(open) = rest.find(quote) {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find(quote) else {
            out.push_str(&rest[open..]);
            return out;
        };
        let ident = &after[..close];
        let tail = &after[close + 1..];
        match rename(ident, tail.starts_with('(')) {
            Some(new) => out.push_str(&new),
            None => out.push_str(&rest[open..open + close + 2]),
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::State;

    #[test]
    fn every_records_table_names_its_format() {
        let mark = format!("{FORMAT_MARK}{RECORDS_FORMAT}");
        for &db in Database::ALL {
            let Ok(ddl) = records(db, "app_recs") else {
                continue;
            };
            let named: Vec<_> = ddl.iter().filter_map(|s| format_in(s)).collect();
            assert_eq!(named, [RECORDS_FORMAT], "{db:?}: {ddl:?}");
            assert!(ddl.iter().any(|s| s.contains(&mark)));
        }
        assert_eq!(format_in("idem records, format 12, and more"), Some(12));
        assert_eq!(format_in("-- idem records, format 3\n scope TEXT"), Some(3));
        assert_eq!(format_in("idem records, format x"), None);
        assert_eq!(format_in("a table of ours"), None);
        assert_eq!(format_in(""), None);
    }

    #[test]
    fn default_names_give_the_constants() {
        for &db in Database::ALL {
            let (records_ddl, outbox_ddl) = match db {
                Database::Postgres => (POSTGRES_RECORDS, POSTGRES_OUTBOX),
                Database::Sqlite => (SQLITE_RECORDS, SQLITE_OUTBOX),
                Database::Mysql => (MYSQL_RECORDS, MYSQL_OUTBOX),
                other => panic!("{other:?} has no DDL here"),
            };
            assert_eq!(records(db, RECORDS_TABLE).unwrap(), records_ddl);
            assert_eq!(outbox(db, OUTBOX_TABLE).unwrap(), outbox_ddl);
        }
        assert_eq!(outbox_notify(OUTBOX_TABLE).unwrap(), POSTGRES_OUTBOX_NOTIFY);
    }

    #[test]
    fn other_names_replace_every_default_name() {
        let all = [
            records(Database::Postgres, "app.recs").unwrap(),
            outbox(Database::Postgres, "app.events").unwrap(),
            outbox_notify("app.events").unwrap(),
        ]
        .concat()
        .join("\n");
        assert!(!all.contains("idem_"), "{all}");
        assert!(all.contains("ON \"app\".\"recs\" (expires_at)"), "{all}");
        assert!(
            all.contains("CREATE DOMAIN \"app\".\"recs_state\" AS text"),
            "{all}"
        );
        assert!(
            all.contains("state \"app\".\"recs_state\" NOT NULL"),
            "{all}"
        );
        let unqualified = records(Database::Postgres, "recs").unwrap().join("\n");
        assert!(
            unqualified.contains("state \"recs_state\" NOT NULL"),
            "{unqualified}"
        );
        assert!(all.contains("\"recs_expires_at_idx\""), "{all}");
        assert!(
            all.contains("FUNCTION \"app\".\"events_notify\"()"),
            "{all}"
        );
        assert!(all.contains("TRIGGER \"events_notify\" AFTER"), "{all}");
        assert!(all.contains("pg_notify('events_wake', '')"), "{all}");
        let lite = outbox(Database::Sqlite, "events").unwrap().join("\n");
        assert!(!lite.contains("idem_") && lite.contains("\"events_parked_idx\""));
        let my = records(Database::Mysql, "app.recs").unwrap().join("\n");
        assert!(!my.contains("idem_") && !my.contains('"'), "{my}");
        assert!(
            my.contains("CREATE TABLE IF NOT EXISTS `app`.`recs` ("),
            "{my}"
        );
        assert!(
            my.contains("INDEX `recs_resume_at_idx` (resume_at, created_at)"),
            "{my}"
        );
        assert!(
            my.contains("INDEX `recs_work_idx` (work_fence, created_at)"),
            "{my}"
        );
        assert!(
            all.contains("\"recs_work_idx\" ON \"app\".\"recs\" (fence)"),
            "{all}"
        );
        let my = outbox(Database::Mysql, "app.events").unwrap().join("\n");
        assert!(!my.contains("idem_") && !my.contains('"'), "{my}");
        assert!(
            my.contains("CREATE TABLE IF NOT EXISTS `app`.`events` ("),
            "{my}"
        );
        for index in ["pending", "sent", "parked"] {
            assert!(
                my.contains(&format!("INDEX `events_{index}_idx` (")),
                "{my}"
            );
        }
    }

    #[test]
    fn table_names_are_checked() {
        assert!(records(Database::Sqlite, "app.recs").is_err());
        assert!(records(Database::Postgres, "x\"; DROP TABLE y; --").is_err());
        assert!(outbox_notify("a b").is_err());
    }

    #[test]
    fn the_state_check_names_every_state() {
        for state in [
            State::InProgress,
            State::Completed,
            State::Released,
            State::Parked,
        ] {
            let quoted = format!("'{}'", state.as_str());
            assert!(POSTGRES_RECORDS[0].contains(&quoted));
            assert!(SQLITE_RECORDS[0].contains(&quoted));
            assert!(MYSQL_RECORDS[0].contains(&quoted));
        }
    }

    #[test]
    fn a_script_ends_every_statement() {
        assert_eq!(script(&["A", "B"]), "A;\n\nB;\n");
    }
}
