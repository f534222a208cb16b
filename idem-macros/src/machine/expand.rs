//! The enum `state_machine!` declares, and its impls: texts, parsing, edges, `Display`,
//! `FromStr`, serde, and the const helpers `#[state_transition(machine = …)]` calls.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Ident, LitStr};

use super::ast::Machine;
use super::valid::Model;

pub(super) fn expand(m: &Machine, model: &Model<'_>) -> TokenStream {
    let p = model.krate.private();
    let declaration = declaration(m, model);
    let inherent = inherent(m, model, &p);
    let traits = traits(m, model, &p);
    quote! {
        #declaration
        #inherent
        #traits
    }
}

/// The enum itself, with the derives every state machine has.
fn declaration(m: &Machine, model: &Model<'_>) -> TokenStream {
    let Machine { vis, ident, .. } = m;
    let attrs = &model.attrs;
    let variants = model.states.iter().map(|s| {
        let (a, i) = (&s.attrs, &s.ident);
        quote!(#(#a)* #i)
    });
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
    }
}

/// The column texts of each edge's ends.
fn edge_texts<'a>(m: &'a Machine, model: &Model<'_>) -> (Vec<&'a LitStr>, Vec<&'a LitStr>) {
    let text_of = |id: &Ident| m.states.iter().find(|s| s.ident == *id).map(|s| &s.text);
    let from = model.edges.iter().filter_map(|(a, _)| text_of(a)).collect();
    let to = model.edges.iter().filter_map(|(_, b)| text_of(b)).collect();
    (from, to)
}

fn inherent(m: &Machine, model: &Model<'_>, p: &TokenStream) -> TokenStream {
    let ident = &m.ident;
    let idents: Vec<&Ident> = model.states.iter().map(|s| &s.ident).collect();
    let texts: Vec<&LitStr> = model.states.iter().map(|s| &s.text).collect();
    let edge_from: Vec<&Ident> = model.edges.iter().map(|(a, _)| *a).collect();
    let edge_to: Vec<&Ident> = model.edges.iter().map(|(_, b)| *b).collect();
    let (edge_from_text, edge_to_text) = edge_texts(m, model);
    let can_become = if model.edges.is_empty() {
        quote!(false)
    } else {
        quote!(::core::matches!((self, to), #((Self::#edge_from, Self::#edge_to))|*))
    };
    quote! {
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

        }

        impl #p::MachineTexts for #ident {
            const MACHINE: #p::MachineText = #p::MachineText {
                states: &[#(#texts),*],
                edges: &[#((#edge_from_text, #edge_to_text)),*],
            };
        }
    }
}

fn traits(m: &Machine, model: &Model<'_>, p: &TokenStream) -> TokenStream {
    let ident = &m.ident;
    let name = ident.to_string();
    let idents: Vec<&Ident> = model.states.iter().map(|s| &s.ident).collect();
    let edge_from = model.edges.iter().map(|(a, _)| *a);
    let edge_to = model.edges.iter().map(|(_, b)| *b);
    quote! {
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
