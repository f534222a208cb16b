//! The checks of `#[versioned_update]`: names are SQL identifiers, and the key, set and
//! version columns each have their argument.

use proc_macro2::Span;
use syn::{Ident, LitStr};

use crate::ctxt::Ctxt;
use crate::sql::bind::Binder;
use crate::sql::ident::{self, SqlIdent};
use crate::sql::target::Target;
use crate::sql::{Checked, Decl};

pub(crate) struct Model {
    pub(super) target: Target,
    pub(super) version: SqlIdent,
    pub(super) keys: Vec<(SqlIdent, Ident)>,
    pub(super) sets: Vec<(SqlIdent, Ident)>,
    /// The argument holding the version that was read.
    pub(super) expected: Ident,
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
    let keys = keys.map(|(lit, cols)| binder.bind(lit, cols, cx));
    let sets = sets.map(|(lit, cols)| binder.bind(lit, cols, cx));
    let expected = version
        .clone()
        .and_then(|v| binder.bind_one(&version_lit, v, cx));
    binder.report_unused(
        |a| format!("argument `{a}` is not a column of this versioned update: name it in the attribute, or remove it"),
        cx,
    );
    Some(Model {
        target: input.target?,
        version: version?,
        keys: keys?,
        sets: sets?,
        expected: expected?.1,
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
