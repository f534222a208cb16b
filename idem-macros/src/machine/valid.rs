//! The checks of `state_machine!`: distinct states and texts, edges between declared states.

use syn::punctuated::Punctuated;
use syn::{Attribute, Ident, Token};

use super::ast::{Machine, State};
use crate::attr::{self, Grammar};
use crate::ctxt::Ctxt;
use crate::krate::{Krate, Site};

const OPTIONS: Grammar = Grammar {
    site: "#[idem(…)] of state_machine!",
    args: &[("crate", "\"::idem\"")],
};

/// What the expansion declares: everything that is valid, so that the enum and its impls are
/// emitted with the errors and the code that uses them still compiles.
pub(super) struct Model<'a> {
    pub(super) krate: Krate,
    /// The enum's attributes, without derives the macro provides itself.
    pub(super) attrs: Vec<Attribute>,
    /// Every state once, in declaration order.
    pub(super) states: Vec<&'a State>,
    /// Every edge between declared states once, in declaration order.
    pub(super) edges: Vec<(&'a Ident, &'a Ident)>,
}

pub(super) fn validate<'a>(m: &'a Machine, cx: &mut Ctxt) -> Model<'a> {
    let krate = options(m, cx);
    let attrs = m.attrs.iter().filter_map(|a| derives(a, m, cx)).collect();
    let states = states(m, cx);
    let edges = edges(m, cx);
    Model {
        krate,
        attrs,
        states,
        edges,
    }
}

/// What the macro implements itself: derived, or (serde) written out as the column text.
const PROVIDED: &[(&str, &str)] = &[
    ("Debug", "derives"),
    ("Clone", "derives"),
    ("Copy", "derives"),
    ("PartialEq", "derives"),
    ("Eq", "derives"),
    ("Hash", "derives"),
    ("Serialize", "implements"),
    ("Deserialize", "implements"),
];

/// The attribute, without what the macro provides: each such derive is an error on its path.
fn derives(attr: &Attribute, m: &Machine, cx: &mut Ctxt) -> Option<Attribute> {
    if !attr.path().is_ident("derive") {
        return Some(attr.clone());
    }
    let parser = Punctuated::<syn::Path, Token![,]>::parse_terminated;
    let Ok(paths) = attr.parse_args_with(parser) else {
        return Some(attr.clone());
    };
    let mut kept = Vec::new();
    for path in paths {
        let name = path.segments.last().map(|s| s.ident.to_string());
        match PROVIDED.iter().find(|(n, _)| Some(*n) == name.as_deref()) {
            Some((name, how)) => cx.spanned(
                &path,
                format_args!(
                    "state_machine! already {how} `{name}` for `{}`: remove it from this list",
                    m.ident
                ),
            ),
            None => kept.push(path),
        }
    }
    if kept.is_empty() {
        return None;
    }
    let mut attr = attr.clone();
    attr.meta = syn::parse_quote!(derive(#(#kept),*));
    Some(attr)
}

/// `#[idem(crate = "…")]`.
fn options(m: &Machine, cx: &mut Ctxt) -> Krate {
    let mut krate = None;
    for option in &m.options {
        let tokens = match &option.meta {
            syn::Meta::List(list) => list.tokens.clone(),
            other => {
                cx.spanned(
                    other,
                    "write the options of state_machine! as `#[idem(crate = \"…\")]`",
                );
                continue;
            }
        };
        attr::parse(tokens, &OPTIONS, cx, |arg, cx| {
            krate = arg.lit_str(cx)?;
            Ok(())
        });
    }
    Krate::new(krate.as_ref(), Site::Machine, cx)
}

fn states<'a>(m: &'a Machine, cx: &mut Ctxt) -> Vec<&'a State> {
    let mut unique = Vec::new();
    for (i, s) in m.states.iter().enumerate() {
        let earlier = &m.states[..i];
        if earlier.iter().any(|o| o.ident == s.ident) {
            cx.at(
                s.ident.span(),
                format_args!("state `{}` is declared twice", s.ident),
            );
        } else {
            unique.push(s);
        }
        if earlier.iter().any(|o| o.text.value() == s.text.value()) {
            cx.at(
                s.text.span(),
                format_args!("column text \"{}\" is used by two states", s.text.value()),
            );
        }
        if s.text.value().is_empty() {
            cx.at(s.text.span(), "a state's column text cannot be empty");
        }
    }
    if m.states.is_empty() {
        cx.at(m.ident.span(), "a state machine needs at least one state");
    }
    unique
}

fn edges<'a>(m: &'a Machine, cx: &mut Ctxt) -> Vec<(&'a Ident, &'a Ident)> {
    let mut edges: Vec<(&Ident, &Ident)> = Vec::new();
    for chain in &m.chains {
        let known = |id: &Ident| m.states.iter().any(|s| s.ident == *id);
        for id in chain.iter().filter(|id| !known(id)) {
            cx.at(
                id.span(),
                format_args!("`{id}` is not a state of `{}`", m.ident),
            );
        }
        for pair in chain.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if !known(a) || !known(b) {
                continue;
            }
            if a == b {
                cx.at(
                    b.span(),
                    format_args!("`{a} -> {b}` goes nowhere: an edge must change the state"),
                );
            } else if edges.iter().any(|(x, y)| *x == a && *y == b) {
                cx.at(
                    b.span(),
                    format_args!("edge `{a} -> {b}` is declared twice"),
                );
            } else {
                edges.push((a, b));
            }
        }
    }
    edges
}
