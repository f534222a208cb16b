//! The arguments of `#[idempotent]` and of its parameters (`#[idem(skip)]`), as written.

use proc_macro2::{Span, TokenStream};
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, LitStr};

use crate::attr::{self, FieldPath, Given, Grammar};
use crate::ctxt::Ctxt;

const GRAMMAR: Grammar = Grammar {
    site: "#[idempotent]",
    args: &[
        ("scope", "\"refund:<order_no>\""),
        ("key", "key"),
        ("store", "store"),
        ("fingerprint", "(order_no, cents)"),
        ("skip", "(app)"),
        ("lease", "\"30s\""),
        ("retain", "\"24h\""),
        ("wait", "\"2s\""),
        ("on_error", "\"store_final\""),
        ("on_expired_lease", "\"fail_closed\""),
        ("on_cancel", "\"finish\""),
        ("transaction", "tx"),
        ("claim", "claim"),
        ("resumable", "\"refund\""),
        ("max_request", "\"256KiB\""),
        ("crate", "\"::idem\""),
    ],
};

/// The attribute's arguments as written.
#[derive(Default)]
pub(super) struct Args {
    pub(super) scope: Option<LitStr>,
    pub(super) key: Option<Expr>,
    pub(super) store: Option<Expr>,
    pub(super) fingerprint: Option<(Span, Vec<FieldPath>)>,
    pub(super) skip: Option<(Span, Vec<FieldPath>)>,
    pub(super) lease: Option<LitStr>,
    pub(super) retain: Option<LitStr>,
    /// `wait = "2s"`: how long a duplicate of a running call waits for its answer.
    pub(super) wait: Option<LitStr>,
    pub(super) on_error: Option<LitStr>,
    pub(super) on_expired_lease: Option<LitStr>,
    pub(super) on_cancel: Option<LitStr>,
    pub(super) transaction: Option<Ident>,
    pub(super) claim: Option<Ident>,
    /// `resumable` (named by the scope template) or `resumable = "name"`: where it was written,
    /// and the name when one was given.
    pub(super) resumable: Option<(Span, Option<LitStr>)>,
    /// `max_request = "256KiB"`: the size cap of a resumable call's stored request.
    pub(super) max_request: Option<LitStr>,
    pub(super) krate: Option<LitStr>,
    /// Names that were written, valid or not: a malformed `scope` is not also a missing one.
    pub(super) given: Given,
}

impl Args {
    pub(super) fn parse(tokens: TokenStream, cx: &mut Ctxt) -> Args {
        let mut args = Args::default();
        args.given = attr::parse(tokens, &GRAMMAR, cx, |arg, cx| {
            let list = |arg: &attr::Arg<'_, '_>| -> syn::Result<_> {
                Ok(Some((arg.meta.path.span(), arg.paths()?)))
            };
            match arg.name {
                "scope" => args.scope = arg.lit_str(cx)?,
                "key" => args.key = Some(arg.value()?),
                "store" => args.store = Some(arg.value()?),
                "fingerprint" => args.fingerprint = list(&arg)?,
                "skip" => args.skip = list(&arg)?,
                "lease" => args.lease = arg.lit_str(cx)?,
                "retain" => args.retain = arg.lit_str(cx)?,
                "wait" => args.wait = arg.lit_str(cx)?,
                "on_error" => args.on_error = arg.lit_str(cx)?,
                "on_expired_lease" => args.on_expired_lease = arg.lit_str(cx)?,
                "on_cancel" => args.on_cancel = arg.lit_str(cx)?,
                "transaction" => args.transaction = Some(arg.value()?),
                "claim" => args.claim = Some(arg.value()?),
                "resumable" => {
                    let span = arg.meta.path.span();
                    let name = if arg.meta.input.peek(syn::Token![=]) {
                        arg.lit_str(cx)?
                    } else {
                        None
                    };
                    args.resumable = Some((span, name));
                }
                "max_request" => args.max_request = arg.lit_str(cx)?,
                "crate" => args.krate = arg.lit_str(cx)?,
                _ => {}
            }
            Ok(())
        });
        args
    }
}

/// Removes `#[idem(…)]` from parameters (the compiler would not know it) and returns, for each
/// parameter, the span of its `#[idem(skip)]` if it has one.
pub(super) fn strip_param_attrs(func: &mut ItemFn, cx: &mut Ctxt) -> Vec<Option<Span>> {
    func.sig
        .inputs
        .iter_mut()
        .map(|arg| {
            let attrs = match arg {
                FnArg::Receiver(r) => &mut r.attrs,
                FnArg::Typed(t) => &mut t.attrs,
            };
            let mut skip = None;
            attrs.retain(|a| {
                if !a.path().is_ident("idem") {
                    return true;
                }
                let parsed = a.parse_nested_meta(|meta| {
                    if meta.path.is_ident("skip") {
                        skip = Some(meta.path.span());
                        Ok(())
                    } else {
                        Err(meta.error(
                            "unknown parameter option: the only one is `#[idem(skip)]`, which leaves the parameter out of the fingerprint",
                        ))
                    }
                });
                cx.ok(parsed);
                false
            });
            skip
        })
        .collect()
}
