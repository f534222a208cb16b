//! The scope template language: text with `<placeholder>`s naming arguments or their fields.
//!
//! `refund:<order_no>`, `order:<user.id>:<cart.0>`. A placeholder is an argument name followed
//! by `.field` or `.0` steps. Two placeholders must be separated by a delimiter other than a
//! letter, digit, `-`, `_`, `.`, `~` or `%` (values are percent-encoded to exactly that alphabet),
//! so that every scope splits back into its values one way only.

use proc_macro2::Span;

/// A parsed template.
#[derive(Debug)]
pub(crate) struct Template {
    pub(crate) parts: Vec<Part>,
    /// Bytes of literal text: the capacity hint for the rendered scope.
    pub(crate) literal_len: usize,
}

#[derive(Debug)]
pub(crate) enum Part {
    Text(String),
    Hole(Hole),
}

#[derive(Debug)]
pub(crate) struct Hole {
    /// The argument.
    pub(crate) root: String,
    /// Field steps after it: names or tuple indices.
    pub(crate) fields: Vec<String>,
    /// The placeholder as written, for messages.
    pub(crate) written: String,
}

fn is_value_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'%')
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && s != "_"
}

pub(crate) fn parse(text: &str, span: Span) -> syn::Result<Template> {
    let err = |msg: String| syn::Error::new(span, msg);
    if text.is_empty() {
        return Err(err(
            "the scope template is empty: name the operation and what it acts on, e.g. `scope = \"refund:<order_no>\"`".into(),
        ));
    }
    let mut parts = Vec::new();
    let mut literal_len = 0;
    let mut rest = text;
    while !rest.is_empty() {
        match rest.find(['<', '>']) {
            None => {
                literal_len += rest.len();
                parts.push(Part::Text(rest.to_owned()));
                rest = "";
            }
            Some(i) if rest.as_bytes()[i] == b'>' => {
                return Err(err(format!(
                    "unmatched `>` in scope template `{text}`: placeholders look like `<order_no>`, and `<` and `>` cannot appear in the text"
                )));
            }
            Some(i) => {
                if i > 0 {
                    literal_len += i;
                    parts.push(Part::Text(rest[..i].to_owned()));
                }
                let (hole, after) = placeholder(&rest[i + 1..], text).map_err(err)?;
                separated(&parts, &hole, text).map_err(err)?;
                parts.push(Part::Hole(hole));
                rest = after;
            }
        }
    }
    let named = parts
        .iter()
        .any(|p| matches!(p, Part::Text(t) if t.bytes().any(|b| b.is_ascii_alphanumeric())));
    if !named {
        return Err(err(format!(
            "scope template `{text}` has no literal text: start it with the operation's name, e.g. `refund:{text}`. Two functions with the same template share their records, so one would get the other's answers"
        )));
    }
    Ok(Template { parts, literal_len })
}

/// The placeholder that `after` (the text after a `<`) starts with, and the text after its `>`.
fn placeholder<'a>(after: &'a str, text: &str) -> Result<(Hole, &'a str), String> {
    let Some(close) = after
        .find(['>', '<'])
        .filter(|&j| after.as_bytes()[j] == b'>')
    else {
        return Err(format!(
            "unclosed `<` in scope template `{text}`: close the placeholder, e.g. `<order_no>`"
        ));
    };
    let inner = after[..close].trim();
    if inner.is_empty() {
        return Err(format!(
            "empty placeholder `<>` in scope template `{text}`: name an argument inside, e.g. `<order_no>`"
        ));
    }
    let mut steps = inner.split('.');
    let root = steps.next().unwrap_or_default();
    let fields: Vec<String> = steps.map(str::to_owned).collect();
    let field_ok =
        |f: &String| is_ident(f) || (!f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()));
    if !is_ident(root) || !fields.iter().all(field_ok) {
        return Err(format!(
            "`<{inner}>` in scope template `{text}` is not an argument or a field path: use `<name>` or `<name.field>`"
        ));
    }
    let hole = Hole {
        root: root.to_owned(),
        fields,
        written: inner.to_owned(),
    };
    Ok((hole, &after[close + 1..]))
}

/// A placeholder after another needs a delimiter between them that no value can contain, so
/// that every scope splits back into its values one way only.
fn separated(parts: &[Part], hole: &Hole, text: &str) -> Result<(), String> {
    let inner = &hole.written;
    if let Some(Part::Hole(prev)) = parts.last() {
        return Err(format!(
            "placeholders `<{}>` and `<{inner}>` in scope template `{text}` must be separated by a delimiter such as `:`, so that different values can never render the same scope",
            prev.written
        ));
    }
    if let (Some(Part::Text(between)), Some(Part::Hole(prev))) = (
        parts.last(),
        parts.len().checked_sub(2).and_then(|k| parts.get(k)),
    ) && between.bytes().all(is_value_byte)
    {
        return Err(format!(
            "placeholders `<{}>` and `<{inner}>` in scope template `{text}` are separated only by `{between}`, which values can contain: add a delimiter such as `:` or `/`",
            prev.written
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holes(t: &str) -> Vec<String> {
        parse(t, Span::call_site())
            .unwrap()
            .parts
            .into_iter()
            .filter_map(|p| match p {
                Part::Hole(h) => Some(h.written),
                Part::Text(_) => None,
            })
            .collect()
    }

    fn error(t: &str) -> String {
        parse(t, Span::call_site()).unwrap_err().to_string()
    }

    #[test]
    fn accepts() {
        assert_eq!(holes("refund:<order_no>"), ["order_no"]);
        assert_eq!(holes("order:<user.id>:<cart.0>"), ["user.id", "cart.0"]);
        assert_eq!(holes("consumer:payments"), Vec::<String>::new());
        assert_eq!(holes("pair:<a>/<b>"), ["a", "b"]);
    }

    #[test]
    fn rejects() {
        assert!(error("").contains("empty"));
        assert!(error("refund:<order_no").contains("unclosed"));
        assert!(error("refund:<a<b>").contains("unclosed"));
        assert!(error("refund:>").contains("unmatched"));
        assert!(error("refund:<>").contains("empty placeholder"));
        assert!(error("refund:<order no>").contains("not an argument"));
        assert!(error("refund:<1x>").contains("not an argument"));
        assert!(error("x:<a><b>").contains("separated"));
        assert!(error("x:<a>-<b>").contains("separated only by"));
        assert!(error("<order_no>").contains("no literal text"));
        assert!(error(":<a>/<b>").contains("no literal text"));
    }
}
