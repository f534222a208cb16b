//! `state_machine!`: an enum of states mapped to their column texts, and its allowed edges,
//! declared once. `#[state_transition(machine = …)]` checks its `from → to` against it at
//! compile time.
//!
//! Parsed ([`ast`]), checked ([`valid`]), then expanded ([`expand`]) into the enum and its
//! impls. `#[idem(crate = "deps::idem")]` on the enum says where a re-exported idem is.

mod ast;
mod expand;
mod valid;

use proc_macro2::TokenStream;

use crate::ctxt::Ctxt;

pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let machine: ast::Machine = match syn::parse2(input) {
        Ok(m) => m,
        Err(e) => return e.to_compile_error(),
    };
    let mut cx = Ctxt::default();
    let model = valid::validate(&machine, &mut cx);
    match cx.finish(model, "state_machine!") {
        Ok(model) => expand::expand(&machine, &model),
        Err(e) => e.to_compile_error(),
    }
}
