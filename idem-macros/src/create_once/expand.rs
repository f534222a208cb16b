//! The generated create-once: `INSERT … ON CONFLICT (unique) DO NOTHING RETURNING *`, and when
//! the number is taken, the row that has it. MySQL has neither: there the `INSERT` is plain, a
//! duplicate key is the number taken, and the row inserted is read back in the `INSERT`'s
//! transaction (a savepoint in the caller's), under the `INSERT`'s lock.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::Ident;
use syn::spanned::Spanned;

use super::valid::Model;
use crate::sql::shell::{self, Body};
use crate::sql::{Decl, mysql};

pub(super) fn expand(m: Model, decl: Decl) -> TokenStream {
    let names: Vec<&str> = m.columns.iter().map(|c| c.quoted.as_str()).collect();
    let params: Vec<String> = (1..=m.columns.len()).map(|i| format!("${i}")).collect();
    let conflict: Vec<&str> = m.unique.iter().map(|c| c.quoted.as_str()).collect();
    let plain_insert = format!(
        "INSERT INTO {} ({}) VALUES ({})",
        m.target.table.quoted,
        names.join(", "),
        params.join(", "),
    );
    let insert = format!(
        "{plain_insert} ON CONFLICT ({}) DO NOTHING RETURNING *",
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
    let value_refs: Vec<TokenStream> = values.iter().map(|a| quote!(&#a)).collect();
    let (my_insert, order) = mysql::render(&plain_insert);
    let my_insert_binds = mysql::binds(&order, &value_refs);
    let unique_refs: Vec<TokenStream> = unique_args.iter().map(|a| quote!(&#a)).collect();
    // A locking read: the row as last committed, even in an older snapshot.
    let (my_select, order) = mysql::render(&format!("{select} LOCK IN SHARE MODE"));
    let my_select_binds = mysql::binds(&order, &unique_refs);
    let attempt = quote_spanned! {Span::mixed_site()=>
        if let #p::Database::Mysql = #p::database(&*conn) {
            let mut tx = #p::sqlx::Connection::begin(&mut *conn)
                .await
                .map_err(#p::sql_error)?;
            let taken = match #p::sqlx::query(#my_insert) #my_insert_binds .execute(&mut *tx).await {
                ::core::result::Result::Ok(_) => {
                    let row = #p::sqlx::query(#my_select) #my_select_binds
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(#p::sql_error)?;
                    tx.commit().await.map_err(#p::sql_error)?;
                    let row = #p::decode(&__idem_rows, &row)?;
                    return ::core::result::Result::Ok(#p::Created::Inserted(row));
                }
                ::core::result::Result::Err(e) if #p::is_unique_violation(&e) => e,
                ::core::result::Result::Err(e) => return ::core::result::Result::Err(#p::sql_error(e)),
            };
            tx.rollback().await.map_err(#p::sql_error)?;
            let existing = #p::sqlx::query(#my_select) #my_select_binds
                .fetch_optional(&mut *conn)
                .await
                .map_err(#p::sql_error)?;
            return match existing {
                ::core::option::Option::Some(row) => {
                    let row = #p::decode(&__idem_rows, &row)?;
                    ::core::result::Result::Ok(#p::Created::Existing(row))
                }
                // Another unique column's value was taken, not the one `unique` names.
                ::core::option::Option::None => ::core::result::Result::Err(#p::sql_error(taken)),
            };
        }
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
