//! The checks of `#[state_transition]`: names are SQL identifiers, every column has its
//! argument and every argument its column, no column plays two parts, the states make a
//! transition, and the return type matches `returning` and `machine`.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Ident, LitStr, Type};

use crate::ctxt::Ctxt;
use crate::sql::bind::{Binder, Compared, not_optional};
use crate::sql::ident::{self, SqlIdent};
use crate::sql::migrations::{Checker, Findings, Schema};
use crate::sql::ret::Ret;
use crate::sql::target::Target;
use crate::sql::{Args, Checked, Decl};

/// One `SET` column: from the argument of the same name, or the database's clock.
pub(super) enum SetValue {
    Arg(SqlIdent, Ident),
    Now(SqlIdent),
}

impl SetValue {
    fn column(&self) -> &SqlIdent {
        match self {
            SetValue::Arg(c, _) | SetValue::Now(c) => c,
        }
    }
}

pub(crate) struct Model {
    pub(super) target: Target,
    pub(super) state: SqlIdent,
    pub(super) keys: Vec<(SqlIdent, Ident)>,
    pub(super) guards: Vec<(SqlIdent, Ident)>,
    /// For each guard, whether its argument is an `Option`: compared so that `None` matches
    /// NULL (`IS NOT DISTINCT FROM` on PostgreSQL, `IS` on SQLite), not with `=`.
    pub(super) null_safe: Vec<bool>,
    /// `owner`: set to its argument when the transition applies, and compared with it when the
    /// row is already in `to`.
    pub(super) owner: Option<(SqlIdent, Ident)>,
    pub(super) sets: Vec<SetValue>,
    pub(super) from: Vec<LitStr>,
    pub(super) to: LitStr,
    pub(super) returning: Option<Type>,
    pub(super) machine: Option<syn::Path>,
    /// `R` and `S` of `Transition<R, S>`, where the return type writes them.
    pub(super) row: Option<Type>,
    pub(super) state_type: Option<Type>,
    /// What the migrations say, where there are any.
    pub(super) findings: Findings,
}

/// The columns, each matched to its argument.
struct Columns {
    keys: Option<Vec<(SqlIdent, Ident)>>,
    guards: Option<Vec<(SqlIdent, Ident)>>,
    /// `Some(None)` when `owner` is not given; `None` when it is given but unusable.
    owner: Option<Option<(SqlIdent, Ident)>>,
    sets: Vec<SetValue>,
    state: Option<SqlIdent>,
}

pub(super) fn validate(input: Checked, decl: &Decl, cx: &mut Ctxt) -> Option<Model> {
    let args = &input.args;
    let mut binder = Binder::new(input.fn_args.as_ref(), &decl.sig.ident);
    let columns = columns(args, &mut binder, cx);
    binder.report_unused(
        |a| format!("argument `{a}` is not a column of this transition: name it in `key`, `guard` or `set`, or remove it"),
        cx,
    );
    parts(args, &columns, cx);
    states(args, cx);
    // A guard argument may be an `Option`: it is then compared so that `None` matches NULL
    // (a guard on a nullable column). A key or the owner must be a value.
    let null_safe: Vec<bool> = columns
        .guards
        .iter()
        .flatten()
        .map(|(_, arg)| {
            input
                .fn_args
                .as_ref()
                .is_some_and(|a| a.value(&arg.to_string()).is_some_and(|v| is_option(&v.ty)))
        })
        .collect();
    if let Some(fn_args) = &input.fn_args {
        let keys = columns.keys.iter().flatten().map(|k| (&k.1, Compared::Key));
        let owner = columns
            .owner
            .iter()
            .flatten()
            .map(|o| (&o.1, Compared::Owner));
        for (arg, part) in keys.chain(owner) {
            not_optional(fn_args, arg, part, cx);
        }
    }
    let findings = match (&input.schema, &input.target) {
        (Some(schema), Some(target)) => against(schema, target, args, &columns, cx),
        _ => Findings::default(),
    };
    let target = input.target?;
    let (row, state_type) = outcome(args, &target.ret, cx)?;
    Some(Model {
        target,
        state: columns.state?,
        keys: columns.keys?,
        guards: columns.guards?,
        null_safe,
        owner: columns.owner?,
        sets: columns.sets,
        from: args.from.clone()?,
        to: args.to.clone()?,
        returning: args.returning.clone(),
        machine: args.machine.clone(),
        row,
        state_type,
        findings,
    })
}

/// `Option<T>`, `&Option<T>`.
fn is_option(ty: &Type) -> bool {
    crate::types::args_of(crate::types::unreferenced(ty), "Option").is_some()
}

/// The table, every column, each argument's type and the states, against the migrations.
fn against(schema: &Schema, target: &Target, args: &Args, c: &Columns, cx: &mut Ctxt) -> Findings {
    let mut check = Checker::new(schema, target, args.table.as_ref(), cx);
    let arg = |name: &Ident| target.values.iter().find(|a| a.ident == *name);
    let keys = c
        .keys
        .iter()
        .flatten()
        .map(|k| (true, args.key.as_ref(), k));
    let guards = c.guards.iter().flatten();
    let guards = guards.map(|g| (false, args.guard.as_ref(), g));
    let owner = c.owner.iter().flatten();
    let owner = owner.map(|o| (false, args.owner.as_ref(), o));
    // The key must find one row: checked once every key column is found.
    let mut keys_found = true;
    for (is_key, lit, (column, ident)) in keys.chain(guards).chain(owner) {
        let span = lit.map_or_else(Span::call_site, LitStr::span);
        let found = check.column(&column.name, span, cx);
        if is_key {
            keys_found &= found.is_some();
        }
        if let Some(found) = found
            && !check.cast(found)
            && let Some(a) = arg(ident)
        {
            check.value(found, a);
        }
    }
    if let (Some(keys), Some(lit), true) = (&c.keys, &args.key, keys_found) {
        let names: Vec<&str> = keys.iter().map(|(k, _)| k.name.as_str()).collect();
        check.unique_key(&names, "transition", lit.span(), cx);
    }
    let set_span = args.set.as_ref().map_or_else(Span::call_site, LitStr::span);
    for set in &c.sets {
        let Some(found) = check.column(&set.column().name, set_span, cx) else {
            continue;
        };
        if let SetValue::Arg(_, ident) = set
            && !check.cast(found)
            && let Some(a) = arg(ident)
        {
            check.value(found, a);
        }
    }
    if let Some(state) = &c.state {
        // The default `status` was not written: its problems are the attribute's.
        let span = args
            .state
            .as_ref()
            .map_or_else(Span::call_site, LitStr::span);
        if let Some(found) = check.column(&state.name, span, cx) {
            check.cast(found);
            let states: Vec<&LitStr> = args.from.iter().flatten().chain(&args.to).collect();
            check.states(found, &states, cx);
        }
    }
    check.findings
}

fn columns(args: &Args, binder: &mut Binder<'_>, cx: &mut Ctxt) -> Columns {
    let mut list = |lit: &LitStr, what: &str, cx: &mut Ctxt| {
        let columns = cx.ok(ident::columns(lit, what));
        binder.readable(columns.is_some());
        Some(binder.bind(lit, columns?, cx))
    };
    let keys = args.key.as_ref().and_then(|l| list(l, "key column", cx));
    let guards = match &args.guard {
        None => Some(Vec::new()),
        Some(l) => list(l, "guard column", cx),
    };
    let owner = match &args.owner {
        None => Some(None),
        Some(l) if l.value().contains(',') => {
            cx.at(
                l.span(),
                format_args!(
                    "`owner` is one column, the one that records who applied the transition, such as `owner = \"refund_request\"`; not `{}`",
                    l.value()
                ),
            );
            binder.readable(false);
            None
        }
        Some(l) => {
            let column = cx.ok(ident::lit_ident(l, "owner column", false));
            binder.readable(column.is_some());
            column.and_then(|c| binder.bind_one(l, c, cx)).map(Some)
        }
    };
    let mut sets = Vec::new();
    if let Some(l) = &args.set {
        let items = cx.ok(ident::set_list(l));
        binder.readable(items.is_some());
        for item in items.unwrap_or_default() {
            if item.now {
                sets.push(SetValue::Now(item.column));
            } else if let Some((col, arg)) = binder.bind_one(l, item.column, cx) {
                sets.push(SetValue::Arg(col, arg));
            }
        }
    }
    let state_lit = args
        .state
        .clone()
        .unwrap_or_else(|| LitStr::new("status", Span::call_site()));
    let state = cx.ok(ident::lit_ident(&state_lit, "state column", false));
    Columns {
        keys,
        guards,
        owner,
        sets,
        state,
    }
}

/// Each column plays one part: the state is set to `to` and compared with `from`, keys find
/// the row, guards are compared, and `set` columns are written.
fn parts(args: &Args, c: &Columns, cx: &mut Ctxt) {
    let state = c.state.as_ref().map(|s| s.name.as_str());
    let keys: Vec<&str> = c
        .keys
        .iter()
        .flatten()
        .map(|(k, _)| k.name.as_str())
        .collect();
    let guards: Vec<&str> = c
        .guards
        .iter()
        .flatten()
        .map(|(g, _)| g.name.as_str())
        .collect();
    let mut clash = |lit: &Option<LitStr>, msg: String| {
        if let Some(lit) = lit {
            cx.at(lit.span(), msg);
        }
    };
    for s in c.sets.iter().map(|s| s.column().name.as_str()) {
        if Some(s) == state {
            clash(
                &args.set,
                format!(
                    "`set` names the state column `{s}`: the transition sets it to `to` itself, and a second value would leave the row in a state no transition allows. Remove it from `set`"
                ),
            );
        } else if keys.contains(&s) {
            clash(
                &args.set,
                format!(
                    "`set` names the key column `{s}`: the transition finds its row by key, and must not move it to another. Remove it from `set`"
                ),
            );
        } else if guards.contains(&s) {
            clash(
                &args.set,
                format!(
                    "`set` names the guard column `{s}`, which is compared with the same argument: setting it changes nothing. Remove it from `set` or `guard`"
                ),
            );
        }
    }
    if let Some(s) = state {
        if keys.contains(&s) {
            clash(
                &args.key,
                format!(
                    "the state column `{s}` cannot be a key column: the transition compares it with `from` and sets it to `to`"
                ),
            );
        }
        if guards.contains(&s) {
            clash(
                &args.guard,
                format!(
                    "`guard` names the state column `{s}`: `from` already says which states the row may be in"
                ),
            );
        }
    }
    if let Some(Some((owner, _))) = &c.owner {
        let o = owner.name.as_str();
        let sets = c.sets.iter().map(|s| s.column().name.as_str());
        let part = if Some(o) == state {
            Some("the state column: the transition sets it to `to` itself")
        } else if keys.contains(&o) {
            Some("a key column: the transition finds its row by key, and must not move it")
        } else if guards.contains(&o) {
            Some(
                "a guard column, compared with the same argument: a row in a `from` state would never match another owner",
            )
        } else if sets.clone().any(|s| s == o) {
            Some("in `set` too: the transition sets the owner itself")
        } else {
            None
        };
        if let Some(part) = part {
            clash(
                &args.owner,
                format!(
                    "`owner` names `{o}`, which is {part}. The owner is a column of its own that records who applied the transition, such as `refund_request`"
                ),
            );
        }
    }
    for g in guards.iter().filter(|g| keys.contains(g)) {
        clash(
            &args.guard,
            format!("`{g}` is a key column already, and compared as one: remove it from `guard`"),
        );
    }
}

/// `from` lists each state once, and `to` is not one of them; every state is one name.
fn states(args: &Args, cx: &mut Ctxt) {
    let from = args.from.as_deref().unwrap_or_default();
    for (i, f) in from.iter().enumerate() {
        if from[..i].iter().any(|e| e.value() == f.value()) {
            cx.at(
                f.span(),
                format_args!("state `{}` is listed twice in `from`", f.value()),
            );
        }
        if f.value().is_empty() {
            cx.at(f.span(), "a state name cannot be empty");
        }
        one_name(f, "from", cx);
    }
    if let Some(to) = &args.to {
        one_name(to, "to", cx);
        if from.iter().any(|f| f.value() == to.value()) {
            cx.at(
                to.span(),
                format_args!(
                    "`to = \"{}\"` is also a `from` state: a transition must change the state (a row already in `to` is reported as `AlreadyApplied`)",
                    to.value()
                ),
            );
        }
    }
}

/// A state name with a comma, a quote or a blank is a list written as one string, or a typo:
/// the column holds no such text.
fn one_name(lit: &LitStr, arg: &str, cx: &mut Ctxt) {
    let value = lit.value();
    if !value.contains([',', '"', '\'', ' ', '\t', '\n']) {
        return;
    }
    let names: Vec<String> = value
        .split([',', '"', '\'', ' ', '\t', '\n'])
        .filter(|n| !n.is_empty())
        .map(|n| format!("\"{n}\""))
        .collect();
    let hint = if arg == "from" && names.len() > 1 {
        format!("several states are a list: `from = [{}]`", names.join(", "))
    } else {
        format!("`{arg}` is one state, such as `{arg} = \"PAID\"`")
    };
    cx.at(
        lit.span(),
        format_args!("`{value}` is not one state name: {hint}"),
    );
}

/// `R` and `S` of the return type's `Transition<R, S>`, checked against `returning`: a row
/// type needs `returning`, and `returning` needs the row type written.
fn outcome(args: &Args, ret: &Ret, cx: &mut Ctxt) -> Option<(Option<Type>, Option<Type>)> {
    let Some(types) = &ret.args else {
        return Some((None, None));
    };
    let (row, state) = (types.first().cloned(), types.get(1).cloned());
    match (&args.returning, &row) {
        (Some(returning), None) => {
            let r = crate::types::display(returning);
            cx.at(
                ret.outcome_span,
                format_args!(
                    "the transition returns `{r}` rows (`returning = {r}`): write `Transition<{r}>` here"
                ),
            );
            None
        }
        (None, Some(row)) if !is_unit(row) => {
            let r = crate::types::display(row);
            cx.at(
                row.span(),
                format_args!(
                    "`Transition<{r}>` carries a row, but the statement returns none: add `returning = {r}` to the attribute, or write `Transition`"
                ),
            );
            None
        }
        _ => Some((row, state)),
    }
}

fn is_unit(ty: &Type) -> bool {
    matches!(ty, Type::Tuple(t) if t.elems.is_empty())
}
