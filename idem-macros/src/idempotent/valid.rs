//! The checks of `#[idempotent]`: each argument against the function it is on. Every check
//! records its errors and goes on; the model is built only when all of them passed.

use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{Expr, Ident, ItemFn, LitStr, ReturnType, Signature, Type};

use super::ast::Args;
use crate::bindings::{self, Param};
use crate::ctxt::Ctxt;
use crate::krate::Krate;
use crate::template::{self, Part, Template};
use crate::types;

/// Everything the expansion needs, checked.
pub(super) struct Model {
    pub(super) krate: Krate,
    pub(super) template: Template,
    pub(super) scope_span: Span,
    pub(super) key: Expr,
    pub(super) store: Option<Expr>,
    pub(super) fingerprinted: Vec<(Ident, Vec<syn::Attribute>)>,
    pub(super) policy: Policy,
    pub(super) transaction: Option<Ident>,
    pub(super) claim: Option<Ident>,
    pub(super) ret: Type,
}

/// The per-handler policy, as far as the attribute sets it.
pub(super) struct Policy {
    pub(super) lease_ms: Option<u64>,
    pub(super) retain_ms: Option<u64>,
    pub(super) store_final: bool,
    pub(super) fail_closed: bool,
}

pub(super) fn validate(
    args: Args,
    func: &ItemFn,
    skipped: &[Option<Span>],
    cx: &mut Ctxt,
) -> Option<Model> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        cx.at(
            sig.fn_token.span,
            "#[idempotent] needs an `async fn`: the claim is taken before the body and completed after it, across `.await`s",
        );
    }
    let ret = return_type(sig, cx);
    let mut params = bindings::params(sig);
    for (p, skip) in params.iter_mut().zip(skipped) {
        p.skipped |= skip.is_some();
    }
    let template = scope(&args, &params, sig, cx);
    if !args.given.contains("key") {
        cx.at(
            Span::call_site(),
            "missing `key`: the idempotency key, e.g. `key = key` for an `IdempotencyKey` argument or `key = msg.id` for a message",
        );
    }
    let fingerprinted = fingerprinted(&args, &params, sig, cx);
    let policy = policy(&args, cx);
    let krate = Krate::new(args.krate.as_ref(), cx);
    for name in [&args.transaction, &args.claim].into_iter().flatten() {
        if bound(&params).any(|i| i == name) {
            cx.at(
                name.span(),
                format_args!("`{name}` would hide the argument `{name}`: name it something else"),
            );
        }
    }
    Some(Model {
        krate,
        template: template?,
        scope_span: args.scope.as_ref()?.span(),
        key: args.key?,
        store: args.store,
        fingerprinted: fingerprinted?,
        policy,
        transaction: args.transaction,
        claim: args.claim,
        ret: ret?,
    })
}

/// Every name the parameters bind.
fn bound(params: &[Param]) -> impl Iterator<Item = &Ident> {
    params.iter().flat_map(|p| &p.idents)
}

/// The return type, when it can be a `Result` of a replayable value.
fn return_type(sig: &Signature, cx: &mut Ctxt) -> Option<Type> {
    match &sig.output {
        ReturnType::Type(_, ty) if types::obviously_not_result(ty) => {
            cx.at(
                ty.span(),
                format_args!(
                    "an #[idempotent] function must return `Result<T, E>`, not `{}`: the `Ok` value is stored and replayed, an `Err` releases the claim so a retry can run",
                    ty.to_token_stream()
                ),
            );
            None
        }
        ReturnType::Type(_, ty) => {
            if let Some(span) = types::impl_trait(ty) {
                cx.at(
                    span,
                    "an #[idempotent] function cannot return `impl Trait`: a replay rebuilds the value from stored bytes, which needs a concrete type",
                );
            }
            Some((**ty).clone())
        }
        ReturnType::Default => {
            cx.at(
                sig.paren_token.span.close(),
                "an #[idempotent] function must return `Result<T, E>`: add `-> Result<T, E>` (the `Ok` value is stored and replayed)",
            );
            None
        }
    }
}

/// The scope template, with every placeholder naming an argument.
fn scope(args: &Args, params: &[Param], sig: &Signature, cx: &mut Ctxt) -> Option<Template> {
    let Some(lit) = &args.scope else {
        if !args.given.contains("scope") {
            cx.at(
                Span::call_site(),
                "missing `scope`: name what the operation acts on, e.g. `scope = \"refund:<order_no>\"` (a function's name is not an identity: renaming it must not reset idempotency)",
            );
        }
        return None;
    };
    let template = cx.ok(template::parse(&lit.value(), lit.span()))?;
    for part in &template.parts {
        if let Part::Hole(h) = part
            && !bound(params).any(|i| *i == h.root)
        {
            let names = bound(params)
                .map(|i| format!("`{i}`"))
                .collect::<Vec<_>>()
                .join(", ");
            cx.at(
                lit.span(),
                format_args!(
                    "`<{}>` in the scope names no argument of `{}`: its arguments are {names}",
                    h.written, sig.ident
                ),
            );
        }
    }
    Some(template)
}

/// The identifiers that go into the fingerprint, each with the `#[cfg]`s of its parameter.
fn fingerprinted(
    args: &Args,
    params: &[Param],
    sig: &Signature,
    cx: &mut Ctxt,
) -> Option<Vec<(Ident, Vec<syn::Attribute>)>> {
    let find = |name: &Ident| params.iter().find(|p| p.idents.iter().any(|i| i == name));
    let mut ok = true;
    let mut check = |list: &[Ident], cx: &mut Ctxt| {
        for name in list.iter().filter(|name| find(name).is_none()) {
            ok = false;
            cx.at(
                name.span(),
                format_args!("`{name}` is not an argument of `{}`", sig.ident),
            );
        }
    };
    if let (Some(_), Some((span, _))) = (&args.fingerprint, &args.skip) {
        cx.at(
            *span,
            "use either `fingerprint(…)` (exactly these arguments) or `skip(…)` (all but these), not both",
        );
    }
    let out: Vec<(Ident, Vec<syn::Attribute>)> = if let Some((_, list)) = &args.fingerprint {
        check(list, cx);
        list.iter()
            .filter_map(|name| find(name).map(|p| (name.clone(), p.cfgs.clone())))
            .collect()
    } else {
        let skip = args.skip.as_ref().map(|(_, l)| l.as_slice());
        let skip = skip.unwrap_or_default();
        check(skip, cx);
        // The key identifies the request and the store keeps it: neither is part of what the
        // request says.
        let implicit = [plain_ident(&args.key), plain_ident(&args.store)];
        params
            .iter()
            .filter(|p| !p.skipped && !p.is_receiver)
            .flat_map(|p| p.idents.iter().map(move |i| (i, p)))
            .filter(|(i, _)| !skip.contains(i) && !implicit.iter().flatten().any(|k| k == *i))
            .map(|(i, p)| (i.clone(), p.cfgs.clone()))
            .collect()
    };
    ok.then_some(out)
}

/// `key = key`: the expression is an argument itself.
fn plain_ident(e: &Option<Expr>) -> Option<Ident> {
    match e {
        Some(Expr::Path(p)) if p.qself.is_none() => p.path.get_ident().cloned(),
        _ => None,
    }
}

/// Lease, retention, and what happens to errors and abandoned claims.
fn policy(args: &Args, cx: &mut Ctxt) -> Policy {
    let mut duration = |lit: &Option<LitStr>| {
        let l = lit.as_ref()?;
        cx.ok(crate::duration::parse(&l.value()).map_err(|msg| syn::Error::new(l.span(), msg)))
    };
    let lease_ms = duration(&args.lease);
    let retain_ms = duration(&args.retain);
    let (lease, retain) = (lease_ms.unwrap_or(300_000), retain_ms.unwrap_or(86_400_000));
    if retain < lease {
        let span = args.retain.as_ref().or(args.lease.as_ref());
        cx.at(
            span.map_or_else(Span::call_site, LitStr::span),
            format_args!(
                "the retention ({retain} ms) is shorter than the lease ({lease} ms): a record must outlive the claim that writes it"
            ),
        );
    }
    let store_final = choice(
        &args.on_error,
        &[("release", false), ("store_final", true)],
        |other| {
            format!(
                "unknown error policy \"{other}\": use \"release\" (the default: an error frees the key for a retry) or \"store_final\" (errors that say they are final are stored and replayed)"
            )
        },
        cx,
    );
    let fail_closed = choice(
        &args.on_expired_lease,
        &[("reclaim", false), ("fail_closed", true)],
        |other| {
            format!(
                "unknown expired-lease policy \"{other}\": use \"reclaim\" (the default) or \"fail_closed\""
            )
        },
        cx,
    );
    Policy {
        lease_ms,
        retain_ms,
        store_final,
        fail_closed,
    }
}

/// One of a few words, each meaning a flag; the first is the default.
fn choice(
    lit: &Option<LitStr>,
    words: &[(&str, bool)],
    unknown: impl Fn(&str) -> String,
    cx: &mut Ctxt,
) -> bool {
    let Some(lit) = lit else { return false };
    let value = lit.value();
    match words.iter().find(|(w, _)| *w == value) {
        Some((_, flag)) => *flag,
        None => {
            cx.at(lit.span(), unknown(&value));
            false
        }
    }
}
