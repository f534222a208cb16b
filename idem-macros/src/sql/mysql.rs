//! The generated statements in MySQL's terms: MySQL numbers no placeholders (`?` is bound in
//! the order it appears) and quotes identifiers with backquotes.

use proc_macro2::TokenStream;
use quote::quote;

/// `sql` (written with `"identifiers"` and `$n` parameters, as for PostgreSQL) as MySQL takes
/// it, and the numbers of the parameters in the order MySQL binds them: a number used twice is
/// bound twice. The generated statements hold no string literals, and their identifiers are
/// plain words (`SqlIdent`), so nothing else needs reading.
pub(crate) fn render(sql: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(sql.len());
    let mut order = Vec::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => out.push('`'),
            '$' if chars.peek().is_some_and(char::is_ascii_digit) => {
                let mut n = 0;
                while let Some(digit) = chars.peek().and_then(|d| d.to_digit(10)) {
                    n = n * 10 + digit as usize;
                    chars.next();
                }
                out.push('?');
                order.push(n);
            }
            c => out.push(c),
        }
    }
    (out, order)
}

/// `.bind(…)` for each parameter of `order`, from `values` (parameter `n` is `values[n - 1]`).
pub(crate) fn binds(order: &[usize], values: &[TokenStream]) -> TokenStream {
    let chain = order.iter().map(|&n| &values[n - 1]);
    quote!(#(.bind(#chain))*)
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn placeholders_are_bound_in_the_order_they_appear() {
        let (sql, order) = render(
            r#"UPDATE "s"."t" SET "a" = $3, "b" = $10 WHERE "k" = $1 AND "g" <=> $2 AND "a" = $3"#,
        );
        assert_eq!(
            sql,
            "UPDATE `s`.`t` SET `a` = ?, `b` = ? WHERE `k` = ? AND `g` <=> ? AND `a` = ?"
        );
        assert_eq!(order, [3, 10, 1, 2, 3]);
    }

    #[test]
    fn a_dollar_without_a_number_stays() {
        assert_eq!(render("SELECT $ FROM t").0, "SELECT $ FROM t");
    }
}
