//! The checks of `#[create_once]`: names are SQL identifiers, the unique columns are among the
//! inserted ones, and the return type's row is `returning`.

use quote::ToTokens;
use syn::{LitStr, Type};

use crate::ctxt::Ctxt;
use crate::sql::ident::{self, SqlIdent};
use crate::sql::target::Target;
use crate::sql::{Checked, Decl};

pub(crate) struct Model {
    pub(super) target: Target,
    /// Every argument after the executor: the inserted columns, in order.
    pub(super) columns: Vec<SqlIdent>,
    pub(super) unique: Vec<SqlIdent>,
    pub(super) returning: Type,
    /// `R` of `Created<R>`, where the return type writes it.
    pub(super) row: Option<Type>,
}

pub(super) fn validate(input: Checked, decl: &Decl, cx: &mut Ctxt) -> Option<Model> {
    let args = &input.args;
    let unique = args.unique.as_ref();
    let unique = unique.and_then(|l| cx.ok(ident::columns(l, "unique column")));
    // Every argument after the executor is an inserted column; the unique ones must be among
    // them.
    let values = input.fn_args.as_ref().map(|a| a.values.as_slice());
    let columns: Vec<SqlIdent> = values
        .unwrap_or_default()
        .iter()
        .filter_map(|a| {
            let lit = LitStr::new(&a.ident.to_string(), a.ident.span());
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
    let target = input.target?;
    let row = match target.ret.args.as_deref() {
        Some([row]) => Some(row.clone()),
        Some(_) => {
            let r = args
                .returning
                .as_ref()
                .map(|r| r.to_token_stream().to_string());
            let r = r.unwrap_or_else(|| "Order".to_owned());
            cx.at(
                target.ret.outcome_span,
                format_args!("write the row type: `Created<{r}>`, as `returning = {r}`"),
            );
            return None;
        }
        None => None,
    };
    Some(Model {
        target,
        columns,
        unique: unique?,
        returning: args.returning.clone()?,
        row,
    })
}
