//! The SQL macros against the user's migrations, with no database: the table exists, every
//! column the attribute names exists, the states are values the state column allows, and each
//! argument's type fits its column.
//!
//! The migrations are the crate's `migrations/` (or the directory its `sqlx.toml` names), or
//! what `migrations = "…"` names (a directory, or one `.sql` schema file, relative to the file
//! the attribute is in, as for `include_str!`); `migrations = false` checks nothing. With no
//! migrations, nothing is checked and nothing is said.
//!
//! A problem with something a statement that could not be read may have changed is a warning,
//! never an error: the check must not refuse a program the database would accept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote_spanned};
use syn::LitStr;

use super::decl::FnArg;
use super::target::Target;
use crate::ctxt::Ctxt;
use crate::krate::Krate;
use idem_schema::{
    self as schema, AllowedValues, Catalog, Column, Database, Lookup, Migrations, SchemaError,
    Table, TypeFamily, ValueSource,
};

/// Where the attribute being expanded is.
pub(crate) struct Origin {
    /// The crate's root: where its `migrations/` and `sqlx.toml` are.
    pub(crate) manifest_dir: Option<PathBuf>,
    /// The file the attribute is written in: `migrations = "…"` is relative to it.
    pub(crate) file: Option<PathBuf>,
}

/// `migrations = "…"` or `migrations = false`.
pub(crate) enum MigrationsArg {
    Path(LitStr),
    Off,
}

/// The migrations an attribute is checked against, and the database they are for.
pub(crate) struct Schema {
    pub(crate) catalog: Arc<Catalog>,
    /// From the executor's type (`PgPool`, `sqlx::Sqlite`, `MySqlConnection`), else from the
    /// migrations' text.
    pub(crate) database: Option<Database>,
    /// Where they are, as the user would name them: for messages.
    pub(crate) place: String,
}

/// The migrations for one attribute, or `None` when there are none or the check is off.
pub(crate) fn load(
    arg: Option<&MigrationsArg>,
    origin: &Origin,
    executor: Option<&FnArg>,
    cx: &mut Ctxt,
) -> Option<Schema> {
    let manifest_dir = origin.manifest_dir.as_deref()?;
    let (explicit, place) = match arg {
        Some(MigrationsArg::Off) => return None,
        // Without the file (an IDE that does not say), a relative path means nothing.
        Some(MigrationsArg::Path(lit)) => {
            let dir = origin.file.as_deref()?.parent()?;
            (Some((dir.join(lit.value()), lit)), lit.value())
        }
        None => (None, "migrations".to_owned()),
    };
    let found = schema::load(manifest_dir, explicit.as_ref().map(|(p, _)| p.as_path()));
    let catalog = match found {
        Ok(Migrations::None) => return None,
        Ok(Migrations::Found(catalog)) => catalog,
        Err(e) => {
            let span = explicit.map_or_else(Span::call_site, |(_, lit)| lit.span());
            cx.at(span, unreadable(&e, manifest_dir, origin));
            return None;
        }
    };
    let database = executor
        .and_then(|e| database_of(&e.ty))
        .or(catalog.database());
    Some(Schema {
        catalog,
        database,
        place,
    })
}

/// The database an executor's type names (`&PgPool`, `&mut SqliteConnection`,
/// `&mut Transaction<'_, MySql>`, `impl Acquire<'_, Database = Postgres>`), if it names one
/// and no other.
fn database_of(ty: &syn::Type) -> Option<Database> {
    let mut named = None;
    for ident in idents(ty.to_token_stream()) {
        let ident = ident.to_string();
        let database = if ident.starts_with("Pg") || ident.starts_with("Postgres") {
            Database::Postgres
        } else if ident.starts_with("Sqlite") {
            Database::Sqlite
        } else if ident.starts_with("MySql") || ident.starts_with("Mysql") {
            Database::Mysql
        } else {
            continue;
        };
        if named.is_some_and(|n| n != database) {
            return None;
        }
        named = Some(database);
    }
    named
}

/// Every identifier in `tokens`, in groups too.
fn idents(tokens: TokenStream) -> Vec<proc_macro2::Ident> {
    let mut out = Vec::new();
    for tree in tokens {
        match tree {
            proc_macro2::TokenTree::Ident(ident) => out.push(ident),
            proc_macro2::TokenTree::Group(group) => out.extend(idents(group.stream())),
            _ => {}
        }
    }
    out
}

/// Why the migrations could not be read, and what to do about it.
fn unreadable(e: &SchemaError, manifest_dir: &Path, origin: &Origin) -> String {
    let relative = |p: &Path| {
        p.strip_prefix(manifest_dir)
            .map_or_else(|_| p.display().to_string(), |r| r.display().to_string())
    };
    match e {
        SchemaError::NotFound { path } => {
            let from_root = origin
                .file
                .as_deref()
                .and_then(Path::parent)
                .and_then(|dir| path.strip_prefix(dir).ok())
                .map(|written| manifest_dir.join(written))
                .filter(|p| p.exists());
            let hint = match (from_root, origin.file.as_deref().and_then(Path::parent)) {
                (Some(p), Some(dir)) => format!(
                    ": `migrations` is relative to this file, as for `include_str!`, and `{}` is relative to the crate's root; from here it is `{}`",
                    relative(&p),
                    relative_from(dir, &p)
                ),
                _ => ": `migrations` names a directory of sqlx migrations or one `.sql` schema file, relative to this file, as for `include_str!`".to_owned(),
            };
            let written = origin
                .file
                .as_deref()
                .and_then(Path::parent)
                .and_then(|dir| path.strip_prefix(dir).ok())
                .map_or_else(|| relative(path), |p| p.display().to_string());
            format!("no migrations at `{written}`{hint}")
        }
        other => format!(
            "{other}: the migrations are checked as sqlx reads them. Fix it, or turn the check off with `migrations = false`"
        ),
    }
}

/// `to`, written relative to `from`.
fn relative_from(from: &Path, to: &Path) -> String {
    let (from, to): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    to[common..].iter().for_each(|c| out.push(c));
    out.display().to_string()
}

/// What the checks leave for the expansion.
#[derive(Default)]
pub(crate) struct Findings {
    /// `include_bytes!` of every migration, and a type check for each column argument.
    pub(crate) tokens: TokenStream,
    /// Columns of a PostgreSQL enum type, with the quoted type: a text value is cast to it.
    pub(crate) casts: BTreeMap<String, String>,
    /// The values the state column allows, and what says so: every state of a machine must be
    /// one of them.
    pub(crate) allowed: Option<(Vec<String>, String)>,
}

/// One attribute's checks against the migrations.
pub(crate) struct Checker<'s> {
    schema: &'s Schema,
    table: Option<&'s Table>,
    krate: Krate,
    pub(crate) findings: Findings,
}

impl<'s> Checker<'s> {
    /// Finds the target's table; reports it (on `lit`, the `table` argument) when it is not
    /// there.
    pub(crate) fn new(
        schema: &'s Schema,
        target: &Target,
        lit: Option<&LitStr>,
        cx: &mut Ctxt,
    ) -> Checker<'s> {
        let span = lit.map_or_else(Span::call_site, LitStr::span);
        let mut findings = Findings::default();
        for input in schema.catalog.inputs() {
            let path = LitStr::new(&input.display().to_string(), Span::call_site());
            // Cargo rebuilds the crate when a migration changes.
            findings
                .tokens
                .extend(quote_spanned!(Span::mixed_site()=> const _: &[u8] = ::core::include_bytes!(#path);));
        }
        let table = find_table(schema, &target.table.name, span, cx);
        Checker {
            schema,
            table,
            krate: target.krate.clone(),
            findings,
        }
    }

    /// The column `name`, reported at `span` when it is not a column of the table.
    pub(crate) fn column(&self, name: &str, span: Span, cx: &mut Ctxt) -> Option<&'s Column> {
        let table = self.table?;
        match table.column(name) {
            Lookup::Found(c) => Some(c),
            Lookup::OtherCase(c) => {
                let found = Named::Column(c.name(), table);
                report_case(self.schema, name, found, span, cx);
                Some(c)
            }
            Lookup::Ambiguous(_) => {
                cx.at(
                    span,
                    format_args!(
                        "`{}` has more than one column named `{name}` but for case: write it as the migration does",
                        table.name()
                    ),
                );
                None
            }
            Lookup::Missing { certain } => {
                let near = schema::nearest(name, table.column_names())
                    .map(|n| format!(": did you mean `{n}`?"))
                    .unwrap_or_else(|| {
                        format!("; its columns are {}", listed(table.column_names()))
                    });
                let msg = format!(
                    "table `{}` has no column `{name}` ({}){near}",
                    table.name(),
                    origin(table)
                );
                report(certain, &self.schema.catalog, span, msg, cx);
                None
            }
        }
    }

    /// Whether `column` is of a PostgreSQL enum type, recorded for the statement to cast the
    /// text bound to it.
    pub(crate) fn cast(&mut self, column: &Column) -> bool {
        let family = self.schema.database.map(|d| column.family(d));
        let Some(TypeFamily::Enum(t)) = family else {
            return false;
        };
        // Unqualified when the migration did not qualify it: it resolves through `search_path`
        // as the table's own name does.
        let quoted = if t.schema == schema::DEFAULT_SCHEMA {
            format!("\"{}\"", t.name)
        } else {
            format!("\"{}\".\"{}\"", t.schema, t.name)
        };
        self.findings.casts.insert(column.name().to_owned(), quoted);
        true
    }

    /// Whether the table has the column (in any case), without a report: for a second look at
    /// a column whose absence was reported already.
    pub(crate) fn exists(&self, name: &str) -> bool {
        self.table
            .is_some_and(|t| matches!(t.column(name), Lookup::Found(_) | Lookup::OtherCase(_)))
    }

    /// A type check of `arg` against `column`, on the argument.
    pub(crate) fn value(&mut self, column: &Column, arg: &FnArg) {
        let Some(database) = self.schema.database.filter(|_| column.is_certain()) else {
            return;
        };
        let family = column.family(database);
        let Some(marker) = marker(&family, database) else {
            return;
        };
        let (ident, span) = (&arg.ident, arg.ident.span());
        let p = self.krate.private_at(span);
        let f = syn::Ident::new(marker, span);
        self.findings.tokens.extend(quote_spanned! {span=> {
            #[allow(unused_imports)]
            use #p::columns::{KnownType as _, OtherType as _};
            (&#p::columns::column::<#p::columns::#f::Column, _>(&#ident))
                .rule()
                .fits(&#ident);
        }});
    }

    /// Each state (`from`, `to`) is a value the state column allows; the values are kept for
    /// the check of a machine's states.
    pub(crate) fn states(&mut self, column: &Column, states: &[&LitStr], cx: &mut Ctxt) {
        let AllowedValues::Only { values, sources } = column.allowed_values() else {
            return;
        };
        let Some(table) = self.table else { return };
        let said = format!(
            "{} allows {}",
            sources_text(&self.schema.catalog, table, sources),
            listed(values.iter().map(String::as_str))
        );
        for lit in states {
            let state = lit.value();
            if values.contains(&state) {
                continue;
            }
            let near = schema::nearest(&state, values.iter().map(String::as_str)).map_or_else(
                || ". Write one of them, or allow it in a migration".to_owned(),
                |n| format!(": did you mean `{n}`?"),
            );
            let msg = format!(
                "`{state}` is not a value of `{}.{}`: {said}{near}",
                table.name(),
                column.name()
            );
            report(
                column.is_certain(),
                &self.schema.catalog,
                lit.span(),
                msg,
                cx,
            );
        }
        if column.is_certain() {
            self.findings.allowed = Some((values.clone(), said));
        }
    }

    /// An `INSERT` of `inserted` leaves out no column that needs a value.
    pub(crate) fn insert(
        &self,
        inserted: &[&str],
        fn_name: &syn::Ident,
        span: Span,
        cx: &mut Ctxt,
    ) {
        let Some(table) = self.table.filter(|t| t.is_certain()) else {
            return;
        };
        let needed = table
            .columns()
            .iter()
            .filter(|c| c.not_null() && !c.has_default() && c.is_certain())
            .filter(|c| !inserted.iter().any(|i| i.eq_ignore_ascii_case(c.name())));
        for c in needed {
            cx.at(
                span,
                format_args!(
                    "`{fn_name}` does not insert `{}.{}`, which is NOT NULL and has no default ({}): add an argument `{}`",
                    table.name(),
                    c.name(),
                    origin(table),
                    c.name()
                ),
            );
        }
    }

    /// `columns` are a primary key or a unique constraint: `ON CONFLICT (…)` needs one.
    pub(crate) fn unique(&self, columns: &[&str], span: Span, cx: &mut Ctxt) {
        let Some(table) = self.table.filter(|t| t.is_certain()) else {
            return;
        };
        if table.is_unique(columns) {
            return;
        }
        let keys = columns.join(", ");
        let msg = if self.schema.database == Some(Database::Mysql) {
            format!(
                "`{keys}` is not a primary key or a unique key of `{}` ({}): on MySQL only a duplicate key says that a `{keys}` is taken, so every call would insert a row. Add one in a migration (`ALTER TABLE {} ADD UNIQUE ({keys})`), or name the columns of one",
                table.name(),
                origin(table),
                table.name(),
            )
        } else {
            format!(
                "`{keys}` is not a primary key or a unique constraint of `{}` ({}): `ON CONFLICT ({keys})` needs one. Add it in a migration, or name the columns of one",
                table.name(),
                origin(table),
            )
        };
        cx.at(span, msg);
    }

    /// The key columns of an `UPDATE` find one row at most: some of them are a primary key or
    /// a unique constraint. Otherwise one call could move many rows.
    pub(crate) fn unique_key(&self, columns: &[&str], what: &str, span: Span, cx: &mut Ctxt) {
        let Some(table) = self.table.filter(|t| t.is_certain()) else {
            return;
        };
        if table.has_unique_within(columns) {
            return;
        }
        let keys = columns.join(", ");
        let pk = table.primary_key();
        let instead = if pk.is_empty() {
            String::new()
        } else {
            format!(", or key it on the primary key `{}`", pk.join(", "))
        };
        cx.at(
            span,
            format_args!(
                "`{keys}` is not a primary key or a unique constraint of `{}` ({}): the {what}'s `UPDATE … WHERE {}` could match many rows and move every one of them at once. Make it unique in a migration (`CREATE UNIQUE INDEX {}_{}_key ON {} ({keys})`){instead}",
                table.name(),
                origin(table),
                columns
                    .iter()
                    .map(|c| format!("{c} = …"))
                    .collect::<Vec<_>>()
                    .join(" AND "),
                table.name().name,
                columns.join("_"),
                table.name(),
            ),
        );
    }

    /// The column is an integer column, as a version must be.
    pub(crate) fn integer(&self, column: &Column, span: Span, cx: &mut Ctxt) {
        let (Some(table), Some(database)) = (self.table, self.schema.database) else {
            return;
        };
        let family = column.family(database);
        if column.is_certain()
            && !matches!(
                family,
                TypeFamily::Int8 | TypeFamily::Int16 | TypeFamily::Int32 | TypeFamily::Int64
            )
        {
            cx.at(
                span,
                format_args!(
                    "the version column `{}.{}` is `{}` ({}): a version is counted in an integer column",
                    table.name(),
                    column.name(),
                    column.declared_type(),
                    origin(table)
                ),
            );
        }
    }
}

/// The table `name`, reported at `span` when it is not in the migrations.
fn find_table<'s>(schema: &'s Schema, name: &str, span: Span, cx: &mut Ctxt) -> Option<&'s Table> {
    let catalog = &schema.catalog;
    match catalog.table(name) {
        Lookup::Found(t) => Some(t),
        Lookup::OtherCase(t) => {
            report_case(schema, name, Named::Table(t), span, cx);
            Some(t)
        }
        Lookup::Ambiguous(tables) => {
            let names: Vec<String> = tables
                .iter()
                .map(|t| format!("{}.{}", t.name().schema, t.name().name))
                .collect();
            cx.at(
                span,
                format_args!(
                    "`{name}` is a table in more than one schema ({}): write which",
                    listed(names.iter().map(String::as_str))
                ),
            );
            None
        }
        Lookup::Missing { certain } => {
            let names = catalog.table_names();
            let near = schema::nearest(name, names.iter().map(String::as_str))
                .map(|n| format!(": did you mean `{n}`?"))
                .unwrap_or_else(|| {
                    format!(
                        "; its tables are {}",
                        listed(names.iter().map(String::as_str))
                    )
                });
            let msg = format!(
                "no table `{name}` in the migrations ({}){near}",
                schema.place
            );
            report(certain, catalog, span, msg, cx);
            None
        }
    }
}

/// An error when the migrations are certain, else a warning saying why it is not an error.
fn report(certain: bool, catalog: &Catalog, span: Span, msg: String, cx: &mut Ctxt) {
    if certain {
        cx.at(span, msg);
        return;
    }
    let unread: Vec<String> = catalog
        .unreadable()
        .iter()
        .map(|u| format!("{} line {}", u.file, u.line))
        .collect();
    cx.warn(
        span,
        format!(
            "{msg}. Not an error: a statement of the migrations could not be read ({}), and it may have made the difference",
            unread.join(", ")
        ),
    );
}

/// What a name written in another case was found as.
enum Named<'s> {
    Table(&'s Table),
    Column(&'s str, &'s Table),
}

/// A name `written` in another case than the migration's: an error where the database tells
/// the two apart (PostgreSQL, whose generated SQL quotes names; MySQL for a table, whose name is
/// a file's on Linux), nothing where it does not (SQLite; MySQL for a column), and a warning
/// when the database is not known, or when MySQL's migrations could not say how they wrote the
/// name (a table's name is kept as written only in migrations that read as MySQL's).
fn report_case(schema: &Schema, written: &str, found: Named<'_>, span: Span, cx: &mut Ctxt) {
    let (what, name, table) = match found {
        Named::Table(t) => ("table", t.name().to_string(), t),
        Named::Column(c, t) => ("column", c.to_owned(), t),
    };
    let (why, error) = match schema.database {
        Some(Database::Sqlite) => return,
        Some(Database::Mysql) if matches!(found, Named::Column(..)) => return,
        Some(Database::Mysql) => (
            "MySQL on Linux tells table names apart by case (`lower_case_table_names = 0`, its default there)",
            schema.catalog.database() == Some(Database::Mysql),
        ),
        database => (
            "the generated SQL quotes names, so PostgreSQL tells them apart",
            database == Some(Database::Postgres),
        ),
    };
    let msg = format!(
        "{what} `{written}` is `{name}` in the migrations ({}): {why}. Write `{name}`",
        origin(table)
    );
    if error {
        cx.at(span, msg);
    } else {
        cx.warn(span, msg);
    }
}

/// "created in 1_init.sql, last changed in 3_paid.sql".
fn origin(table: &Table) -> String {
    let created = table.created_in();
    match table.altered_in().filter(|a| a.path != created.path) {
        Some(altered) => format!("created in {created}, last changed in {altered}"),
        None => format!("created in {created}"),
    }
}

/// What restricts a column's values: its enum type, its CHECK constraints.
fn sources_text(catalog: &Catalog, table: &Table, sources: &[ValueSource]) -> String {
    let each: Vec<String> = sources
        .iter()
        .map(|s| match s {
            ValueSource::EnumType(name) => match catalog.type_def(&name.to_string()) {
                Lookup::Found(t) => format!("{s} ({})", t.defined_in()),
                _ => s.to_string(),
            },
            ValueSource::InlineEnum => format!("{s} ({})", origin(table)),
            ValueSource::Check(_) => format!("{s} of `{}` ({})", table.name(), origin(table)),
        })
        .collect();
    each.join(" and ")
}

/// "`a`, `b`, `c`", or the first few and how many more.
fn listed<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    let shown: Vec<String> = names.iter().take(12).map(|n| format!("`{n}`")).collect();
    match names.len().checked_sub(shown.len()) {
        Some(0) | None => shown.join(", "),
        Some(more) => format!("{} and {more} more", shown.join(", ")),
    }
}

/// The column-type marker of `idem::__private::columns` for a family, where idem judges it:
/// text, integers, floats, booleans and bytes everywhere; the other types only on PostgreSQL,
/// which converts nothing bound to a column. SQLite stores them as text or numbers, whatever
/// was bound, and MySQL converts text and numbers to them.
fn marker(family: &TypeFamily, database: Database) -> Option<&'static str> {
    Some(match (family, database) {
        (TypeFamily::Text, _) => "TEXT",
        (TypeFamily::Int8, _) => "TINYINT",
        (TypeFamily::Int16, _) => "SMALLINT",
        (TypeFamily::Int32, _) => "INTEGER",
        (TypeFamily::Int64, Database::Sqlite) => "INTEGER",
        (TypeFamily::Int64, _) => "BIGINT",
        (TypeFamily::Float32, Database::Mysql) => "FLOAT",
        (TypeFamily::Float32, _) => "REAL",
        (TypeFamily::Float64, Database::Sqlite) => "REAL",
        (TypeFamily::Float64, _) => "DOUBLE_PRECISION",
        (TypeFamily::Bool, _) => "BOOLEAN",
        (TypeFamily::Bytes, Database::Postgres) => "BYTEA",
        (TypeFamily::Bytes, _) => "BLOB",
        (TypeFamily::Numeric, Database::Postgres) => "NUMERIC",
        (TypeFamily::Timestamp, Database::Postgres) => "TIMESTAMP",
        (TypeFamily::TimestampTz, Database::Postgres) => "TIMESTAMPTZ",
        (TypeFamily::Date, Database::Postgres) => "DATE",
        (TypeFamily::Time, Database::Postgres) => "TIME",
        (TypeFamily::Uuid, Database::Postgres) => "UUID",
        (TypeFamily::Json, Database::Postgres) => "JSON",
        (TypeFamily::Enum(_), Database::Postgres) => "ENUM",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_executor_names_its_database() {
        let cases = [
            ("&sqlx::PgPool", Some(Database::Postgres)),
            (
                "impl sqlx::Acquire<'_, Database = sqlx::Postgres>",
                Some(Database::Postgres),
            ),
            ("&mut SqliteConnection", Some(Database::Sqlite)),
            ("&sqlx::MySqlPool", Some(Database::Mysql)),
            ("&mut sqlx::MySqlConnection", Some(Database::Mysql)),
            (
                "&mut sqlx::Transaction<'_, sqlx::MySql>",
                Some(Database::Mysql),
            ),
            (
                "&mut idem::sqlx::pool::PoolConnection<idem::sqlx::MySql>",
                Some(Database::Mysql),
            ),
            ("&Pool", None),
            ("&mut Transaction<'_, Db>", None),
            ("(&PgPool, &MySqlPool)", None),
        ];
        for (ty, want) in cases {
            let ty: syn::Type = syn::parse_str(ty).unwrap();
            assert_eq!(database_of(&ty), want, "{}", ty.to_token_stream());
        }
    }
}
