//! The generated create-once: `INSERT … ON CONFLICT (unique) DO NOTHING RETURNING *`, and when
//! the number is taken, the row that has it.

use proc_macro2::{Span, TokenStream};
use quote::quote_spanned;
use syn::Ident;
use syn::spanned::Spanned;

use super::valid::Model;
use crate::sql::Decl;
use crate::sql::shell::{self, Body};

pub(super) fn expand(m: Model, decl: Decl) -> TokenStream {
    let names: Vec<&str> = m.columns.iter().map(|c| c.quoted.as_str()).collect();
    let params: Vec<String> = (1..=m.columns.len()).map(|i| format!("${i}")).collect();
    let conflict: Vec<&str> = m.unique.iter().map(|c| c.quoted.as_str()).collect();
    let insert = format!(
        "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) DO NOTHING RETURNING *",
        m.target.table.quoted,
        names.join(", "),
        params.join(", "),
        conflict.join(", ")
    );
    let values: Vec<&Ident> = m.target.values.iter().map(|a| &a.ident).collect();
    let unique_args: Vec<&Ident> = m
        .unique
        .iter()
        .filter_map(|u| values.iter().copied().find(|a| *a == u.name.as_str()))
        .collect();
    let where_: Vec<String> = m
        .unique
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{} = ${}", c.quoted, i + 1))
        .collect();
    let select = format!(
        "SELECT * FROM {} WHERE {}",
        m.target.table.quoted,
        where_.join(" AND ")
    );
    let p = m.target.krate.private();
    let attempt = quote_spanned! {Span::mixed_site()=>
        let inserted = #p::sqlx::query(#insert)
            #(.bind(&#values))*
            .fetch_optional(&mut *conn)
            .await
            .map_err(#p::sql_error)?;
        if let ::core::option::Option::Some(row) = inserted {
            let row = #p::decode(&__idem_rows, &row)?;
            return ::core::result::Result::Ok(#p::Created::Inserted(row));
        }
        // The number is taken: the row that holds it is the answer, not an error.
        let existing = #p::sqlx::query(#select)
            #(.bind(&#unique_args))*
            .fetch_optional(&mut *conn)
            .await
            .map_err(#p::sql_error)?;
        if let ::core::option::Option::Some(row) = existing {
            let row = #p::decode(&__idem_rows, &row)?;
            return ::core::result::Result::Ok(#p::Created::Existing(row));
        }
        // Deleted between the two statements: insert again.
    };
    let mut body = Body::new(&m.target, attempt);
    body.checks = checks(&m);
    body.checks.extend(m.findings.tokens.clone());
    shell::function(decl, body)
}

/// The row type: the same as `returning` where the return type writes it, and readable from a
/// row, on `returning`.
fn checks(m: &Model) -> TokenStream {
    let returning = &m.returning;
    let row = shell::row(&m.target, m.row.as_ref(), returning);
    shell::rows(&m.target, row, returning.span())
}
