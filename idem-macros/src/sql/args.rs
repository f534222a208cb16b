//! The arguments of the SQL macros, as written. One struct holds every argument any of them
//! takes; each macro's [`Grammar`] decides which it accepts, so a name another macro uses is
//! still an unknown argument here.

use proc_macro2::{Span, TokenStream};
use syn::{Expr, LitStr, Type};

use super::migrations::MigrationsArg;
use crate::attr::{self, Given, Grammar};
use crate::ctxt::Ctxt;

#[derive(Default)]
pub(crate) struct Args {
    pub(crate) table: Option<LitStr>,
    pub(crate) key: Option<LitStr>,
    pub(crate) set: Option<LitStr>,
    pub(crate) returning: Option<Type>,
    pub(crate) krate: Option<LitStr>,
    /// `#[state_transition]`
    pub(crate) state: Option<LitStr>,
    pub(crate) from: Option<Vec<LitStr>>,
    pub(crate) to: Option<LitStr>,
    pub(crate) guard: Option<LitStr>,
    pub(crate) owner: Option<LitStr>,
    pub(crate) machine: Option<syn::Path>,
    /// `#[versioned_update]`
    pub(crate) version: Option<LitStr>,
    /// `#[create_once]`
    pub(crate) unique: Option<LitStr>,
    /// Where the migrations are, or `false`.
    pub(crate) migrations: Option<MigrationsArg>,
    /// Names that were written, valid or not.
    pub(crate) given: Given,
}

impl Args {
    pub(crate) fn parse(tokens: TokenStream, grammar: &Grammar, cx: &mut Ctxt) -> Args {
        let mut args = Args::default();
        args.given = attr::parse(tokens, grammar, cx, |arg, cx| {
            let text = match arg.name {
                "table" => &mut args.table,
                "key" => &mut args.key,
                "set" => &mut args.set,
                "crate" => &mut args.krate,
                "state" => &mut args.state,
                "to" => &mut args.to,
                "guard" => &mut args.guard,
                "owner" => &mut args.owner,
                "version" => &mut args.version,
                "unique" => &mut args.unique,
                "from" => {
                    args.from = cx.ok(from_states(attr::ungroup(arg.value()?)));
                    return Ok(());
                }
                "returning" => {
                    args.returning = Some(arg.value()?);
                    return Ok(());
                }
                "machine" => {
                    args.machine = Some(arg.value()?);
                    return Ok(());
                }
                "migrations" => {
                    args.migrations = cx.ok(migrations(attr::ungroup(arg.value()?)));
                    return Ok(());
                }
                _ => return Ok(()),
            };
            *text = arg.lit_str(cx)?;
            Ok(())
        });
        args
    }
}

impl Args {
    /// Whether the argument `name` was given with a usable value.
    pub(crate) fn has(&self, name: &str) -> bool {
        match name {
            "table" => self.table.is_some(),
            "key" => self.key.is_some(),
            "set" => self.set.is_some(),
            "returning" => self.returning.is_some(),
            "from" => self.from.is_some(),
            "to" => self.to.is_some(),
            "unique" => self.unique.is_some(),
            _ => true,
        }
    }
}

/// `"path"` or `false`.
fn migrations(expr: Expr) -> syn::Result<MigrationsArg> {
    match expr {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) => Ok(MigrationsArg::Path(s)),
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Bool(b),
            ..
        }) if !b.value => Ok(MigrationsArg::Off),
        other => Err(syn::Error::new_spanned(
            other,
            "`migrations` takes the path of the migrations (a directory, or one `.sql` schema file) relative to this file, e.g. `migrations = \"../migrations\"`, or `false` to check nothing against them",
        )),
    }
}

/// `"PENDING"` or `["PENDING", "PAID"]`.
fn from_states(expr: Expr) -> syn::Result<Vec<LitStr>> {
    let lit = |e: &Expr| match attr::ungroup(e.clone()) {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) => Ok(s),
        other => Err(syn::Error::new_spanned(
            other,
            "`from` takes a state name or a list of them: `from = \"PENDING\"` or `from = [\"PENDING\", \"PAID\"]`",
        )),
    };
    match &expr {
        Expr::Array(a) if a.elems.is_empty() => Err(syn::Error::new_spanned(
            a,
            "`from = []` lists no state, so the transition could never apply: name the states it starts from, e.g. `from = \"PENDING\"` or `from = [\"PENDING\", \"PAID\"]`",
        )),
        Expr::Array(a) => a.elems.iter().map(lit).collect(),
        other => Ok(vec![lit(other)?]),
    }
}

/// The arguments a macro requires, each with an example, and how to say one is missing.
pub(crate) struct Required {
    pub(crate) args: &'static [(&'static str, &'static str)],
    pub(crate) missing: fn(&str, &str) -> String,
}

impl Required {
    /// Reports each required argument that is neither present nor written (a malformed one was
    /// reported already).
    pub(crate) fn check(&self, args: &Args, cx: &mut Ctxt) {
        for (name, example) in self.args {
            if !args.has(name) && !args.given.contains(name) {
                cx.at(Span::call_site(), (self.missing)(name, example));
            }
        }
    }
}
