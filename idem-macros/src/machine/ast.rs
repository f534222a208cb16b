//! `state_machine!`'s input as written: `enum Name { State = "TEXT", … }` then `A -> B -> C;`
//! chains of edges.

use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Attribute, Ident, LitStr, Token, Visibility, braced};

pub(super) struct State {
    pub(super) attrs: Vec<Attribute>,
    pub(super) ident: Ident,
    pub(super) text: LitStr,
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

pub(super) struct Machine {
    /// The enum's attributes, but for `#[idem(…)]`.
    pub(super) attrs: Vec<Attribute>,
    /// `#[idem(…)]`: the macro's own options.
    pub(super) options: Vec<Attribute>,
    pub(super) vis: Visibility,
    pub(super) ident: Ident,
    pub(super) states: Vec<State>,
    pub(super) chains: Vec<Vec<Ident>>,
}

impl Parse for Machine {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let (options, attrs) = input
            .call(Attribute::parse_outer)?
            .into_iter()
            .partition(|a| a.path().is_ident("idem"));
        let vis: Visibility = input.parse()?;
        let _: Token![enum] = input.parse()?;
        let ident: Ident = input.parse()?;
        let content;
        braced!(content in input);
        let states: Punctuated<State, Token![,]> =
            content.parse_terminated(State::parse, Token![,])?;
        let mut chains = Vec::new();
        while !input.is_empty() {
            chains.push(chain(input)?);
        }
        Ok(Machine {
            attrs,
            options,
            vis,
            ident,
            states: states.into_iter().collect(),
            chains,
        })
    }
}

/// `A -> B -> C;`
fn chain(input: ParseStream<'_>) -> syn::Result<Vec<Ident>> {
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
    Ok(chain)
}
