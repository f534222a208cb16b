//! Columns matched to the arguments of the same names.

use syn::{Ident, LitStr};

use super::decl::FnArgs;
use super::ident::SqlIdent;
use crate::ctxt::Ctxt;

/// Matches the columns an attribute names to the function's arguments, and remembers which
/// arguments were used so that the others can be reported.
pub(crate) struct Binder<'a> {
    args: Option<&'a FnArgs>,
    fn_name: &'a Ident,
    used: Vec<Ident>,
    /// Every column list could be read: only then is an argument no column took reported.
    complete: bool,
}

impl<'a> Binder<'a> {
    /// `args` is `None` when the arguments could not be read: nothing is matched or reported.
    pub(crate) fn new(args: Option<&'a FnArgs>, fn_name: &'a Ident) -> Self {
        Binder {
            args,
            fn_name,
            used: Vec::new(),
            complete: true,
        }
    }

    /// Notes whether a column list could be read: an argument it may have named is not then
    /// reported as unused on top of the list's own error.
    pub(crate) fn readable(&mut self, ok: bool) {
        self.complete &= ok;
    }

    /// The argument for each column named in `lit`; an error on `lit` for each without one.
    pub(crate) fn bind(
        &mut self,
        lit: &LitStr,
        columns: Vec<SqlIdent>,
        cx: &mut Ctxt,
    ) -> Vec<(SqlIdent, Ident)> {
        let Some(args) = self.args else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for column in columns {
            match args.value(&column.name) {
                Some(a) => {
                    self.used.push(a.ident.clone());
                    out.push((column, a.ident.clone()));
                }
                None => cx.at(
                    lit.span(),
                    format_args!(
                        "column `{}` takes its value from an argument of the same name, and `{}` has none: add `{}: …`",
                        column.name, self.fn_name, column.name
                    ),
                ),
            }
        }
        out
    }

    /// The argument for one column.
    pub(crate) fn bind_one(
        &mut self,
        lit: &LitStr,
        column: SqlIdent,
        cx: &mut Ctxt,
    ) -> Option<(SqlIdent, Ident)> {
        self.bind(lit, vec![column], cx).pop()
    }

    /// Reports every argument no column took, with `message(argument)`.
    pub(crate) fn report_unused(&self, message: impl Fn(&Ident) -> String, cx: &mut Ctxt) {
        let Some(args) = self.args.filter(|_| self.complete) else {
            return;
        };
        for a in args.values.iter().filter(|a| !self.used.contains(&a.ident)) {
            cx.at(a.ident.span(), message(&a.ident));
        }
    }
}

/// What `=` against NULL does to a column of each part, for the message.
#[derive(Clone, Copy)]
pub(crate) enum Compared {
    Key,
    Owner,
    Unique,
}

/// An argument compared with `=` is not an `Option`: `=` is never true for NULL, so a `None`
/// would silently never match. Reported on the argument's type.
pub(crate) fn not_optional(args: &FnArgs, column: &Ident, part: Compared, cx: &mut Ctxt) {
    let Some(arg) = args.value(&column.to_string()) else {
        return;
    };
    let mut ty = &arg.ty;
    while let syn::Type::Reference(r) = ty {
        ty = &r.elem;
    }
    let Some(inner) = crate::types::args_of(ty, "Option").and_then(|a| a.first().copied()) else {
        return;
    };
    let (what, effect) = match part {
        Compared::Key => ("a key column", "the row would never be found"),
        Compared::Owner => (
            "the owner column",
            "a row already in `to` would never be found to be this owner's",
        ),
        Compared::Unique => (
            "a unique column",
            "no row would conflict with it, and every call would insert one",
        ),
    };
    cx.spanned(
        &arg.ty,
        format_args!(
            "`{column}` is an `Option`, and {what} is compared with `=`, which is never true for NULL: with `None`, {effect}. Take the value itself: `{column}: {}`",
            crate::types::display(inner)
        ),
    );
}
