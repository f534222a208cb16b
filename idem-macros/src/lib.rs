//! Procedural macros of [idem](https://docs.rs/idem). Depend on `idem`, which re-exports them
//! with their documentation.

#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
#![forbid(unsafe_code)]

mod attr;
mod bindings;
mod duration;
mod idempotent;
mod template;

use proc_macro::TokenStream;

/// Makes an `async fn` idempotent.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    idempotent::expand(args.into(), item.into()).into()
}
