//! `#[idempotent]`: parse the arguments, validate them against the function, then rewrite the
//! body into begin → replay or run → complete.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{Expr, FnArg, Ident, ItemFn, LitStr, ReturnType, Type};

use crate::attr::{Errors, Grammar, ident_list, lit_str};
use crate::bindings::{self, Param};
use crate::template::{self, Part, Template};

const NAMES: &[&str] = &[
    "scope",
    "key",
    "store",
    "fingerprint",
    "skip",
    "lease",
    "retain",
    "on_error",
    "on_expired_lease",
    "transaction",
    "claim",
    "crate",
];

/// The attribute's arguments as written.
#[derive(Default)]
struct Args {
    scope: Option<LitStr>,
    key: Option<Expr>,
    store: Option<Expr>,
    fingerprint: Option<(Span, Vec<Ident>)>,
    skip: Option<(Span, Vec<Ident>)>,
    lease: Option<LitStr>,
    retain: Option<LitStr>,
    on_error: Option<LitStr>,
    on_expired_lease: Option<LitStr>,
    transaction: Option<Ident>,
    claim: Option<Ident>,
    krate: Option<LitStr>,
    /// Names that were written, valid or not: a malformed `scope` is not also a missing one.
    given: Vec<String>,
}

impl Args {
    fn parse(tokens: TokenStream, errors: &mut Errors) -> Args {
        let mut args = Args::default();
        let mut grammar = Grammar::new("idempotent", NAMES);
        let parser = syn::meta::parser(|meta| {
            let Some(name) = grammar.check(&meta, errors)? else {
                return Ok(());
            };
            let span = meta.path.span();
            args.given.push(name.clone());
            match name.as_str() {
                "scope" => args.scope = lit_str(&meta, "scope", "\"refund:<order_no>\"", errors)?,
                "key" => args.key = Some(meta.value()?.parse()?),
                "store" => args.store = Some(meta.value()?.parse()?),
                "fingerprint" => args.fingerprint = Some((span, ident_list(&meta, "fingerprint")?)),
                "skip" => args.skip = Some((span, ident_list(&meta, "skip")?)),
                "lease" => args.lease = lit_str(&meta, "lease", "\"30s\"", errors)?,
                "retain" => args.retain = lit_str(&meta, "retain", "\"24h\"", errors)?,
                "on_error" => {
                    args.on_error = lit_str(&meta, "on_error", "\"store_final\"", errors)?
                }
                "on_expired_lease" => {
                    args.on_expired_lease =
                        lit_str(&meta, "on_expired_lease", "\"fail_closed\"", errors)?
                }
                "transaction" => args.transaction = Some(meta.value()?.parse()?),
                "claim" => args.claim = Some(meta.value()?.parse()?),
                "crate" => args.krate = lit_str(&meta, "crate", "\"::idem\"", errors)?,
                _ => unreachable!("every accepted name is handled"),
            }
            Ok(())
        });
        if let Err(e) = syn::parse::Parser::parse2(parser, tokens) {
            // The arguments after a syntax error were not read: do not call them missing.
            errors.push(e);
            args.given.extend(NAMES.iter().map(|n| n.to_string()));
        }
        args
    }
}

/// Everything the expansion needs, checked.
struct Model {
    krate: TokenStream,
    template: Template,
    scope_span: Span,
    key: Expr,
    store: Option<Expr>,
    fingerprinted: Vec<(Ident, Vec<syn::Attribute>)>,
    lease_ms: Option<u64>,
    retain_ms: Option<u64>,
    store_final: bool,
    fail_closed: bool,
    transaction: Option<Ident>,
    claim: Option<Ident>,
    ret: Type,
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut func: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            let e = syn::Error::new(
                Span::call_site(),
                "#[idempotent] applies to an `async fn` with a body",
            )
            .to_compile_error();
            return quote!(#item #e);
        }
    };
    let mut errors = Errors::default();
    let skipped = strip_param_attrs(&mut func, &mut errors);
    let args = Args::parse(args, &mut errors);
    let model = validate(args, &func, &skipped, &mut errors);
    match (errors.finish(), model) {
        (Ok(()), Some(model)) => rewrite(model, func),
        (result, _) => {
            // The function stays as written, so the rest of the crate still type-checks and
            // the user sees only the attribute's own errors.
            // Arguments used only by the attribute would otherwise warn as unused.
            let e = result.err().map(|e| e.to_compile_error());
            quote!(#[allow(unused_variables)] #func #e)
        }
    }
}

/// Removes `#[idem(…)]` from parameters (the compiler would not know it) and returns which
/// parameters said `#[idem(skip)]`.
fn strip_param_attrs(func: &mut ItemFn, errors: &mut Errors) -> Vec<bool> {
    func.sig
        .inputs
        .iter_mut()
        .map(|arg| {
            let attrs = match arg {
                FnArg::Receiver(r) => &mut r.attrs,
                FnArg::Typed(t) => &mut t.attrs,
            };
            let mut skip = false;
            attrs.retain(|a| {
                if !a.path().is_ident("idem") {
                    return true;
                }
                let parsed = a.parse_nested_meta(|meta| {
                    if meta.path.is_ident("skip") {
                        skip = true;
                        Ok(())
                    } else {
                        Err(meta.error(
                            "unknown parameter option: the only one is `#[idem(skip)]`, which leaves the parameter out of the fingerprint",
                        ))
                    }
                });
                if let Err(e) = parsed {
                    errors.push(e);
                }
                false
            });
            skip
        })
        .collect()
}

fn validate(args: Args, func: &ItemFn, skipped: &[bool], errors: &mut Errors) -> Option<Model> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors.at(
            sig.fn_token.span,
            "#[idempotent] needs an `async fn`: the claim is taken before the body and completed after it, across `.await`s",
        );
    }
    let ret = match &sig.output {
        ReturnType::Type(_, ty) if obviously_not_result(ty) => {
            errors.at(
                ty.span(),
                format_args!(
                    "an #[idempotent] function must return `Result<T, E>`, not `{}`: the `Ok` value is stored and replayed, an `Err` releases the claim so a retry can run",
                    ty.to_token_stream()
                ),
            );
            None
        }
        ReturnType::Type(_, ty) => {
            let mut finder = ImplTraitFinder(None);
            finder.visit_type(ty);
            if let Some(span) = finder.0 {
                errors.at(
                    span,
                    "an #[idempotent] function cannot return `impl Trait`: a replay rebuilds the value from stored bytes, which needs a concrete type",
                );
            }
            Some((**ty).clone())
        }
        ReturnType::Default => {
            errors.at(
                sig.paren_token.span.close(),
                "an #[idempotent] function must return `Result<T, E>`: add `-> Result<T, E>` (the `Ok` value is stored and replayed)",
            );
            None
        }
    };

    let mut params = bindings::params(sig);
    for (p, skip) in params.iter_mut().zip(skipped) {
        p.skipped |= *skip;
    }
    let bound: Vec<&Ident> = params.iter().flat_map(|p| &p.idents).collect();
    let is_bound = |name: &str| bound.iter().any(|i| *i == name);
    let names = || {
        bound
            .iter()
            .map(|i| format!("`{i}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };

    let given = |name: &str| args.given.iter().any(|g| g == name);
    let template = match &args.scope {
        None if given("scope") => None,
        None => {
            errors.at(
                Span::call_site(),
                "missing `scope`: name what the operation acts on, e.g. `scope = \"refund:<order_no>\"` (a function's name is not an identity: renaming it must not reset idempotency)",
            );
            None
        }
        Some(lit) => match template::parse(&lit.value(), lit.span()) {
            Err(e) => {
                errors.push(e);
                None
            }
            Ok(t) => {
                for part in &t.parts {
                    if let Part::Hole(h) = part
                        && !is_bound(&h.root)
                    {
                        errors.at(
                                lit.span(),
                                format_args!(
                                    "`<{}>` in the scope names no argument of `{}`: its arguments are {}",
                                    h.written,
                                    sig.ident,
                                    names()
                                ),
                            );
                    }
                }
                Some(t)
            }
        },
    };
    if !given("key") {
        errors.at(
            Span::call_site(),
            "missing `key`: the idempotency key, e.g. `key = key` for an `IdempotencyKey` argument or `key = msg.id` for a message",
        );
    }

    let fingerprinted = fingerprinted(&args, &params, sig, errors);

    let duration = |lit: &Option<LitStr>, errors: &mut Errors| {
        lit.as_ref()
            .and_then(|l| match crate::duration::parse(&l.value()) {
                Ok(ms) => Some(ms),
                Err(msg) => {
                    errors.at(l.span(), msg);
                    None
                }
            })
    };
    let lease_ms = duration(&args.lease, errors);
    let retain_ms = duration(&args.retain, errors);
    let (lease_eff, retain_eff) = (lease_ms.unwrap_or(300_000), retain_ms.unwrap_or(86_400_000));
    if retain_eff < lease_eff {
        let span = args
            .retain
            .as_ref()
            .or(args.lease.as_ref())
            .map_or_else(Span::call_site, LitStr::span);
        errors.at(
            span,
            format_args!(
                "the retention ({retain_eff} ms) is shorter than the lease ({lease_eff} ms): a record must outlive the claim that writes it"
            ),
        );
    }
    let store_final = match &args.on_error {
        None => false,
        Some(l) => match l.value().as_str() {
            "release" => false,
            "store_final" => true,
            other => {
                errors.at(
                    l.span(),
                    format_args!(
                        "unknown error policy \"{other}\": use \"release\" (the default: an error frees the key for a retry) or \"store_final\" (errors that say they are final are stored and replayed)"
                    ),
                );
                false
            }
        },
    };
    let fail_closed = match &args.on_expired_lease {
        None => false,
        Some(l) => match l.value().as_str() {
            "reclaim" => false,
            "fail_closed" => true,
            other => {
                errors.at(
                    l.span(),
                    format_args!(
                        "unknown expired-lease policy \"{other}\": use \"reclaim\" (the default) or \"fail_closed\""
                    ),
                );
                false
            }
        },
    };
    let krate = crate::attr::krate(args.krate.as_ref(), errors);
    for name in [&args.transaction, &args.claim].into_iter().flatten() {
        if is_bound(&name.to_string()) {
            errors.at(
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
        lease_ms,
        retain_ms,
        store_final,
        fail_closed,
        transaction: args.transaction,
        claim: args.claim,
        ret: ret?,
    })
}

/// The identifiers that go into the fingerprint, each with the `#[cfg]`s of its parameter.
fn fingerprinted(
    args: &Args,
    params: &[Param],
    sig: &syn::Signature,
    errors: &mut Errors,
) -> Option<Vec<(Ident, Vec<syn::Attribute>)>> {
    let find = |name: &Ident| params.iter().find(|p| p.idents.iter().any(|i| i == name));
    let mut ok = true;
    let mut check = |list: &[Ident], errors: &mut Errors| {
        for name in list {
            if find(name).is_none() {
                ok = false;
                errors.at(
                    name.span(),
                    format_args!("`{name}` is not an argument of `{}`", sig.ident),
                );
            }
        }
    };
    if let (Some(_), Some((span, _))) = (&args.fingerprint, &args.skip) {
        errors.at(
            *span,
            "use either `fingerprint(…)` (exactly these arguments) or `skip(…)` (all but these), not both",
        );
    }
    let out: Vec<(Ident, Vec<syn::Attribute>)> = if let Some((_, list)) = &args.fingerprint {
        check(list, errors);
        list.iter()
            .filter_map(|name| find(name).map(|p| (name.clone(), p.cfgs.clone())))
            .collect()
    } else {
        let skip = args
            .skip
            .as_ref()
            .map(|(_, l)| l.as_slice())
            .unwrap_or_default();
        check(skip, errors);
        // The key identifies the request and the store keeps it: neither is part of what the
        // request says.
        let plain = |e: &Option<Expr>| match e {
            Some(Expr::Path(p)) if p.qself.is_none() => p.path.get_ident().cloned(),
            _ => None,
        };
        let implicit = [plain(&args.key), plain(&args.store)];
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

struct ImplTraitFinder(Option<Span>);

impl<'ast> Visit<'ast> for ImplTraitFinder {
    fn visit_type_impl_trait(&mut self, t: &'ast syn::TypeImplTrait) {
        self.0.get_or_insert(t.span());
    }
}

fn rewrite(model: Model, func: ItemFn) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        ..
    } = func;
    let Model {
        krate,
        template,
        scope_span,
        key,
        store,
        fingerprinted,
        lease_ms,
        retain_ms,
        store_final,
        fail_closed,
        transaction,
        claim,
        ret,
    } = model;
    let private = quote!(#krate::__private);
    // The runtime path, re-spanned onto a user token: an unmet trait bound of the function it
    // names is then reported there, under the return type or the store, not on the attribute.
    let private_at = |span: Span| respan(private.clone(), span);
    let local = |name: &str| format_ident!("__idem_{}", name, span = Span::mixed_site());
    let (v_store, v_fp, v_policy) = (local("store"), local("fp"), local("policy"));

    // Spans for the calls that check the user's types: the store, the `Ok` type, the error type.
    let ret_span = ret.span();
    let (ok_span, err_span) = match result_args(&ret) {
        Some((ok, err)) => (ok.span(), Some((err.span(), err.clone()))),
        None => (ret_span, None),
    };
    let store_span = store
        .as_ref()
        .map(Spanned::span)
        .or(transaction.as_ref().map(Ident::span))
        .unwrap_or(ret_span);
    let at = |span: Span, name: &Ident| {
        Ident::new(&name.to_string(), Span::mixed_site().located_at(span))
    };

    let checked_store = if transaction.is_some() {
        quote!(tx_store)
    } else {
        quote!(store)
    };
    let p_store = private_at(store_span);
    let store_init = match &store {
        Some(e) => quote_spanned!(store_span=> #p_store::#checked_store((#e).clone())),
        None => quote_spanned!(store_span=> #p_store::#checked_store(#p_store::DefaultStore)),
    };
    let errors_fn = if store_final {
        quote!(errors_final)
    } else {
        quote!(errors)
    };
    let errors_init = match &err_span {
        Some((span, err)) => {
            let p = private_at(*span);
            quote_spanned!(*span=> #p::#errors_fn::<#err>())
        }
        None => {
            let p = private_at(ret_span);
            quote_spanned!(ret_span=> #p::#errors_fn())
        }
    };

    let scope_lit = LitStr::new("", scope_span);
    let scope_expr = crate::scope::render(&template, &scope_lit, &private);

    let fp_steps = fingerprinted.iter().map(|(ident, cfgs)| {
        let p = private_at(ident.span());
        quote_spanned! {ident.span()=>
            #(#cfgs)*
            #p::Fingerprintable::add_to(&#ident, &mut #v_fp)?;
        }
    });

    let lease = lease_ms.map(|ms| quote!(.lease(::core::time::Duration::from_millis(#ms))));
    let retain = retain_ms.map(|ms| quote!(.retain(::core::time::Duration::from_millis(#ms))));
    let expired = fail_closed.then(|| quote!(.expired_lease(#private::ExpiredLease::FailClosed)));
    let key_private = private_at(key.span());
    let key_expr = quote_spanned!(key.span()=> #key_private::key(&(#key)));

    let v_timing = local("timing");
    let prepared = quote! {
        #private::Prepared::new(
            #key_expr,
            #scope_expr,
            (|| {
                let mut #v_fp = #private::Fingerprinter::new();
                #(#fp_steps)*
                ::core::result::Result::Ok::<_, #private::Error>(#v_fp.finish())
            })(),
            #v_policy,
        )
        .timed(&#v_timing)
    };

    // `Self`, through the trait: when the return type is not a `Result`, this is an error type
    // after the one error saying so, and the rest of the expansion stays quiet.
    let p_ret = private_at(ret_span);
    let fake_return = quote_spanned! {ret_span=>
        #[allow(
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value
        )]
        if false {
            let __idem_fake_return = #p_ret::unreachable::<#ret>();
            return __idem_fake_return;
        }
    };
    let stmts = &block.stmts;
    let body = quote! {
        async move {
            #fake_return
            #(#stmts)*
        }
    };
    let (v_errors, v_claim, v_out, v_result) = (
        local("errors"),
        local("claim"),
        local("out"),
        local("result"),
    );
    let p_ok = private_at(ok_span);
    let (store_ok, errors_ok) = (at(ok_span, &v_store), at(ok_span, &v_errors));
    let call = match &transaction {
        None => {
            // Spanned as a whole: a call's unmet bounds are reported on the call's span.
            let body = match &claim {
                None => quote!(#private::Plain(#body)),
                Some(c) => quote!(#private::WithClaim(move |#c: #private::ClaimInfo| #body)),
            };
            quote_spanned! {ok_span=>
                #p_ok::run(&#store_ok, #prepared, #errors_ok, #body).await
            }
        }
        Some(tx) => {
            let (claim_ok, out_ok) = (at(ok_span, &v_claim), at(ok_span, &v_out));
            let start = quote_spanned!(ok_span=> #p_ok::tx_start(&#store_ok, #prepared).await);
            // Spanned on the `Ok` type too: an unmet bound on `out` is traced back to here.
            let body = quote_spanned! {ok_span=>
                async move {
                    #fake_return
                    #(#stmts)*
                }
            };
            let (claimed, bindings) = match &claim {
                None => (quote!(#claim_ok.transaction()), quote!(#tx)),
                Some(c) => (quote!(#claim_ok.claimed()), quote!((#tx, #c))),
            };
            let run_body = quote_spanned! {ok_span=>
                let #out_ok = match #claimed {
                    ::core::option::Option::Some(#bindings) => ::core::option::Option::Some(#body.await),
                    ::core::option::Option::None => ::core::option::Option::None,
                };
            };
            // `.await` included: awaiting re-checks the future's bounds, on the await's span.
            let finish = quote_spanned! {ok_span=>
                #p_ok::tx_finish(&#store_ok, #claim_ok, #errors_ok, #out_ok).await
            };
            quote! {
                let mut #v_claim = #start;
                #run_body
                #finish
            }
        }
    };

    quote! {
        #(#attrs)*
        #vis #sig {
            // How long this function's calls take: what its "in progress" answers say to wait.
            static #v_timing: #private::Timing = #private::Timing::new();
            let #v_store = #store_init;
            let #v_errors = #errors_init;
            let #v_policy = #private::Policy::DEFAULT #lease #retain #expired;
            // Unannotated: the body's type (from the fake return edge above) decides, so that a
            // return type that is not a `Result` is reported once.
            let #v_result = { #call };
            #v_result
        }
    }
}

/// `tokens` with every span set to `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|tt| match tt {
            TokenTree::Group(g) => {
                let mut group = Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                TokenTree::Group(group)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}

/// `T` and `E` of a return type written `Result<T, E>` (any path ending in `Result`).
fn result_args(ty: &Type) -> Option<(&Type, &Type)> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last().filter(|s| s.ident == "Result")?;
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut types = args.args.iter().filter_map(|a| match a {
        syn::GenericArgument::Type(t) => Some(t),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(ok), Some(err), None) => Some((ok, err)),
        _ => None,
    }
}

/// Return types that cannot be a `Result` or an alias of one, rejected before type checking so
/// the message is one, on the type. Anything else is checked by the compiler (`IdemResult`).
fn obviously_not_result(ty: &Type) -> bool {
    const NOT_RESULT: &[&str] = &[
        "bool",
        "char",
        "str",
        "u8",
        "u16",
        "u32",
        "u64",
        "u128",
        "usize",
        "i8",
        "i16",
        "i32",
        "i64",
        "i128",
        "isize",
        "f32",
        "f64",
        "String",
        "Vec",
        "Option",
        "Box",
        "HashMap",
        "BTreeMap",
        "Json",
        "StatusCode",
        "Response",
    ];
    match ty {
        Type::Path(p) => {
            p.qself.is_none()
                && p.path
                    .segments
                    .last()
                    .is_some_and(|s| NOT_RESULT.iter().any(|n| s.ident == n))
        }
        Type::Paren(p) => obviously_not_result(&p.elem),
        Type::Tuple(_)
        | Type::Reference(_)
        | Type::Array(_)
        | Type::Slice(_)
        | Type::Never(_)
        | Type::Ptr(_) => true,
        _ => false,
    }
}
