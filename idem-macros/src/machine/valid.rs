//! The checks of `state_machine!`: distinct states and texts, edges between declared states.

use syn::Ident;

use super::ast::Machine;
use crate::attr::{self, Grammar};
use crate::ctxt::Ctxt;
use crate::krate::{Krate, Site};

const OPTIONS: Grammar = Grammar {
    site: "#[idem(…)] of state_machine!",
    args: &[("crate", "\"::idem\"")],
};

pub(super) struct Model<'a> {
    pub(super) krate: Krate,
    /// Every edge once, in declaration order.
    pub(super) edges: Vec<(&'a Ident, &'a Ident)>,
}

pub(super) fn validate<'a>(m: &'a Machine, cx: &mut Ctxt) -> Option<Model<'a>> {
    let krate = options(m, cx);
    states(m, cx);
    let edges = edges(m, cx);
    Some(Model { krate, edges })
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

fn states(m: &Machine, cx: &mut Ctxt) {
    for (i, s) in m.states.iter().enumerate() {
        let earlier = &m.states[..i];
        if earlier.iter().any(|o| o.ident == s.ident) {
            cx.at(
                s.ident.span(),
                format_args!("state `{}` is declared twice", s.ident),
            );
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
}

fn edges<'a>(m: &'a Machine, cx: &mut Ctxt) -> Vec<(&'a Ident, &'a Ident)> {
    let mut edges: Vec<(&Ident, &Ident)> = Vec::new();
    for chain in &m.chains {
        for id in chain {
            if !m.states.iter().any(|s| s.ident == *id) {
                cx.at(
                    id.span(),
                    format_args!("`{id}` is not a state of `{}`", m.ident),
                );
            }
        }
        for pair in chain.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
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
