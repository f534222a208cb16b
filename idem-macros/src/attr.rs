//! `name = value` arguments, parsed the same way by every macro: one place that catches unknown
//! and duplicate names, keeps their spans, names the whole grammar in its errors, and knows
//! which names were written, so that a malformed argument is not also reported missing.

use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::parse::Parse;
use syn::{Ident, LitStr};

use crate::ctxt::Ctxt;

/// The arguments one macro accepts, each with an example value for its errors.
pub(crate) struct Grammar {
    /// How the user wrote the macro: `#[idempotent]`, `scope!`.
    pub(crate) site: &'static str,
    pub(crate) args: &'static [(&'static str, &'static str)],
}

impl Grammar {
    fn unknown(&self, name: &str) -> String {
        let list = self
            .args
            .iter()
            .map(|(n, _)| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "unknown argument `{name}` in {}: expected one of {list}",
            self.site
        )
    }

    /// The argument's grammar entry if it is known and new; otherwise records why not and
    /// skips its value so that parsing goes on.
    fn check(
        &self,
        meta: &ParseNestedMeta<'_>,
        seen: &mut Vec<&'static str>,
        cx: &mut Ctxt,
    ) -> syn::Result<Option<(&'static str, &'static str)>> {
        let span = path_span(&meta.path);
        let written = meta.path.get_ident().map(ToString::to_string);
        let known = written
            .as_deref()
            .and_then(|w| self.args.iter().find(|(n, _)| *n == w));
        let Some(&(name, example)) = known else {
            let shown =
                written.unwrap_or_else(|| quote::ToTokens::to_token_stream(&meta.path).to_string());
            cx.at(span, self.unknown(&shown));
            skip_value(meta)?;
            return Ok(None);
        };
        if seen.contains(&name) {
            cx.at(
                span,
                format_args!("duplicate argument `{name}` in {}: give it once", self.site),
            );
            skip_value(meta)?;
            return Ok(None);
        }
        seen.push(name);
        Ok(Some((name, example)))
    }
}

fn path_span(path: &syn::Path) -> Span {
    path.segments
        .first()
        .map(|s| s.ident.span())
        .unwrap_or_else(Span::call_site)
}

/// Skips `= value` or `(…)` after a rejected name.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<syn::Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        let _content;
        syn::parenthesized!(_content in meta.input);
    }
    Ok(())
}

/// The names that were written, valid or not.
#[derive(Default)]
pub(crate) struct Given {
    names: Vec<&'static str>,
    /// A syntax error stopped the reading: the arguments after it were not seen.
    unread: bool,
}

impl Given {
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.unread || self.names.contains(&name)
    }
}

/// One known argument, as the parser reaches it.
pub(crate) struct Arg<'a, 'b> {
    pub(crate) name: &'static str,
    example: &'static str,
    pub(crate) meta: &'a ParseNestedMeta<'b>,
}

impl Arg<'_, '_> {
    /// `= <T>`.
    pub(crate) fn value<T: Parse>(&self) -> syn::Result<T> {
        self.meta.value()?.parse()
    }

    /// `= "…"`. Anything else is reported (naming the argument) and skipped, so the remaining
    /// arguments are still read and checked.
    pub(crate) fn lit_str(&self, cx: &mut Ctxt) -> syn::Result<Option<LitStr>> {
        match ungroup(self.value::<syn::Expr>()?) {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Ok(Some(s)),
            other => {
                let (name, example) = (self.name, self.example);
                cx.spanned(
                    other,
                    format_args!("`{name}` takes a string literal, e.g. `{name} = {example}`"),
                );
                Ok(None)
            }
        }
    }

    /// `(a, b.c, d.0)`: a list of argument names, or field paths of them.
    pub(crate) fn paths(&self) -> syn::Result<Vec<FieldPath>> {
        let name = self.name;
        if !self.meta.input.peek(syn::token::Paren) {
            return Err(self.meta.error(format_args!(
                "`{name}` takes a list of argument names, e.g. `{name}(app, user)`"
            )));
        }
        let content;
        syn::parenthesized!(content in self.meta.input);
        let list = content.parse_terminated(FieldPath::parse, syn::Token![,])?;
        Ok(list.into_iter().collect())
    }
}

/// The expression inside the invisible group a `macro_rules!` fragment (`$path:literal`)
/// arrives in.
pub(crate) fn ungroup(expr: syn::Expr) -> syn::Expr {
    match expr {
        syn::Expr::Group(g) => ungroup(*g.expr),
        other => other,
    }
}

/// An argument, or a field of one: `req`, `req.cents`, `pair.0`.
pub(crate) struct FieldPath {
    pub(crate) root: Ident,
    pub(crate) fields: Vec<syn::Member>,
}

impl FieldPath {
    fn parse(input: syn::parse::ParseStream<'_>) -> syn::Result<Self> {
        let root = syn::ext::IdentExt::parse_any(input)?;
        let mut fields = Vec::new();
        while input.peek(syn::Token![.]) {
            input.parse::<syn::Token![.]>()?;
            fields.push(input.parse()?);
        }
        Ok(FieldPath { root, fields })
    }
}

impl quote::ToTokens for FieldPath {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        let (root, fields) = (&self.root, &self.fields);
        tokens.extend(quote::quote!(#root #(.#fields)*));
    }
}

/// Reads `tokens` as `name = value, name(…), …`: `arm` parses each known argument's value.
pub(crate) fn parse(
    tokens: TokenStream,
    grammar: &Grammar,
    cx: &mut Ctxt,
    mut arm: impl FnMut(Arg<'_, '_>, &mut Ctxt) -> syn::Result<()>,
) -> Given {
    let mut given = Given::default();
    let mut seen = Vec::new();
    let parser = syn::meta::parser(|meta| {
        let Some((name, example)) = grammar.check(&meta, &mut seen, cx)? else {
            return Ok(());
        };
        given.names.push(name);
        arm(
            Arg {
                name,
                example,
                meta: &meta,
            },
            cx,
        )
    });
    if let Err(e) = syn::parse::Parser::parse2(parser, tokens) {
        // The arguments after a syntax error were not read: do not call them missing.
        cx.push(e);
        given.unread = true;
    }
    given
}
