//! Whether a claim reads the record before it writes: the SQL stores' readers, Redis's plain
//! `GET`. Chosen by the store as it goes, unless its builder fixed it.

use std::sync::atomic::{AtomicU32, Ordering};

/// Whether a claim reads the record before it writes. Reading first answers a replay without
/// the writer (one reader statement on the SQL stores, a `GET` on Redis) and costs a new key a
/// round trip more (the read that finds nothing, then the claim); claiming first is the
/// reverse. Unless the builder fixed it, the store reads first while recent claims found
/// their record often enough to pay for the reads: a score that a claim which found its
/// record raises by [`ReadFirst::FOUND`] and one that did not lowers by one, so reads stay on
/// while more than about one claim in `FOUND + 1` is answered by its read, and a run of new
/// keys turns them off within a few claims.
pub(crate) struct ReadFirst {
    always: Option<bool>,
    score: AtomicU32,
}

impl ReadFirst {
    pub(crate) const FOUND: u32 = 8;
    pub(crate) const CAP: u32 = 64;

    pub(crate) fn adaptive() -> ReadFirst {
        ReadFirst {
            always: None,
            score: AtomicU32::new(0),
        }
    }

    pub(crate) fn always(on: bool) -> ReadFirst {
        ReadFirst {
            always: Some(on),
            score: AtomicU32::new(0),
        }
    }

    /// Whether this claim should read first.
    pub(crate) fn now(&self) -> bool {
        self.always
            .unwrap_or_else(|| self.score.load(Ordering::Relaxed) > 0)
    }

    /// A claim found its record (on a reader, or under its insert).
    pub(crate) fn answered(&self) {
        if self.always.is_none() {
            let _ = self
                .score
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                    (s < Self::CAP).then(|| (s + Self::FOUND).min(Self::CAP))
                });
        }
    }

    /// A claim found no record to answer from.
    pub(crate) fn missed(&self) {
        if self.always.is_none() {
            let _ = self
                .score
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| s.checked_sub(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One claim as the stores score it (the SQL engine's `begin`, Redis's `run_begin`): a
    /// read first while reads are on (which answers a found record), then the write (an insert,
    /// the claim script), which finds the record or not; whether it read first.
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
}
