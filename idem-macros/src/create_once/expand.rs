//! The generated create-once: `INSERT … ON CONFLICT (unique) DO NOTHING RETURNING *`, and when
//! the number is taken, the row that has it.

use proc_macro2::{Span, TokenStream};
use quote::quote_spanned;
use syn::Ident;

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
    let unique_args: Vec<&Ident> = m
        .unique
        .iter()
        .filter_map(|u| m.values.iter().find(|a| *a == u.name.as_str()))
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
    let (values, ty) = (&m.values, &m.returning);
    let p = m.target.krate.private();
    let attempt = quote_spanned! {Span::mixed_site()=>
        let inserted: ::core::option::Option<#ty> = #p::sqlx::query_as(#insert)
            #(.bind(&#values))*
            .fetch_optional(&mut *conn)
            .await
            .map_err(#p::sql_error)?;
        if let ::core::option::Option::Some(row) = inserted {
            return ::core::result::Result::Ok(#p::Created::Inserted(row));
        }
        // The number is taken: the row that holds it is the answer, not an error.
        let existing: ::core::option::Option<#ty> = #p::sqlx::query_as(#select)
            #(.bind(&#unique_args))*
            .fetch_optional(&mut *conn)
            .await
            .map_err(#p::sql_error)?;
        if let ::core::option::Option::Some(row) = existing {
            return ::core::result::Result::Ok(#p::Created::Existing(row));
        }
        // Deleted between the two statements: insert again.
    };
    shell::function(decl, Body::new(&m.target, attempt))
}
