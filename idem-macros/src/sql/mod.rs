//! What the SQL-generating macros (`#[state_transition]`, `#[versioned_update]`,
//! `#[create_once]`) share: the declaration they are on ([`decl`]), identifier checks
//! ([`ident`]), their arguments ([`args`]), the checks they start with ([`target`]), the
//! checks against the migrations ([`migrations`]),
//! argument-to-column matching ([`bind`]), and the shell of the generated function
//! ([`shell`]).
//!
//! [`expand`] runs each macro's steps: parse the arguments with its grammar, check them with
//! its `valid` module into a model, expand the model with its `expand` module.

pub(crate) mod args;
pub(crate) mod bind;
pub(crate) mod decl;
pub(crate) mod ident;
pub(crate) mod migrations;
pub(crate) mod mysql;
pub(crate) mod ret;
pub(crate) mod shell;
pub(crate) mod target;

use proc_macro2::TokenStream;

pub(crate) use args::{Args, Required};
pub(crate) use decl::Decl;
pub(crate) use ident::SqlIdent;
pub(crate) use migrations::Origin;
pub(crate) use target::Checked;

use crate::attr::Grammar;
use crate::ctxt::Ctxt;

/// One SQL macro: its grammar, its checks and its expansion.
pub(crate) struct Steps<M> {
    /// The attribute's name, as in `#[state_transition]`.
    pub(crate) attr: &'static str,
    pub(crate) grammar: Grammar,
    pub(crate) required: Required,
    pub(crate) outcome: ret::Outcome,
    pub(crate) validate: fn(Checked, &Decl, &mut Ctxt) -> Option<M>,
    pub(crate) expand: fn(M, Decl) -> TokenStream,
}

/// Parses the declaration and the arguments, checks them, and expands, or emits the
/// declaration unchanged with every error.
pub(crate) fn expand<M>(
    steps: &Steps<M>,
    origin: Origin,
    args: TokenStream,
    item: TokenStream,
) -> TokenStream {
    let decl = match Decl::parse(item, steps.attr) {
        Ok(d) => d,
        Err(e) => return e,
    };
    let mut cx = Ctxt::default();
    let args = Args::parse(args, &steps.grammar, &mut cx);
    let checked = target::check(steps, &origin, args, &decl, &mut cx);
    let model = (steps.validate)(checked, &decl, &mut cx);
    let warnings = cx.take_warnings();
    let out = match cx.finish(model, steps.attr) {
        Ok(model) => (steps.expand)(model, decl),
        Err(e) => decl.with_errors(e),
    };
    quote::quote!(#out #warnings)
}
