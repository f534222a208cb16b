//! What the person on call asks a store: which records it holds, one record in full, a safe
//! manual release of a stuck claim, and counts. The `idem` command-line tool and the admin view
//! are built on these operations ([`Operation::List`](super::Operation::List) and the ones after
//! it); the test kit checks them on every store, a store written elsewhere included.
//!
//! Times are read on the store's own clock, as leases are. A record's age is counted from its
//! first claim, whose fence is the store's clock in milliseconds at that moment (every claim
//! after it adds one), so every store answers it the same way.

use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::lifecycle::State;
use crate::record::StoredResponse;

/// Which records [`Operation::List`](super::Operation::List) returns: all filters hold at once.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordQuery {
    /// Only records in this state.
    pub state: Option<State>,
    /// Only records whose scope starts with this text.
    pub scope_prefix: Option<String>,
    /// Only records first claimed longer ago than this.
    pub older_than: Option<Duration>,
    /// At most this many records, oldest first (default 100).
    pub limit: usize,
}

impl Default for RecordQuery {
    fn default() -> Self {
        RecordQuery {
            state: None,
            scope_prefix: None,
            older_than: None,
            limit: 100,
        }
    }
}

impl RecordQuery {
    /// Every record, at most 100.
    pub fn new() -> Self {
        RecordQuery::default()
    }

    /// Only records in `state`.
    pub fn state(mut self, state: State) -> Self {
        self.state = Some(state);
        self
    }

    /// Only records whose scope starts with `prefix`.
    pub fn scope_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.scope_prefix = Some(prefix.into());
        self
    }

    /// Only records first claimed longer ago than `age`.
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// At most `limit` records.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Whether `record` passes every filter: what stores that cannot filter as they read use.
    pub fn matches(&self, record: &RecordInfo) -> bool {
        self.state.is_none_or(|s| s == record.state)
            && self
                .scope_prefix
                .as_deref()
                .is_none_or(|p| record.scope.starts_with(p))
            && self.older_than.is_none_or(|age| record.age > age)
    }
}

/// One record as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordInfo {
    /// The rendered scope.
    pub scope: String,
    /// The key.
    pub key: String,
    /// Its state. A record whose retention ended and that is not purged yet keeps its last
    /// state and has `expires_in` zero.
    pub state: State,
    /// The fence of its current (or last) claim.
    pub fence: u64,
    /// Which attempt of the request holds (or last held) it: 1 for the first.
    pub attempt: u32,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// How long ago it was first claimed.
    pub age: Duration,
    /// For a claim in progress, what is left of its lease (zero once it ran out: the next
    /// request takes it over).
    pub lease_remaining: Option<Duration>,
    /// How long until its retention ends and it may be purged; zero once it has.
    pub expires_in: Duration,
    /// How far the attempt got, if it checkpointed. Only
    /// [`Operation::Inspect`](super::Operation::Inspect) reads it.
    pub recovery_point: Option<Vec<u8>>,
    /// The stored answer of a completed record. Only
    /// [`Operation::Inspect`](super::Operation::Inspect) reads it.
    pub response: Option<StoredResponse>,
    /// Why its last attempt did not finish: the note of an outcome that may have had its
    /// effect ([`Operation::Suspend`](super::Operation::Suspend)), or why it was parked.
    pub note: Option<String>,
    /// Whether its request is stored, so that a completer can finish it.
    pub resumable: bool,
    /// The stored request of a resumable record, encoded
    /// ([`StoredRequest`](crate::StoredRequest)). Only
    /// [`Operation::Inspect`](super::Operation::Inspect) reads it.
    pub request: Option<Vec<u8>>,
}

impl RecordInfo {
    /// The record's age from its fence and the store's clock, both in milliseconds.
    pub fn age_from(fence: u64, now_ms: i64) -> Duration {
        Duration::from_millis(u64::try_from(now_ms).unwrap_or(0).saturating_sub(fence))
    }

    /// A duration from milliseconds that may have run negative: zero then.
    pub fn ms_left(ms: i64) -> Duration {
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }
}

/// What [`Operation::ForceRelease`](super::Operation::ForceRelease) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForcedRelease {
    /// The claim in progress was released and its fence moved on to `fence`: the next request
    /// with this key claims and runs, and the previous owner, if it is still running, can no
    /// longer complete, release or checkpoint ([`Error::FenceLost`](crate::Error::FenceLost)).
    Released {
        /// The record's fence now.
        fence: u64,
    },
    /// The record is not in progress (completed or released already): nothing changed.
    NotInProgress(State),
    /// The record's fence is not the one the release was asked for: the claim the operator saw
    /// ended and another took its place (or was released or completed since). Nothing
    /// changed; here is the record as it is now.
    FenceMoved {
        /// The record's fence now.
        fence: u64,
        /// The record's state now.
        state: State,
    },
    /// No such record (never claimed, or its retention ended): nothing changed.
    NotFound,
}

/// What [`Operation::Retry`](super::Operation::Retry) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retried {
    /// The parked record is in progress again, its lease run out: a completer resumes it now
    /// (when its request is stored), as does the request's own retry. Its attempts are counted
    /// afresh: the record's attempt number starts again at 1.
    Retried {
        /// The record's fence; the next claim takes the one after it.
        fence: u64,
    },
    /// The record is not parked: nothing changed.
    NotParked(State),
    /// No such record: nothing changed.
    NotFound,
}

/// Counts of records by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateCounts {
    /// Claims in progress (live or with a lease run out).
    pub in_progress: u64,
    /// Completed records.
    pub completed: u64,
    /// Released records.
    pub released: u64,
    /// Parked records: unfinished work given up by the completer, waiting for an operator.
    pub parked: u64,
}

impl StateCounts {
    /// Counts one more record in `state`.
    pub fn add(&mut self, state: State, n: u64) {
        match state {
            State::InProgress => self.in_progress += n,
            State::Completed => self.completed += n,
            State::Released => self.released += n,
            State::Parked => self.parked += n,
        }
    }

    /// All records counted.
    pub fn total(&self) -> u64 {
        self.in_progress + self.completed + self.released + self.parked
    }
}

/// What [`Operation::Stats`](super::Operation::Stats) answers: a store at a glance. Records
/// whose retention ended are counted only in `expired`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Live records by state.
    pub states: StateCounts,
    /// Records whose retention ended, waiting for the purge.
    pub expired: u64,
    /// The age of the oldest live claim in progress: a large one is a claim stuck since a
    /// crash (see [`ForcedRelease`]).
    pub oldest_in_progress: Option<Duration>,
    /// Live records whose retention ends within the window asked for.
    pub expiring_soon: u64,
    /// Live records by scope prefix (the scope up to its first `:`, the whole scope when it has
    /// none), sorted by prefix.
    pub by_prefix: Vec<(String, StateCounts)>,
    /// Claims in progress that hold unfinished work (a stored request, or an outcome that may
    /// have had its effect) and whose lease ran out: waiting for a retry, the completer or an
    /// operator.
    pub unfinished: u64,
    /// The age of the oldest of them.
    pub oldest_unfinished: Option<Duration>,
}

impl StoreStats {
    /// The prefix a scope is counted under: up to its first `:`.
    pub fn prefix_of(scope: &str) -> &str {
        scope.split(':').next().unwrap_or(scope)
    }

    /// Counts one live record: what stores that count as they read use.
    pub fn count(&mut self, record: &RecordInfo, expiring_within: Duration) {
        if record.expires_in.is_zero() && !record.holds_work() {
            self.expired += 1;
            return;
        }
        self.states.add(record.state, 1);
        if record.state == State::InProgress {
            self.oldest_in_progress = self.oldest_in_progress.max(Some(record.age));
            if record.is_unfinished() {
                self.unfinished += 1;
                self.oldest_unfinished = self.oldest_unfinished.max(Some(record.age));
            }
        }
        if record.expires_in <= expiring_within {
            self.expiring_soon += 1;
        }
        let prefix = StoreStats::prefix_of(&record.scope);
        match self
            .by_prefix
            .binary_search_by(|(p, _)| p.as_str().cmp(prefix))
        {
            Ok(i) => self.by_prefix[i].1.add(record.state, 1),
            Err(i) => {
                let mut counts = StateCounts::default();
                counts.add(record.state, 1);
                self.by_prefix.insert(i, (prefix.to_owned(), counts));
            }
        }
    }
}

/// `90s`, `5m`, `2h`, `1d`, or a number of seconds: an age as operators write it (`idem records
/// list --older-than 5m`, the admin view's filter).
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not an age: write 90s, 5m, 2h or 1d"))?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?} is not an age: write 90s, 5m, 2h or 1d")),
    };
    n.checked_mul(secs)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long an age"))
}

/// A duration in whole milliseconds, as the JSON of records and counts writes it.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RecordInfo {
    /// Whether it holds unfinished work and so never expires ([`crate::lifecycle::unfinished`]):
    /// parked, or in progress with a stored request or after an unknown outcome.
    pub fn holds_work(&self) -> bool {
        crate::lifecycle::unfinished(self.state, self.resumable, self.note.is_some())
    }

    /// Whether it is a claim in progress that holds unfinished work (a stored request, or an
    /// outcome that may have had its effect) and whose lease ran out: what
    /// [`StoreStats::unfinished`] counts.
    pub fn is_unfinished(&self) -> bool {
        self.state == State::InProgress
            && (self.resumable || self.note.is_some())
            && self.lease_remaining.is_some_and(|l| l.is_zero())
    }

    /// The record as JSON, without its recovery point and answer (which each reader shows its
    /// own way): the fields and names of the admin view's API and of `idem records --json`.
    pub fn summary_json(&self) -> serde_json::Value {
        serde_json::json!({
            "scope": self.scope,
            "key": self.key,
            "state": self.state.as_str(),
            "fence": self.fence,
            "attempt": self.attempt,
            "fingerprint": self.fingerprint.to_string(),
            "age_ms": millis(self.age),
            "lease_remaining_ms": self.lease_remaining.map(millis),
            "expires_in_ms": millis(self.expires_in),
            "resumable": self.resumable,
            "note": self.note,
        })
    }
}

impl StateCounts {
    /// The counts as JSON: `{"in_progress": …, "completed": …, "released": …, "parked": …}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "in_progress": self.in_progress,
            "completed": self.completed,
            "released": self.released,
            "parked": self.parked,
        })
    }
}

impl StoreStats {
    /// The counts as JSON: the fields and names of the admin view's API and of
    /// `idem stats --json`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "states": self.states.to_json(),
            "expired": self.expired,
            "oldest_in_progress_ms": self.oldest_in_progress.map(millis),
            "expiring_soon": self.expiring_soon,
            "unfinished": self.unfinished,
            "oldest_unfinished_ms": self.oldest_unfinished.map(millis),
            "by_prefix": self
                .by_prefix
                .iter()
                .map(|(p, c)| serde_json::json!({"prefix": p, "counts": c.to_json()}))
                .collect::<Vec<_>>(),
        })
    }
}

impl ForcedRelease {
    /// The one JSON rendering of what a release did, for the admin view and the `idem` tool:
    /// `{"released": true, "fence": N}`, or `false` with a `reason` (`not_in_progress` with the
    /// `state`, `not_found`, `fence_moved` with the record's `fence` and `state` now).
    pub fn to_json(&self) -> serde_json::Value {
        match *self {
            ForcedRelease::Released { fence } => {
                serde_json::json!({"released": true, "fence": fence})
            }
            ForcedRelease::NotInProgress(state) => serde_json::json!({
                "released": false, "reason": "not_in_progress", "state": state.as_str(),
            }),
            ForcedRelease::NotFound => {
                serde_json::json!({"released": false, "reason": "not_found"})
            }
            ForcedRelease::FenceMoved { fence, state } => serde_json::json!({
                "released": false, "reason": "fence_moved", "fence": fence, "state": state.as_str(),
            }),
        }
    }
}

impl Retried {
    /// The one JSON rendering of what a retry did, for the admin view and the `idem` tool:
    /// `{"retried": true, "fence": N}`, or `false` with a `reason` (`not_parked` with the
    /// `state`, `not_found`).
    pub fn to_json(&self) -> serde_json::Value {
        match *self {
            Retried::Retried { fence } => serde_json::json!({"retried": true, "fence": fence}),
            Retried::NotParked(state) => serde_json::json!({
                "retried": false, "reason": "not_parked", "state": state.as_str(),
            }),
            Retried::NotFound => serde_json::json!({"retried": false, "reason": "not_found"}),
        }
    }
}
