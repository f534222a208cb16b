//! `#[idempotent]`: parse the arguments ([`ast`]), check them against the function ([`valid`]),
//! then rewrite the body into begin → replay or run → complete ([`expand`]).

mod ast;
mod expand;
mod valid;

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::ItemFn;

use crate::ctxt::Ctxt;

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut func: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            let e = match syn::parse2::<syn::TraitItemFn>(item.clone()) {
                // A declaration: in a trait, or a `fn …;` elsewhere.
                Ok(f) if f.default.is_none() => syn::Error::new(
                    f.sig.ident.span(),
                    format_args!(
                        "#[idempotent] rewrites a function's body, and `{}` has none here: put the attribute on the method in each `impl` block, where its body is",
                        f.sig.ident
                    ),
                ),
                _ => syn::Error::new(
                    Span::call_site(),
                    "#[idempotent] applies to an `async fn` with a body",
                ),
            }
            .to_compile_error();
            return quote!(#item #e);
        }
    };
    let mut cx = Ctxt::default();
    let skipped = ast::strip_param_attrs(&mut func, &mut cx);
    let args = ast::Args::parse(args, &mut cx);
    // A name the attribute introduces, used without the argument that binds it: bound to its
    // error at its first use, so the compiler reports that, once, and nothing else about it.
    for (name, msg) in valid::unbound_names(&args, &func) {
        let span = name.span();
        func.block.stmts.insert(
            0,
            syn::parse_quote_spanned!(span=> let #name = ::core::compile_error!(#msg);),
        );
    }
    let model = valid::validate(args, &func, &skipped, &mut cx);
    match cx.finish(model, "idempotent") {
        Ok(model) => expand::rewrite(model, func),
        Err(e) => {
            // The function stays as written, so the rest of the crate still type-checks and
            // the user sees only the attribute's own errors.
            // Arguments used only by the attribute would otherwise warn as unused.
            let e = e.to_compile_error();
            quote!(#[allow(unused_variables)] #func #e)
        }
    }
}
