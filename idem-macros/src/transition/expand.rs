//! The generated transition: one guarded `UPDATE`, and when it changes nothing, one `SELECT`
//! by key that tells a duplicate from a guard mismatch, an illegal state or a missing row.
//! MySQL has no `UPDATE … RETURNING`: there a transition that returns its row reads it after
//! the `UPDATE`, in one transaction, while the `UPDATE`'s lock keeps it as written.

use std::collections::BTreeMap;

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::Ident;
use syn::spanned::Spanned;

use super::valid::{Model, SetValue};
use crate::sql::Decl;
use crate::sql::shell::{self, Body, Params};

/// The statements, for one dialect.
struct Sql {
    update: String,
    select: String,
}

/// What the statements of one database differ in.
struct Dialect<'a> {
    /// The database's clock.
    now: &'a str,
    /// The comparison that is true when both sides are NULL.
    null_safe: &'a str,
    /// The enum types parameters are cast to (PostgreSQL's).
    casts: &'a BTreeMap<String, String>,
    /// MySQL: no `RETURNING`, `table.*` beside other columns, the state read as `CHAR`.
    mysql: bool,
}

/// The statements in `d`'s terms: its clock, and the text bound to a column of an enum type
/// cast to it (PostgreSQL; `casts` is empty elsewhere). Parameters are numbered in this order:
/// keys, guards, the owner, set arguments, `to`, each `from`.
///
/// `d.null_safe` is the comparison for guards whose argument is an `Option`.
fn statements(m: &Model, d: &Dialect<'_>) -> Sql {
    let (now, null_safe, casts) = (d.now, d.null_safe, d.casts);
    let mut params = Params::default();
    let key_where = params.equal_cast(m.keys.iter().map(|(c, _)| c), casts);
    let guard_where: Vec<String> = m
        .guards
        .iter()
        .zip(&m.null_safe)
        .map(|((c, _), nullable)| {
            let op = if *nullable { null_safe } else { "=" };
            format!("{} {op} {}", c.quoted, params.next_cast(&c.name, casts))
        })
        .collect();
    // The owner is written when the transition applies, and compared when the row is in `to`.
    let owner_equal = params.equal_cast(m.owner.iter().map(|(c, _)| c), casts);
    let mut set: Vec<String> = owner_equal.clone();
    set.extend(m.sets.iter().map(|s| match s {
        SetValue::Arg(c, _) => format!("{} = {}", c.quoted, params.next_cast(&c.name, casts)),
        SetValue::Now(c) => format!("{} = {now}", c.quoted),
    }));
    let state = &m.state;
    set.insert(
        0,
        format!(
            "{} = {}",
            state.quoted,
            params.next_cast(&state.name, casts)
        ),
    );
    let from: Vec<String> = m
        .from
        .iter()
        .map(|_| params.next_cast(&state.name, casts))
        .collect();
    let mut conditions = key_where.clone();
    conditions.push(format!("{} IN ({})", state.quoted, from.join(", ")));
    conditions.extend(guard_where.iter().cloned());
    let returning = if m.returning.is_some() && !d.mysql {
        " RETURNING *"
    } else {
        ""
    };
    // The guards again, compared in the database, for a row already in `to`: the `SELECT`
    // binds keys then guards, numbered as in the `UPDATE`.
    let guards_match = if guard_where.is_empty() {
        "true".to_owned()
    } else {
        format!("COALESCE(({}), false)", guard_where.join(" AND "))
    };
    let owner_match = match owner_equal.first() {
        Some(equal) => format!(", COALESCE(({equal}), false) AS \"__idem_owner_match\""),
        None => String::new(),
    };
    // An enum is read back as its text.
    let state_text = if d.mysql {
        format!("CAST({} AS CHAR)", state.quoted)
    } else if casts.contains_key(&state.name) {
        format!("CAST({} AS TEXT)", state.quoted)
    } else {
        state.quoted.clone()
    };
    let table = &m.target.table.quoted;
    let row = match (&m.returning, d.mysql) {
        (None, _) => String::new(),
        (Some(_), false) => ", *".to_owned(),
        (Some(_), true) => format!(", {table}.*"),
    };
    Sql {
        update: format!(
            "UPDATE {} SET {} WHERE {}{returning}",
            m.target.table.quoted,
            set.join(", "),
            conditions.join(" AND ")
        ),
        // On MySQL a locking read, which reads the row as last committed even in a
        // transaction whose snapshot is older (`REPEATABLE READ`, its default), as the
        // `UPDATE` did.
        select: format!(
            "SELECT {state_text} AS \"__idem_state\", {guards_match} AS \"__idem_guards_match\"{owner_match}{row} FROM {table} WHERE {}{}",
            key_where.join(" AND "),
            if d.mysql { " LOCK IN SHARE MODE" } else { "" }
        ),
    }
}

pub(super) fn expand(m: Model, decl: Decl) -> TokenStream {
    let p = m.target.krate.private();
    let no_casts = BTreeMap::new();
    let pg = statements(
        &m,
        &Dialect {
            now: "now()",
            null_safe: "IS NOT DISTINCT FROM",
            casts: &m.findings.casts,
            mysql: false,
        },
    );
    let lite = statements(
        &m,
        &Dialect {
            now: "CURRENT_TIMESTAMP",
            null_safe: "IS",
            casts: &no_casts,
            mysql: false,
        },
    );
    let my = statements(
        &m,
        &Dialect {
            now: "CURRENT_TIMESTAMP(6)",
            null_safe: "<=>",
            casts: &no_casts,
            mysql: true,
        },
    );
    let (pg_update, pg_select, lite_update, lite_select) =
        (&pg.update, &pg.select, &lite.update, &lite.select);
    let setup = quote_spanned! {Span::mixed_site()=>
        let database = #p::database(&*conn);
        let (sql_update, sql_select) = match database {
            #p::Database::Postgres => (#pg_update, #pg_select),
            _ => (#lite_update, #lite_select),
        };
    };
    let numbered = attempt(&m, &p, Numbered::Bound);
    let mysql = attempt(&m, &p, Numbered::Mysql(&my));
    let mut body = Body::new(
        &m.target,
        quote_spanned! {Span::mixed_site()=>
            if let #p::Database::Mysql = database {
                #mysql
            } else {
                #numbered
            }
        },
    );
    body.checks = checks(&m);
    body.checks.extend(m.findings.tokens.clone());
    body.prelude = machine_check(&m).unwrap_or_default();
    body.setup = setup;
    shell::function(decl, body)
}

/// How an attempt's statements are written and bound: `$n` texts chosen at run time
/// (`sql_update`, `sql_select`: PostgreSQL's or SQLite's), bound in their numbers' order; or
/// MySQL's, whose `?` are bound in the order they appear.
#[derive(Clone, Copy)]
enum Numbered<'a> {
    Bound,
    Mysql(&'a Sql),
}

/// The row type (readable from a row, on `returning`; the same as the return type's, on that)
/// and the state type (the machine's, or the column's text), each checked where it is written.
fn checks(m: &Model) -> TokenStream {
    let t = &m.target;
    let at = |span: Span| t.krate.private_at(span);
    let mut out = TokenStream::new();
    if let Some(returning) = &m.returning {
        out.extend(shell::rows(
            t,
            shell::row(t, m.row.as_ref(), returning),
            returning.span(),
        ));
    }
    if let Some(state) = &m.state_type {
        let p = at(state.span());
        let check = match &m.machine {
            Some(machine) => quote_spanned!(state.span()=> #p::state_of::<#state, #machine>()),
            None => quote_spanned!(state.span()=> #p::text_state::<#state>()),
        };
        out.extend(quote_spanned!(Span::mixed_site()=> let __idem_state = #check;));
    }
    out
}

/// The arguments in binding order: keys, guards (with the owner after them), set arguments.
fn bound(m: &Model) -> (Vec<&Ident>, Vec<&Ident>, Vec<&Ident>) {
    let keys = m.keys.iter().map(|(_, a)| a).collect();
    let guards = m.guards.iter().chain(&m.owner).map(|(_, a)| a).collect();
    let sets = m
        .sets
        .iter()
        .filter_map(|s| match s {
            SetValue::Arg(_, a) => Some(a),
            SetValue::Now(_) => None,
        })
        .collect();
    (keys, guards, sets)
}

/// The values of the parameters `$1`, `$2`, … in their numbers' order: keys, guards (with the
/// owner after them), set arguments, `to`, each `from`.
fn values(m: &Model) -> Vec<TokenStream> {
    let (key_args, guard_args, set_args) = bound(m);
    let args = key_args.into_iter().chain(guard_args).chain(set_args);
    let mut values: Vec<TokenStream> = args.map(|a| quote!(&#a)).collect();
    let to = m.to.value();
    values.push(quote!(#to));
    values.extend(m.from.iter().map(|f| {
        let f = f.value();
        quote!(#f)
    }));
    values
}

/// A statement of `numbered`'s with its parameters bound: `text` and `$n`-numbered values, or
/// MySQL's text (`mysql` picks it from its statements) with its `?` bound in order.
fn query(
    p: &TokenStream,
    numbered: Numbered<'_>,
    text: TokenStream,
    mysql: impl Fn(&Sql) -> &String,
    values: &[TokenStream],
    count: usize,
) -> TokenStream {
    match numbered {
        Numbered::Bound => {
            let values = &values[..count];
            quote_spanned!(Span::mixed_site()=> #p::sqlx::query(#text) #(.bind(#values))*)
        }
        Numbered::Mysql(sql) => {
            let (text, order) = crate::sql::mysql::render(mysql(sql));
            let binds = crate::sql::mysql::binds(&order, values);
            quote_spanned!(Span::mixed_site()=> #p::sqlx::query(#text) #binds)
        }
    }
}

/// The `UPDATE`, returning when it applied; and the row type read from a `SELECT` row.
fn apply(m: &Model, p: &TokenStream, numbered: Numbered<'_>) -> (TokenStream, TokenStream) {
    let values = values(m);
    let update = query(
        p,
        numbered,
        quote_spanned!(Span::mixed_site()=> sql_update),
        |s| &s.update,
        &values,
        values.len(),
    );
    let row_of = quote_spanned!(Span::mixed_site()=> #p::decode(&__idem_rows, &row)?);
    match (&m.returning, numbered) {
        (Some(_), Numbered::Bound) => (
            quote_spanned! {Span::mixed_site()=>
                let applied = #update
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(#p::sql_error)?;
                if let ::core::option::Option::Some(row) = applied {
                    let row = #p::decode(&__idem_rows, &row)?;
                    return ::core::result::Result::Ok(#p::Transition::Applied(row));
                }
            },
            row_of,
        ),
        // No `RETURNING`: the row is read after the `UPDATE`, in its transaction (a savepoint
        // in the caller's), so that it is the row as the `UPDATE` wrote it.
        (Some(_), Numbered::Mysql(_)) => {
            let keys = m.keys.iter().map(|(c, _)| c);
            let key_where = shell::Params::default().equal(keys);
            let written = format!(
                "SELECT * FROM {} WHERE {}",
                m.target.table.quoted,
                key_where.join(" AND ")
            );
            let (text, order) = crate::sql::mysql::render(&written);
            let binds = crate::sql::mysql::binds(&order, &values);
            let read = quote_spanned!(Span::mixed_site()=> #p::sqlx::query(#text) #binds);
            (
                quote_spanned! {Span::mixed_site()=>
                    let mut tx = #p::sqlx::Connection::begin(&mut *conn)
                        .await
                        .map_err(#p::sql_error)?;
                    let done = #update.execute(&mut *tx).await.map_err(#p::sql_error)?;
                    if done.rows_affected() > 0 {
                        let row = #read.fetch_one(&mut *tx).await.map_err(#p::sql_error)?;
                        tx.commit().await.map_err(#p::sql_error)?;
                        let row = #p::decode(&__idem_rows, &row)?;
                        return ::core::result::Result::Ok(#p::Transition::Applied(row));
                    }
                    tx.rollback().await.map_err(#p::sql_error)?;
                },
                row_of,
            )
        }
        (None, _) => (
            quote_spanned! {Span::mixed_site()=>
                let done = #update
                    .execute(&mut *conn)
                    .await
                    .map_err(#p::sql_error)?;
                if done.rows_affected() > 0 {
                    return ::core::result::Result::Ok(#p::Transition::Applied(()));
                }
            },
            quote!(()),
        ),
    }
}

/// One attempt: the update, then the classification of a miss.
fn attempt(m: &Model, p: &TokenStream, numbered: Numbered<'_>) -> TokenStream {
    let (key_args, _, _) = bound(m);
    let (apply, row_of) = apply(m, p, numbered);
    // The `SELECT` binds keys, guards and the owner, numbered as in the `UPDATE`.
    let select_count = m.keys.len() + m.guards.len() + m.owner.iter().count();
    let select = query(
        p,
        numbered,
        quote_spanned!(Span::mixed_site()=> sql_select),
        |s| &s.select,
        &values(m),
        select_count,
    );
    let to = m.to.value();
    let from: Vec<String> = m.from.iter().map(|f| f.value()).collect();
    let table = &m.target.table.name;
    let guard_names: Vec<&str> = m.guards.iter().map(|(c, _)| c.name.as_str()).collect();
    // With an owner, a row already in `to` is this owner's (`AlreadyApplied`) or another's.
    let by_another = m.owner.as_ref().map(|_| {
        quote_spanned! {Span::mixed_site()=>
            let owner_match = #p::flag(&row, "__idem_owner_match")?;
            if !owner_match {
                return ::core::result::Result::Ok(#p::Transition::AppliedByAnother(#row_of));
            }
        }
    });
    let guarded = !m.guards.is_empty();
    let key_debug = quote!(&(#(&#key_args,)*));
    let current = match &m.state_type {
        Some(_) => quote_spanned!(Span::mixed_site()=> #p::state_value(&__idem_state, current)),
        None => quote_spanned!(Span::mixed_site()=> #p::StateValue::from_column(current)),
    };
    quote_spanned! {Span::mixed_site()=>
        #apply
        let found = #select
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
                #by_another
                let guards_match = #p::flag(&row, "__idem_guards_match")?;
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
                    current: #current?,
                });
            }
            // Back in a `from` state between the two statements: apply again.
            #p::Miss::Retry => {}
        }
    }
}

/// With a machine: a `const` block that fails to compile when `from` or `to` is not one of
/// its states, or `from → to` not one of its edges, spanned on the offending string. The
/// machine is read once, on its path: a type that is not a machine is one error there.
fn machine_check(m: &Model) -> Option<TokenStream> {
    let machine = m.machine.as_ref()?;
    let name = machine.to_token_stream().to_string().replace(' ', "");
    let p = m.target.krate.private();
    let p_machine = m.target.krate.private_at(machine.span());
    let read = quote_spanned!(machine.span()=> <#machine as #p_machine::MachineTexts>::MACHINE);
    let to_lit = &m.to;
    let state_checks = m.from.iter().chain(std::iter::once(to_lit)).map(|lit| {
        let msg = format!(
            "`{}` is not a state of the state machine `{name}`",
            lit.value()
        );
        quote_spanned! {lit.span()=>
            if !#p::const_str_in(#lit, MACHINE.states) {
                ::core::panic!(#msg);
            }
        }
    });
    let edge_checks = m.from.iter().map(|f| {
        let msg = format!(
            "`{}` → `{}` is not an edge of the state machine `{name}`: declare it there, or start from another state",
            f.value(),
            to_lit.value()
        );
        quote_spanned! {to_lit.span()=>
            if #p::const_str_in(#f, MACHINE.states)
                && #p::const_str_in(#to_lit, MACHINE.states)
                && !#p::const_edge_in(#f, #to_lit, MACHINE.edges)
            {
                ::core::panic!(#msg);
            }
        }
    });
    let allowed = allowed_check(m, machine, &name);
    Some(quote! {
        const _: () = {
            const MACHINE: #p::MachineText = #read;
            #(#state_checks)*
            #(#edge_checks)*
            #allowed
        };
    })
}

/// With migrations that list the state column's values: every state of the machine is one of
/// them, or the transitions to it could never be written. The message names the state, so it
/// is built at compile time from the machine's texts.
fn allowed_check(m: &Model, machine: &syn::Path, name: &str) -> Option<TokenStream> {
    let (values, said) = m.findings.allowed.as_ref()?;
    let p = m.target.krate.private();
    let (table, state) = (&m.target.table.name, &m.state.name);
    let after = format!(
        "` of the state machine `{name}` is not a value of `{table}.{state}`: {said}. Add it in a migration, or remove it from the machine"
    );
    Some(quote_spanned! {machine.span()=>
        const MISSING: &str = #p::first_not_in(MACHINE.states, &[#(#values),*]);
        if !MISSING.is_empty() {
            const PARTS: &[&str] = &["state `", MISSING, #after];
            const LEN: usize = #p::concat_len(PARTS);
            const MESSAGE: [u8; LEN] = #p::concat::<LEN>(PARTS);
            ::core::panic!("{}", #p::utf8(&MESSAGE));
        }
    })
}
