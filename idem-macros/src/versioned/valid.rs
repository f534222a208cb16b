//! The checks of `#[versioned_update]`: names are SQL identifiers, the key, set and version
//! columns each have their argument, and no column plays two parts.

use proc_macro2::Span;
use syn::{Ident, LitStr};

use crate::ctxt::Ctxt;
use crate::sql::bind::{Binder, Compared, not_optional};
use crate::sql::decl::FnArg;
use crate::sql::ident::{self, SqlIdent};
use crate::sql::migrations::{Checker, Findings, Schema};
use crate::sql::target::Target;
use crate::sql::{Args, Checked, Decl};

pub(crate) struct Model {
    pub(super) target: Target,
    pub(super) version: SqlIdent,
    pub(super) keys: Vec<(SqlIdent, Ident)>,
    pub(super) sets: Vec<(SqlIdent, Ident)>,
    /// The argument holding the version that was read.
    pub(super) expected: FnArg,
    /// What the migrations say, where there are any.
    pub(super) findings: Findings,
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
    if let Some(fn_args) = &input.fn_args {
        for (_, arg) in keys.iter().flatten() {
            not_optional(fn_args, arg, Compared::Key, cx);
        }
    }
    let expected = input
        .fn_args
        .as_ref()
        .and_then(|a| a.value(&expected?.1.to_string()).cloned());
    let findings = match (&input.schema, &input.target) {
        (Some(schema), Some(target)) => {
            let lists = [(&args.key, keys.as_deref()), (&args.set, sets.as_deref())];
            against(
                schema,
                target,
                args,
                &lists,
                version.as_ref(),
                &version_lit,
                cx,
            )
        }
        _ => Findings::default(),
    };
    Some(Model {
        target: input.target?,
        version: version?,
        keys: keys?,
        sets: sets?,
        expected: expected?,
        findings,
    })
}

/// Columns as a literal lists them, each with its argument.
type ColumnList<'a> = (&'a Option<LitStr>, Option<&'a [(SqlIdent, Ident)]>);

/// The table, the key, set and version columns, and each argument's type, against the
/// migrations.
fn against(
    schema: &Schema,
    target: &Target,
    args: &Args,
    lists: &[ColumnList<'_>],
    version: Option<&SqlIdent>,
    version_lit: &LitStr,
    cx: &mut Ctxt,
) -> Findings {
    let mut check = Checker::new(schema, target, args.table.as_ref(), cx);
    let arg = |name: &str| target.values.iter().find(|a| a.ident == name);
    for (i, (lit, columns)) in lists.iter().enumerate() {
        let span = lit.as_ref().map_or_else(Span::call_site, LitStr::span);
        let mut all_found = true;
        for (column, ident) in columns.unwrap_or_default() {
            let found = check.column(&column.name, span, cx);
            all_found &= found.is_some();
            if let Some(found) = found
                && let Some(a) = arg(&ident.to_string())
            {
                check.value(found, a);
            }
        }
        // The first list is the key.
        if i == 0
            && all_found
            && let (Some(lit), Some(columns)) = (lit, columns)
        {
            let names: Vec<&str> = columns.iter().map(|(k, _)| k.name.as_str()).collect();
            check.unique_key(&names, "versioned update", lit.span(), cx);
        }
    }
    if let Some(v) = version
        && let Some(found) = check.column(&v.name, version_lit.span(), cx)
    {
        check.integer(found, version_lit.span(), cx);
    }
    check.findings
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
