//! Driver errors sorted into "retry later" and "broken", and errors that name their record.

use crate::error::Error;

/// `e`, saying which record it is about.
pub(super) fn within(scope: &str, key: &str, e: Error) -> Error {
    Error::Store(format!("record (scope {scope:?}, key {key:?}): {e}").into())
}

/// Sorts a driver error into "retry later" ([`Error::Unavailable`], HTTP 503) and "broken"
/// ([`Error::Store`], HTTP 500).
pub(crate) fn map_err(e: sqlx::Error) -> Error {
    let transient = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| is_transient_code(&c)),
        _ => false,
    };
    if transient {
        Error::Unavailable(Box::new(e))
    } else {
        Error::Store(Box::new(e))
    }
}

pub(super) fn is_transient_code(code: &str) -> bool {
    // PostgreSQL SQLSTATEs: connection exceptions (08…), insufficient resources (53…), operator
    // intervention such as a shutdown (57P0…), serialization failure, deadlock, lock timeout.
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57P0")
        || matches!(code, "40001" | "40P01" | "55P03")
        // SQLite extended result codes whose primary code is SQLITE_BUSY (5) or SQLITE_LOCKED (6).
        || code.parse::<u32>().is_ok_and(|c| matches!(c & 0xFF, 5 | 6))
}

/// Too many concurrent changes to one record in a row: report it as contention.
pub(crate) fn contention(scope: &str, key: &str) -> Error {
    Error::Unavailable(
        format!("the record ({scope}, {key}) changed under every attempt to claim it").into(),
    )
}
