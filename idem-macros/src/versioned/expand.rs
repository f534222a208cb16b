//! The generated optimistic update: `UPDATE … SET …, version = version + 1 WHERE key AND
//! version = $n RETURNING version`, and when it changes nothing, the current version by key.

use proc_macro2::{Span, TokenStream};
use quote::quote_spanned;
use syn::Ident;

use super::valid::Model;
use crate::sql::Decl;
use crate::sql::shell::{self, Body, Params};

pub(super) fn expand(m: Model, decl: Decl) -> TokenStream {
    let mut params = Params::default();
    let key_where = params.equal(m.keys.iter().map(|(c, _)| c));
    let set_sql = params.equal(m.sets.iter().map(|(c, _)| c));
    let v = &m.version.quoted;
    let update = format!(
        "UPDATE {} SET {}, {v} = {v} + 1 WHERE {} AND {v} = {} RETURNING {v}",
        m.target.table.quoted,
        set_sql.join(", "),
        key_where.join(" AND "),
        params.next()
    );
    let select = format!(
        "SELECT {v} FROM {} WHERE {}",
        m.target.table.quoted,
        key_where.join(" AND ")
    );
    let key_args: Vec<&Ident> = m.keys.iter().map(|(_, a)| a).collect();
    let set_args: Vec<&Ident> = m.sets.iter().map(|(_, a)| a).collect();
    let p = m.target.krate.private();
    let attempt = quote_spanned! {Span::mixed_site()=>
        let updated: ::core::option::Option<i64> = #p::sqlx::query_scalar(#update)
            #(.bind(&#key_args))* #(.bind(&#set_args))* .bind(__idem_expected)
            .fetch_optional(&mut *conn)
            .await
            .map_err(#p::sql_error)?;
        if let ::core::option::Option::Some(version) = updated {
            return ::core::result::Result::Ok(#p::Versioned::Updated { version });
        }
        let current: ::core::option::Option<i64> = #p::sqlx::query_scalar(#select)
            #(.bind(&#key_args))*
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
