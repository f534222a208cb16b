//! Procedural macros of idem. Depend on [`idempotency`](https://docs.rs/idempotency) (library
//! `idem`), which re-exports them with their documentation.

#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
#![forbid(unsafe_code)]

mod attr;
mod bindings;
mod create_once;
mod ctxt;
mod duration;
mod idempotent;
mod krate;
mod machine;
mod quantity;
mod size;
// The catalog answers more than the macros ask of it yet.
mod scope;
mod spans;
mod sql;
mod template;
mod transition;
mod types;
mod versioned;

use proc_macro::TokenStream;

/// Makes an `async fn` idempotent.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    idempotent::expand(args.into(), item.into()).into()
}

/// Generates the guarded `UPDATE` of a state transition.
#[proc_macro_attribute]
pub fn state_transition(args: TokenStream, item: TokenStream) -> TokenStream {
    sql::expand(&transition::STEPS, origin(), args.into(), item.into()).into()
}

/// Generates an optimistic, versioned `UPDATE`.
#[proc_macro_attribute]
pub fn versioned_update(args: TokenStream, item: TokenStream) -> TokenStream {
    sql::expand(&versioned::STEPS, origin(), args.into(), item.into()).into()
}

/// Generates an insert that returns the existing row when a unique business number is taken.
#[proc_macro_attribute]
pub fn create_once(args: TokenStream, item: TokenStream) -> TokenStream {
    sql::expand(&create_once::STEPS, origin(), args.into(), item.into()).into()
}

/// Where the attribute being expanded is: the crate (for its migrations) and the file (for a
/// path written in the attribute, which is relative to it as for `include_str!`).
fn origin() -> sql::Origin {
    // The compiler names a file relative to its working directory (a workspace's root, not the
    // crate's): the macro runs in the compiler's process, so its working directory is the same.
    let file = proc_macro::Span::call_site()
        .local_file()
        .map(|f| match std::env::current_dir() {
            Ok(cwd) if f.is_relative() => cwd.join(f),
            _ => f,
        });
    sql::Origin {
        manifest_dir: std::env::var_os("CARGO_MANIFEST_DIR").map(Into::into),
        file,
    }
}

/// Declares a state machine: an enum of states with their column texts, and its edges.
#[proc_macro]
pub fn state_machine(input: TokenStream) -> TokenStream {
    machine::expand(input.into()).into()
}

/// Renders a scope template from the variables in scope.
#[proc_macro]
pub fn scope(input: TokenStream) -> TokenStream {
    scope::expand(input.into()).into()
}
