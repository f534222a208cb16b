//! The checks of `#[versioned_update]`: names are SQL identifiers, the key, set and version
//! columns each have their argument, and no column plays two parts.

use proc_macro2::Span;
use syn::{Ident, LitStr};

use crate::ctxt::Ctxt;
use crate::sql::bind::Binder;
use crate::sql::decl::FnArg;
use crate::sql::ident::{self, SqlIdent};
use crate::sql::target::Target;
use crate::sql::{Args, Checked, Decl};

pub(crate) struct Model {
    pub(super) target: Target,
    pub(super) version: SqlIdent,
    pub(super) keys: Vec<(SqlIdent, Ident)>,
    pub(super) sets: Vec<(SqlIdent, Ident)>,
    /// The argument holding the version that was read.
    pub(super) expected: FnArg,
}

pub(super) fn validate(input: Checked, decl: &Decl, cx: &mut Ctxt) -> Option<Model> {
    let args = &input.args;
    let version_lit = args
        .version
        .clone()
        .unwrap_or_else(|| LitStr::new("version", Span::call_site()));
    let version = cx.ok(ident::lit_ident(&version_lit, "version column", false));
    let keys = list(args.key.as_ref(), "key column", cx);
    let sets = list(args.set.as_ref(), "set column", cx);
    let mut binder = Binder::new(input.fn_args.as_ref(), &decl.sig.ident);
    binder.readable(keys.is_some() && sets.is_some());
    let keys = keys.map(|(lit, cols)| binder.bind(lit, cols, cx));
    let sets = sets.map(|(lit, cols)| binder.bind(lit, cols, cx));
    let expected = version
        .clone()
        .and_then(|v| binder.bind_one(&version_lit, v, cx));
    binder.report_unused(
        |a| format!("argument `{a}` is not a column of this versioned update: name it in the attribute, or remove it"),
        cx,
    );
    parts(args, version.as_ref(), keys.as_deref(), sets.as_deref(), cx);
    let expected = input
        .fn_args
        .as_ref()
        .and_then(|a| a.value(&expected?.1.to_string()).cloned());
    Some(Model {
        target: input.target?,
        version: version?,
        keys: keys?,
        sets: sets?,
        expected: expected?,
    })
}

/// The columns a literal lists, with the literal.
fn list<'a>(
    lit: Option<&'a LitStr>,
    what: &str,
    cx: &mut Ctxt,
) -> Option<(&'a LitStr, Vec<SqlIdent>)> {
    let lit = lit?;
    Some((lit, cx.ok(ident::columns(lit, what))?))
}

/// The version is compared and bumped by the statement, keys find the row, `set` columns are
/// written: each column plays one part.
fn parts(
    args: &Args,
    version: Option<&SqlIdent>,
    keys: Option<&[(SqlIdent, Ident)]>,
    sets: Option<&[(SqlIdent, Ident)]>,
    cx: &mut Ctxt,
) {
    let version = version.map(|v| v.name.as_str());
    let names = |l: Option<&[(SqlIdent, Ident)]>| -> Vec<String> {
        l.unwrap_or_default()
            .iter()
            .map(|(c, _)| c.name.clone())
            .collect()
    };
    let (keys, sets) = (names(keys), names(sets));
    let at = |lit: &Option<LitStr>, cx: &mut Ctxt, msg: String| {
        if let Some(lit) = lit {
            cx.at(lit.span(), msg);
        }
    };
    for s in &sets {
        if Some(s.as_str()) == version {
            at(
                &args.set,
                cx,
                format!(
                    "`set` names the version column `{s}`: the update bumps it itself (`{s} = {s} + 1`), and a value of yours would break the next reader's check. Remove it from `set`"
                ),
            );
        } else if keys.contains(s) {
            at(
                &args.set,
                cx,
                format!(
                    "`set` names the key column `{s}`: the update finds its row by key, and must not move it to another. Remove it from `set`"
                ),
            );
        }
    }
    if let Some(v) = version.filter(|v| keys.iter().any(|k| k == v)) {
        at(
            &args.key,
            cx,
            format!(
                "the version column `{v}` cannot be a key column: it is compared with the version that was read"
            ),
        );
    }
}
