//! Shared parsing of `name = value` attribute arguments: one place that catches unknown and
//! duplicate names, keeps their spans, and names the whole grammar in its errors.

use std::collections::HashMap;

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;

/// Collects every error, so the user sees all of them at once.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    pub(crate) fn at(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Names accepted by one attribute, with the grammar quoted in "unknown argument" errors.
pub(crate) struct Grammar {
    pub(crate) attr: &'static str,
    pub(crate) names: &'static [&'static str],
    seen: HashMap<String, Span>,
}

impl Grammar {
    pub(crate) fn new(attr: &'static str, names: &'static [&'static str]) -> Grammar {
        Grammar {
            attr,
            names,
            seen: HashMap::new(),
        }
    }

    /// The argument's name if it is known and new; otherwise records why not and skips its
    /// value so that parsing goes on.
    pub(crate) fn check(
        &mut self,
        meta: &ParseNestedMeta<'_>,
        errors: &mut Errors,
    ) -> syn::Result<Option<String>> {
        let span = path_span(&meta.path);
        let Some(name) = meta.path.get_ident().map(ToString::to_string) else {
            errors.at(
                span,
                self.unknown(&quote::ToTokens::to_token_stream(&meta.path).to_string()),
            );
            skip_value(meta)?;
            return Ok(None);
        };
        if !self.names.contains(&name.as_str()) {
            errors.at(span, self.unknown(&name));
            skip_value(meta)?;
            return Ok(None);
        }
        if self.seen.insert(name.clone(), span).is_some() {
            errors.at(
                span,
                format_args!(
                    "duplicate argument `{name}` in #[{}]: give it once",
                    self.attr
                ),
            );
            skip_value(meta)?;
            return Ok(None);
        }
        Ok(Some(name))
    }

    fn unknown(&self, name: &str) -> String {
        let list = self
            .names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "unknown argument `{name}` in #[{}]: expected one of {list}",
            self.attr
        )
    }
}

fn path_span(path: &syn::Path) -> Span {
    path.segments
        .first()
        .map(|s| s.ident.span())
        .unwrap_or_else(Span::call_site)
}

/// Skips `= value` or `(…)` after a rejected name.
pub(crate) fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<syn::Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        let _content;
        syn::parenthesized!(_content in meta.input);
    }
    Ok(())
}

/// Parses `"…"` after `=`. Anything else is reported (naming the argument) and skipped, so the
/// remaining arguments are still read and checked.
pub(crate) fn lit_str(
    meta: &ParseNestedMeta<'_>,
    name: &str,
    example: &str,
    errors: &mut Errors,
) -> syn::Result<Option<syn::LitStr>> {
    let value = meta.value()?;
    let expr: syn::Expr = value.parse()?;
    match expr {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) => Ok(Some(s)),
        other => {
            errors.push(syn::Error::new_spanned(
                other,
                format_args!("`{name}` takes a string literal, e.g. `{name} = {example}`"),
            ));
            Ok(None)
        }
    }
}

/// Parses `(a, b, c)`: a list of identifiers.
pub(crate) fn ident_list(meta: &ParseNestedMeta<'_>, name: &str) -> syn::Result<Vec<syn::Ident>> {
    if !meta.input.peek(syn::token::Paren) {
        return Err(meta.error(format_args!(
            "`{name}` takes a list of argument names, e.g. `{name}(app, user)`"
        )));
    }
    let content;
    syn::parenthesized!(content in meta.input);
    let list = content.parse_terminated(syn::ext::IdentExt::parse_any, syn::Token![,])?;
    Ok(list.into_iter().collect())
}

/// The path to the idem crate: `::idem`, or the `crate = "…"` argument, checked.
pub(crate) fn krate(lit: Option<&syn::LitStr>, errors: &mut Errors) -> proc_macro2::TokenStream {
    match lit {
        None => quote::quote!(::idem),
        Some(l) => match l.parse::<syn::Path>() {
            Ok(p) => quote::ToTokens::into_token_stream(p),
            Err(_) => {
                errors.at(
                    l.span(),
                    format_args!(
                        "`crate` must be a path to the idem crate, such as \"::idem\" or \"my_app::deps::idem\", not \"{}\"",
                        l.value()
                    ),
                );
                quote::quote!(::idem)
            }
        },
    }
}
