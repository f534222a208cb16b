//! What the generated functions share: numbered parameters, and the shell every statement runs
//! in (one connection, a bounded retry when the row changes between two statements).

use proc_macro2::{Span, TokenStream};
use quote::quote_spanned;
use syn::Ident;

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
        columns
            .into_iter()
            .map(|c| format!("{} = {}", c.quoted, self.next()))
            .collect()
    }
}

/// The pieces of a generated function's body.
pub(crate) struct Body {
    /// `<crate>::__private`.
    pub(crate) private: TokenStream,
    pub(crate) executor: Ident,
    /// The table, for the error when every attempt lost a race.
    pub(crate) table: String,
    /// Before the connection is acquired.
    pub(crate) prelude: TokenStream,
    /// After it is acquired, before the first attempt.
    pub(crate) setup: TokenStream,
    /// One attempt: returns when it can tell the outcome, falls through to try again.
    pub(crate) attempt: TokenStream,
}

impl Body {
    /// A body that runs `attempt` on the connection of `target`'s executor.
    pub(crate) fn new(target: &Target, attempt: TokenStream) -> Body {
        Body {
            private: target.krate.private(),
            executor: target.executor.clone(),
            table: target.table.name.clone(),
            prelude: TokenStream::new(),
            setup: TokenStream::new(),
            attempt,
        }
    }
}

/// The declaration with its body. Generated locals are hygienic: an argument named `conn` or
/// `row` cannot collide with them.
pub(crate) fn function(decl: Decl, body: Body) -> TokenStream {
    let Decl { attrs, vis, sig } = decl;
    let Body {
        private: p,
        executor,
        table,
        prelude,
        setup,
        attempt,
    } = body;
    quote_spanned! {Span::mixed_site()=>
        #(#attrs)*
        #vis #sig {
            #prelude
            let mut conn = #p::transition_acquire(#executor).await.map_err(#p::sql_error)?;
            let conn = &mut *conn;
            #setup
            for _ in 0..3u8 {
                #attempt
            }
            ::core::result::Result::Err(::core::convert::From::from(#p::contention(#table)))
        }
    }
}
