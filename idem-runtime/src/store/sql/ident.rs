//! Table and index names: checked, then quoted.

use crate::error::{Error, Result};

/// Checks that `name` is an identifier (`schema.table` where `qualified`) and returns it quoted.
///
/// Only `[A-Za-z_][A-Za-z0-9_]*` parts of at most 63 bytes are accepted, so the quoted form can
/// never contain a quote: a table name is configuration, but it is spliced into SQL text, and
/// nothing that could close a quote gets there.
pub(crate) fn quote_table(name: &str, qualified: bool) -> Result<String> {
    let parts: Vec<&str> = name.split('.').collect();
    let max_parts = if qualified { 2 } else { 1 };
    if parts.len() > max_parts || parts.iter().any(|p| !is_identifier(p)) {
        let shape = if qualified {
            ", optionally `schema.table`"
        } else {
            ""
        };
        return Err(Error::Config(format!(
            "table name {name:?} is not an identifier: use letters, digits and `_` (not first), at most 63 bytes{shape}"
        )));
    }
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
}

/// Whether `s` is a plain SQL identifier.
pub(super) fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// The unquoted last part of a table name, for naming its indexes.
pub(crate) fn base_name(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

/// The name of the index on `expires_at` of table `name` (unquoted, in the table's schema).
/// The name of the records table's index on `column`, as `store::schema` names it.
pub(super) fn index_name(name: &str, column: &str) -> String {
    format!("{}_{column}_idx", base_name(name))
}
