//! The generated optimistic update: `UPDATE … SET …, version = version + 1 WHERE key AND
//! version = $n RETURNING version`, and when it changes nothing, the current version by key.
//! On MySQL, which has no `RETURNING`, an `UPDATE` that matched its row wrote the expected
//! version plus one, and says so.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::Ident;

use super::valid::Model;
use crate::sql::shell::{self, Body, Params};
use crate::sql::{Decl, mysql};

pub(super) fn expand(m: Model, decl: Decl) -> TokenStream {
    let mut params = Params::default();
    let key_where = params.equal(m.keys.iter().map(|(c, _)| c));
    let set_sql = params.equal(m.sets.iter().map(|(c, _)| c));
    let v = &m.version.quoted;
    let update_sql = format!(
        "UPDATE {} SET {}, {v} = {v} + 1 WHERE {} AND {v} = {}",
        m.target.table.quoted,
        set_sql.join(", "),
        key_where.join(" AND "),
        params.next()
    );
    let update = format!("{update_sql} RETURNING {v}");
    let select = format!(
        "SELECT {v} FROM {} WHERE {}",
        m.target.table.quoted,
        key_where.join(" AND ")
    );
    let key_args: Vec<&Ident> = m.keys.iter().map(|(_, a)| a).collect();
    let set_args: Vec<&Ident> = m.sets.iter().map(|(_, a)| a).collect();
    let p = m.target.krate.private();
    // MySQL's `?` are bound in the order they appear: sets, then keys, then the version.
    let values: Vec<TokenStream> = key_args
        .iter()
        .chain(&set_args)
        .map(|a| quote!(&#a))
        .chain(std::iter::once(
            quote_spanned!(Span::mixed_site()=> __idem_expected),
        ))
        .collect();
    let (my_update, order) = mysql::render(&update_sql);
    let my_update_binds = mysql::binds(&order, &values);
    // A locking read: the version as last committed, even in an older snapshot.
    let (my_select, order) = mysql::render(&format!("{select} LOCK IN SHARE MODE"));
    let my_select_binds = mysql::binds(&order, &values);
    let attempt = quote_spanned! {Span::mixed_site()=>
        let mysql = ::core::matches!(#p::database(&*conn), #p::Database::Mysql);
        let updated: ::core::option::Option<i64> = if mysql {
            let done = #p::sqlx::query(#my_update) #my_update_binds
                .execute(&mut *conn)
                .await
                .map_err(#p::sql_error)?;
            (done.rows_affected() > 0).then_some(__idem_expected + 1)
        } else {
            #p::sqlx::query_scalar(#update)
                #(.bind(&#key_args))* #(.bind(&#set_args))* .bind(__idem_expected)
                .fetch_optional(&mut *conn)
                .await
                .map_err(#p::sql_error)?
        };
        if let ::core::option::Option::Some(version) = updated {
            return ::core::result::Result::Ok(#p::Versioned::Updated { version });
        }
        let current: ::core::option::Option<i64> = if mysql {
            #p::sqlx::query_scalar(#my_select) #my_select_binds
        } else {
            #p::sqlx::query_scalar(#select) #(.bind(&#key_args))*
        }
            .fetch_optional(&mut *conn)
            .await
            .map_err(#p::sql_error)?;
        match current {
            ::core::option::Option::None => {
                return ::core::result::Result::Ok(#p::Versioned::NotFound);
            }
            ::core::option::Option::Some(current_version) if current_version != __idem_expected => {
                return ::core::result::Result::Ok(#p::Versioned::Stale { current_version });
            }
            // The row was re-created with the expected version between the statements.
            ::core::option::Option::Some(_) => {}
        }
    };
    // The version argument is checked as a version (an `i64`, or narrower), on its name.
    let ident = &m.expected.ident;
    let span = ident.span();
    let p_at = m.target.krate.private_at(span);
    let version = quote_spanned!(span=> #p_at::version(&#ident));
    let mut body = Body::new(&m.target, attempt);
    body.checks = quote_spanned!(Span::mixed_site()=> let __idem_expected: i64 = #version;);
    body.checks.extend(m.findings.tokens.clone());
    body.unbound = vec![ident.clone()];
    shell::function(decl, body)
}
