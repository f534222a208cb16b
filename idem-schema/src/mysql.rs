//! What MySQL's DDL adds to the replay: columns defined anew (`MODIFY`, `CHANGE`) and placed
//! (`FIRST`, `AFTER`), inline `ENUM(…)` types, indexes dropped by the names MySQL gives them,
//! and the table options the parser does not read in an `ALTER TABLE`.

use sqlparser::ast::{
    ColumnDef, ColumnOption, ColumnOptionDef, DataType, EnumMember, Ident, MySQLColumnPosition,
};

use super::catalog::Table;
use super::lex::{self, Kind};
use super::replay::fold;

/// MySQL's `FIRST` or `AFTER column` for the column `name`; where it stands otherwise.
pub(super) fn place(table: &mut Table, name: &str, position: Option<&MySQLColumnPosition>) {
    let Some(position) = position else {
        return;
    };
    let Some(from) = table.columns.iter().position(|c| c.name == name) else {
        return;
    };
    let column = table.columns.remove(from);
    let at = match position {
        MySQLColumnPosition::First => 0,
        MySQLColumnPosition::After(after) => {
            let after = fold(after);
            table
                .columns
                .iter()
                .position(|c| c.name.eq_ignore_ascii_case(&after))
                .map_or(table.columns.len(), |i| i + 1)
        }
    };
    table.columns.insert(at, column);
}

/// A column definition from the parts of MySQL's `MODIFY` or `CHANGE`.
pub(super) fn column_def(
    name: &Ident,
    data_type: &DataType,
    options: &[ColumnOption],
) -> ColumnDef {
    ColumnDef {
        name: name.clone(),
        data_type: data_type.clone(),
        options: options
            .iter()
            .map(|option| ColumnOptionDef {
                name: None,
                option: option.clone(),
            })
            .collect(),
    }
}

/// The labels of MySQL's `ENUM('A', 'B')`.
pub(super) fn inline_enum(data_type: &DataType) -> Option<Vec<String>> {
    let DataType::Enum(members, _) = data_type else {
        return None;
    };
    Some(
        members
            .iter()
            .map(|m| match m {
                EnumMember::Name(name) | EnumMember::NamedValue(name, _) => name.clone(),
            })
            .collect(),
    )
}

/// MySQL's `DROP INDEX name` on `table`: a unique key by the name it was given, else an index
/// that makes nothing unique, else a key declared without a name by the name MySQL gave it.
pub(super) fn drop_index(table: &mut Table, name: &str) {
    let before = table.unique.len();
    table.unique.retain(|u| {
        u.name
            .as_ref()
            .is_none_or(|n| !n.name.eq_ignore_ascii_case(name))
    });
    if table.unique.len() != before {
        return;
    }
    let before = table.plain_indexes.len();
    table
        .plain_indexes
        .retain(|i| !i.eq_ignore_ascii_case(name));
    if table.plain_indexes.len() != before {
        return;
    }
    table
        .unique
        .retain(|u| u.name.is_some() || !u.generated_name.eq_ignore_ascii_case(name));
}

/// `ALTER TABLE t ENGINE = InnoDB`, `… CONVERT TO CHARACTER SET utf8mb4`, `… AUTO_INCREMENT =
/// 100` and the like: MySQL's table options, which the parser does not read in an
/// `ALTER TABLE`, with no operation on a column, key or constraint.
pub(super) fn only_table_options(text: &str) -> bool {
    const OPTIONS: &[&str] = &[
        "engine",
        "convert",
        "default",
        "charset",
        "character",
        "collate",
        "comment",
        "auto_increment",
        "row_format",
        "key_block_size",
        "stats_persistent",
        "stats_auto_recalc",
        "stats_sample_pages",
        "pack_keys",
        "checksum",
        "delay_key_write",
        "avg_row_length",
        "max_rows",
        "min_rows",
        "compression",
        "encryption",
        "force",
    ];
    const OPERATIONS: &[&str] = &[
        "add",
        "drop",
        "modify",
        "change",
        "rename",
        "alter",
        "column",
        "index",
        "key",
        "constraint",
        "check",
        "partition",
        "discard",
        "import",
        "order",
    ];
    let tokens = lex::lex_as(text, true);
    let mut i = 0;
    for keyword in ["alter", "table"] {
        if !tokens.get(i).is_some_and(|t| t.is_keyword(keyword)) {
            return false;
        }
        i += 1;
    }
    while tokens
        .get(i)
        .is_some_and(|t| t.is_keyword("if") || t.is_keyword("exists"))
    {
        i += 1;
    }
    // The table's name, perhaps qualified.
    loop {
        if !matches!(
            tokens.get(i).map(|t| &t.kind),
            Some(Kind::Word(_) | Kind::QuotedIdent(_))
        ) {
            return false;
        }
        i += 1;
        if tokens.get(i).map(|t| &t.kind) == Some(&Kind::Punct('.')) {
            i += 1;
        } else {
            break;
        }
    }
    let word = |t: &lex::Token| match &t.kind {
        Kind::Word(w) => Some(w.to_ascii_lowercase()),
        _ => None,
    };
    tokens
        .get(i)
        .and_then(word)
        .is_some_and(|w| OPTIONS.contains(&w.as_str()))
        && !tokens[i..]
            .iter()
            .filter_map(word)
            .any(|w| OPERATIONS.contains(&w.as_str()))
}
