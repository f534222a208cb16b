//! What the person on call asks a store: which records it holds, one record in full, a safe
//! manual release of a stuck claim, and counts. The `idem` command-line tool and the admin view
//! are built on these operations ([`Operation::List`](super::Operation::List) and the ones after
//! it); the test kit checks them on every store, a store written elsewhere included.
//!
//! Times are read on the store's own clock, as leases are. A record's age is counted from its
//! first claim, whose fence is the store's clock in milliseconds at that moment (every claim
//! after it adds one), so every store answers it the same way.
//!
//! # Bounded reads
//!
//! An operator's page reloads, and a store may hold tens of millions of records: no listing or
//! count reads them all. Records that hold unfinished work (parked, or a claim in progress with
//! a stored request or an unknown outcome: [`RecordInfo::holds_work`]) are kept in an index of
//! their own (on the SQL stores a partial index, on Redis the completer's sorted set), whose
//! size is the work waiting, not the table's; every other listing walks an index the store has
//! anyway (the records' retention, their primary key) and examines at most
//! [`RecordQuery::examine`] records of it. Nothing is added to a claim's or a completion's
//! path: a claim in progress that holds no work differs from a completed record only in
//! columns the completion writes, and an index on them would cost every completion (on
//! PostgreSQL, the heap-only update that keeps completions cheap).
//!
//! | listing | served by | order |
//! |---|---|---|
//! | [`RecordQuery::holding_work`], or the state `parked` | the index of unfinished work | oldest first (by first claim) |
//! | a [`scope_prefix`](RecordQuery::scope_prefix) | the primary key's range (SQL); a scan (Redis) | by scope, then key |
//! | anything else | the retention index (SQL); a scan (Redis) | by the end of retention, soonest first: for one retention, oldest first |
//!
//! The other filters (state, age, prefix outside its own order) apply to the records examined;
//! [`Listing::complete`] says whether the answer is every record that passes them. On Redis,
//! which has no order but the completer's index, a scan examines records in the server's own
//! order and the answer is sorted as above. [`StoreStats`] says what each count covers.

use std::cmp::Ordering;
use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::lifecycle::State;
use crate::record::StoredResponse;

/// Which records [`Operation::List`](super::Operation::List) returns: all filters hold at once,
/// in the order of [`RecordQuery::order`], from at most [`examine`](RecordQuery::examine)
/// records (see [Bounded reads](self#bounded-reads)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordQuery {
    /// Only records in this state.
    pub state: Option<State>,
    /// Only records whose scope starts with this text.
    pub scope_prefix: Option<String>,
    /// Only records first claimed longer ago than this.
    pub older_than: Option<Duration>,
    /// Only records that hold unfinished work ([`RecordInfo::holds_work`]): parked, or in
    /// progress with a stored request or after an outcome that may have had its effect.
    pub holding_work: bool,
    /// At most this many records (default 100).
    pub limit: usize,
    /// At most this many records of the listing's order are examined for the filters
    /// (default [`RecordQuery::EXAMINE`]): what bounds the work of one listing.
    pub examine: usize,
}

impl Default for RecordQuery {
    fn default() -> Self {
        RecordQuery {
            state: None,
            scope_prefix: None,
            older_than: None,
            holding_work: false,
            limit: 100,
            examine: RecordQuery::EXAMINE,
        }
    }
}

/// The order a listing reads and answers records in, chosen by its filters
/// ([`RecordQuery::order`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListOrder {
    /// Records that hold unfinished work, oldest first (by fence: their first claim).
    Work,
    /// By scope, then key, in byte order.
    Scope,
    /// By the end of their retention, soonest first; then by scope and key.
    Retention,
}

impl ListOrder {
    /// How `a` and `b` compare in this order: for stores that sort what they read.
    pub fn cmp(self, a: &RecordInfo, b: &RecordInfo) -> Ordering {
        let by_identity = || a.scope.cmp(&b.scope).then_with(|| a.key.cmp(&b.key));
        match self {
            ListOrder::Work => a.fence.cmp(&b.fence).then_with(by_identity),
            ListOrder::Scope => by_identity(),
            ListOrder::Retention => a.expires_in.cmp(&b.expires_in).then_with(by_identity),
        }
    }
}

impl RecordQuery {
    /// How many records a listing examines unless told otherwise: 10,000.
    pub const EXAMINE: usize = 10_000;

    /// Every record, at most 100.
    pub fn new() -> Self {
        RecordQuery::default()
    }

    /// Only records that hold unfinished work (`true`), or any (`false`, the default).
    pub fn holding_work(mut self, holding_work: bool) -> Self {
        self.holding_work = holding_work;
        self
    }

    /// Examine at most `records` records of the listing's order (at least 1).
    pub fn examine(mut self, records: usize) -> Self {
        self.examine = records.max(1);
        self
    }

    /// The order this listing reads and answers in: [`ListOrder::Work`] when it asks only for
    /// records that hold work (or for parked ones, which all do), [`ListOrder::Scope`] for a
    /// scope prefix, else [`ListOrder::Retention`].
    pub fn order(&self) -> ListOrder {
        if self.holding_work || self.state == Some(State::Parked) {
            ListOrder::Work
        } else if self.scope_prefix.is_some() {
            ListOrder::Scope
        } else {
            ListOrder::Retention
        }
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
            && (!self.holding_work || record.holds_work())
    }

    /// Whether the listing's order reads `record` at all: one that holds work for
    /// [`ListOrder::Work`], one under the prefix for [`ListOrder::Scope`], any for
    /// [`ListOrder::Retention`]. What a store that keeps its records in memory examines.
    pub fn offers(&self, record: &RecordInfo) -> bool {
        match self.order() {
            ListOrder::Work => record.holds_work(),
            ListOrder::Scope => self
                .scope_prefix
                .as_deref()
                .is_none_or(|p| record.scope.starts_with(p)),
            ListOrder::Retention => true,
        }
    }

    /// The answer of a store that read `examined`, records in no particular order: those that
    /// pass the filters, in the listing's order, at most `limit`; complete when `exhausted`
    /// (nothing more to examine) and fewer than `limit` passed.
    pub fn answer(&self, examined: Vec<RecordInfo>, exhausted: bool) -> Listing {
        let order = self.order();
        let mut records: Vec<RecordInfo> =
            examined.into_iter().filter(|r| self.matches(r)).collect();
        records.sort_by(|a, b| order.cmp(a, b));
        let complete = exhausted && records.len() < self.limit;
        records.truncate(self.limit);
        Listing { records, complete }
    }
}

/// What [`Operation::List`](super::Operation::List) answers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listing {
    /// The records that pass the query's filters, in its order, at most its `limit`.
    pub records: Vec<RecordInfo>,
    /// Whether they are every record that passes the filters: fewer than the limit were found,
    /// and every record the listing's order could offer was examined. When `false`, more may
    /// pass: raise the limit, or narrow the listing (a scope prefix, unfinished work) so that
    /// fewer records are examined to find them.
    pub complete: bool,
}

impl Listing {
    /// `records`, and whether they are all there is.
    pub fn new(records: Vec<RecordInfo>, complete: bool) -> Self {
        Listing { records, complete }
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

/// What [`Operation::Stats`](super::Operation::Stats) answers: a store at a glance, read with
/// bounded work whatever the store's size.
///
/// The counts are of the records **counted**: every record that holds unfinished work (up to
/// [`StoreStats::BOUND`] of them), and the [`StoreStats::BOUND`] others whose retention ends
/// last (on Redis, the first the server's scan meets). A store that holds fewer is counted
/// whole: [`complete`](Self::complete) says so. So `unfinished`, the parked records and their
/// ages are exact; on a larger store the counts by state and prefix describe the newest
/// records (for one retention, the most recent traffic), and a claim in progress older than
/// them that holds no work is not counted. `expired` and `expiring_soon` are read from the
/// retention index and are exact up to [`StoreStats::BOUND`], which means "that many or more"
/// (on Redis, which deletes expired records itself, `expired` is 0 and `expiring_soon` is
/// counted over the records counted). Records whose retention ended are counted only in
/// `expired`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Live records counted, by state.
    pub states: StateCounts,
    /// Records whose retention ended, waiting for the purge (at most [`StoreStats::BOUND`]).
    pub expired: u64,
    /// The age of the oldest live claim in progress counted: a large one is a claim stuck
    /// since a crash (see [`ForcedRelease`]).
    pub oldest_in_progress: Option<Duration>,
    /// Live records that hold no unfinished work and whose retention ends within the window
    /// asked for (at most [`StoreStats::BOUND`]).
    pub expiring_soon: u64,
    /// Live records counted, by scope prefix (the scope up to its first `:`, the whole scope
    /// when it has none), sorted by prefix.
    pub by_prefix: Vec<(String, StateCounts)>,
    /// Claims in progress that hold unfinished work (a stored request, or an outcome that may
    /// have had its effect) and whose lease ran out: waiting for a retry, the completer or an
    /// operator.
    pub unfinished: u64,
    /// The age of the oldest of them.
    pub oldest_unfinished: Option<Duration>,
    /// How many records were read for the counts.
    pub counted: u64,
    /// Whether those were every record the store holds: the counts by state and prefix are
    /// then the whole store's.
    pub complete: bool,
}

impl StoreStats {
    /// The most records read for each part of the counts: 10,000.
    pub const BOUND: u64 = 10_000;

    /// The prefix a scope is counted under: up to its first `:`.
    pub fn prefix_of(scope: &str) -> &str {
        scope.split(':').next().unwrap_or(scope)
    }

    /// Counts one record: what stores that count as they read use.
    pub fn count(&mut self, record: &RecordInfo, expiring_within: Duration) {
        self.counted += 1;
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
        if record.expires_in <= expiring_within && !record.holds_work() {
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
            "counted": self.counted,
            "complete": self.complete,
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
