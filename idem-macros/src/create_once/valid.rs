//! The checks of `#[create_once]`: names are SQL identifiers, and the unique columns are
//! among the inserted ones.

use syn::{Ident, LitStr, Type};

use crate::ctxt::Ctxt;
use crate::sql::ident::{self, SqlIdent};
use crate::sql::target::Target;
use crate::sql::{Checked, Decl};

pub(crate) struct Model {
    pub(super) target: Target,
    /// Every argument after the executor: the inserted columns, in order.
    pub(super) columns: Vec<SqlIdent>,
    pub(super) values: Vec<Ident>,
    pub(super) unique: Vec<SqlIdent>,
    pub(super) returning: Type,
}

pub(super) fn validate(input: Checked, decl: &Decl, cx: &mut Ctxt) -> Option<Model> {
    let args = &input.args;
    let unique = args.unique.as_ref();
    let unique = unique.and_then(|l| cx.ok(ident::columns(l, "unique column")));
    // Every argument after the executor is an inserted column; the unique ones must be among
    // them.
    let values = input
        .fn_args
        .as_ref()
        .map(|a| a.values.clone())
        .unwrap_or_default();
    let columns: Vec<SqlIdent> = values
        .iter()
        .filter_map(|a| {
            let lit = LitStr::new(&a.to_string(), a.span());
            cx.ok(ident::lit_ident(&lit, "column", false))
        })
        .collect();
    if let (Some(unique), Some(lit)) = (&unique, &args.unique) {
        for u in unique
            .iter()
            .filter(|u| !columns.iter().any(|c| c.name == u.name))
        {
            cx.at(
                lit.span(),
                format_args!(
                    "unique column `{}` must be an argument of `{}`, so it is inserted",
                    u.name, decl.sig.ident
                ),
            );
        }
    }
    Some(Model {
        target: input.target?,
        columns,
        values,
        unique: unique?,
        returning: args.returning.clone()?,
    })
}
