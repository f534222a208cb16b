//! The names a function's parameters bind: what scope placeholders and the fingerprint can
//! refer to.

use syn::punctuated::Punctuated;
use syn::visit::Visit;
use syn::{Expr, FnArg, Ident, ItemFn, Pat, Signature, Token};

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

/// The first use of `name` as a value in the function's body (`tx`, `&mut **tx`, `tx.commit()`;
/// not a field, a method or a longer path), when nothing in the function binds it: no
/// parameter, `let`, closure parameter or pattern. A macro whose arguments are not expressions
/// of a known standard macro, and that mentions the name, may bind it: then `None`, and the
/// compiler has the last word.
pub(crate) fn unbound_use(func: &ItemFn, name: &str) -> Option<Ident> {
    let mut finder = Uses {
        name,
        first: None,
        bound: false,
    };
    for arg in &func.sig.inputs {
        if let FnArg::Typed(t) = arg {
            finder.visit_pat(&t.pat);
        }
    }
    finder.visit_block(&func.block);
    finder.first.filter(|_| !finder.bound)
}

struct Uses<'a> {
    name: &'a str,
    first: Option<Ident>,
    /// Bound somewhere, or possibly bound inside a macro.
    bound: bool,
}

impl<'ast> Visit<'ast> for Uses<'_> {
    fn visit_pat_ident(&mut self, p: &'ast syn::PatIdent) {
        self.bound |= p.ident == self.name;
        syn::visit::visit_pat_ident(self, p);
    }

    fn visit_expr_path(&mut self, e: &'ast syn::ExprPath) {
        if e.qself.is_none()
            && let Some(ident) = e.path.get_ident()
            && ident == self.name
        {
            self.first.get_or_insert_with(|| ident.clone());
        }
    }

    // A nested function or impl is a scope of its own: its names are not the body's.
    fn visit_item(&mut self, _: &'ast syn::Item) {}

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        /// Macros of the standard library whose arguments are expressions.
        const EXPRESSIONS: &[&str] = &[
            "format",
            "print",
            "println",
            "eprint",
            "eprintln",
            "write",
            "writeln",
            "panic",
            "assert",
            "assert_eq",
            "assert_ne",
            "debug_assert",
            "debug_assert_eq",
            "debug_assert_ne",
            "vec",
            "dbg",
            "todo",
            "unimplemented",
            "unreachable",
        ];
        let known = m
            .path
            .segments
            .last()
            .is_some_and(|s| EXPRESSIONS.iter().any(|n| s.ident == n));
        let args = m.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated);
        match args {
            Ok(args) if known => {
                for arg in &args {
                    match arg {
                        // `name = value`: a named argument of a format string.
                        Expr::Assign(a) if matches!(&*a.left, Expr::Path(p) if p.path.get_ident().is_some()) =>
                        {
                            self.visit_expr(&a.right);
                        }
                        other => self.visit_expr(other),
                    }
                }
            }
            _ => self.bound |= mentions(m.tokens.clone(), self.name),
        }
    }
}

/// Whether a token stream holds the identifier `name`, at any depth.
fn mentions(tokens: proc_macro2::TokenStream, name: &str) -> bool {
    tokens.into_iter().any(|t| match t {
        proc_macro2::TokenTree::Ident(i) => i == name,
        proc_macro2::TokenTree::Group(g) => mentions(g.stream(), name),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    use super::unbound_use;

    fn used(f: syn::ItemFn, name: &str) -> Option<String> {
        unbound_use(&f, name).map(|i| i.to_string())
    }

    #[test]
    fn a_name_used_and_bound_nowhere_is_found() {
        let f = parse_quote!(
            async fn f() {
                q.execute(&mut **tx).await;
            }
        );
        assert_eq!(used(f, "tx").as_deref(), Some("tx"));
        let f = parse_quote!(
            async fn f() {
                println!("{}", claim.attempt());
            }
        );
        assert_eq!(used(f, "claim").as_deref(), Some("claim"));
        let f = parse_quote!(
            async fn f() {
                let x = S { tx };
            }
        );
        assert_eq!(used(f, "tx").as_deref(), Some("tx"));
    }

    #[test]
    fn a_name_the_user_binds_is_theirs() {
        for f in [
            parse_quote!(
                async fn f(tx: u32) {
                    tx;
                }
            ),
            parse_quote!(
                async fn f() {
                    let tx = 1;
                    tx;
                }
            ),
            parse_quote!(
                async fn f() {
                    let g = |tx: u32| tx;
                }
            ),
            parse_quote!(
                async fn f(c: Option<u32>) {
                    if let Some(tx) = c {
                        tx;
                    }
                }
            ),
            parse_quote!(
                async fn f(S { tx }: S) {
                    tx;
                }
            ),
            parse_quote!(
                async fn f() {
                    for tx in xs {
                        tx;
                    }
                }
            ),
            // A macro that is not a known expression macro may bind it.
            parse_quote!(
                async fn f() {
                    my_macro!(tx => 1);
                    tx;
                }
            ),
        ] {
            let f: syn::ItemFn = f;
            assert_eq!(unbound_use(&f, "tx"), None, "{}", quote::quote!(#f));
        }
    }

    #[test]
    fn fields_methods_paths_and_nested_items_are_not_uses() {
        for f in [
            parse_quote!(
                async fn f() {
                    a.tx;
                    a.tx();
                    m::tx();
                }
            ),
            parse_quote!(
                async fn f() {
                    fn g(tx: u32) -> u32 {
                        tx
                    }
                }
            ),
            parse_quote!(
                async fn f() {
                    println!("{x}", x = 1);
                    let s = format!("{tx}", tx = 2);
                }
            ),
        ] {
            let f: syn::ItemFn = f;
            assert_eq!(unbound_use(&f, "tx"), None, "{}", quote::quote!(#f));
        }
    }
}
