//! The catalog: the tables and types that replaying the migrations leaves behind, and how
//! sure we are of each.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Database;
use super::types::TypeFamily;

/// The schema that unqualified names are created in (PostgreSQL's default `search_path`).
pub const DEFAULT_SCHEMA: &str = "public";

/// A schema-qualified name, each part as the database stores it: unquoted identifiers folded
/// to lower case, quoted ones as written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QualifiedName {
    /// The schema (`public` unless the migrations say otherwise).
    pub schema: String,
    /// The name within it.
    pub name: String,
}

impl QualifiedName {
    /// `schema.name`.
    pub fn new(schema: impl Into<String>, name: impl Into<String>) -> Self {
        QualifiedName {
            schema: schema.into(),
            name: name.into(),
        }
    }
}

/// `orders` for the default schema, `app.orders` otherwise: as a user would write it.
impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.schema == DEFAULT_SCHEMA {
            f.write_str(&self.name)
        } else {
            write!(f, "{}.{}", self.schema, self.name)
        }
    }
}

/// How a migration file takes part, following sqlx's file naming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationKind {
    /// `<VERSION>_<DESCRIPTION>.sql`
    Simple,
    /// `<VERSION>_<DESCRIPTION>.up.sql` (its `.down.sql` twin is never applied here).
    ReversibleUp,
    /// A single schema file given explicitly, outside sqlx's naming.
    Schema,
}

/// One file that was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationFile {
    /// Where it is.
    pub path: PathBuf,
    /// The numeric version, for migrations (`None` for a single schema file).
    pub version: Option<i64>,
    /// sqlx's description: the name after the version, `_` read as a space.
    pub description: String,
    /// A migration, or a single schema file.
    pub kind: MigrationKind,
}

impl MigrationFile {
    /// The file's name without its directory.
    pub fn file_name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }
}

/// The file's name, e.g. `20240102_create_orders.up.sql`: what a diagnostic should point at.
impl fmt::Display for MigrationFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file_name())
    }
}

/// The values a column may hold, as far as its type and CHECK constraints tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedValues {
    /// Nothing restricts the column to a list of values.
    Any,
    /// Only these values (besides NULL where the column allows it), in the order the first
    /// source lists them; `sources` names the enum type and the constraints that say so.
    Only {
        /// The values.
        values: Vec<String>,
        /// What says so.
        sources: Vec<ValueSource>,
    },
    /// Something restricts the column in a way that could not be read (a CHECK beyond lists
    /// and equalities, an enum type or a table changed by a statement that could not be
    /// parsed): check nothing.
    Unknown,
}

impl AllowedValues {
    /// Whether `value` is allowed: `None` when that cannot be known.
    pub fn permits(&self, value: &str) -> Option<bool> {
        match self {
            AllowedValues::Any => Some(true),
            AllowedValues::Only { values, .. } => Some(values.iter().any(|v| v == value)),
            AllowedValues::Unknown => None,
        }
    }
}

/// What restricts a column to a list of values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// A PostgreSQL enum type, by name.
    EnumType(QualifiedName),
    /// The column's own type, a MySQL `ENUM('PENDING', …)`.
    InlineEnum,
    /// A CHECK constraint, by its name (the one PostgreSQL would generate when it has none).
    Check(String),
}

impl fmt::Display for ValueSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueSource::EnumType(t) => write!(f, "enum type `{t}`"),
            ValueSource::InlineEnum => f.write_str("the column's `ENUM(…)` type"),
            ValueSource::Check(c) => write!(f, "CHECK constraint `{c}`"),
        }
    }
}

/// One column.
#[derive(Debug, Clone)]
pub struct Column {
    pub(super) name: String,
    pub(super) declared_type: String,
    /// A user-defined type the column was declared with, resolved when it was declared (so a
    /// later `ALTER TYPE … RENAME` follows it, as PostgreSQL's type OIDs do).
    pub(super) type_ref: Option<QualifiedName>,
    /// The labels of a MySQL `ENUM(…)` type, declared with the column.
    pub(super) inline_enum: Option<Vec<String>>,
    pub(super) not_null: bool,
    pub(super) has_default: bool,
    pub(super) generated: bool,
    // Settled once every migration has been replayed:
    pub(super) enum_type: Option<QualifiedName>,
    pub(super) allowed: AllowedValues,
    pub(super) certain: bool,
}

impl Column {
    pub(super) fn new(name: String, declared_type: String) -> Self {
        Column {
            name,
            declared_type,
            type_ref: None,
            inline_enum: None,
            not_null: false,
            has_default: false,
            generated: false,
            enum_type: None,
            allowed: AllowedValues::Unknown,
            certain: false,
        }
    }

    /// The column's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The type as declared, e.g. `VARCHAR(20)` or `order_status`.
    pub fn declared_type(&self) -> &str {
        &self.declared_type
    }

    /// The declared type's family on `database`; a PostgreSQL enum column is `Enum`.
    pub fn family(&self, database: Database) -> TypeFamily {
        match (&self.enum_type, database) {
            (Some(t), Database::Postgres) => TypeFamily::Enum(t.clone()),
            _ => TypeFamily::classify(&self.declared_type, database),
        }
    }

    /// `NOT NULL`, declared or implied by `PRIMARY KEY`.
    pub fn not_null(&self) -> bool {
        self.not_null
    }

    /// Whether an `INSERT` may leave it out and still satisfy `NOT NULL`: a default, a serial
    /// or identity column, a generated column, or an `INTEGER PRIMARY KEY` (SQLite's rowid;
    /// counted on every database, so that none gets a false error).
    pub fn has_default(&self) -> bool {
        self.has_default || self.generated
    }

    /// A generated column cannot be written.
    pub fn is_generated(&self) -> bool {
        self.generated
    }

    /// The values its type and CHECK constraints allow.
    pub fn allowed_values(&self) -> &AllowedValues {
        &self.allowed
    }

    /// False when a statement that could not be parsed may have changed this column, or its
    /// enum type: a problem found with it should then be a warning, not an error.
    pub fn is_certain(&self) -> bool {
        self.certain
    }
}

/// A CHECK constraint, kept in the form needed to answer which values a column allows.
#[derive(Debug, Clone)]
pub(super) struct Check {
    /// The name given with `CONSTRAINT name`.
    pub(super) name: Option<String>,
    /// The name PostgreSQL generates when none is given: `<table>_<first column>_check`.
    pub(super) generated_name: String,
    /// Every column the expression mentions: dropping one drops the constraint.
    pub(super) columns: Vec<String>,
    /// The column it was declared with, for a column's own CHECK: MariaDB drops it when
    /// `MODIFY` or `CHANGE` defines the column anew.
    pub(super) declared_on: Option<String>,
    /// What the expression tells about the columns it restricts.
    pub(super) restrictions: BTreeMap<String, Restriction>,
}

impl Check {
    pub(super) fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.generated_name)
    }
}

/// What a CHECK expression says about one column it mentions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Restriction {
    /// The column holds one of these values (or NULL) whenever the expression holds.
    Only(Vec<String>),
    /// The column is restricted in a way this reader does not follow.
    Opaque,
}

/// A set of columns that a primary key, unique constraint or unique index makes unique.
#[derive(Debug, Clone)]
pub(super) struct UniqueKey {
    /// The constraint's or index's name, when given (so `DROP INDEX` can find it).
    pub(super) name: Option<QualifiedName>,
    /// The name MySQL gives a key declared without one: its first column's, with `_2`, `_3`, …
    /// when another index of the table has that name.
    pub(super) generated_name: String,
    pub(super) columns: Vec<String>,
}

/// One table.
#[derive(Debug, Clone)]
pub struct Table {
    pub(super) name: QualifiedName,
    pub(super) columns: Vec<Column>,
    pub(super) checks: Vec<Check>,
    pub(super) primary_key: Vec<String>,
    pub(super) unique: Vec<UniqueKey>,
    /// The names of the indexes that make nothing unique (MySQL's `KEY`, `INDEX`): a key declared
    /// without a name is named around them, and `DROP INDEX` may name one.
    pub(super) plain_indexes: Vec<String>,
    pub(super) certain: bool,
    pub(super) created_in: Arc<MigrationFile>,
    pub(super) altered_in: Option<Arc<MigrationFile>>,
}

impl Table {
    pub(super) fn new(name: QualifiedName, file: Arc<MigrationFile>) -> Self {
        Table {
            name,
            columns: Vec::new(),
            checks: Vec::new(),
            primary_key: Vec::new(),
            unique: Vec::new(),
            plain_indexes: Vec::new(),
            certain: true,
            created_in: file,
            altered_in: None,
        }
    }

    /// The table's name.
    pub fn name(&self) -> &QualifiedName {
        &self.name
    }

    /// The columns, in table order.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// Looks a column up by the name the macro writes (quoted, so case-sensitive on PostgreSQL).
    pub fn column(&self, name: &str) -> Lookup<'_, Column> {
        let found = lookup(&self.columns, name, |c| &c.name);
        match found {
            Lookup::Missing { .. } => Lookup::Missing {
                certain: self.certain,
            },
            other => other,
        }
    }

    /// The column names, e.g. for [`super::nearest`].
    pub fn column_names(&self) -> impl Iterator<Item = &str> {
        self.columns.iter().map(|c| c.name.as_str())
    }

    /// The primary key's columns (empty when there is none).
    pub fn primary_key(&self) -> &[String] {
        &self.primary_key
    }

    /// Whether a primary key, unique constraint or unique index covers exactly these columns
    /// (in any order). Names are compared ignoring ASCII case: a name in another case is a
    /// problem of its own, reported where the database tells names apart.
    pub fn is_unique(&self, columns: &[&str]) -> bool {
        let same = |key: &[String]| {
            key.len() == columns.len()
                && columns
                    .iter()
                    .all(|c| key.iter().any(|k| k.eq_ignore_ascii_case(c)))
        };
        (!self.primary_key.is_empty() && same(&self.primary_key))
            || self.unique.iter().any(|u| same(&u.columns))
    }

    /// Whether a primary key, unique constraint or unique index is made of some of these
    /// columns (in any order, names compared ignoring ASCII case): a row matched on all of them
    /// is then one row at most.
    pub fn has_unique_within(&self, columns: &[&str]) -> bool {
        let within = |key: &[String]| {
            !key.is_empty()
                && key
                    .iter()
                    .all(|k| columns.iter().any(|c| c.eq_ignore_ascii_case(k)))
        };
        within(&self.primary_key) || self.unique.iter().any(|u| within(&u.columns))
    }

    /// A unique key of `columns`, named `name` or, without one, as MySQL would name it.
    pub(super) fn add_unique(&mut self, name: Option<String>, columns: Vec<String>) {
        let base = columns.first().cloned().unwrap_or_default();
        let taken = |n: &str| {
            n.eq_ignore_ascii_case("primary")
                || self.plain_indexes.iter().any(|i| i.eq_ignore_ascii_case(n))
                || self.unique.iter().any(|u| {
                    u.name
                        .as_ref()
                        .is_some_and(|q| q.name.eq_ignore_ascii_case(n))
                        || (u.name.is_none() && u.generated_name.eq_ignore_ascii_case(n))
                })
        };
        let mut generated_name = base.clone();
        let mut n = 2;
        while taken(&generated_name) {
            generated_name = format!("{base}_{n}");
            n += 1;
        }
        self.unique.push(UniqueKey {
            name: name.map(|n| QualifiedName::new(self.name.schema.clone(), n)),
            generated_name,
            columns,
        });
    }

    /// False when a statement that could not be parsed may have created, changed or dropped
    /// this table: its columns may differ from what the catalog lists.
    pub fn is_certain(&self) -> bool {
        self.certain
    }

    /// The migration that created the table (for an uncertain table not created by a readable
    /// statement: the first that touched it).
    pub fn created_in(&self) -> &MigrationFile {
        &self.created_in
    }

    /// The last migration after its creation that changed it, if any.
    pub fn altered_in(&self) -> Option<&MigrationFile> {
        self.altered_in.as_deref()
    }

    /// The column a migration names. Exactly, or else the one column that matches ignoring
    /// case: PostgreSQL would have rejected the statement, SQLite ignores case.
    pub(super) fn column_mut(&mut self, name: &str) -> Option<&mut Column> {
        let at = self
            .columns
            .iter()
            .position(|c| c.name == name)
            .or_else(|| {
                let mut matches = self
                    .columns
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.name.eq_ignore_ascii_case(name));
                match (matches.next(), matches.next()) {
                    (Some((i, _)), None) => Some(i),
                    _ => None,
                }
            })?;
        self.columns.get_mut(at)
    }
}

/// A user-defined type.
#[derive(Debug, Clone)]
pub struct TypeDef {
    pub(super) name: QualifiedName,
    pub(super) kind: TypeKind,
    pub(super) certain: bool,
    pub(super) defined_in: Arc<MigrationFile>,
}

/// What kind of type a `CREATE TYPE` made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeKind {
    /// `CREATE TYPE … AS ENUM`, with its labels in order.
    Enum(Vec<String>),
    /// Any other type (composite, range, …), or one only known from an unreadable statement.
    Other,
}

impl TypeDef {
    /// The type's name.
    pub fn name(&self) -> &QualifiedName {
        &self.name
    }

    /// What kind of type it is.
    pub fn kind(&self) -> &TypeKind {
        &self.kind
    }

    /// False when a statement that could not be parsed may have changed it.
    pub fn is_certain(&self) -> bool {
        self.certain
    }

    /// The migration that created it.
    pub fn defined_in(&self) -> &MigrationFile {
        &self.defined_in
    }
}

/// The answer to a lookup by name.
#[derive(Debug)]
pub enum Lookup<'a, T> {
    /// Exactly this name.
    Found(&'a T),
    /// Only a match that ignores ASCII case. SQLite treats the macro's quoted name as this one;
    /// PostgreSQL treats it as a different name.
    OtherCase(&'a T),
    /// An unqualified name that matches in more than one schema (or, ignoring case, more than
    /// one name): the catalog does not guess.
    Ambiguous(Vec<&'a T>),
    /// No such name. `certain` is false when an unreadable statement could have created it.
    Missing {
        /// Whether no unreadable statement could have created it.
        certain: bool,
    },
}

impl<'a, T> Lookup<'a, T> {
    /// The item when found exactly.
    pub fn found(&self) -> Option<&'a T> {
        match self {
            Lookup::Found(t) => Some(t),
            _ => None,
        }
    }
}

fn lookup<'a, T>(items: &'a [T], name: &str, key: impl Fn(&T) -> &str) -> Lookup<'a, T> {
    if let Some(t) = items.iter().find(|t| key(t) == name) {
        return Lookup::Found(t);
    }
    let folded: Vec<&T> = items
        .iter()
        .filter(|t| key(t).eq_ignore_ascii_case(name))
        .collect();
    match folded.as_slice() {
        [] => Lookup::Missing { certain: true },
        [one] => Lookup::OtherCase(one),
        _ => Lookup::Ambiguous(folded),
    }
}

/// A statement that no dialect could parse.
#[derive(Debug, Clone)]
pub struct Unreadable {
    /// The file it is in.
    pub file: Arc<MigrationFile>,
    /// The line the statement starts on, counting from 1.
    pub line: usize,
    /// What the parser said.
    pub error: String,
}

/// Everything the migrations define, in the state the last one leaves it.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub(super) files: Vec<Arc<MigrationFile>>,
    pub(super) config: Option<PathBuf>,
    pub(super) tables: BTreeMap<QualifiedName, Table>,
    pub(super) types: BTreeMap<QualifiedName, TypeDef>,
    pub(super) unreadable: Vec<Unreadable>,
    /// An unreadable statement changed a table whose name could not be found in its text.
    pub(super) unnamed_change: bool,
    pub(super) database: Option<Database>,
}

impl Catalog {
    /// The migration files read, in the order they were applied.
    pub fn files(&self) -> impl Iterator<Item = &MigrationFile> {
        self.files.iter().map(|f| &**f)
    }

    /// Every file the catalog depends on: the `sqlx.toml` that chose the directory, if one did,
    /// then each migration. The macro emits `include_bytes!` for each so that cargo rebuilds
    /// when one changes.
    pub fn inputs(&self) -> impl Iterator<Item = &Path> {
        self.config
            .iter()
            .map(PathBuf::as_path)
            .chain(self.files.iter().map(|f| f.path.as_path()))
    }

    /// The statements that could not be parsed; each made what it touches uncertain.
    pub fn unreadable(&self) -> &[Unreadable] {
        &self.unreadable
    }

    /// The database the migrations are written for, when their text says so unambiguously
    /// (enum types and `$$` bodies, or `AUTOINCREMENT` and `BLOB`, …).
    pub fn database(&self) -> Option<Database> {
        self.database
    }

    /// Looks a table up by the name the macro writes: `orders` or `app.orders`. An
    /// unqualified name matches a table in any schema, but only when just one schema has it.
    pub fn table(&self, name: &str) -> Lookup<'_, Table> {
        self.by_name(&self.tables, name)
    }

    /// Looks a user-defined type up, with the same rules as [`Catalog::table`].
    pub fn type_def(&self, name: &str) -> Lookup<'_, TypeDef> {
        self.by_name(&self.types, name)
    }

    /// Every table, ordered by schema and name.
    pub fn tables(&self) -> impl Iterator<Item = &Table> {
        self.tables.values()
    }

    /// The names a user could mean, for suggestions: unqualified in the default schema,
    /// qualified elsewhere.
    pub fn table_names(&self) -> Vec<String> {
        self.tables.keys().map(ToString::to_string).collect()
    }

    fn by_name<'a, T>(&self, map: &'a BTreeMap<QualifiedName, T>, name: &str) -> Lookup<'a, T> {
        let (schema, bare) = match name.split_once('.') {
            Some((s, n)) => (Some(s), n),
            None => (None, name),
        };
        let candidates: Vec<(&QualifiedName, &T)> = map
            .iter()
            .filter(|(k, _)| schema.is_none_or(|s| k.schema.eq_ignore_ascii_case(s)))
            .filter(|(k, _)| k.name.eq_ignore_ascii_case(bare))
            .collect();
        let exact: Vec<&T> = candidates
            .iter()
            .filter(|(k, _)| k.name == bare && schema.is_none_or(|s| k.schema == s))
            .map(|(_, t)| *t)
            .collect();
        match exact.as_slice() {
            [one] => return Lookup::Found(one),
            [_, _, ..] => return Lookup::Ambiguous(exact),
            [] => {}
        }
        match candidates.as_slice() {
            [] => Lookup::Missing {
                certain: !self.unnamed_change,
            },
            [(_, one)] => Lookup::OtherCase(one),
            _ => Lookup::Ambiguous(candidates.into_iter().map(|(_, t)| t).collect()),
        }
    }
}
