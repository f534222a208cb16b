//! The checks of `#[state_transition]`: names are SQL identifiers, every column has its
//! argument and every argument its column, and the states make a transition.

use proc_macro2::Span;
use syn::{Ident, LitStr, Type};

use crate::ctxt::Ctxt;
use crate::sql::bind::Binder;
use crate::sql::ident::{self, SqlIdent};
use crate::sql::target::Target;
use crate::sql::{Args, Checked, Decl};

/// One `SET` column: from the argument of the same name, or the database's clock.
pub(super) enum SetValue {
    Arg(SqlIdent, Ident),
    Now(SqlIdent),
}

pub(crate) struct Model {
    pub(super) target: Target,
    pub(super) state: SqlIdent,
    pub(super) keys: Vec<(SqlIdent, Ident)>,
    pub(super) guards: Vec<(SqlIdent, Ident)>,
    pub(super) sets: Vec<SetValue>,
    pub(super) from: Vec<LitStr>,
    pub(super) to: LitStr,
    pub(super) returning: Option<Type>,
    pub(super) machine: Option<syn::Path>,
}

/// The columns, each matched to its argument.
struct Columns {
    keys: Option<Vec<(SqlIdent, Ident)>>,
    guards: Option<Vec<(SqlIdent, Ident)>>,
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
    states(args, cx);
    Some(Model {
        target: input.target?,
        state: columns.state?,
        keys: columns.keys?,
        guards: columns.guards?,
        sets: columns.sets,
        from: args.from.clone()?,
        to: args.to.clone()?,
        returning: args.returning.clone(),
        machine: args.machine.clone(),
    })
}

fn columns(args: &Args, binder: &mut Binder<'_>, cx: &mut Ctxt) -> Columns {
    let mut list = |lit: &LitStr, what: &str, cx: &mut Ctxt| {
        let columns = cx.ok(ident::columns(lit, what))?;
        Some(binder.bind(lit, columns, cx))
    };
    let keys = args.key.as_ref().and_then(|l| list(l, "key column", cx));
    let guards = match &args.guard {
        None => Some(Vec::new()),
        Some(l) => list(l, "guard column", cx),
    };
    let mut sets = Vec::new();
    if let Some(l) = &args.set {
        for item in cx.ok(ident::set_list(l)).unwrap_or_default() {
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
        sets,
        state,
    }
}

/// `from` lists each state once, and `to` is not one of them.
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
    }
    if let Some(to) = &args.to
        && from.iter().any(|f| f.value() == to.value())
    {
        cx.at(
            to.span(),
            format_args!(
                "`to = \"{}\"` is also a `from` state: a transition must change the state (a row already in `to` is reported as `AlreadyApplied`)",
                to.value()
            ),
        );
    }
}
