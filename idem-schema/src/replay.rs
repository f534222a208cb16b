//! Replaying migrations into a [`Catalog`]: parsing each file, applying the DDL it holds, and
//! marking uncertain whatever a statement that cannot be parsed may have touched.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;

use sqlparser::ast::{
    AlterColumnOperation, AlterTable, AlterTableOperation, AlterTypeAddValuePosition,
    AlterTypeOperation, ColumnDef, ColumnOption, CreateIndex, CreateTable, DataType, Expr, Ident,
    MySQLColumnPosition, ObjectName, ObjectNamePart, ObjectType, RenameTableNameKind, Set, SetExpr,
    Statement, TableConstraint, UserDefinedTypeRepresentation,
};
use sqlparser::dialect::{Dialect, GenericDialect, MySqlDialect, PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;

use super::Database;
use super::catalog::{
    AllowedValues, Catalog, Check, Column, DEFAULT_SCHEMA, MigrationFile, QualifiedName,
    Restriction, Table, TypeDef, TypeKind, Unreadable, ValueSource,
};
use super::check;
use super::evidence::Evidence;
use super::lex::{self, Kind, Piece};
use super::mysql::{column_def, drop_index, inline_enum, only_table_options, place};

/// Replays `files` (each with its text) in order.
pub(super) fn build(files: Vec<(MigrationFile, String)>, config: Option<PathBuf>) -> Catalog {
    // The words of every file first: a MySQL project is parsed, and its names kept, as MySQL
    // would, from its first file on, whether or not that file says so itself.
    let mut evidence = Evidence::new();
    for (_, text) in &files {
        evidence.read_text(text);
    }
    let mysql = evidence.guess() == Some(Database::Mysql);
    let mut replay = Replay {
        catalog: Catalog {
            config,
            ..Catalog::default()
        },
        // Replaced by each file before any of its statements is applied.
        file: Arc::new(MigrationFile {
            path: PathBuf::new(),
            version: None,
            description: String::new(),
            kind: super::catalog::MigrationKind::Schema,
        }),
        schema: DEFAULT_SCHEMA.to_owned(),
        evidence,
        mysql,
    };
    for (file, text) in files {
        let file = Arc::new(file);
        replay.catalog.files.push(Arc::clone(&file));
        replay.file = file;
        replay.replay_file(&text);
    }
    replay.finish()
}

struct Replay {
    catalog: Catalog,
    file: Arc<MigrationFile>,
    /// Where unqualified names are created: `public`, or what `SET search_path` chose earlier
    /// in the same file (sqlx runs each migration on its own).
    schema: String,
    /// What the text says about the database it is for; read from every file before the
    /// first is replayed, and from each statement's types as it is.
    evidence: Evidence,
    /// The words say MySQL: its grammar is tried first, and table names keep their case.
    mysql: bool,
}

/// A name as written, folded: `(schema, name)`.
type NameRef = (Option<String>, String);

/// Unquoted identifiers fold to lower case, as PostgreSQL does (SQLite ignores case anyway);
/// quoted ones are kept as written.
pub(super) fn fold(ident: &Ident) -> String {
    match ident.quote_style {
        None => ident.value.to_ascii_lowercase(),
        Some(_) => ident.value.clone(),
    }
}

/// The table an `INTO` target names.
fn expr_name(expr: &Expr) -> Option<ObjectName> {
    match expr {
        Expr::Identifier(ident) => Some(ObjectName::from(vec![ident.clone()])),
        Expr::CompoundIdentifier(parts) => Some(ObjectName::from(parts.clone())),
        _ => None,
    }
}

/// A table's, type's or index's name. MySQL keeps an unquoted name as written: a table's name
/// is a file's name, which the server tells apart by case on Linux.
fn name_ref(name: &ObjectName, keep_case: bool) -> Option<NameRef> {
    let mut parts = Vec::new();
    for part in &name.0 {
        match part {
            ObjectNamePart::Identifier(ident) if keep_case => parts.push(ident.value.clone()),
            ObjectNamePart::Identifier(ident) => parts.push(fold(ident)),
            _ => return None,
        }
    }
    let last = parts.pop()?;
    // `database.schema.table`: the database part does not matter here.
    Some((parts.pop(), last))
}

/// Parses with `dialect`. A panic inside the parser is taken as a parse error: a bug there must
/// not take the user's build down with it.
fn parse(dialect: &dyn Dialect, sql: &str) -> Result<Vec<Statement>, String> {
    match catch_unwind(AssertUnwindSafe(|| Parser::parse_sql(dialect, sql))) {
        Ok(Ok(statements)) => Ok(statements),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the SQL parser failed on this statement".to_owned()),
    }
}

impl Replay {
    fn name_ref(&self, name: &ObjectName) -> Option<NameRef> {
        name_ref(name, self.mysql)
    }

    /// The grammars to read a statement with, in order: MySQL's first for a MySQL project,
    /// else PostgreSQL's, SQLite's and MySQL's; the generic one last.
    fn dialects(&self) -> [&'static dyn Dialect; 4] {
        if self.mysql {
            [
                &MySqlDialect {},
                &PostgreSqlDialect {},
                &SQLiteDialect {},
                &GenericDialect {},
            ]
        } else {
            [
                &PostgreSqlDialect {},
                &SQLiteDialect {},
                &MySqlDialect {},
                &GenericDialect {},
            ]
        }
    }

    /// The whole file in the first grammar; else statement by statement.
    fn replay_file(&mut self, text: &str) {
        self.schema = DEFAULT_SCHEMA.to_owned();
        match parse(self.dialects()[0], text) {
            Ok(statements) => {
                for statement in &statements {
                    self.apply(statement);
                }
            }
            Err(_) => {
                for piece in lex::split(text, self.mysql) {
                    self.replay_piece(&piece);
                }
            }
        }
    }

    /// One statement alone, in each grammar in turn.
    fn replay_piece(&mut self, piece: &Piece<'_>) {
        let mut first_error = None;
        for dialect in self.dialects() {
            match parse(dialect, piece.text) {
                Ok(statements) => {
                    for statement in &statements {
                        self.apply(statement);
                    }
                    return;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        // MySQL's table options, which the parser does not read in an `ALTER TABLE`, change no
        // column, key or allowed value.
        if only_table_options(piece.text) {
            return;
        }
        self.catalog.unreadable.push(Unreadable {
            file: Arc::clone(&self.file),
            line: piece.line,
            error: first_error.unwrap_or_default(),
        });
        self.touch_unreadable(piece.text);
    }

    fn apply(&mut self, statement: &Statement) {
        match statement {
            Statement::CreateTable(create) => self.create_table(create),
            Statement::AlterTable(alter) => self.alter_table(alter),
            Statement::CreateIndex(index) => self.create_index(index),
            Statement::Drop {
                object_type,
                names,
                cascade,
                table,
                ..
            } => {
                for name in names {
                    self.drop(*object_type, name, *cascade, table.as_ref());
                }
            }
            // Its columns are the module's business: known to exist, not what it holds.
            Statement::CreateVirtualTable { name, .. } => self.add_uncertain_table(name),
            // A view can be the target of an UPDATE too; what it exposes is not followed.
            Statement::CreateView(view) => self.add_uncertain_table(&view.name),
            // `SELECT … INTO t` creates `t` with the query's columns.
            Statement::Query(query) => {
                if let SetExpr::Select(select) = &*query.body
                    && let Some(into) = &select.into
                    && !into.temporary
                {
                    for target in &into.targets {
                        if let Some(name) = expr_name(target) {
                            self.add_uncertain_table(&name);
                        }
                    }
                }
            }
            Statement::CreateType {
                name,
                representation,
            } => self.create_type(name, representation.as_ref()),
            Statement::AlterType(alter) => {
                self.evidence.note(&[Database::Postgres]);
                self.alter_type(&alter.name, &alter.operation);
            }
            Statement::RenameTable(renames) => {
                for rename in renames {
                    if let (Some(old), Some(new)) = (
                        self.name_ref(&rename.old_name),
                        self.name_ref(&rename.new_name),
                    ) {
                        self.rename_table(&old, new);
                    }
                }
            }
            Statement::Set(Set::SingleAssignment {
                variable, values, ..
            }) if variable.to_string().eq_ignore_ascii_case("search_path") => {
                self.set_search_path(values);
            }
            // Everything else leaves tables and types as they are: data, indexes that are not
            // unique, functions, grants, comments.
            _ => {}
        }
    }

    /// The first schema of the new path that is not `"$user"`.
    fn set_search_path(&mut self, values: &[Expr]) {
        for value in values {
            let schema = match value {
                Expr::Identifier(ident) => fold(ident),
                Expr::Value(v) => match v.clone().into_string() {
                    Some(s) => s,
                    None => continue,
                },
                _ => continue,
            };
            if schema != "$user" {
                self.schema = schema;
                return;
            }
        }
    }

    /// A table whose existence is known but whose columns are not.
    fn add_uncertain_table(&mut self, name: &ObjectName) {
        let Some(name) = self.name_ref(name) else {
            return;
        };
        let q = self.qualify(name);
        let mut table = Table::new(q.clone(), Arc::clone(&self.file));
        table.certain = false;
        self.catalog.tables.insert(q, table);
    }

    fn qualify(&self, (schema, name): NameRef) -> QualifiedName {
        QualifiedName::new(schema.unwrap_or_else(|| self.schema.clone()), name)
    }

    /// An existing table or type: qualified exactly; unqualified, in the current schema, else
    /// in the one schema that has it.
    fn resolve<T>(
        &self,
        map: &BTreeMap<QualifiedName, T>,
        name: &NameRef,
    ) -> Option<QualifiedName> {
        let (schema, bare) = name;
        if let Some(schema) = schema {
            let q = QualifiedName::new(schema.clone(), bare.clone());
            if map.contains_key(&q) {
                return Some(q);
            }
            let mut matches = map.keys().filter(|k| {
                k.schema.eq_ignore_ascii_case(schema) && k.name.eq_ignore_ascii_case(bare)
            });
            return match (matches.next(), matches.next()) {
                (Some(only), None) => Some(only.clone()),
                _ => None,
            };
        }
        let here = QualifiedName::new(self.schema.clone(), bare.clone());
        if map.contains_key(&here) {
            return Some(here);
        }
        let unique = |same: &dyn Fn(&QualifiedName) -> bool| {
            let mut matches = map.keys().filter(|k| same(k));
            match (matches.next(), matches.next()) {
                (Some(only), None) => Some(only.clone()),
                _ => None,
            }
        };
        // PostgreSQL would have rejected a statement naming a table in another case; SQLite
        // ignores case, so a unique match that ignores it is the table meant.
        unique(&|k| &k.name == bare).or_else(|| unique(&|k| k.name.eq_ignore_ascii_case(bare)))
    }

    /// The table an `ALTER TABLE` names. One that the catalog does not know was made some way
    /// this reader did not follow: it is added, uncertain, so that what is said about it
    /// becomes warnings.
    fn table_for_change(&mut self, name: &ObjectName) -> Option<QualifiedName> {
        let name = self.name_ref(name)?;
        if let Some(q) = self.resolve(&self.catalog.tables, &name) {
            return Some(q);
        }
        let q = self.qualify(name);
        let mut table = Table::new(q.clone(), Arc::clone(&self.file));
        table.certain = false;
        self.catalog.tables.insert(q.clone(), table);
        Some(q)
    }

    fn column(&mut self, def: &ColumnDef) -> (Column, ColumnConstraints) {
        self.evidence.read_type(&def.data_type);
        let mut column = Column::new(fold(&def.name), def.data_type.to_string());
        column.type_ref = self.type_ref(&def.data_type);
        column.inline_enum = inline_enum(&def.data_type);
        let declared = column.declared_type.to_ascii_lowercase();
        column.has_default = matches!(
            declared.as_str(),
            "serial" | "bigserial" | "smallserial" | "serial2" | "serial4" | "serial8"
        );
        let mut constraints = ColumnConstraints::default();
        // MySQL's `SERIAL` is `BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE`.
        if self.mysql && declared == "serial" {
            column.not_null = true;
            constraints.unique = Some(None);
        }
        for option in &def.options {
            match &option.option {
                ColumnOption::NotNull => column.not_null = true,
                ColumnOption::Null => column.not_null = false,
                ColumnOption::Default(_) | ColumnOption::Identity(_) => column.has_default = true,
                ColumnOption::PrimaryKey(_) => {
                    column.not_null = true;
                    constraints.primary_key = true;
                    // SQLite's `INTEGER PRIMARY KEY` is the rowid: it fills itself in.
                    if declared == "integer" {
                        column.has_default = true;
                    }
                }
                ColumnOption::Unique(u) => {
                    constraints.unique = Some(u.name.as_ref().map(fold));
                }
                ColumnOption::Check(c) => {
                    let name = option.name.as_ref().or(c.name.as_ref()).map(fold);
                    constraints.checks.push((name, (*c.expr).clone()));
                }
                ColumnOption::Generated {
                    generation_expr, ..
                } => {
                    if generation_expr.is_some() {
                        column.generated = true;
                    } else {
                        column.has_default = true;
                    }
                }
                // SQLite's `AUTOINCREMENT`, MySQL's `AUTO_INCREMENT`.
                ColumnOption::DialectSpecific(tokens)
                    if tokens.iter().any(|t| {
                        let t = t.to_string();
                        t.eq_ignore_ascii_case("autoincrement")
                            || t.eq_ignore_ascii_case("auto_increment")
                    }) =>
                {
                    column.has_default = true;
                }
                _ => {}
            }
        }
        (column, constraints)
    }

    /// The user-defined type a column is declared with, if the catalog has it.
    fn type_ref(&self, data_type: &DataType) -> Option<QualifiedName> {
        match data_type {
            DataType::Custom(name, _) => {
                let name = self.name_ref(name)?;
                self.resolve(&self.catalog.types, &name)
            }
            _ => None,
        }
    }

    fn create_table(&mut self, create: &CreateTable) {
        // A temporary table is gone when the migration's session ends.
        if create.temporary {
            return;
        }
        let Some(name) = self.name_ref(&create.name) else {
            return;
        };
        let q = self.qualify(name);
        if create.if_not_exists && self.catalog.tables.contains_key(&q) {
            return;
        }
        let mut table = Table::new(q.clone(), Arc::clone(&self.file));
        // Columns copied from a query, another table or a parent are not listed here.
        table.certain = create.query.is_none()
            && create.like.is_none()
            && create.clone.is_none()
            && create.inherits.as_ref().is_none_or(Vec::is_empty)
            && create.partition_of.is_none();
        if !create.sqlite_table_options.options.is_empty() {
            self.evidence.note(&[Database::Sqlite]);
        }
        let mut pending = Vec::new();
        for def in &create.columns {
            let (column, constraints) = self.column(def);
            pending.push((column.name.clone(), constraints));
            table.columns.retain(|c| c.name != column.name);
            table.columns.push(column);
        }
        for (column, constraints) in pending {
            apply_column_constraints(&mut table, &column, constraints);
        }
        for constraint in &create.constraints {
            add_constraint(&mut table, constraint);
        }
        self.catalog.tables.insert(q, table);
    }

    fn alter_table(&mut self, alter: &AlterTable) {
        let Some(name) = self.name_ref(&alter.name) else {
            return;
        };
        if alter.if_exists && self.resolve(&self.catalog.tables, &name).is_none() {
            return;
        }
        let Some(mut q) = self.table_for_change(&alter.name) else {
            return;
        };
        for operation in &alter.operations {
            match operation {
                AlterTableOperation::AddColumn {
                    if_not_exists,
                    column_def,
                    column_position,
                    ..
                } => {
                    let (column, constraints) = self.column(column_def);
                    let Some(table) = self.catalog.tables.get_mut(&q) else {
                        continue;
                    };
                    if *if_not_exists && table.column_mut(&column.name).is_some() {
                        continue;
                    }
                    let name = column.name.clone();
                    table.columns.retain(|c| c.name != name);
                    table.columns.push(column);
                    place(table, &name, column_position.as_ref());
                    apply_column_constraints(table, &name, constraints);
                }
                // MySQL's: the column defined anew (type, `NULL`, default), keeping its keys and
                // CHECKs; `CHANGE` renames it too.
                AlterTableOperation::ModifyColumn {
                    col_name,
                    data_type,
                    options,
                    column_position,
                } => {
                    let def = column_def(col_name, data_type, options);
                    self.redefine_column(&q, col_name, &def, column_position.as_ref());
                }
                AlterTableOperation::ChangeColumn {
                    old_name,
                    new_name,
                    data_type,
                    options,
                    column_position,
                } => {
                    let def = column_def(new_name, data_type, options);
                    self.redefine_column(&q, old_name, &def, column_position.as_ref());
                }
                AlterTableOperation::RenameTable { table_name } => {
                    let (RenameTableNameKind::To(new) | RenameTableNameKind::As(new)) = table_name;
                    if let Some((schema, new)) = self.name_ref(new) {
                        // PostgreSQL keeps a renamed table in its schema.
                        let schema = schema.or_else(|| Some(q.schema.clone()));
                        let old = (Some(q.schema.clone()), q.name.clone());
                        if let Some(moved) = self.rename_table(&old, (schema, new)) {
                            q = moved;
                        }
                    }
                }
                AlterTableOperation::AlterColumn {
                    column_name,
                    op: AlterColumnOperation::SetDataType { data_type, .. },
                } => {
                    self.evidence.read_type(data_type);
                    let type_ref = self.type_ref(data_type);
                    if let Some(column) = self
                        .catalog
                        .tables
                        .get_mut(&q)
                        .and_then(|t| t.column_mut(&fold(column_name)))
                    {
                        column.declared_type = data_type.to_string();
                        column.type_ref = type_ref;
                        column.inline_enum = inline_enum(data_type);
                    }
                }
                other => {
                    if let Some(table) = self.catalog.tables.get_mut(&q) {
                        alter_operation(table, other);
                    }
                }
            }
        }
        if let Some(table) = self.catalog.tables.get_mut(&q) {
            table.altered_in = Some(Arc::clone(&self.file));
        }
    }

    /// `MODIFY` or `CHANGE` of the column `old` of `q` to `def`, at `position`.
    fn redefine_column(
        &mut self,
        q: &QualifiedName,
        old: &Ident,
        def: &ColumnDef,
        position: Option<&MySQLColumnPosition>,
    ) {
        let (mut column, constraints) = self.column(def);
        let Some(table) = self.catalog.tables.get_mut(q) else {
            return;
        };
        let Some(from) = table.column_mut(&fold(old)).map(|c| c.name.clone()) else {
            return;
        };
        // Its own CHECKs go with the old definition (on MariaDB; MySQL keeps them, and a check
        // that is not there can only let more values through).
        table
            .checks
            .retain(|c| c.declared_on.as_deref() != Some(from.as_str()));
        let to = column.name.clone();
        rename_column(table, &from, &to);
        // A key's columns stay `NOT NULL` whatever the new definition says.
        if table.primary_key.contains(&to) {
            column.not_null = true;
        }
        if let Some(at) = table.columns.iter().position(|c| c.name == to) {
            table.columns[at] = column;
        }
        place(table, &to, position);
        apply_column_constraints(table, &to, constraints);
    }

    fn rename_table(&mut self, old: &NameRef, new: NameRef) -> Option<QualifiedName> {
        let from = self.resolve(&self.catalog.tables, old)?;
        let mut table = self.catalog.tables.remove(&from)?;
        let to = QualifiedName::new(new.0.unwrap_or_else(|| from.schema.clone()), new.1);
        table.name = to.clone();
        table.altered_in = Some(Arc::clone(&self.file));
        self.catalog.tables.insert(to.clone(), table);
        Some(to)
    }

    /// A unique index makes its columns a key; an index on expressions or with a `WHERE` does
    /// not make the plain columns unique. Any other index's name is kept (MySQL names keys
    /// around it).
    fn create_index(&mut self, index: &CreateIndex) {
        let Some(table_name) = self.name_ref(&index.table_name) else {
            return;
        };
        let Some(q) = self.resolve(&self.catalog.tables, &table_name) else {
            return;
        };
        // Index names are compared ignoring case on MySQL, and folded elsewhere.
        let index_name = index
            .name
            .as_ref()
            .and_then(|n| name_ref(n, false))
            .map(|(_, n)| n);
        let columns = key_columns(&index.columns);
        let Some(table) = self.catalog.tables.get_mut(&q) else {
            return;
        };
        match columns {
            Some(columns) if index.unique && index.predicate.is_none() => {
                table.add_unique(index_name, columns);
                table.altered_in = Some(Arc::clone(&self.file));
            }
            _ => table.plain_indexes.extend(index_name),
        }
    }

    /// `DROP … name`; `on` is the table of MySQL's `DROP INDEX name ON table`.
    fn drop(
        &mut self,
        object_type: ObjectType,
        name: &ObjectName,
        cascade: bool,
        on: Option<&ObjectName>,
    ) {
        if object_type == ObjectType::Index {
            self.drop_index(name, on);
            return;
        }
        let Some(name) = self.name_ref(name) else {
            return;
        };
        match object_type {
            ObjectType::Table => {
                if let Some(q) = self.resolve(&self.catalog.tables, &name) {
                    self.catalog.tables.remove(&q);
                }
            }
            ObjectType::Type => {
                let Some(q) = self.resolve(&self.catalog.types, &name) else {
                    return;
                };
                self.catalog.types.remove(&q);
                // `DROP TYPE … CASCADE` drops the columns of that type with it.
                if cascade {
                    for table in self.catalog.tables.values_mut() {
                        let gone: Vec<String> = table
                            .columns
                            .iter()
                            .filter(|c| c.type_ref.as_ref() == Some(&q))
                            .map(|c| c.name.clone())
                            .collect();
                        for column in gone {
                            drop_column(table, &column);
                        }
                    }
                }
            }
            // `DROP SCHEMA s CASCADE` drops what is in it; without CASCADE it must be empty.
            ObjectType::Schema if cascade => {
                let schema = name.1;
                self.catalog.tables.retain(|q, _| q.schema != schema);
                self.catalog.types.retain(|q, _| q.schema != schema);
            }
            ObjectType::View | ObjectType::MaterializedView => {
                if let Some(q) = self.resolve(&self.catalog.tables, &name)
                    && self.catalog.tables.get(&q).is_some_and(|t| !t.certain)
                {
                    self.catalog.tables.remove(&q);
                }
            }
            _ => {}
        }
    }

    /// `DROP INDEX name`: PostgreSQL's finds the index in its schema; MySQL's names the table
    /// (`ON table`), where a key declared without a name goes by the name MySQL gave it.
    fn drop_index(&mut self, name: &ObjectName, on: Option<&ObjectName>) {
        let Some((schema, index)) = name_ref(name, false) else {
            return;
        };
        if let Some(on) = on {
            let Some(q) = self
                .name_ref(on)
                .and_then(|t| self.resolve(&self.catalog.tables, &t))
            else {
                return;
            };
            if let Some(table) = self.catalog.tables.get_mut(&q) {
                drop_index(table, &index);
                table.altered_in = Some(Arc::clone(&self.file));
            }
            return;
        }
        for table in self.catalog.tables.values_mut() {
            let before = table.unique.len();
            table.unique.retain(|u| {
                u.name.as_ref().is_none_or(|n| {
                    n.name != index || schema.as_ref().is_some_and(|s| *s != n.schema)
                })
            });
            if table.unique.len() != before {
                table.altered_in = Some(Arc::clone(&self.file));
            }
        }
    }

    fn create_type(
        &mut self,
        name: &ObjectName,
        representation: Option<&UserDefinedTypeRepresentation>,
    ) {
        self.evidence.note(&[Database::Postgres]);
        let Some(name) = self.name_ref(name) else {
            return;
        };
        let q = self.qualify(name);
        let kind = match representation {
            Some(UserDefinedTypeRepresentation::Enum { labels }) => {
                TypeKind::Enum(labels.iter().map(|l| l.value.clone()).collect())
            }
            _ => TypeKind::Other,
        };
        self.catalog.types.insert(
            q.clone(),
            TypeDef {
                name: q,
                kind,
                certain: true,
                defined_in: Arc::clone(&self.file),
            },
        );
    }

    fn alter_type(&mut self, name: &ObjectName, operation: &AlterTypeOperation) {
        let Some(name) = self.name_ref(name) else {
            return;
        };
        let Some(q) = self.resolve(&self.catalog.types, &name) else {
            return;
        };
        match operation {
            AlterTypeOperation::Rename(rename) => {
                let Some(mut def) = self.catalog.types.remove(&q) else {
                    return;
                };
                let to = QualifiedName::new(q.schema.clone(), fold(&rename.new_name));
                def.name = to.clone();
                self.catalog.types.insert(to.clone(), def);
                for column in self
                    .catalog
                    .tables
                    .values_mut()
                    .flat_map(|t| t.columns.iter_mut())
                {
                    if column.type_ref.as_ref() == Some(&q) {
                        column.type_ref = Some(to.clone());
                    }
                }
            }
            AlterTypeOperation::AddValue(add) => {
                let Some(TypeDef {
                    kind: TypeKind::Enum(labels),
                    ..
                }) = self.catalog.types.get_mut(&q)
                else {
                    return;
                };
                let value = add.value.value.clone();
                if labels.contains(&value) {
                    return;
                }
                let at = match &add.position {
                    Some(AlterTypeAddValuePosition::Before(l)) => {
                        labels.iter().position(|x| *x == l.value)
                    }
                    Some(AlterTypeAddValuePosition::After(l)) => {
                        labels.iter().position(|x| *x == l.value).map(|i| i + 1)
                    }
                    None => None,
                };
                labels.insert(at.unwrap_or(labels.len()), value);
            }
            AlterTypeOperation::RenameValue(rename) => {
                if let Some(TypeDef {
                    kind: TypeKind::Enum(labels),
                    ..
                }) = self.catalog.types.get_mut(&q)
                {
                    for label in labels.iter_mut() {
                        if *label == rename.from.value {
                            label.clone_from(&rename.to.value);
                        }
                    }
                }
            }
        }
    }

    /// A statement that could not be parsed: every table and type its text names becomes
    /// uncertain (added, uncertain, when the catalog does not have it).
    fn touch_unreadable(&mut self, text: &str) {
        let touched = touched(text);
        if touched.nameless_table {
            self.catalog.unnamed_change = true;
        }
        for name in touched.tables {
            let q = match self.resolve(&self.catalog.tables, &name) {
                Some(q) => q,
                None => self.qualify(name),
            };
            let file = Arc::clone(&self.file);
            let table = self
                .catalog
                .tables
                .entry(q.clone())
                .or_insert_with(|| Table::new(q, Arc::clone(&file)));
            table.certain = false;
            table.altered_in = Some(file);
        }
        for name in touched.types {
            let q = match self.resolve(&self.catalog.types, &name) {
                Some(q) => q,
                None => self.qualify(name),
            };
            let file = Arc::clone(&self.file);
            let def = self
                .catalog
                .types
                .entry(q.clone())
                .or_insert_with(|| TypeDef {
                    name: q,
                    kind: TypeKind::Other,
                    certain: false,
                    defined_in: file,
                });
            def.certain = false;
        }
    }

    fn finish(mut self) -> Catalog {
        self.catalog.database = self.evidence.guess();
        let types = &self.catalog.types;
        for table in self.catalog.tables.values_mut() {
            let checks = &table.checks;
            for column in &mut table.columns {
                let def = column.type_ref.as_ref().and_then(|t| types.get(t));
                column.enum_type = def
                    .filter(|d| matches!(d.kind, TypeKind::Enum(_)))
                    .map(|d| d.name.clone());
                column.certain = table.certain && def.is_none_or(|d| d.certain);
                column.allowed = if table.certain {
                    allowed(column, def, checks)
                } else {
                    AllowedValues::Unknown
                };
            }
        }
        self.catalog
    }
}

/// The values the enum type (or MySQL's `ENUM(…)`) and every CHECK allow together: only the
/// readable ones narrow the list, so the answer is never narrower than the database's.
fn allowed(column: &Column, def: Option<&TypeDef>, checks: &[Check]) -> AllowedValues {
    let mut lists: Vec<(&[String], ValueSource)> = Vec::new();
    let mut opaque = false;
    if let Some(labels) = &column.inline_enum {
        lists.push((labels, ValueSource::InlineEnum));
    }
    if let Some(def) = def {
        match (&def.kind, def.certain) {
            (TypeKind::Enum(labels), true) => {
                lists.push((labels, ValueSource::EnumType(def.name.clone())));
            }
            // An unreadable statement may have made it an enum, or changed its labels.
            (_, false) => opaque = true,
            (TypeKind::Other, true) => {}
        }
    }
    for check in checks {
        match check.restrictions.get(&column.name) {
            Some(Restriction::Only(values)) => {
                lists.push((values, ValueSource::Check(check.display_name().to_owned())));
            }
            Some(Restriction::Opaque) => opaque = true,
            None => {}
        }
    }
    let Some(((first, _), rest)) = lists.split_first() else {
        return if opaque {
            AllowedValues::Unknown
        } else {
            AllowedValues::Any
        };
    };
    let values = first
        .iter()
        .filter(|v| rest.iter().all(|(list, _)| list.contains(v)))
        .cloned()
        .collect();
    AllowedValues::Only {
        values,
        sources: lists.into_iter().map(|(_, s)| s).collect(),
    }
}

#[derive(Default)]
struct ColumnConstraints {
    primary_key: bool,
    /// `Some(name)` when the column is `UNIQUE` (with the constraint's name, if given).
    unique: Option<Option<String>>,
    checks: Vec<(Option<String>, Expr)>,
}

fn apply_column_constraints(table: &mut Table, column: &str, constraints: ColumnConstraints) {
    if constraints.primary_key {
        table.primary_key = vec![column.to_owned()];
    }
    if let Some(name) = constraints.unique {
        table.add_unique(name, vec![column.to_owned()]);
    }
    for (name, expr) in constraints.checks {
        add_check(table, name, &expr, Some(column));
    }
}

/// `CHECK` at table level (or a column's check): PostgreSQL names an unnamed one after the
/// table and the first column it mentions, or the column it is declared on.
fn add_check(table: &mut Table, name: Option<String>, expr: &Expr, on_column: Option<&str>) {
    let names: Vec<&str> = table.columns.iter().map(|c| c.name.as_str()).collect();
    let (restrictions, mentioned) = check::read(expr, &names);
    let first = on_column
        .map(str::to_owned)
        .or_else(|| mentioned.first().cloned());
    let generated_name = match first {
        Some(c) => format!("{}_{c}_check", table.name.name),
        None => format!("{}_check", table.name.name),
    };
    table.checks.push(Check {
        name,
        generated_name,
        columns: mentioned,
        declared_on: on_column.map(str::to_owned),
        restrictions,
    });
}

fn key_columns(columns: &[sqlparser::ast::IndexColumn]) -> Option<Vec<String>> {
    columns
        .iter()
        .map(|c| match &c.column.expr {
            Expr::Identifier(ident) => Some(fold(ident)),
            _ => None,
        })
        .collect()
}

fn add_constraint(table: &mut Table, constraint: &TableConstraint) {
    match constraint {
        TableConstraint::PrimaryKey(pk) => {
            if let Some(columns) = key_columns(&pk.columns) {
                for column in &columns {
                    if let Some(c) = table.column_mut(column) {
                        c.not_null = true;
                    }
                }
                table.primary_key = columns;
            }
        }
        TableConstraint::Unique(u) => {
            if let Some(columns) = key_columns(&u.columns) {
                // MySQL's `UNIQUE KEY name (…)` names the index; `CONSTRAINT name UNIQUE (…)`
                // the constraint, and on MySQL its index too.
                let name = u.index_name.as_ref().or(u.name.as_ref()).map(fold);
                table.add_unique(name, columns);
            }
        }
        TableConstraint::Check(c) => add_check(table, c.name.as_ref().map(fold), &c.expr, None),
        // MySQL's `KEY name (…)`, `INDEX name (…)`: nothing unique, but a name taken.
        TableConstraint::Index(index) => table.plain_indexes.extend(index.name.as_ref().map(fold)),
        // Foreign keys change neither columns nor allowed values.
        _ => {}
    }
}

fn drop_column(table: &mut Table, column: &str) {
    table.columns.retain(|c| c.name != column);
    // PostgreSQL drops the constraints and indexes that involve the column with it.
    table
        .checks
        .retain(|c| !c.columns.iter().any(|m| m == column));
    table
        .unique
        .retain(|u| !u.columns.iter().any(|c| c == column));
    if table.primary_key.iter().any(|c| c == column) {
        table.primary_key.clear();
    }
}

fn rename_in(list: &mut [String], from: &str, to: &str) {
    for item in list.iter_mut() {
        if item == from {
            *item = to.to_owned();
        }
    }
}

/// The column `from` is called `to`, in its keys and CHECKs too.
fn rename_column(table: &mut Table, from: &str, to: &str) {
    for column in &mut table.columns {
        if column.name == from {
            column.name = to.to_owned();
        }
    }
    for check in &mut table.checks {
        rename_in(&mut check.columns, from, to);
        if check.declared_on.as_deref() == Some(from) {
            check.declared_on = Some(to.to_owned());
        }
        if let Some(r) = check.restrictions.remove(from) {
            check.restrictions.insert(to.to_owned(), r);
        }
    }
    rename_in(&mut table.primary_key, from, to);
    for key in &mut table.unique {
        rename_in(&mut key.columns, from, to);
    }
}

/// The operations that need no catalog-wide look-up. One this reader does not know may change
/// columns, so it makes the table uncertain.
fn alter_operation(table: &mut Table, operation: &AlterTableOperation) {
    match operation {
        AlterTableOperation::DropColumn { column_names, .. } => {
            for column in column_names {
                if let Some(name) = table.column_mut(&fold(column)).map(|c| c.name.clone()) {
                    drop_column(table, &name);
                }
            }
        }
        AlterTableOperation::RenameColumn {
            old_column_name,
            new_column_name,
        } => {
            if let Some(from) = table
                .column_mut(&fold(old_column_name))
                .map(|c| c.name.clone())
            {
                rename_column(table, &from, &fold(new_column_name));
            }
        }
        AlterTableOperation::AddConstraint { constraint, .. } => add_constraint(table, constraint),
        AlterTableOperation::DropConstraint { name, .. } => drop_constraint(table, &fold(name)),
        AlterTableOperation::RenameConstraint { old_name, new_name } => {
            let (from, to) = (fold(old_name), fold(new_name));
            for check in &mut table.checks {
                if check.display_name() == from {
                    check.name = Some(to.clone());
                }
            }
        }
        AlterTableOperation::AlterColumn { column_name, op } => {
            let Some(column) = table.column_mut(&fold(column_name)) else {
                return;
            };
            match op {
                AlterColumnOperation::SetNotNull => column.not_null = true,
                AlterColumnOperation::DropNotNull => column.not_null = false,
                AlterColumnOperation::SetDefault { .. } => column.has_default = true,
                AlterColumnOperation::DropDefault => column.has_default = false,
                AlterColumnOperation::AddGenerated { .. } => column.has_default = true,
                // The type change is applied by the caller, which can resolve type names.
                _ => {}
            }
        }
        AlterTableOperation::DropPrimaryKey { .. } => table.primary_key.clear(),
        // Row security, triggers, rules, ownership, storage and replication settings, foreign
        // keys and validation leave columns and allowed values alone.
        AlterTableOperation::EnableRowLevelSecurity
        | AlterTableOperation::DisableRowLevelSecurity
        | AlterTableOperation::ForceRowLevelSecurity
        | AlterTableOperation::NoForceRowLevelSecurity
        | AlterTableOperation::EnableTrigger { .. }
        | AlterTableOperation::DisableTrigger { .. }
        | AlterTableOperation::EnableAlwaysTrigger { .. }
        | AlterTableOperation::EnableReplicaTrigger { .. }
        | AlterTableOperation::EnableRule { .. }
        | AlterTableOperation::DisableRule { .. }
        | AlterTableOperation::EnableAlwaysRule { .. }
        | AlterTableOperation::EnableReplicaRule { .. }
        | AlterTableOperation::OwnerTo { .. }
        | AlterTableOperation::SetOptionsParens { .. }
        | AlterTableOperation::ResetOptions { .. }
        | AlterTableOperation::ValidateConstraint { .. }
        | AlterTableOperation::ReplicaIdentity { .. }
        | AlterTableOperation::SetLogged
        | AlterTableOperation::SetUnlogged
        | AlterTableOperation::DropForeignKey { .. } => {}
        AlterTableOperation::DropIndex { name } => drop_index(table, &fold(name)),
        _ => table.certain = false,
    }
}

/// `DROP CONSTRAINT name`: a CHECK or key by its given or generated name. When no CHECK has
/// that name, the generated names may differ from the database's (PostgreSQL adds digits on a
/// clash), so every unnamed CHECK is dropped: a dropped check can only widen what is allowed.
fn drop_constraint(table: &mut Table, name: &str) {
    let before = table.checks.len();
    table.checks.retain(|c| c.display_name() != name);
    let keys_before = table.unique.len();
    table
        .unique
        .retain(|u| u.name.as_ref().is_none_or(|n| n.name != name));
    if !table.primary_key.is_empty() && name == format!("{}_pkey", table.name.name) {
        table.primary_key.clear();
        return;
    }
    if table.checks.len() == before && table.unique.len() == keys_before {
        table.checks.retain(|c| c.name.is_some());
    }
}

/// What an unreadable statement's text names.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Touched {
    pub(super) tables: Vec<NameRef>,
    pub(super) types: Vec<NameRef>,
    /// It says `TABLE` but no name could be read after it.
    pub(super) nameless_table: bool,
}

/// Finds, in the text of a statement that could not be parsed, the names after `TABLE`
/// (`CREATE/ALTER/DROP TABLE [IF [NOT] EXISTS] [ONLY] name[, name…]`), after `RENAME TO`, and
/// after `CREATE/ALTER/DROP TYPE|DOMAIN`. `$$` bodies are read too (a `DO` block may create a
/// table); string literals are not (dynamic SQL cannot be followed).
pub(super) fn touched(text: &str) -> Touched {
    let mut out = Touched::default();
    scan(text, &mut out);
    out
}

fn scan(text: &str, out: &mut Touched) {
    let tokens = lex::lex(text);
    for (i, token) in tokens.iter().enumerate() {
        if let Kind::Dollar(body) = &token.kind {
            scan(&text[body.clone()], out);
            continue;
        }
        let previous = i.checked_sub(1).and_then(|p| tokens.get(p));
        let after_ddl = previous.is_some_and(|p| {
            p.is_keyword("create") || p.is_keyword("alter") || p.is_keyword("drop")
        });
        if token.is_keyword("table") {
            let names = names_after(&tokens[i + 1..], true);
            if names.is_empty() {
                out.nameless_table = true;
            }
            out.tables.extend(names);
        } else if (token.is_keyword("type") || token.is_keyword("domain")) && after_ddl {
            out.types.extend(names_after(&tokens[i + 1..], true));
        } else if token.is_keyword("schema") && previous.is_some_and(|p| p.is_keyword("set")) {
            // `ALTER TABLE t SET SCHEMA s` moves `t` to `s.t`.
            let moved = names_after(&tokens[i + 1..], false);
            if let (Some((_, schema)), Some((_, table))) = (moved.first(), out.tables.last()) {
                out.tables.push((Some(schema.clone()), table.clone()));
            }
        } else if token.is_keyword("to") && previous.is_some_and(|p| p.is_keyword("rename")) {
            // In `ALTER TYPE … RENAME TO`, the new name is a type; otherwise a table.
            let is_type = tokens[..i]
                .iter()
                .rev()
                .find(|t| t.is_keyword("table") || t.is_keyword("type"))
                .is_some_and(|t| t.is_keyword("type"));
            let names = names_after(&tokens[i + 1..], false);
            if is_type {
                out.types.extend(names);
            } else {
                out.tables.extend(names);
            }
        }
    }
}

/// The qualified names at the start of `tokens`, after `IF [NOT] EXISTS` and `ONLY`; with
/// `list`, a comma-separated list of them (`DROP TABLE a, b`).
fn names_after(tokens: &[lex::Token], list: bool) -> Vec<NameRef> {
    let mut i = 0;
    while tokens.get(i).is_some_and(|t| {
        t.is_keyword("if") || t.is_keyword("not") || t.is_keyword("exists") || t.is_keyword("only")
    }) {
        i += 1;
    }
    let mut names = Vec::new();
    loop {
        let mut parts = Vec::new();
        loop {
            let part = match tokens.get(i).map(|t| &t.kind) {
                Some(Kind::Word(w)) => w.to_ascii_lowercase(),
                Some(Kind::QuotedIdent(q)) => q.clone(),
                _ => break,
            };
            parts.push(part);
            i += 1;
            if tokens.get(i).map(|t| &t.kind) == Some(&Kind::Punct('.')) {
                i += 1;
            } else {
                break;
            }
        }
        let Some(name) = parts.pop() else {
            break;
        };
        names.push((parts.pop(), name));
        if list && tokens.get(i).map(|t| &t.kind) == Some(&Kind::Punct(',')) {
            i += 1;
        } else {
            break;
        }
    }
    names
}
