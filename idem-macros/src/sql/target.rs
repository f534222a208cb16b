//! The checks every SQL macro starts with: an `async fn`, the required arguments, the
//! function's arguments, the table, and the crate path.

use syn::Ident;

use super::args::{Args, Required};
use super::decl::{self, Decl, FnArgs};
use super::ident::{self, SqlIdent};
use crate::ctxt::Ctxt;
use crate::krate::{Krate, Site};

/// What a generated function acts on.
pub(crate) struct Target {
    pub(crate) krate: Krate,
    pub(crate) table: SqlIdent,
    pub(crate) executor: Ident,
}

/// The arguments, and what the shared checks made of them.
pub(crate) struct Checked {
    pub(crate) args: Args,
    /// `None` when the table, the function's arguments or the crate path is wrong.
    pub(crate) target: Option<Target>,
    /// The function's arguments, for the macro's own checks.
    pub(crate) fn_args: Option<FnArgs>,
}

/// The function's arguments and the table, checked, and the crate path.
pub(crate) fn check(
    attr: &str,
    args: Args,
    required: &Required,
    decl: &Decl,
    cx: &mut Ctxt,
) -> Checked {
    let sig = &decl.sig;
    cx.ok(decl::require_async(sig, attr));
    required.check(&args, cx);
    let fn_args = cx.ok(decl::fn_args(sig, attr));
    let table = args.table.as_ref();
    let table = table.and_then(|l| cx.ok(ident::lit_ident(l, "table", true)));
    let krate = Krate::new(args.krate.as_ref(), Site::Attribute, cx);
    let target = match (table, &fn_args) {
        (Some(table), Some(a)) => Some(Target {
            krate,
            table,
            executor: a.executor.clone(),
        }),
        _ => None,
    };
    Checked {
        args,
        target,
        fn_args,
    }
}
