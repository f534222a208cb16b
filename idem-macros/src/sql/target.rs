//! The checks every SQL macro starts with: an `async fn`, the required arguments, the
//! function's arguments, the return type, the table, and the crate path.

use super::Steps;
use super::args::Args;
use super::decl::{self, Decl, FnArg, FnArgs};
use super::ident::{self, SqlIdent};
use super::migrations::{self, Origin, Schema};
use super::ret::{self, Ret};
use crate::ctxt::Ctxt;
use crate::krate::{Krate, Site};

/// What a generated function acts on, and how it is declared.
pub(crate) struct Target {
    pub(crate) krate: Krate,
    pub(crate) table: SqlIdent,
    pub(crate) executor: FnArg,
    /// The other arguments: each is bound as a parameter.
    pub(crate) values: Vec<FnArg>,
    pub(crate) ret: Ret,
}

/// The arguments, and what the shared checks made of them.
pub(crate) struct Checked {
    pub(crate) args: Args,
    /// `None` when the table, the function's arguments, the return type or the crate path is
    /// wrong.
    pub(crate) target: Option<Target>,
    /// The function's arguments, for the macro's own checks.
    pub(crate) fn_args: Option<FnArgs>,
    /// The migrations to check against, when there are any and the check is on.
    pub(crate) schema: Option<Schema>,
}

/// The function's arguments, its return type and the table, checked, and the crate path.
pub(crate) fn check<M>(
    steps: &Steps<M>,
    origin: &Origin,
    args: Args,
    decl: &Decl,
    cx: &mut Ctxt,
) -> Checked {
    let (attr, sig) = (steps.attr, &decl.sig);
    cx.ok(decl::require_async(sig, attr));
    steps.required.check(&args, cx);
    let fn_args = decl::fn_args(sig, attr, cx);
    let ret = ret::check(sig, attr, &steps.outcome, cx);
    let table = args.table.as_ref();
    let table = table.and_then(|l| cx.ok(ident::lit_ident(l, "table", true)));
    let krate = Krate::new(args.krate.as_ref(), Site::Attribute, cx);
    let executor = fn_args.as_ref().map(|a| &a.executor);
    let schema = migrations::load(args.migrations.as_ref(), origin, executor, cx);
    let target = match (table, &fn_args, ret) {
        (Some(table), Some(a), Some(ret)) => Some(Target {
            krate,
            table,
            executor: a.executor.clone(),
            values: a.values.clone(),
            ret,
        }),
        _ => None,
    };
    Checked {
        args,
        target,
        fn_args,
        schema,
    }
}
