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
    // What is valid is declared even next to errors, so that code using the enum still
    // compiles and the errors are only the macro's own.
    let declared = expand::expand(&machine, &model);
    match cx.finish(Some(()), "state_machine!") {
        Ok(()) => declared,
        Err(e) => {
            let e = e.to_compile_error();
            quote::quote!(#declared #e)
        }
    }
}
