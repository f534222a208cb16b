//! SQL names in attribute strings: identifiers checked before they are spliced into SQL text,
//! column lists, and the `set` list.

use syn::LitStr;

/// A checked SQL identifier and its quoted form.
#[derive(Debug, Clone)]
pub(crate) struct SqlIdent {
    pub(crate) name: String,
    pub(crate) quoted: String,
}

fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Checks one identifier (or `schema.table` when `qualified`), reporting on `lit`.
pub(crate) fn ident(
    text: &str,
    lit: &LitStr,
    what: &str,
    qualified: bool,
) -> syn::Result<SqlIdent> {
    let text = text.trim();
    let parts: Vec<&str> = text.split('.').collect();
    let ok = parts.iter().all(|p| is_identifier(p))
        && (parts.len() == 1 || (qualified && parts.len() == 2));
    if !ok {
        let shape = if qualified {
            "letters, digits and `_` (not first), at most 63 bytes, optionally `schema.table`"
        } else {
            "letters, digits and `_` (not first), at most 63 bytes"
        };
        return Err(syn::Error::new(
            lit.span(),
            format_args!(
                "{what} `{text}` is not an SQL identifier: use {shape}. Names are spliced into the SQL text, so nothing else is accepted"
            ),
        ));
    }
    Ok(SqlIdent {
        name: text.to_owned(),
        quoted: parts
            .iter()
            .map(|p| format!("\"{p}\""))
            .collect::<Vec<_>>()
            .join("."),
    })
}

/// The whole literal as one identifier.
pub(crate) fn lit_ident(lit: &LitStr, what: &str, qualified: bool) -> syn::Result<SqlIdent> {
    ident(&lit.value(), lit, what, qualified)
}

/// A comma-separated list of column names in one string literal.
pub(crate) fn columns(lit: &LitStr, what: &str) -> syn::Result<Vec<SqlIdent>> {
    let value = lit.value();
    let mut out: Vec<SqlIdent> = Vec::new();
    for part in value.split(',') {
        let col = ident(part, lit, what, false)?;
        if out.iter().any(|c| c.name == col.name) {
            return Err(syn::Error::new(
                lit.span(),
                format_args!("{what} `{}` is listed twice", col.name),
            ));
        }
        out.push(col);
    }
    Ok(out)
}

/// One entry of a `set` list: `column` (from the argument of the same name) or
/// `column = now()` (the database's clock).
pub(crate) struct SetItem {
    pub(crate) column: SqlIdent,
    pub(crate) now: bool,
}

pub(crate) fn set_list(lit: &LitStr) -> syn::Result<Vec<SetItem>> {
    let mut out: Vec<SetItem> = Vec::new();
    for part in lit.value().split(',') {
        let (col, now) = match part.split_once('=') {
            None => (part, false),
            Some((col, value)) => {
                let v = value.trim().to_ascii_lowercase();
                if v != "now()" {
                    return Err(syn::Error::new(
                        lit.span(),
                        format_args!(
                            "`set` takes `column` (its value comes from the argument of the same name) or `column = now()` (the database's clock), not `{}`",
                            part.trim()
                        ),
                    ));
                }
                (col, true)
            }
        };
        let column = ident(col, lit, "set column", false)?;
        if out.iter().any(|s| s.column.name == column.name) {
            return Err(syn::Error::new(
                lit.span(),
                format_args!("set column `{}` is listed twice", column.name),
            ));
        }
        out.push(SetItem { column, now });
    }
    Ok(out)
}
