//! `state_machine!`: an enum of states mapped to their column texts, and its allowed edges,
//! declared once. `#[state_transition(machine = …)]` checks its `from → to` against it at compile
//! time.

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Attribute, Ident, LitStr, Token, Visibility, braced};

use crate::attr::Errors;

struct State {
    attrs: Vec<Attribute>,
    ident: Ident,
    text: LitStr,
}

impl Parse for State {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let ident: Ident = input.parse()?;
        let _: Token![=] = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                format_args!(
                    "each state names its column text: `{ident} = \"{}\"`",
                    ident.to_string().to_uppercase()
                ),
            )
        })?;
        let text: LitStr = input.parse()?;
        Ok(State { attrs, ident, text })
    }
}

struct Machine {
    attrs: Vec<Attribute>,
    vis: Visibility,
    ident: Ident,
    states: Vec<State>,
    chains: Vec<Vec<Ident>>,
}

impl Parse for Machine {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let _: Token![enum] = input.parse()?;
        let ident: Ident = input.parse()?;
        let content;
        braced!(content in input);
        let states: Punctuated<State, Token![,]> =
            content.parse_terminated(State::parse, Token![,])?;
        let mut chains = Vec::new();
        while !input.is_empty() {
            let mut chain = vec![input.parse::<Ident>()?];
            while input.peek(Token![->]) {
                let _: Token![->] = input.parse()?;
                chain.push(input.parse()?);
            }
            if chain.len() < 2 {
                return Err(syn::Error::new(
                    chain[0].span(),
                    "an edge goes from one state to another: `Pending -> Paid;` (chains like `A -> B -> C;` are fine)",
                ));
            }
            let _: Token![;] = input.parse()?;
            chains.push(chain);
        }
        Ok(Machine {
            attrs,
            vis,
            ident,
            states: states.into_iter().collect(),
            chains,
        })
    }
}

pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let m: Machine = match syn::parse2(input) {
        Ok(m) => m,
        Err(e) => return e.to_compile_error(),
    };
    let mut errors = Errors::default();
    for (i, s) in m.states.iter().enumerate() {
        if m.states[..i].iter().any(|o| o.ident == s.ident) {
            errors.at(
                s.ident.span(),
                format_args!("state `{}` is declared twice", s.ident),
            );
        }
        if m.states[..i]
            .iter()
            .any(|o| o.text.value() == s.text.value())
        {
            errors.at(
                s.text.span(),
                format_args!("column text \"{}\" is used by two states", s.text.value()),
            );
        }
        if s.text.value().is_empty() {
            errors.at(s.text.span(), "a state's column text cannot be empty");
        }
    }
    if m.states.is_empty() {
        errors.at(m.ident.span(), "a state machine needs at least one state");
    }
    let mut edges: Vec<(&Ident, &Ident)> = Vec::new();
    for chain in &m.chains {
        for id in chain {
            if !m.states.iter().any(|s| s.ident == *id) {
                errors.at(
                    id.span(),
                    format_args!("`{id}` is not a state of `{}`", m.ident),
                );
            }
        }
        for pair in chain.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if a == b {
                errors.at(
                    b.span(),
                    format_args!("`{a} -> {b}` goes nowhere: an edge must change the state"),
                );
            } else if edges.iter().any(|(x, y)| *x == a && *y == b) {
                errors.at(
                    b.span(),
                    format_args!("edge `{a} -> {b}` is declared twice"),
                );
            } else {
                edges.push((a, b));
            }
        }
    }
    if let Err(e) = errors.finish() {
        return e.to_compile_error();
    }

    let Machine {
        attrs,
        vis,
        ident,
        states,
        ..
    } = &m;
    let name = ident.to_string();
    let variants = states.iter().map(|s| {
        let (a, i) = (&s.attrs, &s.ident);
        quote!(#(#a)* #i)
    });
    let idents: Vec<&Ident> = states.iter().map(|s| &s.ident).collect();
    let texts: Vec<&LitStr> = states.iter().map(|s| &s.text).collect();
    let text_of = |id: &Ident| states.iter().find(|s| s.ident == *id).map(|s| &s.text);
    let edge_from: Vec<&Ident> = edges.iter().map(|(a, _)| *a).collect();
    let edge_to: Vec<&Ident> = edges.iter().map(|(_, b)| *b).collect();
    let edge_from_text: Vec<&LitStr> = edges.iter().filter_map(|(a, _)| text_of(a)).collect();
    let edge_to_text: Vec<&LitStr> = edges.iter().filter_map(|(_, b)| text_of(b)).collect();
    let can_become = if edges.is_empty() {
        quote!(false)
    } else {
        quote!(::core::matches!((self, to), #((Self::#edge_from, Self::#edge_to))|*))
    };
    let p = quote!(::idem::__private);

    quote! {
        #(#attrs)*
        #[derive(
            ::core::fmt::Debug,
            ::core::clone::Clone,
            ::core::marker::Copy,
            ::core::cmp::PartialEq,
            ::core::cmp::Eq,
            ::core::hash::Hash
        )]
        #vis enum #ident {
            #(#variants,)*
        }

        impl #ident {
            /// The state's text in the state column.
            pub const fn as_str(&self) -> &'static str {
                match self {
                    #(Self::#idents => #texts,)*
                }
            }

            /// The state whose column text is `text`.
            pub fn parse(text: &str) -> ::core::option::Option<Self> {
                match text {
                    #(#texts => ::core::option::Option::Some(Self::#idents),)*
                    _ => ::core::option::Option::None,
                }
            }

            /// Whether the machine allows `self -> to`.
            pub const fn can_become(&self, to: Self) -> bool {
                #can_become
            }

            #[doc(hidden)]
            pub const fn __idem_is_state(text: &str) -> bool {
                #p::const_str_in(text, &[#(#texts),*])
            }

            #[doc(hidden)]
            pub const fn __idem_allows(from: &str, to: &str) -> bool {
                #p::const_edge_in(from, to, &[#((#edge_from_text, #edge_to_text)),*])
            }
        }

        impl #p::StateMachine for #ident {
            const NAME: &'static str = #name;
            const STATES: &'static [Self] = &[#(Self::#idents),*];
            const EDGES: &'static [(Self, Self)] = &[#((Self::#edge_from, Self::#edge_to)),*];

            fn as_str(&self) -> &'static str {
                #ident::as_str(self)
            }
        }

        impl ::core::fmt::Display for #ident {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::core::str::FromStr for #ident {
            type Err = #p::Error;
            fn from_str(text: &str) -> ::core::result::Result<Self, #p::Error> {
                Self::parse(text).ok_or_else(|| #p::unknown_state(#name, text))
            }
        }

        impl #p::serde::Serialize for #ident {
            fn serialize<S: #p::serde::Serializer>(&self, s: S) -> ::core::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> #p::serde::Deserialize<'de> for #ident {
            fn deserialize<D: #p::serde::Deserializer<'de>>(d: D) -> ::core::result::Result<Self, D::Error> {
                let text = <::std::string::String as #p::serde::Deserialize>::deserialize(d)?;
                Self::parse(&text).ok_or_else(|| {
                    <D::Error as #p::serde::de::Error>::custom(#p::unknown_state(#name, &text))
                })
            }
        }
    }
}
