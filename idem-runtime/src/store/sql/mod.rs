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

    /// One claim as `Engine::begin` scores it: a read first while reads are on (which answers
    /// a found record), then the insert; whether it read first.
    fn claim(rf: &ReadFirst, found: bool) -> bool {
        let read = rf.now();
        if read {
            if found {
                rf.answered();
                return true;
            }
            rf.missed();
        }
        if found {
            rf.answered()
        } else {
            rf.missed()
        }
        read
    }

    /// Of `n` claims of which every `every`-th finds its record, how many read first.
    fn reads(rf: &ReadFirst, n: usize, every: usize) -> usize {
        (1..=n).filter(|i| claim(rf, i % every == 0)).count()
    }

    #[test]
    fn reading_first_follows_the_share_of_claims_that_find_their_record() {
        let rf = ReadFirst::adaptive();
        assert!(!rf.now(), "a new store inserts first");
        assert_eq!(reads(&rf, 100, usize::MAX), 0, "new keys never read first");
        rf.answered();
        assert!(rf.now(), "one record found turns reads on");
        for _ in 0..ReadFirst::FOUND {
            rf.missed();
        }
        assert!(!rf.now(), "as many new keys turn them off again");
        // Retries common (one in four, one in two, all): nearly every claim reads first.
        for every in [4, 2, 1] {
            let rf = ReadFirst::adaptive();
            let n = reads(&rf, 400, every);
            assert!(n >= 390, "one in {every}: {n} of 400 read first");
        }
        // Retries rare (one in twenty, one in a hundred): few reads.
        for every in [20, 100] {
            let rf = ReadFirst::adaptive();
            let n = reads(&rf, 400, every);
            assert!(n <= 400 / 4, "one in {every}: {n} of 400 read first");
        }
        // The score is capped: a long run of replays is undone by a bounded run of new keys.
        let rf = ReadFirst::adaptive();
        assert_eq!(reads(&rf, 1_000, 1), 999);
        assert!(reads(&rf, 1_000, usize::MAX) <= ReadFirst::CAP as usize);
        assert!(!rf.now());
        for (on, rf) in [
            (true, ReadFirst::always(true)),
            (false, ReadFirst::always(false)),
        ] {
            assert_eq!(reads(&rf, 100, 3), if on { 100 } else { 0 });
            assert_eq!(reads(&rf, 100, usize::MAX), if on { 100 } else { 0 });
        }
    }

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
