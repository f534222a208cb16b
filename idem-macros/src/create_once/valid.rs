//! The checks of `#[create_once]`: names are SQL identifiers, the unique columns are among the
//! inserted ones, and the return type's row is `returning`.

use syn::{LitStr, Type};

use crate::ctxt::Ctxt;
use crate::sql::bind::{Compared, not_optional};
use crate::sql::ident::{self, SqlIdent};
use crate::sql::migrations::{Checker, Findings, Schema};
use crate::sql::target::Target;
use crate::sql::{Args, Checked, Decl};

pub(crate) struct Model {
    pub(super) target: Target,
    /// Every argument after the executor: the inserted columns, in order.
    pub(super) columns: Vec<SqlIdent>,
    pub(super) unique: Vec<SqlIdent>,
    pub(super) returning: Type,
    /// `R` of `Created<R>`, where the return type writes it.
    pub(super) row: Option<Type>,
    /// What the migrations say, where there are any.
    pub(super) findings: Findings,
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
    if let (Some(fn_args), Some(unique)) = (&input.fn_args, &unique) {
        for column in unique {
            let ident = syn::Ident::new(&column.name, proc_macro2::Span::call_site());
            not_optional(fn_args, &ident, Compared::Unique, cx);
        }
    }
    let findings = match (&input.schema, &input.target) {
        (Some(schema), Some(target)) => {
            against(schema, target, &columns, unique.as_deref(), args, decl, cx)
        }
        _ => Findings::default(),
    };
    let target = input.target?;
    let row = match target.ret.args.as_deref() {
        Some([row]) => Some(row.clone()),
        Some(_) => {
            let r = args.returning.as_ref().map(crate::types::display);
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
        findings,
    })
}

/// The table, each inserted column and its argument's type, the columns that need a value, and
/// the unique key, against the migrations.
fn against(
    schema: &Schema,
    target: &Target,
    columns: &[SqlIdent],
    unique: Option<&[SqlIdent]>,
    args: &Args,
    decl: &Decl,
    cx: &mut Ctxt,
) -> Findings {
    let mut check = Checker::new(schema, target, args.table.as_ref(), cx);
    for (column, arg) in columns.iter().zip(&target.values) {
        if let Some(found) = check.column(&column.name, arg.ident.span(), cx) {
            check.value(found, arg);
        }
    }
    let inserted: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
    check.insert(&inserted, &decl.sig.ident, decl.sig.ident.span(), cx);
    if let (Some(unique), Some(lit)) = (unique, &args.unique) {
        let names: Vec<&str> = unique.iter().map(|c| c.name.as_str()).collect();
        // Each is an inserted column too, reported there if missing.
        if names.iter().all(|n| check.exists(n)) {
            check.unique(&names, lit.span(), cx);
        }
    }
    check.findings
}
