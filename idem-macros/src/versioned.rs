//! `#[versioned_update]` (optimistic locking) and `#[create_once]` (insert, or return the row
//! a unique business number already names).

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::{Ident, LitStr, Type};

use crate::attr::{Errors, Grammar, lit_str};
use crate::sql::{self, SqlIdent};

#[derive(Default)]
struct Args {
    table: Option<LitStr>,
    key: Option<LitStr>,
    version: Option<LitStr>,
    set: Option<LitStr>,
    unique: Option<LitStr>,
    returning: Option<Type>,
    krate: Option<LitStr>,
    given: Vec<String>,
}

fn parse(
    attr: &'static str,
    names: &'static [&'static str],
    tokens: TokenStream,
    errors: &mut Errors,
) -> Args {
    let mut args = Args::default();
    let mut grammar = Grammar::new(attr, names);
    let parser = syn::meta::parser(|meta| {
        let Some(name) = grammar.check(&meta, errors)? else {
            return Ok(());
        };
        args.given.push(name.clone());
        match name.as_str() {
            "table" => args.table = lit_str(&meta, "table", "\"orders\"", errors)?,
            "key" => args.key = lit_str(&meta, "key", "\"user_id\"", errors)?,
            "version" => args.version = lit_str(&meta, "version", "\"version\"", errors)?,
            "set" => args.set = lit_str(&meta, "set", "\"nickname\"", errors)?,
            "unique" => args.unique = lit_str(&meta, "unique", "\"order_no\"", errors)?,
            "crate" => args.krate = lit_str(&meta, "crate", "\"::idem\"", errors)?,
            "returning" => args.returning = Some(meta.value()?.parse()?),
            _ => unreachable!("every accepted name is handled"),
        }
        Ok(())
    });
    if let Err(e) = syn::parse::Parser::parse2(parser, tokens) {
        errors.push(e);
        args.given.extend(names.iter().map(|n| n.to_string()));
    }
    args
}

fn missing(args: &Args, name: &str, present: bool, attr: &str, example: &str, errors: &mut Errors) {
    if !present && !args.given.iter().any(|g| g == name) {
        errors.at(
            Span::call_site(),
            format_args!("missing `{name}` in #[{attr}], e.g. `{example}`"),
        );
    }
}

fn fallback(decl: sql::Decl, e: syn::Error) -> TokenStream {
    let sql::Decl { attrs, vis, sig } = decl;
    let e = e.to_compile_error();
    quote! {
        #(#attrs)*
        #[allow(unused_variables)]
        #vis #sig { ::core::unimplemented!() }
        #e
    }
}

fn bind_all(
    lit: &LitStr,
    cols: Vec<SqlIdent>,
    fa: &sql::FnArgs,
    fn_name: &Ident,
    used: &mut Vec<Ident>,
    errors: &mut Errors,
) -> Vec<(SqlIdent, Ident)> {
    cols.into_iter()
        .filter_map(|c| match sql::arg_for(fa, &c, lit, fn_name) {
            Ok(a) => {
                used.push(a.clone());
                Some((c, a.clone()))
            }
            Err(e) => {
                errors.push(e);
                None
            }
        })
        .collect()
}

fn unused(fa: &sql::FnArgs, used: &[Ident], what: &str, errors: &mut Errors) {
    for a in &fa.values {
        if !used.contains(a) {
            errors.at(
                a.span(),
                format_args!("argument `{a}` is not a column of this {what}: name it in the attribute, or remove it"),
            );
        }
    }
}

fn list(errors: &mut Errors, lit: Option<&LitStr>, what: &str) -> Option<Vec<SqlIdent>> {
    let lit = lit?;
    sql::columns(lit, what).map_err(|e| errors.push(e)).ok()
}

const VERSIONED: &[&str] = &["table", "key", "version", "set", "crate"];

pub(crate) fn expand_versioned(args: TokenStream, item: TokenStream) -> TokenStream {
    let decl = match sql::decl(item, "versioned_update") {
        Ok(d) => d,
        Err(e) => return e,
    };
    let mut errors = Errors::default();
    let args = parse("versioned_update", VERSIONED, args, &mut errors);
    let sig = &decl.sig;
    if let Err(e) = sql::require_async(sig, "versioned_update") {
        errors.push(e);
    }
    missing(
        &args,
        "table",
        args.table.is_some(),
        "versioned_update",
        "table = \"user_profile\"",
        &mut errors,
    );
    missing(
        &args,
        "key",
        args.key.is_some(),
        "versioned_update",
        "key = \"user_id\"",
        &mut errors,
    );
    missing(
        &args,
        "set",
        args.set.is_some(),
        "versioned_update",
        "set = \"nickname\"",
        &mut errors,
    );
    let fa = sql::fn_args(sig, "versioned_update")
        .map_err(|e| errors.push(e))
        .ok();
    let table = args.table.as_ref().and_then(|l| {
        sql::ident(&l.value(), l, "table", true)
            .map_err(|e| errors.push(e))
            .ok()
    });
    let version_lit = args
        .version
        .clone()
        .unwrap_or_else(|| LitStr::new("version", Span::call_site()));
    let version = sql::ident(&version_lit.value(), &version_lit, "version column", false)
        .map_err(|e| errors.push(e))
        .ok();
    let keys = list(&mut errors, args.key.as_ref(), "key column");
    let sets = list(&mut errors, args.set.as_ref(), "set column");
    let mut used = Vec::new();
    let bound = fa.as_ref().map(|fa| {
        let keys = keys.clone().map(|k| {
            bind_all(
                args.key.as_ref().unwrap_or(&version_lit),
                k,
                fa,
                &sig.ident,
                &mut used,
                &mut errors,
            )
        });
        let sets = sets.clone().map(|s| {
            bind_all(
                args.set.as_ref().unwrap_or(&version_lit),
                s,
                fa,
                &sig.ident,
                &mut used,
                &mut errors,
            )
        });
        let expected = version.as_ref().and_then(|v| {
            bind_all(
                &version_lit,
                vec![v.clone()],
                fa,
                &sig.ident,
                &mut used,
                &mut errors,
            )
            .pop()
        });
        unused(fa, &used, "versioned update", &mut errors);
        (keys, sets, expected)
    });
    if let Err(e) = errors.finish() {
        return fallback(decl, e);
    }
    let mut errors = Errors::default();
    let krate = crate::attr::krate(args.krate.as_ref(), &mut errors);
    if let Err(e) = errors.finish() {
        return fallback(decl, e);
    }
    let (Some(table), Some(version), Some(fa), Some((Some(keys), Some(sets), Some((_, expected))))) =
        (table, version, fa, bound)
    else {
        return fallback(
            decl,
            syn::Error::new(Span::call_site(), "invalid #[versioned_update]"),
        );
    };

    let mut n = 0;
    let mut param = || {
        n += 1;
        format!("${n}")
    };
    let key_where: Vec<String> = keys
        .iter()
        .map(|(c, _)| format!("{} = {}", c.quoted, param()))
        .collect();
    let set_sql: Vec<String> = sets
        .iter()
        .map(|(c, _)| format!("{} = {}", c.quoted, param()))
        .collect();
    let v = &version.quoted;
    let update = format!(
        "UPDATE {} SET {}, {v} = {v} + 1 WHERE {} AND {v} = {} RETURNING {v}",
        table.quoted,
        set_sql.join(", "),
        key_where.join(" AND "),
        param()
    );
    let select = format!(
        "SELECT {v} FROM {} WHERE {}",
        table.quoted,
        key_where.join(" AND ")
    );
    let key_args: Vec<&Ident> = keys.iter().map(|(_, a)| a).collect();
    let set_args: Vec<&Ident> = sets.iter().map(|(_, a)| a).collect();
    let exec = &fa.executor;
    let table_name = &table.name;
    let p = quote!(#krate::__private);
    let sql::Decl { attrs, vis, sig } = decl;
    quote_spanned! {Span::mixed_site()=>
        #(#attrs)*
        #vis #sig {
            let mut conn = #p::transition_acquire(#exec).await.map_err(#p::sql_error)?;
            let conn = &mut *conn;
            for _ in 0..3u8 {
                let updated: ::core::option::Option<i64> = #p::sqlx::query_scalar(#update)
                    #(.bind(&#key_args))* #(.bind(&#set_args))* .bind(&#expected)
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
                    ::core::option::Option::Some(current_version) if current_version != #expected => {
                        return ::core::result::Result::Ok(#p::Versioned::Stale { current_version });
                    }
                    // The row was re-created with the expected version between the statements.
                    ::core::option::Option::Some(_) => {}
                }
            }
            ::core::result::Result::Err(::core::convert::From::from(#p::contention(#table_name)))
        }
    }
}

const CREATE_ONCE: &[&str] = &["table", "unique", "returning", "crate"];

pub(crate) fn expand_create_once(args: TokenStream, item: TokenStream) -> TokenStream {
    let decl = match sql::decl(item, "create_once") {
        Ok(d) => d,
        Err(e) => return e,
    };
    let mut errors = Errors::default();
    let args = parse("create_once", CREATE_ONCE, args, &mut errors);
    let sig = &decl.sig;
    if let Err(e) = sql::require_async(sig, "create_once") {
        errors.push(e);
    }
    missing(
        &args,
        "table",
        args.table.is_some(),
        "create_once",
        "table = \"orders\"",
        &mut errors,
    );
    missing(
        &args,
        "unique",
        args.unique.is_some(),
        "create_once",
        "unique = \"order_no\"",
        &mut errors,
    );
    missing(
        &args,
        "returning",
        args.returning.is_some(),
        "create_once",
        "returning = Order",
        &mut errors,
    );
    let fa = sql::fn_args(sig, "create_once")
        .map_err(|e| errors.push(e))
        .ok();
    let table = args.table.as_ref().and_then(|l| {
        sql::ident(&l.value(), l, "table", true)
            .map_err(|e| errors.push(e))
            .ok()
    });
    let unique = list(&mut errors, args.unique.as_ref(), "unique column");
    // Every argument after the executor is an inserted column; the unique ones must be among
    // them.
    let columns: Vec<SqlIdent> = fa
        .as_ref()
        .map(|fa| {
            fa.values
                .iter()
                .filter_map(|a| {
                    let lit = LitStr::new(&a.to_string(), a.span());
                    sql::ident(&a.to_string(), &lit, "column", false)
                        .map_err(|e| errors.push(e))
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default();
    if let (Some(unique), Some(lit)) = (&unique, &args.unique) {
        for u in unique {
            if !columns.iter().any(|c| c.name == u.name) {
                errors.at(
                    lit.span(),
                    format_args!(
                        "unique column `{}` must be an argument of `{}`, so it is inserted",
                        u.name, sig.ident
                    ),
                );
            }
        }
    }
    let krate = crate::attr::krate(args.krate.as_ref(), &mut errors);
    if let Err(e) = errors.finish() {
        return fallback(decl, e);
    }
    let (Some(table), Some(unique), Some(fa), Some(ty)) = (table, unique, fa, args.returning)
    else {
        return fallback(
            decl,
            syn::Error::new(Span::call_site(), "invalid #[create_once]"),
        );
    };
    let names: Vec<&str> = columns.iter().map(|c| c.quoted.as_str()).collect();
    let params: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
    let conflict: Vec<&str> = unique.iter().map(|c| c.quoted.as_str()).collect();
    let insert = format!(
        "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) DO NOTHING RETURNING *",
        table.quoted,
        names.join(", "),
        params.join(", "),
        conflict.join(", ")
    );
    let unique_args: Vec<Ident> = unique
        .iter()
        .filter_map(|u| fa.values.iter().find(|a| *a == u.name.as_str()).cloned())
        .collect();
    let where_: Vec<String> = unique
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{} = ${}", c.quoted, i + 1))
        .collect();
    let select = format!(
        "SELECT * FROM {} WHERE {}",
        table.quoted,
        where_.join(" AND ")
    );
    let values = &fa.values;
    let exec = &fa.executor;
    let table_name = &table.name;
    let p = quote!(#krate::__private);
    let sql::Decl { attrs, vis, sig } = decl;
    quote_spanned! {Span::mixed_site()=>
        #(#attrs)*
        #vis #sig {
            let mut conn = #p::transition_acquire(#exec).await.map_err(#p::sql_error)?;
            let conn = &mut *conn;
            for _ in 0..3u8 {
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
            }
            ::core::result::Result::Err(::core::convert::From::from(#p::contention(#table_name)))
        }
    }
}
