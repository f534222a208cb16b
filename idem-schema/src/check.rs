//! Reading a CHECK constraint for the values it allows a column.
//!
//! A row passes a CHECK when its expression is true *or null*, so what can be concluded is
//! "whenever the row passes, the column is NULL or one of these values". The reader follows
//! lists (`IN (…)`, `= ANY (ARRAY[…])`), equalities, `IS [NOT] NULL`, `AND` and `OR`, and
//! calls anything else that mentions the column opaque, which restricts nothing.

use std::collections::BTreeMap;

use sqlparser::ast::{BinaryOperator, Expr, InTarget, UnaryOperator, Value};

use super::catalog::Restriction;
use super::lex::{Kind, lex};

/// What an expression says about one column.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Says {
    /// Nothing: the column does not matter to it.
    Nothing,
    /// Whenever it holds, the column is NULL or one of these values.
    Only(Vec<String>),
    /// It restricts the column in a way this reader does not follow.
    Opaque,
}

/// The columns among `columns` that `expr` mentions, in order of first mention.
pub(super) fn mentioned(expr: &Expr, columns: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for token in lex(&expr.to_string()) {
        let name = match token.kind {
            Kind::Word(w) => w.to_ascii_lowercase(),
            Kind::QuotedIdent(q) => q,
            _ => continue,
        };
        if columns.contains(&name.as_str()) && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// What `expr` says about each table column it mentions (columns it says nothing about are
/// left out), and the columns in order of first mention.
pub(super) fn read(expr: &Expr, columns: &[&str]) -> (BTreeMap<String, Restriction>, Vec<String>) {
    let named = mentioned(expr, columns);
    let mut out = BTreeMap::new();
    for column in &named {
        match says(expr, column) {
            Says::Nothing => {}
            Says::Only(values) => {
                out.insert(column.clone(), Restriction::Only(values));
            }
            Says::Opaque => {
                out.insert(column.clone(), Restriction::Opaque);
            }
        }
    }
    (out, named)
}

fn says(expr: &Expr, column: &str) -> Says {
    match expr {
        Expr::Nested(inner) => says(inner, column),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => both(says(left, column), says(right, column)),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Or,
            right,
        } => either(says(left, column), says(right, column)),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } => {
            let (col, other) = if is_column(left, column) {
                (true, right)
            } else if is_column(right, column) {
                (true, left)
            } else {
                (false, right)
            };
            match (col, literal(other)) {
                (true, Literal::Text(v)) => Says::Only(vec![v]),
                // `= NULL` is never false: it passes every row.
                (true, Literal::Null) => Says::Nothing,
                _ => opaque_if_mentioned(expr, column),
            }
        }
        Expr::In {
            expr: inner,
            target: InTarget::List(list),
            negated: false,
            ..
        } if is_column(inner, column) => list_of(list).unwrap_or(Says::Opaque),
        Expr::AnyOp {
            left,
            compare_op: BinaryOperator::Eq,
            right,
            ..
        } if is_column(left, column) => match array(right) {
            Some(items) => list_of(items).unwrap_or(Says::Opaque),
            None => Says::Opaque,
        },
        // Only NULL passes, so no value does.
        Expr::IsNull(inner) if is_column(inner, column) => Says::Only(Vec::new()),
        Expr::IsNotNull(inner) if is_column(inner, column) => Says::Nothing,
        Expr::UnaryOp {
            op: UnaryOperator::Not,
            ..
        } => opaque_if_mentioned(expr, column),
        _ => opaque_if_mentioned(expr, column),
    }
}

fn opaque_if_mentioned(expr: &Expr, column: &str) -> Says {
    if mentioned(expr, &[column]).is_empty() {
        Says::Nothing
    } else {
        Says::Opaque
    }
}

/// `a AND b` holds only when both do.
fn both(a: Says, b: Says) -> Says {
    match (a, b) {
        (Says::Only(x), Says::Only(y)) => {
            Says::Only(x.into_iter().filter(|v| y.contains(v)).collect())
        }
        (Says::Only(x), _) | (_, Says::Only(x)) => Says::Only(x),
        (Says::Opaque, _) | (_, Says::Opaque) => Says::Opaque,
        (Says::Nothing, Says::Nothing) => Says::Nothing,
    }
}

/// `a OR b` holds when either does: only two lists combine; a side that does not restrict the
/// column lets any value through.
fn either(a: Says, b: Says) -> Says {
    match (a, b) {
        (Says::Only(mut x), Says::Only(y)) => {
            for v in y {
                if !x.contains(&v) {
                    x.push(v);
                }
            }
            Says::Only(x)
        }
        (Says::Nothing, Says::Nothing) => Says::Nothing,
        _ => Says::Opaque,
    }
}

/// A list of literals. A NULL in an `IN` list makes every other value pass (the comparison is
/// null, not false), so the list says nothing; anything but literals is not read.
fn list_of(items: &[Expr]) -> Option<Says> {
    let mut values = Vec::new();
    for item in items {
        match literal(item) {
            Literal::Text(v) => {
                if !values.contains(&v) {
                    values.push(v);
                }
            }
            Literal::Null => return Some(Says::Nothing),
            Literal::Other => return None,
        }
    }
    Some(Says::Only(values))
}

/// `ARRAY['A', 'B']`, possibly parenthesized or cast (`(ARRAY['A'::text, 'B'::text])`, as
/// `pg_dump` writes an `IN` list).
fn array(expr: &Expr) -> Option<&[Expr]> {
    match expr {
        Expr::Array(a) => Some(&a.elem),
        Expr::Nested(inner) => array(inner),
        Expr::Cast { expr, .. } => array(expr),
        _ => None,
    }
}

fn is_column(expr: &Expr, column: &str) -> bool {
    match expr {
        Expr::Identifier(ident) => fold(&ident.value, ident.quote_style) == column,
        // `orders.status`: the table qualifier can only be this table.
        Expr::CompoundIdentifier(parts) => parts
            .last()
            .is_some_and(|i| fold(&i.value, i.quote_style) == column),
        // `status::text` compares the same labels.
        Expr::Nested(inner)
        | Expr::Cast { expr: inner, .. }
        | Expr::Collate { expr: inner, .. } => is_column(inner, column),
        _ => false,
    }
}

fn fold(value: &str, quote: Option<char>) -> String {
    match quote {
        None => value.to_ascii_lowercase(),
        Some(_) => value.to_owned(),
    }
}

enum Literal {
    Text(String),
    Null,
    Other,
}

fn literal(expr: &Expr) -> Literal {
    match expr {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s)
            | Value::EscapedStringLiteral(s)
            | Value::UnicodeStringLiteral(s)
            | Value::NationalStringLiteral(s) => Literal::Text(s.clone()),
            Value::DollarQuotedString(d) => Literal::Text(d.value.clone()),
            Value::Number(n, _) => Literal::Text(n.to_string()),
            Value::Null => Literal::Null,
            _ => Literal::Other,
        },
        // `'PAID'::text`, `'PAID'::order_status`
        Expr::Nested(inner) | Expr::Cast { expr: inner, .. } => literal(inner),
        _ => Literal::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::parser::Parser;

    fn restriction(check: &str, column: &str) -> Option<Restriction> {
        let expr = Parser::new(&PostgreSqlDialect {})
            .try_with_sql(check)
            .and_then(|mut p| p.parse_expr())
            .unwrap_or_else(|e| panic!("test expression `{check}`: {e}"));
        let (map, _) = read(&expr, &["status", "amount", "kind"]);
        map.get(column).cloned()
    }

    fn only(values: &[&str]) -> Option<Restriction> {
        Some(Restriction::Only(
            values.iter().map(|v| v.to_string()).collect(),
        ))
    }

    #[test]
    fn reads_lists_and_equalities() {
        assert_eq!(
            restriction("status IN ('PENDING', 'PAID')", "status"),
            only(&["PENDING", "PAID"])
        );
        assert_eq!(
            restriction("status = 'PENDING' OR 'PAID' = status", "status"),
            only(&["PENDING", "PAID"])
        );
        assert_eq!(
            restriction("(status = ANY (ARRAY['A'::text, 'B'::text]))", "status"),
            only(&["A", "B"])
        );
        assert_eq!(
            restriction("status::text IN ('A', 'B')", "status"),
            only(&["A", "B"])
        );
        assert_eq!(restriction("kind IN (1, 2)", "kind"), only(&["1", "2"]));
    }

    #[test]
    fn and_narrows_or_widens() {
        assert_eq!(
            restriction("status IN ('A', 'B') AND amount > 0", "status"),
            only(&["A", "B"])
        );
        assert_eq!(
            restriction("status IN ('A', 'B') AND amount > 0", "amount"),
            Some(Restriction::Opaque)
        );
        assert_eq!(
            restriction(
                "status IN ('A', 'B', 'C') AND status <> 'C' AND status IN ('B', 'C')",
                "status"
            ),
            only(&["B", "C"])
        );
        assert_eq!(
            restriction("status IN ('A') OR status IS NULL", "status"),
            only(&["A"])
        );
    }

    #[test]
    fn what_it_cannot_read_restricts_nothing() {
        for check in [
            "status NOT IN ('A')",
            "status IN ('A') OR amount > 0",
            "lower(status) IN ('a')",
            "status LIKE 'A%'",
            "status IN (SELECT s FROM states)",
        ] {
            assert_eq!(
                restriction(check, "status"),
                Some(Restriction::Opaque),
                "{check}"
            );
        }
        assert_eq!(restriction("status IN ('A', NULL)", "status"), None);
        assert_eq!(restriction("status IS NOT NULL", "status"), None);
        assert_eq!(restriction("amount > 0", "status"), None);
    }
}
