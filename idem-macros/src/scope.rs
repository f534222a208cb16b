//! `scope!`: renders a scope template from the variables in scope, exactly as `#[idempotent]`
//! renders it from a function's arguments.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::LitStr;

use crate::template::{self, Part};

pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let lit: LitStr = match syn::parse2(input) {
        Ok(l) => l,
        Err(e) => {
            return syn::Error::new(
                e.span(),
                "scope! takes one scope template, e.g. `idem::scope!(\"order:<user.id>\")`",
            )
            .to_compile_error();
        }
    };
    match template::parse(&lit.value(), lit.span()) {
        Ok(t) => render(&t, &lit, &quote!(::idem::__private)),
        Err(e) => e.to_compile_error(),
    }
}

/// Code that evaluates to `Result<String, idem::Error>`: the rendered scope.
pub(crate) fn render(t: &template::Template, lit: &LitStr, private: &TokenStream) -> TokenStream {
    let span = lit.span();
    let builder = syn::Ident::new("__idem_scope", proc_macro2::Span::mixed_site());
    let cap = t.literal_len + 16;
    let steps = t.parts.iter().map(|part| match part {
        Part::Text(text) => quote!(#builder.literal(#text);),
        Part::Hole(h) => {
            let root = syn::Ident::new(&h.root, span);
            let fields = h.fields.iter().map(|f| match f.parse::<u32>() {
                Ok(index) => syn::Member::Unnamed(syn::Index { index, span }),
                Err(_) => syn::Member::Named(syn::Ident::new(f, span)),
            });
            quote_spanned!(span=> #builder.value(&#root #(.#fields)*);)
        }
    });
    quote! {
        {
            let mut #builder = #private::ScopeBuilder::with_capacity(#cap);
            #(#steps)*
            #builder.finish()
        }
    }
}
