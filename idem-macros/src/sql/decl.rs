//! The function an SQL macro is on: a body-less `async fn` whose first argument is the
//! executor and whose other arguments fill the columns of the same names.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{FnArg, Ident, Pat, Signature};

/// An `async fn` without a body (`;` or `{}`): the macro writes the body.
pub(crate) struct Decl {
    pub(crate) attrs: Vec<syn::Attribute>,
    pub(crate) vis: syn::Visibility,
    pub(crate) sig: Signature,
}

impl Decl {
    /// The declaration, or the tokens to emit instead: the item and an error on it.
    pub(crate) fn parse(item: TokenStream, attr: &str) -> Result<Decl, TokenStream> {
        if let Ok(f) = syn::parse2::<syn::ItemFn>(item.clone()) {
            if !f.block.stmts.is_empty() {
                let e = syn::Error::new_spanned(
                    &f.block,
                    format_args!(
                        "#[{attr}] writes this function's body: declare it with `;` or `{{}}`"
                    ),
                )
                .to_compile_error();
                return Err(quote!(#e));
            }
            return Ok(Decl {
                attrs: f.attrs,
                vis: f.vis,
                sig: f.sig,
            });
        }
        match syn::parse2::<syn::ForeignItemFn>(item.clone()) {
            Ok(f) => Ok(Decl {
                attrs: f.attrs,
                vis: f.vis,
                sig: f.sig,
            }),
            Err(_) => {
                let e = syn::Error::new(
                    Span::call_site(),
                    format_args!("#[{attr}] applies to an `async fn` declaration, such as `async fn mark_paid(db: &PgPool, order_no: &str) -> Result<…, idem::Error>;`"),
                )
                .to_compile_error();
                Err(quote!(#item #e))
            }
        }
    }

    /// The declaration, with a body that type-checks, and the errors: callers see no errors
    /// of their own.
    pub(crate) fn with_errors(self, e: syn::Error) -> TokenStream {
        let Decl { attrs, vis, sig } = self;
        let e = e.to_compile_error();
        quote! {
            #(#attrs)*
            #[allow(unused_variables)]
            #vis #sig { ::core::unimplemented!() }
            #e
        }
    }
}

/// `async` is required: the function runs statements.
pub(crate) fn require_async(sig: &Signature, attr: &str) -> syn::Result<()> {
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span,
            format_args!("#[{attr}] needs an `async fn`: it runs SQL statements"),
        ));
    }
    Ok(())
}

/// The function's arguments: the executor first, then plain `name: Type` arguments.
pub(crate) struct FnArgs {
    pub(crate) executor: Ident,
    pub(crate) values: Vec<Ident>,
}

pub(crate) fn fn_args(sig: &Signature, attr: &str) -> syn::Result<FnArgs> {
    let mut idents = Vec::new();
    for arg in &sig.inputs {
        match arg {
            FnArg::Receiver(r) => {
                return Err(syn::Error::new(
                    r.self_token.span,
                    format_args!(
                        "#[{attr}] generates a free function: take the executor as the first argument instead of `self`"
                    ),
                ));
            }
            FnArg::Typed(t) => match &*t.pat {
                Pat::Ident(p) if p.subpat.is_none() => idents.push(p.ident.clone()),
                other => {
                    return Err(syn::Error::new_spanned(
                        other,
                        format_args!(
                            "#[{attr}] arguments must be plain names: they name the columns they fill"
                        ),
                    ));
                }
            },
        }
    }
    let mut it = idents.into_iter();
    let Some(executor) = it.next() else {
        return Err(syn::Error::new(
            sig.paren_token.span.join(),
            format_args!(
                "#[{attr}] needs the executor as the first argument: a `&PgPool`, `&mut PgConnection`, `&mut Transaction<…>` (or their SQLite counterparts)"
            ),
        ));
    };
    Ok(FnArgs {
        executor,
        values: it.collect(),
    })
}
