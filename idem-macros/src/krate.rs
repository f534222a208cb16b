//! The path generated code names idem by: `::idem`, or what `crate = "…"` says.

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};
use syn::LitStr;

use crate::ctxt::Ctxt;

/// The idem crate, as generated code reaches it.
#[derive(Clone)]
pub(crate) struct Krate(TokenStream);

impl Krate {
    /// `::idem`, or the `crate = "…"` argument, checked: a string that is not a path is an
    /// error on it, and `::idem` stands in so the rest of the checks still run.
    pub(crate) fn new(lit: Option<&LitStr>, cx: &mut Ctxt) -> Krate {
        let Some(lit) = lit else {
            return Krate(quote!(::idem));
        };
        match lit.parse::<syn::Path>() {
            Ok(path) => Krate(path.into_token_stream()),
            Err(_) => {
                cx.at(
                    lit.span(),
                    format_args!(
                        "`crate` must be a path to the idem crate, such as \"::idem\" or \"my_app::deps::idem\", not \"{}\"",
                        lit.value()
                    ),
                );
                Krate(quote!(::idem))
            }
        }
    }

    /// `<crate>::__private`: where everything generated code calls lives.
    pub(crate) fn private(&self) -> TokenStream {
        let path = &self.0;
        quote!(#path::__private)
    }
}
