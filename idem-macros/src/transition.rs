//! `#[state_transition]`: the guarded `UPDATE` of a state machine, and the classification of
//! what happened when it did not apply.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::{Expr, Ident, LitStr, Type};

use crate::attr::{Errors, Grammar, lit_str};
use crate::sql::{self, SqlIdent};

const NAMES: &[&str] = &[
    "table",
    "key",
    "state",
    "from",
    "to",
    "guard",
    "set",
    "returning",
    "machine",
    "crate",
];

#[derive(Default)]
struct Args {
    table: Option<LitStr>,
    key: Option<LitStr>,
    state: Option<LitStr>,
    from: Option<Vec<LitStr>>,
    to: Option<LitStr>,
    guard: Option<LitStr>,
    set: Option<LitStr>,
    returning: Option<Type>,
    machine: Option<syn::Path>,
    krate: Option<LitStr>,
    given: Vec<String>,
}

fn from_states(expr: Expr) -> syn::Result<Vec<LitStr>> {
    let lit = |e: &Expr| match e {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) => Ok(s.clone()),
        other => Err(syn::Error::new_spanned(
            other,
            "`from` takes a state name or a list of them: `from = \"PENDING\"` or `from = [\"PENDING\", \"PAID\"]`",
        )),
    };
    match &expr {
        Expr::Array(a) if !a.elems.is_empty() => a.elems.iter().map(lit).collect(),
        other => Ok(vec![lit(other)?]),
    }
}

impl Args {
    fn parse(tokens: TokenStream, errors: &mut Errors) -> Args {
        let mut args = Args::default();
        let mut grammar = Grammar::new("state_transition", NAMES);
        let parser = syn::meta::parser(|meta| {
            let Some(name) = grammar.check(&meta, errors)? else {
                return Ok(());
            };
            args.given.push(name.clone());
            match name.as_str() {
                "table" => args.table = lit_str(&meta, "table", "\"orders\"", errors)?,
                "key" => args.key = lit_str(&meta, "key", "\"order_no\"", errors)?,
                "state" => args.state = lit_str(&meta, "state", "\"status\"", errors)?,
                "to" => args.to = lit_str(&meta, "to", "\"PAID\"", errors)?,
                "guard" => args.guard = lit_str(&meta, "guard", "\"amount_cents\"", errors)?,
                "set" => args.set = lit_str(&meta, "set", "\"paid_at = now()\"", errors)?,
                "crate" => args.krate = lit_str(&meta, "crate", "\"::idem\"", errors)?,
                "from" => match from_states(meta.value()?.parse()?) {
                    Ok(v) => args.from = Some(v),
                    Err(e) => errors.push(e),
                },
                "returning" => args.returning = Some(meta.value()?.parse()?),
                "machine" => args.machine = Some(meta.value()?.parse()?),
                _ => unreachable!("every accepted name is handled"),
            }
            Ok(())
        });
        if let Err(e) = syn::parse::Parser::parse2(parser, tokens) {
            errors.push(e);
            args.given.extend(NAMES.iter().map(|n| n.to_string()));
        }
        args
    }
}

/// One `SET` column: from the argument of the same name, or the database's clock.
enum SetValue {
    Arg(SqlIdent, Ident),
    Now(SqlIdent),
}

fn set_columns(lit: &LitStr) -> syn::Result<Vec<(SqlIdent, bool)>> {
    let mut out: Vec<(SqlIdent, bool)> = Vec::new();
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
        let col = sql::ident(col, lit, "set column", false)?;
        if out.iter().any(|(c, _)| c.name == col.name) {
            return Err(syn::Error::new(
                lit.span(),
                format_args!("set column `{}` is listed twice", col.name),
            ));
        }
        out.push((col, now));
    }
    Ok(out)
}

struct Model {
    krate: TokenStream,
    table: SqlIdent,
    state: SqlIdent,
    keys: Vec<(SqlIdent, Ident)>,
    guards: Vec<(SqlIdent, Ident)>,
    sets: Vec<SetValue>,
    from: Vec<String>,
    from_lits: Vec<LitStr>,
    to: String,
    to_lit: LitStr,
    returning: Option<Type>,
    machine: Option<syn::Path>,
    executor: Ident,
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let decl = match sql::decl(item, "state_transition") {
        Ok(d) => d,
        Err(e) => return e,
    };
    let mut errors = Errors::default();
    let args = Args::parse(args, &mut errors);
    let model = validate(args, &decl, &mut errors);
    match (errors.finish(), model) {
        (Ok(()), Some(model)) => generate(model, decl),
        (result, _) => {
            let e = result.err().map(|e| e.to_compile_error());
            let sql::Decl { attrs, vis, sig } = decl;
            // The declaration stays, with a body that type-checks, so callers see no errors.
            quote! {
                #(#attrs)*
                #[allow(unused_variables)]
                #vis #sig { ::core::unimplemented!() }
                #e
            }
        }
    }
}

fn validate(args: Args, decl: &sql::Decl, errors: &mut Errors) -> Option<Model> {
    let sig = &decl.sig;
    if let Err(e) = sql::require_async(sig, "state_transition") {
        errors.push(e);
    }
    let given = |n: &str| args.given.iter().any(|g| g == n);
    for (name, present, example) in [
        ("table", args.table.is_some(), "table = \"orders\""),
        ("key", args.key.is_some(), "key = \"order_no\""),
        ("from", args.from.is_some(), "from = \"PENDING\""),
        ("to", args.to.is_some(), "to = \"PAID\""),
    ] {
        if !present && !given(name) {
            errors.at(
                Span::call_site(),
                format_args!("missing `{name}`: #[state_transition] needs `table`, `key`, `from` and `to`, e.g. `{example}`"),
            );
        }
    }
    let fn_args = match sql::fn_args(sig, "state_transition") {
        Ok(a) => Some(a),
        Err(e) => {
            errors.push(e);
            None
        }
    };
    let mut used: Vec<Ident> = Vec::new();
    let mut bind =
        |lit: &LitStr, cols: Vec<SqlIdent>, errors: &mut Errors| -> Vec<(SqlIdent, Ident)> {
            let Some(fa) = &fn_args else {
                return Vec::new();
            };
            cols.into_iter()
                .filter_map(|c| match sql::arg_for(fa, &c, lit, &sig.ident) {
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
        };
    let table = args.table.as_ref().and_then(|l| {
        sql::ident(&l.value(), l, "table", true)
            .map_err(|e| errors.push(e))
            .ok()
    });
    let keys = args
        .key
        .as_ref()
        .and_then(|l| match sql::columns(l, "key column") {
            Ok(cols) => Some(bind(l, cols, errors)),
            Err(e) => {
                errors.push(e);
                None
            }
        });
    let guards = match &args.guard {
        None => Some(Vec::new()),
        Some(l) => match sql::columns(l, "guard column") {
            Ok(cols) => Some(bind(l, cols, errors)),
            Err(e) => {
                errors.push(e);
                None
            }
        },
    };
    let mut sets = Vec::new();
    if let Some(l) = &args.set {
        match set_columns(l) {
            Ok(cols) => {
                for (col, now) in cols {
                    if now {
                        sets.push(SetValue::Now(col));
                    } else if let Some((col, arg)) = bind(l, vec![col], errors).pop() {
                        sets.push(SetValue::Arg(col, arg));
                    }
                }
            }
            Err(e) => errors.push(e),
        }
    }
    let state_lit = args
        .state
        .clone()
        .unwrap_or_else(|| LitStr::new("status", Span::call_site()));
    let state = sql::ident(&state_lit.value(), &state_lit, "state column", false)
        .map_err(|e| errors.push(e))
        .ok();
    if let Some(fa) = &fn_args {
        for a in &fa.values {
            if !used.contains(a) {
                errors.at(
                    a.span(),
                    format_args!(
                        "argument `{a}` is not a column of this transition: name it in `key`, `guard` or `set`, or remove it"
                    ),
                );
            }
        }
    }
    let from: Vec<String> = args.from.iter().flatten().map(LitStr::value).collect();
    for (i, f) in args.from.iter().flatten().enumerate() {
        if from[..i].contains(&f.value()) {
            errors.at(
                f.span(),
                format_args!("state `{}` is listed twice in `from`", f.value()),
            );
        }
        if f.value().is_empty() {
            errors.at(f.span(), "a state name cannot be empty");
        }
    }
    if let Some(to) = &args.to
        && from.contains(&to.value())
    {
        errors.at(
                to.span(),
                format_args!(
                    "`to = \"{}\"` is also a `from` state: a transition must change the state (a row already in `to` is reported as `AlreadyApplied`)",
                    to.value()
                ),
            );
    }
    let krate = crate::attr::krate(args.krate.as_ref(), errors);
    Some(Model {
        krate,
        table: table?,
        state: state?,
        keys: keys?,
        guards: guards?,
        sets,
        from,
        from_lits: args.from?,
        to: args.to.as_ref()?.value(),
        to_lit: args.to?,
        returning: args.returning,
        machine: args.machine,
        executor: fn_args?.executor,
    })
}

/// The statements, for one dialect.
struct Sql {
    update: String,
    select: String,
}

fn statements(m: &Model, now: &str) -> Sql {
    let mut n = 0;
    let mut param = || {
        n += 1;
        format!("${n}")
    };
    let key_where: Vec<String> = m
        .keys
        .iter()
        .map(|(c, _)| format!("{} = {}", c.quoted, param()))
        .collect();
    let guard_where: Vec<String> = m
        .guards
        .iter()
        .map(|(c, _)| format!("{} = {}", c.quoted, param()))
        .collect();
    let mut set = Vec::new();
    for s in &m.sets {
        match s {
            SetValue::Arg(c, _) => set.push(format!("{} = {}", c.quoted, param())),
            SetValue::Now(c) => set.push(format!("{} = {now}", c.quoted)),
        }
    }
    set.insert(0, format!("{} = {}", m.state.quoted, param()));
    let from: Vec<String> = m.from.iter().map(|_| param()).collect();
    let mut conditions = key_where.clone();
    conditions.push(format!("{} IN ({})", m.state.quoted, from.join(", ")));
    conditions.extend(guard_where);
    let returning = if m.returning.is_some() {
        " RETURNING *"
    } else {
        ""
    };
    Sql {
        update: format!(
            "UPDATE {} SET {} WHERE {}{returning}",
            m.table.quoted,
            set.join(", "),
            conditions.join(" AND ")
        ),
        select: {
            // The guards again, compared in the database, for a row already in `to`.
            let guards: Vec<String> = m
                .guards
                .iter()
                .enumerate()
                .map(|(i, (c, _))| format!("{} = ${}", c.quoted, m.keys.len() + i + 1))
                .collect();
            let guards_match = if guards.is_empty() {
                "true".to_owned()
            } else {
                format!("COALESCE(({}), false)", guards.join(" AND "))
            };
            format!(
                "SELECT {} AS \"__idem_state\", {guards_match} AS \"__idem_guards_match\"{} FROM {} WHERE {}",
                m.state.quoted,
                if m.returning.is_some() { ", *" } else { "" },
                m.table.quoted,
                key_where.join(" AND ")
            )
        },
    }
}

fn generate(m: Model, decl: sql::Decl) -> TokenStream {
    let sql::Decl { attrs, vis, sig } = decl;
    let krate = &m.krate;
    let p = quote!(#krate::__private);
    let pg = statements(&m, "now()");
    let lite = statements(&m, "CURRENT_TIMESTAMP");
    let (pg_update, pg_select, lite_update, lite_select) =
        (&pg.update, &pg.select, &lite.update, &lite.select);
    let exec = &m.executor;
    let key_args: Vec<&Ident> = m.keys.iter().map(|(_, a)| a).collect();
    let guard_args: Vec<&Ident> = m.guards.iter().map(|(_, a)| a).collect();
    let set_args: Vec<&Ident> = m
        .sets
        .iter()
        .filter_map(|s| match s {
            SetValue::Arg(_, a) => Some(a),
            SetValue::Now(_) => None,
        })
        .collect();
    let (to, from) = (&m.to, &m.from);
    let table = &m.table.name;
    let guard_names: Vec<&str> = m.guards.iter().map(|(c, _)| c.name.as_str()).collect();
    let guarded = !m.guards.is_empty();

    let (apply, row_of) = match &m.returning {
        Some(ty) => (
            quote_spanned! {Span::mixed_site()=>
                let applied: ::core::option::Option<#ty> = #p::sqlx::query_as(sql_update)
                    #(.bind(&#key_args))* #(.bind(&#guard_args))* #(.bind(&#set_args))*
                    .bind(#to) #(.bind(#from))*
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(#p::sql_error)?;
                if let ::core::option::Option::Some(row) = applied {
                    return ::core::result::Result::Ok(#p::Transition::Applied(row));
                }
            },
            quote_spanned!(Span::mixed_site()=> <#ty as #p::sqlx::FromRow<'_, _>>::from_row(&row).map_err(#p::sql_error)?),
        ),
        None => (
            quote_spanned! {Span::mixed_site()=>
                let done = #p::sqlx::query(sql_update)
                    #(.bind(&#key_args))* #(.bind(&#guard_args))* #(.bind(&#set_args))*
                    .bind(#to) #(.bind(#from))*
                    .execute(&mut *conn)
                    .await
                    .map_err(#p::sql_error)?;
                if done.rows_affected() > 0 {
                    return ::core::result::Result::Ok(#p::Transition::Applied(()));
                }
            },
            quote!(()),
        ),
    };

    let machine_check = m.machine.as_ref().map(|machine| {
        let name = machine.to_token_stream().to_string().replace(' ', "");
        let state_checks = m.from_lits.iter().chain(std::iter::once(&m.to_lit)).map(|lit| {
            let msg = format!("`{}` is not a state of the state machine `{name}`", lit.value());
            quote_spanned! {lit.span()=>
                if !<#machine>::__idem_is_state(#lit) {
                    ::core::panic!(#msg);
                }
            }
        });
        let edge_checks = m.from_lits.iter().map(|f| {
            let msg = format!(
                "`{}` → `{}` is not an edge of the state machine `{name}`: declare it there, or start from another state",
                f.value(),
                m.to
            );
            let to_lit = &m.to_lit;
            quote_spanned! {m.to_lit.span()=>
                if <#machine>::__idem_is_state(#f)
                    && <#machine>::__idem_is_state(#to_lit)
                    && !<#machine>::__idem_allows(#f, #to_lit)
                {
                    ::core::panic!(#msg);
                }
            }
        });
        quote! {
            const _: () = {
                #(#state_checks)*
                #(#edge_checks)*
            };
        }
    });

    let key_debug = quote!(&(#(&#key_args,)*));
    // Generated locals are hygienic: an argument named `conn` or `row` cannot collide.
    quote_spanned! {Span::mixed_site()=>
        #(#attrs)*
        #vis #sig {
            #machine_check
            let mut conn = #p::transition_acquire(#exec).await.map_err(#p::sql_error)?;
            let conn = &mut *conn;
            let postgres = #p::is_postgres(&*conn);
            let (sql_update, sql_select) = if postgres {
                (#pg_update, #pg_select)
            } else {
                (#lite_update, #lite_select)
            };
            for _ in 0..3u8 {
                #apply
                let found = #p::sqlx::query(sql_select)
                    #(.bind(&#key_args))* #(.bind(&#guard_args))*
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(#p::sql_error)?;
                let ::core::option::Option::Some(row) = found else {
                    return ::core::result::Result::Ok(#p::Transition::NotFound);
                };
                let current: ::std::string::String =
                    #p::sqlx::Row::try_get(&row, "__idem_state").map_err(#p::sql_error)?;
                match #p::classify_miss(&current, &[#(#from),*], #to, #guarded) {
                    #p::Miss::AlreadyApplied => {
                        let guards_match: bool =
                            #p::sqlx::Row::try_get(&row, "__idem_guards_match").map_err(#p::sql_error)?;
                        if !guards_match {
                            #p::warn_guard_differs_after(#table, #key_debug, #to, &[#(#guard_names),*]);
                        }
                        return ::core::result::Result::Ok(#p::Transition::AlreadyApplied(#row_of));
                    }
                    #p::Miss::GuardMismatch => {
                        #p::warn_guard_mismatch(#table, #key_debug, &[#(#from),*], #to, &[#(#guard_names),*]);
                        return ::core::result::Result::Ok(#p::Transition::GuardMismatch(#row_of));
                    }
                    #p::Miss::Illegal => {
                        return ::core::result::Result::Ok(#p::Transition::Illegal {
                            current: #p::StateValue::from_column(current)?,
                        });
                    }
                    // Back in a `from` state between the two statements: apply again.
                    #p::Miss::Retry => {}
                }
            }
            ::core::result::Result::Err(::core::convert::From::from(#p::contention(#table)))
        }
    }
}
