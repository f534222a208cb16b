//! Tracing events, and `metrics` counters behind the `metrics` feature, for every outcome.
//!
//! Every metric idem records is named here (the guide's "Operating it" lists them with their
//! meaning), except `idem_transitions_total` (`transition.rs`):
//!
//! - `idem_outcomes_total{outcome}`: `claimed`, `reclaimed`, `replayed`, `in_progress`,
//!   `key_reused`, `completed`, `released`, `fence_lost`, `store_error`, `suspended` (an outcome
//!   that may have had its effect: the claim is kept for a retry or the completer), `parked`
//!   (a request refused because its unfinished work is parked);
//! - `idem_completer_resumed_total{result}`: claims a completer resumed, by how the resumed
//!   call ended: `completed`, `released`, `suspended` (unknown again), `unrecorded`,
//!   `taken` (another attempt held or finished it), `failed` (the resume function or the store
//!   failed); `idem_completer_parked_total`: claims a completer parked after their attempts;
//! - the gauges `idem_unfinished_claims`, `idem_unfinished_oldest_seconds` and
//!   `idem_parked_claims`: the claims in the store that hold unfinished work (in progress,
//!   their request stored or their outcome unknown, their lease run out: waiting for a retry,
//!   a completer or an operator), the age of the oldest of them (from its first claim), and the
//!   parked ones, as a completer last read them from the store's counts (`idem stats`);
//! - `idem_new_keys_refused_total`: requests with a new key a [`BoundedStore`] refused
//!   (429 `TOO_MANY_NEW_KEYS`);
//! - `idem_purged_records_total{store, database}`: expired records a background purge deleted
//!   (`database` only on a SQL store's own purge);
//! - `idem_consumer_settlements_total{settlement}`: deliveries a consumer settled with its
//!   broker: `completed`, `replayed` (acks), `in_progress`, `retried` (retries), `dead_lettered`;
//! - `idem_outbox_published_total`, `idem_outbox_publish_failures_total{cause}` (`refused`,
//!   `unreachable`), `idem_outbox_parked_total`: what outbox relays did with events;
//! - the gauges `idem_outbox_pending` and `idem_outbox_parked`: events waiting in the outbox and
//!   parked there, as a relay last counted them (its lag, in events).

/// One outcome of the record lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Claimed,
    Reclaimed,
    Replayed,
    InProgress,
    KeyReused,
    Completed,
    Released,
    FenceLost,
    StoreError,
    Suspended,
    Parked,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Claimed => "claimed",
            Outcome::Reclaimed => "reclaimed",
            Outcome::Replayed => "replayed",
            Outcome::InProgress => "in_progress",
            Outcome::KeyReused => "key_reused",
            Outcome::Completed => "completed",
            Outcome::Released => "released",
            Outcome::FenceLost => "fence_lost",
            Outcome::StoreError => "store_error",
            Outcome::Suspended => "suspended",
            Outcome::Parked => "parked",
        }
    }
}

/// Records `outcome` for `(scope, key)` at the level it deserves, with a message a reader of
/// the log understands without knowing the fields.
pub(crate) fn record(outcome: Outcome, scope: &str, key: &str, fence: u64) {
    let name = outcome.as_str();
    macro_rules! event {
        ($level:ident, $message:literal) => {
            tracing::$level!(target: "idem", outcome = name, scope, key, fence, $message)
        };
    }
    match outcome {
        Outcome::Claimed => event!(debug, "claimed: the request runs"),
        Outcome::Completed => event!(debug, "completed: the answer is stored for replay"),
        Outcome::Replayed => event!(debug, "replayed the stored answer; the body did not run"),
        Outcome::InProgress => {
            event!(
                info,
                "refused: a request with this key is still in progress"
            )
        }
        Outcome::Released => event!(info, "released: a retry may run the request again"),
        Outcome::KeyReused => event!(
            warn,
            "refused: the key was already used for a request with a different fingerprint"
        ),
        Outcome::Reclaimed => event!(
            warn,
            "took over a claim whose lease ran out: the previous attempt may have done part of the work"
        ),
        Outcome::FenceLost => event!(
            error,
            "fence lost: a newer attempt took the record over, so this attempt's write was refused"
        ),
        Outcome::StoreError => event!(error, "the idempotency store failed"),
        Outcome::Suspended => event!(
            warn,
            "suspended: the outcome is unknown (the effect may have happened); the claim is kept for a retry or the completer"
        ),
        Outcome::Parked => event!(
            warn,
            "refused: this request's unfinished work is parked for an operator"
        ),
    }
    #[cfg(feature = "metrics")]
    count(outcome);
}

/// One literal label per arm: the macro then builds a static key, with no allocation per call.
#[cfg(feature = "metrics")]
fn count(outcome: Outcome) {
    macro_rules! count {
        ($label:literal) => {
            metrics::counter!("idem_outcomes_total", "outcome" => $label).increment(1)
        };
    }
    match outcome {
        Outcome::Claimed => count!("claimed"),
        Outcome::Reclaimed => count!("reclaimed"),
        Outcome::Replayed => count!("replayed"),
        Outcome::InProgress => count!("in_progress"),
        Outcome::KeyReused => count!("key_reused"),
        Outcome::Completed => count!("completed"),
        Outcome::Released => count!("released"),
        Outcome::FenceLost => count!("fence_lost"),
        Outcome::StoreError => count!("store_error"),
        Outcome::Suspended => count!("suspended"),
        Outcome::Parked => count!("parked"),
    }
}

/// Counts a claim a completer resumed, by how the resumed call ended.
pub(crate) fn resumed(result: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_completer_resumed_total", "result" => result).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = result;
}

/// Counts a request with a new key refused by a [`BoundedStore`](crate::BoundedStore).
pub(crate) fn limited() {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_new_keys_refused_total").increment(1);
}

/// Counts a claim a completer parked.
pub(crate) fn completer_parked() {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_completer_parked_total").increment(1);
}

/// Records the store's unfinished claims (how many, the age of the oldest) and parked ones, as
/// a completer read them.
pub(crate) fn unfinished(claims: u64, oldest: std::time::Duration, parked: u64) {
    #[cfg(feature = "metrics")]
    {
        // A gauge holds an f64; counts beyond 2^53 are not a concern.
        metrics::gauge!("idem_unfinished_claims").set(claims as f64);
        metrics::gauge!("idem_unfinished_oldest_seconds").set(oldest.as_secs_f64());
        metrics::gauge!("idem_parked_claims").set(parked as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (claims, oldest, parked);
}

/// Counts an outbox event a relay parked (its error log is the relay's own).
#[cfg(feature = "sql")]
pub(crate) fn outbox_parked() {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_outbox_parked_total").increment(1);
}

/// Counts the expired records a background purge of `store` (a SQL store's table, else the
/// store's type) deleted; `database` names a SQL store's database (`sqlite`, `postgres`,
/// `mysql`), so that two databases' tables of one name are told apart.
pub(crate) fn purged(store: &str, database: Option<&'static str>, n: u64) {
    #[cfg(feature = "metrics")]
    match database {
        Some(database) => metrics::counter!(
            "idem_purged_records_total",
            "store" => store.to_owned(),
            "database" => database
        )
        .increment(n),
        None => {
            metrics::counter!("idem_purged_records_total", "store" => store.to_owned())
                .increment(n);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (store, database, n);
}

/// Counts a delivery a consumer settled with its broker (the broker took the settlement), by
/// the settlement's label (`completed`, `replayed`, `in_progress`, `retried`, `dead_lettered`).
pub(crate) fn settled(settlement: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_consumer_settlements_total", "settlement" => settlement).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = settlement;
}

/// Counts an outbox event a relay published and marked sent.
#[cfg(feature = "sql")]
pub(crate) fn outbox_published() {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_outbox_published_total").increment(1);
}

/// Counts a publish of an outbox event that failed: the broker `refused` it, or was out of
/// reach.
#[cfg(feature = "sql")]
pub(crate) fn outbox_publish_failed(refused: bool) {
    #[cfg(feature = "metrics")]
    if refused {
        metrics::counter!("idem_outbox_publish_failures_total", "cause" => "refused").increment(1);
    } else {
        metrics::counter!("idem_outbox_publish_failures_total", "cause" => "unreachable")
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = refused;
}

/// Records how many events an outbox holds waiting and parked.
#[cfg(feature = "sql")]
pub(crate) fn outbox_backlog(pending: u64, parked: u64) {
    #[cfg(feature = "metrics")]
    {
        // A gauge holds an f64; counts beyond 2^53 are not a concern.
        metrics::gauge!("idem_outbox_pending").set(pending as f64);
        metrics::gauge!("idem_outbox_parked").set(parked as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (pending, parked);
}
