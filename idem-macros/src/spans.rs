//! Spans for generated code: where rustc reports a problem with it.

use proc_macro2::{Group, Span, TokenStream, TokenTree};

/// `tokens` with every span set to `span`. A runtime path re-spanned onto a user token makes an
/// unmet bound of the function it names show up there (under the return type, the store, an
/// argument), not on the attribute.
pub(crate) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|tt| match tt {
            TokenTree::Group(g) => {
                let mut group = Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                TokenTree::Group(group)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}
