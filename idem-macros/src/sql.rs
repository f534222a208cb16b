//! What the SQL-generating macros share: identifier checks, column lists, body-less function
//! declarations, and argument-to-column matching.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{FnArg, Ident, LitStr, Pat, Signature};

/// A checked SQL identifier and its quoted form.
#[derive(Debug, Clone)]
pub(crate) struct SqlIdent {
    pub(crate) name: String,
    pub(crate) quoted: String,
}

fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Checks one identifier (or `schema.table` when `qualified`), reporting on `lit`.
pub(crate) fn ident(
    text: &str,
    lit: &LitStr,
    what: &str,
    qualified: bool,
) -> syn::Result<SqlIdent> {
    let text = text.trim();
    let parts: Vec<&str> = text.split('.').collect();
    let ok = parts.iter().all(|p| is_identifier(p))
        && (parts.len() == 1 || (qualified && parts.len() == 2));
    if !ok {
        let shape = if qualified {
            "letters, digits and `_` (not first), at most 63 bytes, optionally `schema.table`"
        } else {
            "letters, digits and `_` (not first), at most 63 bytes"
        };
        return Err(syn::Error::new(
            lit.span(),
            format_args!(
                "{what} `{text}` is not an SQL identifier: use {shape}. Names are spliced into the SQL text, so nothing else is accepted"
            ),
        ));
    }
    Ok(SqlIdent {
        name: text.to_owned(),
        quoted: parts
            .iter()
            .map(|p| format!("\"{p}\""))
            .collect::<Vec<_>>()
            .join("."),
    })
}

/// A comma-separated list of column names in one string literal.
pub(crate) fn columns(lit: &LitStr, what: &str) -> syn::Result<Vec<SqlIdent>> {
    let value = lit.value();
    let mut out: Vec<SqlIdent> = Vec::new();
    for part in value.split(',') {
        let col = ident(part, lit, what, false)?;
        if out.iter().any(|c| c.name == col.name) {
            return Err(syn::Error::new(
                lit.span(),
                format_args!("{what} `{}` is listed twice", col.name),
            ));
        }
        out.push(col);
    }
    Ok(out)
}

/// An `async fn` without a body (`;` or `{}`): the macro writes the body.
pub(crate) struct Decl {
    pub(crate) attrs: Vec<syn::Attribute>,
    pub(crate) vis: syn::Visibility,
    pub(crate) sig: Signature,
}

pub(crate) fn decl(item: TokenStream, attr: &str) -> Result<Decl, TokenStream> {
    if let Ok(f) = syn::parse2::<syn::ItemFn>(item.clone()) {
        if !f.block.stmts.is_empty() {
            let e = syn::Error::new_spanned(
                &f.block,
                format_args!(
                    "#[{attr}] writes this function's body: declare it with `;` or `{{}}`"
                ),
            )
            .to_compile_error();
            return Err(quote!(#e));
        }
        return Ok(Decl {
            attrs: f.attrs,
            vis: f.vis,
            sig: f.sig,
        });
    }
    match syn::parse2::<syn::ForeignItemFn>(item.clone()) {
        Ok(f) => Ok(Decl {
            attrs: f.attrs,
            vis: f.vis,
            sig: f.sig,
        }),
        Err(_) => {
            let e = syn::Error::new(
                Span::call_site(),
                format_args!("#[{attr}] applies to an `async fn` declaration, such as `async fn mark_paid(db: &PgPool, order_no: &str) -> Result<…, idem::Error>;`"),
            )
            .to_compile_error();
            Err(quote!(#item #e))
        }
    }
}

/// The function's arguments: the executor first, then plain `name: Type` arguments.
pub(crate) struct FnArgs {
    pub(crate) executor: Ident,
    pub(crate) values: Vec<Ident>,
}

pub(crate) fn fn_args(sig: &Signature, attr: &str) -> syn::Result<FnArgs> {
    let mut idents = Vec::new();
    for arg in &sig.inputs {
        match arg {
            FnArg::Receiver(r) => {
                return Err(syn::Error::new(
                    r.self_token.span,
                    format_args!(
                        "#[{attr}] generates a free function: take the executor as the first argument instead of `self`"
                    ),
                ));
            }
            FnArg::Typed(t) => match &*t.pat {
                Pat::Ident(p) if p.subpat.is_none() => idents.push(p.ident.clone()),
                other => {
                    return Err(syn::Error::new_spanned(
                        other,
                        format_args!(
                            "#[{attr}] arguments must be plain names: they name the columns they fill"
                        ),
                    ));
                }
            },
        }
    }
    let mut it = idents.into_iter();
    let Some(executor) = it.next() else {
        return Err(syn::Error::new(
            sig.paren_token.span.join(),
            format_args!(
                "#[{attr}] needs the executor as the first argument: a `&PgPool`, `&mut PgConnection`, `&mut Transaction<…>` (or their SQLite counterparts)"
            ),
        ));
    };
    Ok(FnArgs {
        executor,
        values: it.collect(),
    })
}

/// The argument named like `column`, or an error on `lit`.
pub(crate) fn arg_for<'a>(
    args: &'a FnArgs,
    column: &SqlIdent,
    lit: &LitStr,
    fn_name: &Ident,
) -> syn::Result<&'a Ident> {
    args.values
        .iter()
        .find(|a| *a == column.name.as_str())
        .ok_or_else(|| {
            syn::Error::new(
                lit.span(),
                format_args!(
                    "column `{}` takes its value from an argument of the same name, and `{fn_name}` has none: add `{}: …`",
                    column.name, column.name
                ),
            )
        })
}

/// `async` is required: the function runs statements.
pub(crate) fn require_async(sig: &Signature, attr: &str) -> syn::Result<()> {
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span,
            format_args!("#[{attr}] needs an `async fn`: it runs SQL statements"),
        ));
    }
    Ok(())
}
