//! The SQL stores, written once: the statements, the row mapping, and the engine that runs them.
//! [`Dialect`] holds the only differences between the databases — the clock expression, column
//! types, how a table name may be qualified, the first-claim statement and the purge — and each
//! store (`postgres`, `sqlite`) adds only how it pools its connections.
//!
//! Every write after a claim is conditional on the record being exactly as its owner, or the
//! reader deciding a take-over, saw it: `fence` for the fenced writes, and `(fence, state, lease)`
//! for a take-over, so that what to do is decided in one place, `lifecycle::decide`, and the
//! statement only checks that nothing changed in between.

mod builder;
pub(crate) mod ddl;
mod dialect;
mod engine;
mod errors;
mod ident;
#[cfg(feature = "sql-groups")]
mod lanes;
mod statements;
#[cfg(feature = "sql-waits")]
pub(crate) mod waits;

pub(crate) use self::builder::*;
pub use self::builder::{SqlKind, SqlStoreBuilder, ping_when_idle};
pub(crate) use self::dialect::*;
pub(crate) use self::engine::*;
pub(crate) use self::errors::*;
pub(crate) use self::ident::*;
#[cfg(feature = "sql-groups")]
pub use self::lanes::GroupCommitStats;
#[cfg(feature = "sql-groups")]
pub(crate) use self::lanes::{InFlight, InFlightCount, LaneSender};
pub(crate) use self::statements::*;
#[cfg(feature = "sql-waits")]
pub(crate) use self::waits::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert_eq!(
            quote_table("idem_records", true).unwrap(),
            "\"idem_records\""
        );
        assert_eq!(quote_table("app.idem", true).unwrap(), "\"app\".\"idem\"");
        assert!(quote_table("app.idem", false).is_err());
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "idem\"; DROP TABLE orders; --",
            "a.b.c",
            "a.",
            &"x".repeat(64),
        ] {
            assert!(quote_table(bad, true).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn transient_codes() {
        assert!(is_transient_code("08006"));
        assert!(is_transient_code("57P01"));
        assert!(is_transient_code("5"));
        assert!(is_transient_code("517"));
        assert!(!is_transient_code("23505"));
        assert!(!is_transient_code("42P01"));
        assert!(!is_transient_code("19"));
    }

    #[test]
    fn stored_statuses_are_read_exactly() {
        assert_eq!(
            stored_response(Some(201), false, Some(vec![]))
                .unwrap()
                .status,
            Some(201)
        );
        assert!(stored_response(Some(-1), false, Some(vec![])).is_err());
        assert!(stored_response(Some(70_000), false, Some(vec![])).is_err());
        assert!(stored_response(Some(201), false, None).is_err());
    }
}
