//! What the generated functions share: numbered parameters, the checks of the user's types
//! (each spanned on the tokens it is about), and the shell every statement runs in (one
//! connection, a bounded retry when the row changes between two statements).

use std::collections::BTreeMap;

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::Ident;
use syn::spanned::Spanned;

use super::decl::Decl;
use super::target::Target;

/// `$1`, `$2`, … in the order values are bound.
#[derive(Default)]
pub(crate) struct Params(usize);

impl Params {
    pub(crate) fn next(&mut self) -> String {
        self.0 += 1;
        format!("${}", self.0)
    }

    /// `"col" = $n` for each column, in order.
    pub(crate) fn equal<'a>(
        &mut self,
        columns: impl IntoIterator<Item = &'a super::SqlIdent>,
    ) -> Vec<String> {
        self.equal_cast(columns, &BTreeMap::new())
    }

    /// The next parameter, cast to the type named for `column` in `casts` (a PostgreSQL enum
    /// type, which text is not compared with or assigned to without one).
    pub(crate) fn next_cast(&mut self, column: &str, casts: &BTreeMap<String, String>) -> String {
        let n = self.next();
        match casts.get(column) {
            Some(t) => format!("CAST({n} AS {t})"),
            None => n,
        }
    }

    /// `"col" = $n` for each column, in order, with `next_cast`.
    pub(crate) fn equal_cast<'a>(
        &mut self,
        columns: impl IntoIterator<Item = &'a super::SqlIdent>,
        casts: &BTreeMap<String, String>,
    ) -> Vec<String> {
        columns
            .into_iter()
            .map(|c| format!("{} = {}", c.quoted, self.next_cast(&c.name, casts)))
            .collect()
    }
}

/// The pieces of a generated function's body.
pub(crate) struct Body<'a> {
    pub(crate) target: &'a Target,
    /// Checks of the macro's own, after those of the executor and the arguments.
    pub(crate) checks: TokenStream,
    /// Arguments the macro checks itself instead of as plain column values.
    pub(crate) unbound: Vec<Ident>,
    /// Before the connection is acquired.
    pub(crate) prelude: TokenStream,
    /// After it is acquired, before the first attempt.
    pub(crate) setup: TokenStream,
    /// One attempt: returns when it can tell the outcome, falls through to try again.
    pub(crate) attempt: TokenStream,
}

impl<'a> Body<'a> {
    /// A body that runs `attempt` on the connection of `target`'s executor.
    pub(crate) fn new(target: &'a Target, attempt: TokenStream) -> Body<'a> {
        Body {
            target,
            checks: TokenStream::new(),
            unbound: Vec::new(),
            prelude: TokenStream::new(),
            setup: TokenStream::new(),
            attempt,
        }
    }
}

/// The declaration with its body. The statements run in an inner block whose errors are
/// `idem::Error`, converted once at the end by the checked conversion. Generated locals are
/// hygienic: an argument named `conn` or `row` cannot collide with them.
pub(crate) fn function(decl: Decl, body: Body<'_>) -> TokenStream {
    let Decl { attrs, vis, sig } = decl;
    let t = body.target;
    let p = t.krate.private();
    let checks = checks(&body);
    let Body {
        checks: own_checks,
        prelude,
        setup,
        attempt,
        ..
    } = body;
    let table = &t.table.name;
    quote_spanned! {Span::mixed_site()=>
        #(#attrs)*
        #vis #sig {
            #checks
            #own_checks
            #prelude
            let __idem_out: ::core::result::Result<_, #p::Error> = async {
                let mut conn = #p::transition_acquire(__idem_exec).await.map_err(#p::sql_error)?;
                let conn = &mut *conn;
                #setup
                for _ in 0..3u8 {
                    #attempt
                }
                ::core::result::Result::Err(#p::contention(#table))
            }
            .await;
            __idem_out.map_err(__idem_into)
        }
    }
}

/// The error conversion (on the error type), the executor and its database (on the
/// executor's type), and each column argument (on its type). Each check hands the checked
/// value on: after a failed one it is an error type, and the same mistake is not reported
/// again by the statements that use it.
fn checks(body: &Body<'_>) -> TokenStream {
    let t = body.target;
    let at = |span: Span| t.krate.private_at(span);
    let into = match &t.ret.err {
        Some(e) => {
            let p = at(e.span());
            quote_spanned!(e.span()=> #p::into_error::<#e>())
        }
        None => {
            let p = at(t.ret.ty.span());
            quote_spanned!(t.ret.ty.span()=> #p::into_error())
        }
    };
    let exec = &t.executor.ident;
    let p = at(exec.span());
    let executor = quote_spanned!(exec.span()=> #p::executor(#exec));
    let binds = t
        .values
        .iter()
        .filter(|v| !body.unbound.contains(&v.ident))
        .map(|v| {
            let (ident, span) = (&v.ident, v.ident.span());
            let p = at(span);
            let db = Ident::new("__idem_db", Span::mixed_site());
            quote_spanned!(span=> let #ident = #p::bind(&#db, #ident);)
        });
    quote_spanned! {Span::mixed_site()=>
        let __idem_into = #into;
        let (__idem_exec, __idem_db) = #executor;
        #(#binds)*
    }
}

/// `let __idem_rows = rows(…)`: the row type carried by `row` (an expression of type
/// `PhantomData<R>`), checked to be readable from a row, on the tokens at `span` (the
/// `returning` type).
pub(crate) fn rows(target: &Target, row: TokenStream, span: Span) -> TokenStream {
    let p = target.krate.private_at(span);
    // Through a local, so that an unmet bound is reported on the call, not on the tokens the
    // row type was written with.
    let (db, marker) = (
        Ident::new("__idem_db", Span::mixed_site()),
        // Located on the user's tokens outright: a local of the macro's own would be shown on
        // the whole attribute.
        Ident::new("__idem_row", span),
    );
    let rows = quote_spanned!(span=> #p::rows(&#db, #marker));
    quote_spanned! {Span::mixed_site()=>
        let #marker = #row;
        let __idem_rows = #rows;
    }
}

/// The row type: the return type's where it writes one (checked to be `returning`'s, on it),
/// else `returning`.
pub(crate) fn row(t: &Target, written: Option<&syn::Type>, returning: &syn::Type) -> TokenStream {
    match written {
        Some(written) => {
            let p = t.krate.private_at(written.span());
            quote_spanned!(written.span()=> #p::same_row::<#written, #returning>())
        }
        None => quote!(::core::marker::PhantomData::<#returning>),
    }
}
