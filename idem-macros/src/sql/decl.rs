//! The function an SQL macro is on: a body-less `async fn` whose first argument is the
//! executor and whose other arguments fill the columns of the same names.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use quote::quote;
use syn::{Ident, Pat, Signature, Type};

use crate::ctxt::Ctxt;

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

/// One argument: its name and type.
#[derive(Clone)]
pub(crate) struct FnArg {
    pub(crate) ident: Ident,
    pub(crate) ty: Type,
}

/// The function's arguments: the executor first, then plain `name: Type` arguments.
pub(crate) struct FnArgs {
    pub(crate) executor: FnArg,
    pub(crate) values: Vec<FnArg>,
}

impl FnArgs {
    /// The argument named `name`.
    pub(crate) fn value(&self, name: &str) -> Option<&FnArg> {
        self.values.iter().find(|a| a.ident == name)
    }
}

pub(crate) fn fn_args(sig: &Signature, attr: &str, cx: &mut Ctxt) -> Option<FnArgs> {
    let mut args = Vec::new();
    for arg in &sig.inputs {
        match arg {
            syn::FnArg::Receiver(r) => {
                cx.at(
                    r.self_token.span,
                    format_args!(
                        "#[{attr}] generates a free function: take the executor as the first argument instead of `self`"
                    ),
                );
                return None;
            }
            syn::FnArg::Typed(t) => match &*t.pat {
                Pat::Ident(p) if p.subpat.is_none() => args.push(FnArg {
                    ident: p.ident.clone(),
                    ty: (*t.ty).clone(),
                }),
                other => {
                    cx.spanned(
                        other,
                        format_args!(
                            "#[{attr}] arguments must be plain names: they name the columns they fill"
                        ),
                    );
                    return None;
                }
            },
        }
    }
    if args.is_empty() {
        cx.at(
            sig.paren_token.span.join(),
            format_args!(
                "#[{attr}] needs the executor as the first argument: a `&PgPool`, `&mut PgConnection`, `&mut Transaction<…>` (or their SQLite counterparts)"
            ),
        );
        return None;
    }
    let at = executor_position(&args);
    if at > 0 {
        let (exec, first) = (&args[at], &args[0]);
        cx.at(
            exec.ident.span(),
            format_args!(
                "the executor comes first: move `{}` before `{}` (every argument after it fills the column of its name)",
                exec.ident, first.ident
            ),
        );
    }
    let executor = args.remove(at);
    Some(FnArgs {
        executor,
        values: args,
    })
}

/// Where the executor is: the first argument, unless only a later one has an executor's type
/// (a pool, a connection, a transaction, an `impl Acquire`).
fn executor_position(args: &[FnArg]) -> usize {
    let looks = |a: &FnArg| {
        let text = a.ty.to_token_stream().to_string();
        ["Pool", "Connection", "Transaction", "Acquire", "Executor"]
            .iter()
            .any(|w| text.contains(w))
    };
    if args.first().is_some_and(looks) {
        return 0;
    }
    args.iter().position(looks).unwrap_or(0)
}
