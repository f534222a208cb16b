//! `scope!`: renders a scope template from the variables in scope, exactly as `#[idempotent]`
//! renders it from a function's arguments.
//!
//! `idem::scope!("order:<user.id>")`, or with a re-exported idem,
//! `idem::scope!("order:<user.id>", crate = "deps::idem")`.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::{LitStr, Token};

use crate::attr::{self, Grammar};
use crate::ctxt::Ctxt;
use crate::krate::{Krate, Site};
use crate::template::{self, Part, Template};

const GRAMMAR: Grammar = Grammar {
    site: "scope!",
    args: &[("crate", "\"::idem\"")],
};

/// The template, then the arguments after a comma.
struct Input {
    lit: LitStr,
    args: TokenStream,
}

impl Parse for Input {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let lit: LitStr = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "scope! takes one scope template, e.g. `idem::scope!(\"order:<user.id>\")`",
            )
        })?;
        let args = if input.is_empty() {
            TokenStream::new()
        } else {
            input.parse::<Token![,]>()?;
            input.parse()?
        };
        Ok(Input { lit, args })
    }
}

struct Model {
    template: Template,
    lit: LitStr,
    krate: Krate,
}

fn validate(input: Input, cx: &mut Ctxt) -> Option<Model> {
    let mut krate = None;
    attr::parse(input.args, &GRAMMAR, cx, |arg, cx| {
        krate = arg.lit_str(cx)?;
        Ok(())
    });
    let krate = Krate::new(krate.as_ref(), Site::Scope, cx);
    let template = cx.ok(template::parse(&input.lit.value(), input.lit.span()))?;
    Some(Model {
        template,
        lit: input.lit,
        krate,
    })
}

pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let input: Input = match syn::parse2(input) {
        Ok(i) => i,
        Err(e) => return e.to_compile_error(),
    };
    let mut cx = Ctxt::default();
    let model = validate(input, &mut cx);
    match cx.finish(model, "scope!") {
        Ok(m) => render(&m.template, &m.lit, &m.krate),
        Err(e) => e.to_compile_error(),
    }
}

/// Code that evaluates to `Result<String, idem::Error>`: the rendered scope.
pub(crate) fn render(t: &Template, lit: &LitStr, krate: &Krate) -> TokenStream {
    let private = krate.private();
    let span = lit.span();
    let builder = syn::Ident::new("__idem_scope", proc_macro2::Span::mixed_site());
    let cap = t.literal_len + 16;
    let steps = t.parts.iter().map(|part| match part {
        Part::Text(text) => quote!(#builder.literal(#text);),
        Part::Hole(h) => {
            let root = syn::Ident::new(&h.root, span);
            // A field is named by generated tokens located on the string: rustc's "a field with
            // a similar name exists" cannot then offer to rewrite the whole string as the field.
            let located = proc_macro2::Span::mixed_site().located_at(span);
            let fields = h.fields.iter().map(|f| match f.parse::<u32>() {
                Ok(index) => syn::Member::Unnamed(syn::Index {
                    index,
                    span: located,
                }),
                Err(_) => syn::Member::Named(syn::Ident::new(f, located)),
            });
            let p = krate.private_at(span);
            let fields: Vec<_> = fields.collect();
            // A float is refused by its type (a field's is not written in the signature).
            quote_spanned! {span=>
                {
                    #[allow(unused_imports)]
                    use #p::{AnyScope as _, FloatScope as _};
                    #p::stable_scope_value((&#p::ScopeProbe(&#root #(.#fields)*)).scope_kind());
                }
                #p::ScopeValue::add_to(&#root #(.#fields)*, &mut #builder);
            }
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
