//! The names a function's parameters bind: what scope placeholders and the fingerprint can
//! refer to.

use syn::{FnArg, Ident, Pat, Signature};

/// One parameter of the function.
pub(crate) struct Param {
    /// The identifiers its pattern binds, in order (`Json(req)` binds `req`).
    pub(crate) idents: Vec<Ident>,
    /// `self`, `&self`, `&mut self`.
    pub(crate) is_receiver: bool,
    /// `#[cfg(…)]` and `#[cfg_attr(…)]` attributes to repeat on code that uses it.
    pub(crate) cfgs: Vec<syn::Attribute>,
    /// Marked `#[idem(skip)]`.
    pub(crate) skipped: bool,
}

pub(crate) fn params(sig: &Signature) -> Vec<Param> {
    sig.inputs
        .iter()
        .map(|arg| match arg {
            FnArg::Receiver(r) => Param {
                idents: vec![Ident::new("self", r.self_token.span)],
                is_receiver: true,
                cfgs: cfgs(&r.attrs),
                skipped: true,
            },
            FnArg::Typed(t) => {
                let mut idents = Vec::new();
                collect(&t.pat, &mut idents);
                Param {
                    idents,
                    is_receiver: false,
                    cfgs: cfgs(&t.attrs),
                    skipped: false,
                }
            }
        })
        .collect()
}

fn cfgs(attrs: &[syn::Attribute]) -> Vec<syn::Attribute> {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .cloned()
        .collect()
}

fn collect(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                collect(sub, out);
            }
        }
        Pat::Reference(p) => collect(&p.pat, out),
        Pat::Paren(p) => collect(&p.pat, out),
        Pat::Type(p) => collect(&p.pat, out),
        Pat::Tuple(p) => p.elems.iter().for_each(|e| collect(e, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| collect(e, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| collect(e, out)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| collect(&f.pat, out)),
        // Every alternative binds the same names.
        Pat::Or(p) => {
            if let Some(first) = p.cases.first() {
                collect(first, out);
            }
        }
        _ => {}
    }
}
