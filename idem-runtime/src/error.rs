//! The one error type of idem, and what each variant means on the wire.

use std::fmt;
use std::time::Duration;

/// A boxed error from a store's driver, kept as the source of [`Error::Unavailable`] and
/// [`Error::Store`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with idem's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when guarding a request.
///
/// Each variant maps to an HTTP status ([`Error::status`]) and a stable machine-readable code
/// ([`Error::code`]) without depending on any web framework; the `axum` feature renders them as
/// RFC 9457 `application/problem+json`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The idempotency key is missing or malformed. Nothing was read from or written to the
    /// store. HTTP 400, `INVALID_IDEMPOTENCY_KEY`.
    #[error("invalid idempotency key: {0}")]
    InvalidKey(#[from] KeyError),

    /// A value placed into the scope template made the scope longer than a store can index.
    /// HTTP 400, `INVALID_IDEMPOTENCY_SCOPE`.
    #[error("invalid idempotency scope: {len} bytes, at most {max} allowed")]
    InvalidScope {
        /// Length of the rendered scope in bytes.
        len: usize,
        /// The limit, [`crate::scope::MAX_SCOPE_LEN`].
        max: usize,
    },

    /// Another request with the same scope and key is still running. The client should retry
    /// after `retry_after` and will then get the stored result. HTTP 409, `REQUEST_IN_PROGRESS`,
    /// with a `Retry-After` header: see [`RetryHint`](crate::RetryHint) for how it is chosen.
    #[error("a request with this idempotency key is still in progress; retry in {} s", whole_seconds(*retry_after))]
    InProgress {
        /// About how long the running attempt still needs: the operation's observed duration,
        /// at least one second and at most what is left of the attempt's lease.
        retry_after: Duration,
    },

    /// An earlier attempt of this request did not finish, and the retries of the completer
    /// were given up: the work is parked for an operator, who retries or releases it (`idem
    /// records`, the admin view). Retrying the request does not help. HTTP 409,
    /// `REQUEST_PARKED`.
    #[error("an earlier attempt of this request did not finish and is parked for an operator")]
    Parked,

    /// The request with this key ran, but its answer was not kept, so it cannot be replayed: it
    /// was larger than the policy keeps ([`Policy::max_answer`](crate::Policy::max_answer)), or
    /// a stream the guard passed through as it came. Its first caller got it; a retry gets this
    /// instead of a second run. Look the result up by other means rather than retrying. HTTP
    /// 409, `ANSWER_NOT_KEPT`.
    #[error("the request with this idempotency key ran, but its answer ({}) was not kept and cannot be replayed", not_kept_what(*len, *max))]
    AnswerNotKept {
        /// The answer's encoded length in bytes; `None` for a stream.
        len: Option<usize>,
        /// The policy's limit.
        max: usize,
    },

    /// The request's key is new, and the budget of new records it falls under
    /// ([`BoundedStore`](crate::BoundedStore): the instance's, or its principal's) is spent for
    /// now. Nothing was written. HTTP 429, `TOO_MANY_NEW_KEYS`, with a `Retry-After`.
    #[error("too many requests with new idempotency keys; retry in {} s", whole_seconds(*retry_after))]
    TooManyNewKeys {
        /// When the budget has a new record again.
        retry_after: Duration,
    },

    /// A resumable call's request is too large to store with its claim. Nothing was claimed.
    /// HTTP 413, `REQUEST_TOO_LARGE_TO_RESUME`.
    #[error("the request is {len} bytes, but a resumable call stores at most {max}")]
    RequestTooLarge {
        /// Its encoded length in bytes.
        len: usize,
        /// The cap of the call, [`RequestCap`](crate::RequestCap) (64 KiB unless set).
        max: usize,
    },

    /// The key was already used for a request with a different fingerprint (a different body or
    /// different arguments). HTTP 422, `KEY_REUSED_WITH_DIFFERENT_BODY`.
    #[error("the idempotency key was already used for a different request")]
    KeyReused,

    /// This attempt's claim was taken over: its lease ran out and a retry re-claimed the record
    /// with a higher fence. Its completion, release or checkpoint was refused, so it overwrote
    /// nothing; the new owner's result is the one clients will be given. HTTP 409,
    /// `REQUEST_SUPERSEDED`.
    #[error("the claim with fence {fence} was superseded by a newer attempt; nothing was written")]
    FenceLost {
        /// The fence this attempt held.
        fence: u64,
    },

    /// The response could not be encoded for storage (its `Serialize` implementation failed).
    /// HTTP 500, `IDEMPOTENCY_INTERNAL_ERROR`.
    #[error("could not encode the response for storage: {0}")]
    Encode(String),

    /// A stored response could not be decoded into the handler's return type, typically after a
    /// deploy changed that type incompatibly. HTTP 500, `IDEMPOTENCY_INTERNAL_ERROR`.
    #[error("could not decode the stored response: {0}")]
    Decode(String),

    /// The store could not be reached or is overloaded (connection refused or dropped, pool
    /// timeout, database shutting down, lock contention). Safe to retry with the same key.
    /// HTTP 503, `IDEMPOTENCY_STORE_UNAVAILABLE`.
    #[error("the idempotency store is unavailable: {0}")]
    Unavailable(#[source] BoxError),

    /// The store answered with an error that retrying will not fix (a missing table, a
    /// permission error). HTTP 500, `IDEMPOTENCY_INTERNAL_ERROR`.
    #[error("the idempotency store failed: {0}")]
    Store(#[source] BoxError),

    /// A guarded function has no `store = …` argument and no default store was installed with
    /// [`crate::set_default_store`]. HTTP 500, `IDEMPOTENCY_INTERNAL_ERROR`.
    #[error(
        "no idempotency store: pass `store = …` to #[idempotent] or call idem::set_default_store at start-up"
    )]
    NoDefaultStore,

    /// An argument of a store or configuration call was rejected (for example a table name that
    /// is not an identifier). HTTP 500, `IDEMPOTENCY_INTERNAL_ERROR`.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The store does not offer this operation (a store written elsewhere that predates it, or
    /// one that cannot answer it, such as listing records on a store without an index to scan).
    /// HTTP 501, `OPERATION_NOT_SUPPORTED_BY_STORE`.
    #[error("the idempotency store does not support `{operation}`")]
    Unsupported {
        /// The operation's name ([`Operation::name`](crate::store::Operation::name)).
        operation: &'static str,
    },
}

impl Error {
    /// The HTTP status this error should produce: 400, 409, 413, 422, 429, 500, 501 or 503.
    pub fn status(&self) -> u16 {
        match self {
            Error::InvalidKey(_) | Error::InvalidScope { .. } => 400,
            Error::InProgress { .. }
            | Error::FenceLost { .. }
            | Error::Parked
            | Error::AnswerNotKept { .. } => 409,
            Error::RequestTooLarge { .. } => 413,
            Error::TooManyNewKeys { .. } => 429,
            Error::KeyReused => 422,
            Error::Unavailable(_) => 503,
            Error::Encode(_)
            | Error::Decode(_)
            | Error::Store(_)
            | Error::NoDefaultStore
            | Error::Config(_) => 500,
            Error::Unsupported { .. } => 501,
        }
    }

    /// The stable machine-readable code of this error, as used in problem+json bodies: one of
    /// the constants of [`codes`].
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidKey(_) => codes::INVALID_IDEMPOTENCY_KEY,
            Error::InvalidScope { .. } => codes::INVALID_IDEMPOTENCY_SCOPE,
            Error::InProgress { .. } => codes::REQUEST_IN_PROGRESS,
            Error::KeyReused => codes::KEY_REUSED_WITH_DIFFERENT_BODY,
            Error::Parked => codes::REQUEST_PARKED,
            Error::AnswerNotKept { .. } => codes::ANSWER_NOT_KEPT,
            Error::TooManyNewKeys { .. } => codes::TOO_MANY_NEW_KEYS,
            Error::RequestTooLarge { .. } => codes::REQUEST_TOO_LARGE_TO_RESUME,
            Error::FenceLost { .. } => codes::REQUEST_SUPERSEDED,
            Error::Unavailable(_) => codes::IDEMPOTENCY_STORE_UNAVAILABLE,
            Error::Encode(_)
            | Error::Decode(_)
            | Error::Store(_)
            | Error::NoDefaultStore
            | Error::Config(_) => codes::IDEMPOTENCY_INTERNAL_ERROR,
            Error::Unsupported { .. } => codes::OPERATION_NOT_SUPPORTED_BY_STORE,
        }
    }

    /// When the client should try again, if it should: the hint of [`Error::InProgress`], one
    /// second for [`Error::Unavailable`] and [`Error::FenceLost`].
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::InProgress { retry_after } | Error::TooManyNewKeys { retry_after } => {
                Some(*retry_after)
            }
            Error::Unavailable(_) | Error::FenceLost { .. } => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// Whether repeating the same request with the same key can succeed.
    pub fn is_retryable(&self) -> bool {
        self.retry_after().is_some()
    }
}

/// The problem codes idem answers with (the `code` member of its problem+json bodies), named
/// once for the server ([`Error::code`]) and for the clients that read them (`client`, feature
/// `client`).
pub mod codes {
    /// 400: the idempotency key is missing or malformed ([`Error::InvalidKey`](super::Error::InvalidKey)).
    pub const INVALID_IDEMPOTENCY_KEY: &str = "INVALID_IDEMPOTENCY_KEY";
    /// 400: the rendered scope is too long ([`Error::InvalidScope`](super::Error::InvalidScope)).
    pub const INVALID_IDEMPOTENCY_SCOPE: &str = "INVALID_IDEMPOTENCY_SCOPE";
    /// 409: the first request with this key is still running; retry after `Retry-After`
    /// ([`Error::InProgress`](super::Error::InProgress)).
    pub const REQUEST_IN_PROGRESS: &str = "REQUEST_IN_PROGRESS";
    /// 422: the key was used for another request ([`Error::KeyReused`](super::Error::KeyReused)).
    pub const KEY_REUSED_WITH_DIFFERENT_BODY: &str = "KEY_REUSED_WITH_DIFFERENT_BODY";
    /// 409: the request's work is parked for an operator ([`Error::Parked`](super::Error::Parked)).
    pub const REQUEST_PARKED: &str = "REQUEST_PARKED";
    /// 409: the request ran but its answer was not kept
    /// ([`Error::AnswerNotKept`](super::Error::AnswerNotKept)).
    pub const ANSWER_NOT_KEPT: &str = "ANSWER_NOT_KEPT";
    /// 429: the budget of new keys is spent for now
    /// ([`Error::TooManyNewKeys`](super::Error::TooManyNewKeys)).
    pub const TOO_MANY_NEW_KEYS: &str = "TOO_MANY_NEW_KEYS";
    /// 413: a resumable call's request is too large to store
    /// ([`Error::RequestTooLarge`](super::Error::RequestTooLarge)).
    pub const REQUEST_TOO_LARGE_TO_RESUME: &str = "REQUEST_TOO_LARGE_TO_RESUME";
    /// 409: the attempt's claim was taken over by a newer one; retrying gets the new owner's
    /// answer ([`Error::FenceLost`](super::Error::FenceLost)).
    pub const REQUEST_SUPERSEDED: &str = "REQUEST_SUPERSEDED";
    /// 503: the idempotency store is unavailable; retry with the same key
    /// ([`Error::Unavailable`](super::Error::Unavailable)).
    pub const IDEMPOTENCY_STORE_UNAVAILABLE: &str = "IDEMPOTENCY_STORE_UNAVAILABLE";
    /// 500: the guard failed.
    pub const IDEMPOTENCY_INTERNAL_ERROR: &str = "IDEMPOTENCY_INTERNAL_ERROR";
    /// 501: the store does not offer the operation
    /// ([`Error::Unsupported`](super::Error::Unsupported)).
    pub const OPERATION_NOT_SUPPORTED_BY_STORE: &str = "OPERATION_NOT_SUPPORTED_BY_STORE";
    /// 404 from a lookup by key: no request with this key is known, so sending it again with
    /// the same key is safe.
    pub const IDEMPOTENCY_KEY_NOT_FOUND: &str = "IDEMPOTENCY_KEY_NOT_FOUND";
}

/// What an answer that was not kept was, for [`Error::AnswerNotKept`]'s message.
fn not_kept_what(len: Option<usize>, max: usize) -> String {
    match len {
        Some(len) => format!("{len} bytes, above the {max} kept"),
        None => "a stream, passed through as it came".to_owned(),
    }
}

/// `d` rounded up to whole seconds, at least one: what `Retry-After` says. Saturates at
/// `u64::MAX` seconds rather than overflow on a `Duration` that long.
pub(crate) fn whole_seconds(d: Duration) -> u64 {
    d.as_secs()
        .saturating_add(u64::from(d.subsec_nanos() > 0))
        .max(1)
}

/// Why a key was rejected. Carried by [`Error::InvalidKey`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// No key was sent (for HTTP: no `Idempotency-Key` header).
    Missing,
    /// The key is the empty string.
    Empty,
    /// The key is longer than the policy allows.
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The policy's maximum.
        max: usize,
    },
    /// The key holds a byte that is not visible ASCII (a control character, a space, or
    /// non-ASCII).
    InvalidByte {
        /// Offset of the first offending byte.
        index: usize,
    },
    /// The policy requires a UUID and the key is not one.
    NotUuid,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Missing => f.write_str("no idempotency key was given"),
            KeyError::Empty => f.write_str("the key is empty"),
            KeyError::TooLong { len, max } => {
                write!(f, "the key is {len} bytes long, at most {max} are allowed")
            }
            KeyError::InvalidByte { index } => write!(
                f,
                "the key must be visible ASCII (0x21..=0x7E); byte {index} is not"
            ),
            KeyError::NotUuid => f.write_str(
                "the key must be a UUID (8-4-4-4-12 hexadecimal digits, e.g. 0b2c1c6e-1f7b-4f0f-9d3a-8f2f6f0a1111)",
            ),
        }
    }
}

impl std::error::Error for KeyError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_codes() {
        let cases: Vec<(Error, u16, &str)> = vec![
            (
                Error::InvalidKey(KeyError::Empty),
                400,
                "INVALID_IDEMPOTENCY_KEY",
            ),
            (
                Error::InvalidScope {
                    len: 2000,
                    max: 1024,
                },
                400,
                "INVALID_IDEMPOTENCY_SCOPE",
            ),
            (
                Error::InProgress {
                    retry_after: Duration::from_secs(3),
                },
                409,
                "REQUEST_IN_PROGRESS",
            ),
            (Error::KeyReused, 422, "KEY_REUSED_WITH_DIFFERENT_BODY"),
            (Error::FenceLost { fence: 2 }, 409, "REQUEST_SUPERSEDED"),
            (
                Error::Unavailable("down".into()),
                503,
                "IDEMPOTENCY_STORE_UNAVAILABLE",
            ),
            (
                Error::Store("no table".into()),
                500,
                "IDEMPOTENCY_INTERNAL_ERROR",
            ),
        ];
        for (err, status, code) in cases {
            assert_eq!(err.status(), status, "{err}");
            assert_eq!(err.code(), code, "{err}");
        }
        assert_eq!(
            Error::InProgress {
                retry_after: Duration::from_secs(3)
            }
            .retry_after(),
            Some(Duration::from_secs(3))
        );
        assert!(!Error::KeyReused.is_retryable());
    }

    #[test]
    fn retry_after_of_any_duration_is_whole_seconds() {
        // Found by fuzzing (fuzz target `problem`): rounding `Duration::MAX` up overflowed, a
        // panic in debug builds when the error was displayed or rendered as a problem.
        assert_eq!(whole_seconds(Duration::MAX), u64::MAX);
        assert_eq!(whole_seconds(Duration::new(u64::MAX, 1)), u64::MAX);
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(2_100)), 3);
        let e = Error::InProgress {
            retry_after: Duration::MAX,
        };
        assert!(e.to_string().ends_with(&format!("{} s", u64::MAX)), "{e}");
    }
}
