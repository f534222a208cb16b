//! The return type of a generated statement function: `Result<Outcome<…>, E>`, read from its
//! tokens where it is written that way, so that each part is checked where the user wrote it.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{ReturnType, Signature, Type};

use crate::ctxt::Ctxt;
use crate::types;

/// What a macro returns: `Transition`, `Versioned` or `Created`, and how to write it.
pub(crate) struct Outcome {
    pub(crate) name: &'static str,
    pub(crate) example: &'static str,
}

/// The return type, and what could be read of it.
pub(crate) struct Ret {
    pub(crate) ty: Type,
    /// The outcome's type arguments (`Transition<Order, OrderStatus>` gives both), when the
    /// return type is written `Result<Transition<…>, …>`; `None` behind an alias.
    pub(crate) args: Option<Vec<Type>>,
    /// Where the outcome type is written (the return type, behind an alias).
    pub(crate) outcome_span: Span,
    /// `E` of `Result<_, E>`, when written.
    pub(crate) err: Option<Type>,
}

pub(crate) fn check(sig: &Signature, attr: &str, outcome: &Outcome, cx: &mut Ctxt) -> Option<Ret> {
    let example = outcome.example;
    let ty = match &sig.output {
        ReturnType::Default => {
            cx.at(
                sig.paren_token.span.close(),
                format_args!("#[{attr}] returns what the statement did: add `-> {example}`"),
            );
            return None;
        }
        ReturnType::Type(_, ty) if types::obviously_not_result(ty) => {
            cx.at(
                ty.span(),
                format_args!(
                    "#[{attr}] returns `{example}`, not `{}`",
                    types::display(ty)
                ),
            );
            return None;
        }
        ReturnType::Type(_, ty) => (**ty).clone(),
    };
    let (ok, err) = match types::args_of(&ty, "Result").as_deref() {
        Some([ok, err]) => ((*ok).clone(), Some((*err).clone())),
        Some([ok]) => ((*ok).clone(), None),
        _ => {
            return Some(Ret {
                outcome_span: ty.span(),
                ty,
                args: None,
                err: None,
            });
        }
    };
    let Some(args) = types::args_of(&ok, outcome.name) else {
        cx.at(
            ok.span(),
            format_args!(
                "#[{attr}] returns `{example}`, not `Result<{}, …>`: `{}` says what the statement did",
                types::display(&ok),
                outcome.name
            ),
        );
        return None;
    };
    let args = args.into_iter().cloned().collect();
    let outcome_span = match &ok {
        Type::Path(p) => p.path.segments.last().map_or(ok.span(), |s| s.ident.span()),
        other => other.span(),
    };
    Some(Ret {
        ty,
        args: Some(args),
        outcome_span,
        err,
    })
}
