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

/// The spans of the first and last tokens of `tokens`: generated code that starts with one and
/// ends with the other is reported over all of them (`self.idem`, `std::io::Result<u64>`), not
/// only under their first token.
pub(crate) fn ends(tokens: &impl quote::ToTokens) -> (Span, Span) {
    let mut all = tokens.to_token_stream().into_iter();
    let first = all.next().map_or_else(Span::call_site, |t| t.span());
    let last = all.last().map_or(first, |t| t.span());
    (first, last)
}

/// `tokens` in parentheses that end where `last` is.
pub(crate) fn parens_at(tokens: TokenStream, last: Span) -> Group {
    let mut group = Group::new(proc_macro2::Delimiter::Parenthesis, tokens);
    group.set_span(last);
    group
}
