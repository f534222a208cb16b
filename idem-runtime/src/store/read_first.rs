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
