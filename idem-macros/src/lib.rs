//! Procedural macros of [idem](https://docs.rs/idem). Depend on `idem`, which re-exports them.

#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
#![forbid(unsafe_code)]

use proc_macro::TokenStream;

/// Makes an async function idempotent. See the `idem` crate for the documentation.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let _ = args;
    item
}
