//! The rewritten body of an `#[idempotent]` function: begin → replay or run → complete, with
//! every check of the user's types spanned on the tokens it is about.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, LitStr, Stmt, Type};

use super::valid::Model;
use crate::{spans, types};

/// Names and spans shared by the pieces of the expansion.
struct Gen<'a> {
    model: &'a Model,
    /// `<crate>::__private`.
    private: TokenStream,
    /// The return type's span, and those of its `Ok` and error types where it is written
    /// `Result<T, E>`.
    ret_span: Span,
    ok_span: Span,
    err: Option<(Span, &'a Type)>,
    /// The `Ok` type when it is written like an HTTP answer (`Json<T>`, `(StatusCode,
    /// Json<T>)`): its replay marker is then picked up front, and `ok_span` is `T`'s.
    json_ok: Option<&'a Type>,
}

impl Gen<'_> {
    /// The runtime path, re-spanned onto a user token: an unmet trait bound of the function it
    /// names is then reported there, under the return type or the store, not on the attribute.
    fn private_at(&self, span: Span) -> TokenStream {
        self.model.krate.private_at(span)
    }

    /// A hygienic generated local.
    fn local(name: &str) -> Ident {
        format_ident!("__idem_{}", name, span = Span::mixed_site())
    }

    /// The same local, located on a user token so that errors about it point there.
    fn local_at(name: &str, span: Span) -> Ident {
        Ident::new(
            &format!("__idem_{name}"),
            Span::mixed_site().located_at(span),
        )
    }
}

pub(super) fn rewrite(model: Model, func: ItemFn) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        ..
    } = func;
    let ret_span = model.ret.span();
    let (ok_span, err, json_ok) = match types::result_args(&model.ret) {
        Some((ok, err)) => match types::json_body(ok) {
            // An unmet bound of the answer is one of its body: reported there, by name.
            Some(body) => (body.span(), Some((err.span(), err)), Some(ok)),
            None => (ok.span(), Some((err.span(), err)), None),
        },
        None => (ret_span, None, None),
    };
    let g = Gen {
        model: &model,
        private: model.krate.private(),
        ret_span,
        ok_span,
        err,
        json_ok,
    };
    let prelude = prelude(&g);
    let contract = contract(&g, &sig.ident);
    let call = call(&g, &block.stmts);
    let v_result = Gen::local("result");
    quote! {
        #(#attrs)*
        #vis #sig {
            #contract
            #prelude
            // Unannotated: the body's type (from the fake return edge above) decides, so that a
            // return type that is not a `Result` is reported once.
            let #v_result = { #call };
            #v_result
        }
    }
}

/// What the function promises, registered for OpenAPI documents (`idem::openapi`, feature
/// `utoipa`; nothing without it).
fn contract(g: &Gen<'_>, name: &Ident) -> TokenStream {
    let m = g.model;
    let private = &g.private;
    let name = name.to_string();
    let name = name.strip_prefix("r#").unwrap_or(&name);
    let scope = &m.scope_text;
    let ms = |d: Option<u64>| match d {
        Some(ms) => quote!(::core::option::Option::Some(#ms)),
        None => quote!(::core::option::Option::None),
    };
    let (lease, retain, wait) = (
        ms(m.policy.lease_ms),
        ms(m.policy.retain_ms),
        ms(m.policy.wait_ms),
    );
    let tx = m.transaction.is_some();
    quote! {
        #private::contract!(#name, ::core::module_path!(), #scope, #lease, #retain, #wait, #tx);
    }
}

/// The store, the error conversions and the policy, each checked where the user wrote it.
fn prelude(g: &Gen<'_>) -> TokenStream {
    let m = g.model;
    let private = &g.private;
    let store_span = m
        .store
        .as_ref()
        .map(Spanned::span)
        .or(m.transaction.as_ref().map(Ident::span))
        .unwrap_or(g.ret_span);
    let checked_store = if m.transaction.is_some() {
        quote!(tx_store)
    } else {
        quote!(store)
    };
    let p_store = g.private_at(store_span);
    // By reference, and cloned by the shim: a value that is no store is told so, not that it
    // has no `clone` method. Reported over the whole expression (`self.idem`).
    let store_init = match &m.store {
        Some(e) => {
            let (first, last) = spans::ends(e);
            let arg = spans::parens_at(quote!(#e), last);
            quote_spanned!(first=> #p_store::#checked_store(&#arg))
        }
        None => quote_spanned!(store_span=> #p_store::#checked_store(&#p_store::DefaultStore)),
    };
    let errors_init = match g.err {
        // Named through its trait, `<E as ErrorType>`: an error type without the impl is
        // reported on `E` with the trait's message, and no generated function is quoted.
        Some((span, err)) => {
            let p = g.private_at(span);
            let ops = Gen::local_at("errors", span);
            let finals = m.policy.store_final.then(|| {
                quote_spanned!(span=> let #ops = <#err as #p::FinalErrorType>::with_finals(#ops);)
            });
            quote_spanned! {span=> {
                let #ops = <#err as #p::ErrorType>::errors();
                #finals
                #ops
            }}
        }
        // Written through an alias (`AppResult<T>`): inferred, and reported on the return type.
        None => {
            let p = g.private_at(g.ret_span);
            let (_, last) = spans::ends(&m.ret);
            let errors_fn = if m.policy.store_final {
                Ident::new("errors_final", last)
            } else {
                Ident::new("errors", last)
            };
            quote_spanned!(g.ret_span=> #p::#errors_fn())
        }
    };
    let ms = |d: Option<u64>| d.map(|ms| quote!(::core::time::Duration::from_millis(#ms)));
    let lease = ms(m.policy.lease_ms).map(|d| quote!(.lease(#d)));
    let retain = ms(m.policy.retain_ms).map(|d| quote!(.retain(#d)));
    let wait = ms(m.policy.wait_ms).map(|d| quote!(.wait(#d)));
    let expired = m
        .policy
        .fail_closed
        .then(|| quote!(.expired_lease(#private::ExpiredLease::FailClosed)));
    let (v_store, v_errors, v_policy) = (
        Gen::local("store"),
        Gen::local("errors"),
        Gen::local("policy"),
    );
    let v_timing = Gen::local("timing");
    // An answer of the HTTP integration fixes its replay marker, so the compiler names the body
    // type that cannot be replayed instead of the whole answer; any other `Json` keeps the
    // inferred marker (see `ShapeProbe`).
    let shaped = g.json_ok.map(|ok| {
        quote! {
            let #v_errors = #v_errors.replayed_as({
                #[allow(unused_imports)]
                use #private::{AnyShape as _, HttpShape as _};
                (&#private::ShapeProbe::<#ok>::new()).shape()
            });
        }
    });
    quote! {
        // How long this function's calls take: what its "in progress" answers say to wait.
        static #v_timing: #private::Timing = #private::Timing::new();
        let #v_store = #store_init;
        let #v_errors = #errors_init;
        #shaped
        let #v_policy = #private::default_policy() #lease #retain #wait #expired;
    }
}

/// `Prepared::new(key, scope, fingerprint, policy)`: everything `begin` needs.
fn prepared(g: &Gen<'_>) -> TokenStream {
    let m = g.model;
    let private = &g.private;
    let v_fp = Gen::local("fp");
    let v_policy = Gen::local("policy");
    let v_timing = Gen::local("timing");
    let scope_lit = LitStr::new("", m.scope_span);
    let scope_expr = crate::scope::render(&m.template, &scope_lit, &m.krate);
    let fp_steps = m.fingerprinted.iter().map(|f| {
        let span = f.path.root.span();
        let p = g.private_at(span);
        let check = if f.read_by_key {
            Ident::new("KeySource", span)
        } else {
            Ident::new("Fingerprintable", span)
        };
        let (path, cfgs) = (&f.path, &f.cfgs);
        quote_spanned! {span=>
            #(#cfgs)*
            #p::#check::add_to(&#path, &mut #v_fp)?;
        }
    });
    let key = &m.key;
    let key_private = g.private_at(key.span());
    let key_expr = quote_spanned!(key.span()=> #key_private::key(&(#key)));
    // A resumable call stores its fingerprinted arguments by name, for its resume function.
    let resumable = m.resumable.as_ref().map(|name| {
        let v_args = Gen::local("args");
        let steps = m.fingerprinted.iter().map(|f| {
            let span = f.path.root.span();
            let p = g.private_at(span);
            let check = if f.read_by_key {
                Ident::new("KeySource", span)
            } else {
                Ident::new("Fingerprintable", span)
            };
            let (path, cfgs) = (&f.path, &f.cfgs);
            let label = quote!(#path).to_string().replace(' ', "");
            quote_spanned! {span=>
                #(#cfgs)*
                #v_args.add(#label, #p::#check::request_value(&#path)?);
            }
        });
        let max_request = usize::try_from(m.max_request).unwrap_or(usize::MAX);
        quote! {
            .resumable(#name, (|| {
                let mut #v_args = #private::RequestArgs::new();
                #(#steps)*
                #v_args.finish()
            })(), #max_request)
        }
    });
    quote! {
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
        #resumable
    }
}

/// The body as an `async move` block, typed by the fake return edge: `Self`, through the
/// trait. When the return type is not a `Result`, this is an error type after the one error
/// saying so, and the rest of the expansion stays quiet.
fn body(g: &Gen<'_>, stmts: &[Stmt], span: Span) -> TokenStream {
    let ret = &g.model.ret;
    let p_ret = g.private_at(g.ret_span);
    let fake_return = quote_spanned! {g.ret_span=>
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
    quote_spanned! {span=>
        async move {
            #fake_return
            #(#stmts)*
        }
    }
}

/// Runs the body under the claim: `run` in separate-commit mode, `tx_start` … `tx_finish`
/// in transactional mode.
fn call(g: &Gen<'_>, stmts: &[Stmt]) -> TokenStream {
    let m = g.model;
    let private = &g.private;
    let ok_span = g.ok_span;
    let p_ok = g.private_at(ok_span);
    let prepared = prepared(g);
    let store_ok = Gen::local_at("store", ok_span);
    let errors_ok = Gen::local_at("errors", ok_span);
    let Some(tx) = &m.transaction else {
        let body = body(g, stmts, Span::call_site());
        // Spanned as a whole: a call's unmet bounds are reported on the call's span.
        let body = match &m.claim {
            None => quote!(#private::Plain(#body)),
            Some(c) => quote!(#private::WithClaim(move |#c: #private::ClaimInfo| #body)),
        };
        if m.policy.finish_on_cancel {
            // On a task of its own: the store handle and the body move there.
            return quote_spanned! {ok_span=>
                #p_ok::run_detached(#store_ok, #prepared, #errors_ok, #body).await
            };
        }
        return quote_spanned! {ok_span=>
            #p_ok::run(&#store_ok, #prepared, #errors_ok, #body).await
        };
    };
    // Located on the `Ok` type outright, not with the macro's hygiene: an unmet bound of
    // `tx_finish` is then reported once, there, and not also on the whole attribute.
    let (claim_ok, out_ok) = (
        Ident::new("__idem_claim", ok_span),
        Ident::new("__idem_out", ok_span),
    );
    let start = quote_spanned!(ok_span=> #p_ok::tx_start(&#store_ok, #prepared).await);
    // Spanned on the `Ok` type too: an unmet bound on `out` is traced back to here.
    let body = body(g, stmts, ok_span);
    let (claimed, bindings) = match &m.claim {
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
        let mut #claim_ok = #start;
        #run_body
        #finish
    }
}
