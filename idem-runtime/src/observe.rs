//! Tracing events, and `metrics` counters behind the `metrics` feature, for every outcome.
//!
//! Counters: `idem_outcomes_total`, label `outcome` = `claimed`, `reclaimed`, `replayed`,
//! `in_progress`, `key_reused`, `completed`, `released`, `fence_lost`, `store_error`; and
//! `idem_outbox_parked_total`, outbox events a relay parked.

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
    }
}

/// Counts an outbox event a relay parked (its error log is the relay's own).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn outbox_parked() {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_outbox_parked_total").increment(1);
}
