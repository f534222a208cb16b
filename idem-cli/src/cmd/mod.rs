//! One module per command group. A new group (`outbox`, `dead-letters`, `stats`) is a module
//! here with its `Args` or `Command` and a `run`, and one variant of `Command` in `main.rs`.

pub(crate) mod dead_letters;
pub(crate) mod outbox;
pub(crate) mod purge;
pub(crate) mod records;
pub(crate) mod schema;
pub(crate) mod stats;
