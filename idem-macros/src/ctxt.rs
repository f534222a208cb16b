//! Error collection: every check records what is wrong and goes on, so that the user sees all of
//! the mistakes in one build, each on its own tokens.

use std::fmt::Display;

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote_spanned};

/// The errors of one expansion, combined in the order they were found, and its warnings.
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: Option<syn::Error>,
    warnings: Vec<(Span, String)>,
}

impl Ctxt {
    pub(crate) fn push(&mut self, e: syn::Error) {
        match &mut self.errors {
            Some(all) => all.combine(e),
            None => self.errors = Some(e),
        }
    }

    /// An error at `span`.
    pub(crate) fn at(&mut self, span: Span, msg: impl Display) {
        self.push(syn::Error::new(span, msg));
    }

    /// An error over `tokens`, from their first to their last token.
    pub(crate) fn spanned(&mut self, tokens: impl ToTokens, msg: impl Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }

    /// A warning at `span`: something that may be wrong, and cannot be known to be.
    pub(crate) fn warn(&mut self, span: Span, msg: impl Display) {
        self.warnings.push((span, msg.to_string()));
    }

    /// The warnings, as items that make the compiler say them: emitted whether the expansion
    /// succeeds or not.
    pub(crate) fn take_warnings(&mut self) -> TokenStream {
        std::mem::take(&mut self.warnings)
            .into_iter()
            .map(|(span, msg)| warning(span, &msg))
            .collect()
    }

    /// The value, or `None` with its error recorded.
    pub(crate) fn ok<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|e| self.push(e)).ok()
    }

    /// The checked model, or every error found. A model missing without an error recorded is
    /// reported on the attribute, never dropped silently.
    pub(crate) fn finish<T>(self, model: Option<T>, attr: &str) -> syn::Result<T> {
        match (self.errors, model) {
            (Some(e), _) => Err(e),
            (None, Some(model)) => Ok(model),
            (None, None) => Err(syn::Error::new(
                Span::call_site(),
                format_args!("invalid #[{attr}]"),
            )),
        }
    }
}

/// A warning on stable Rust: a deprecated constant used at `span`, whose note is the message.
/// The compiler says "use of deprecated constant `…::idem_schema_warning`: <message>".
fn warning(span: Span, msg: &str) -> TokenStream {
    let name = syn::Ident::new("idem_schema_warning", span);
    quote_spanned! {span=>
        const _: () = {
            #[deprecated(note = #msg)]
            #[allow(non_upper_case_globals)]
            const #name: () = ();
            #name
        };
    }
}
