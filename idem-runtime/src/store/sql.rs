//! What the SQL stores share: identifier checks and error classification.

use crate::error::Error;

/// The default table name of the SQL stores.
pub(crate) const DEFAULT_TABLE: &str = "idem_records";

/// Checks that `name` is an identifier (optionally `schema.table`) and returns it quoted.
///
/// Only `[A-Za-z_][A-Za-z0-9_]*` parts of at most 63 bytes are accepted, so the quoted form can
/// never contain a quote: a table name is configuration, but it is spliced into SQL text, and
/// nothing that could close a quote gets there.
pub(crate) fn quote_table(name: &str) -> Result<String, Error> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 || parts.iter().any(|p| !is_identifier(p)) {
        return Err(Error::Config(format!(
            "table name {name:?} is not an identifier: use letters, digits and `_` (not first), at most 63 bytes, optionally `schema.table`"
        )));
    }
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
}

/// Whether `s` is a plain SQL identifier.
pub(crate) fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

#[cfg(feature = "postgres")]
/// The unquoted last part of a table name, for naming its indexes.
pub(crate) fn base_name(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
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

fn is_transient_code(code: &str) -> bool {
    // PostgreSQL SQLSTATEs: connection exceptions (08…), insufficient resources (53…), operator
    // intervention such as a shutdown (57P0…), serialization failure, deadlock, lock timeout.
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57P0")
        || matches!(code, "40001" | "40P01" | "55P03")
        // SQLite extended result codes whose primary code is SQLITE_BUSY (5) or SQLITE_LOCKED (6).
        || code.parse::<u32>().is_ok_and(|c| matches!(c & 0xFF, 5 | 6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert_eq!(quote_table("idem_records").unwrap(), "\"idem_records\"");
        assert_eq!(quote_table("app.idem").unwrap(), "\"app\".\"idem\"");
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
            assert!(quote_table(bad).is_err(), "{bad:?} accepted");
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
}

/// The columns `begin` reads from an existing record, the same in every SQL store.
#[derive(Debug)]
pub(crate) struct CurRow {
    pub(crate) fence: i64,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) state: String,
    pub(crate) response_status: Option<i32>,
    pub(crate) response_error: bool,
    pub(crate) response_body: Option<Vec<u8>>,
    pub(crate) expired: bool,
    pub(crate) lease_left_ms: i64,
}

impl CurRow {
    pub(crate) fn seen(
        &self,
        fingerprint: &crate::fingerprint::Fingerprint,
    ) -> crate::lifecycle::Seen {
        crate::lifecycle::Seen {
            state: crate::lifecycle::SeenState::parse(&self.state),
            same_fingerprint: self.fingerprint == fingerprint.as_bytes(),
            expired: self.expired,
            lease_left_ms: self.lease_left_ms,
        }
    }

    pub(crate) fn into_response(self) -> crate::record::StoredResponse {
        stored_response(
            self.response_status,
            self.response_error,
            self.response_body,
        )
    }
}

pub(crate) fn stored_response(
    status: Option<i32>,
    is_error: bool,
    body: Option<Vec<u8>>,
) -> crate::record::StoredResponse {
    crate::record::StoredResponse {
        status: status.and_then(|s| u16::try_from(s).ok()),
        is_error,
        body: body.map(bytes::Bytes::from).unwrap_or_default(),
    }
}

pub(crate) fn fence_from_db(fence: i64) -> Result<u64, Error> {
    u64::try_from(fence)
        .map_err(|_| Error::Store(format!("negative fence {fence} in the store").into()))
}

pub(crate) fn fence_to_db(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}

pub(crate) fn ms(d: std::time::Duration) -> i64 {
    crate::clock::duration_ms(d)
}

/// Too many concurrent changes to one record in a row: report it as contention.
pub(crate) fn contention(scope: &str, key: &str) -> Error {
    Error::Unavailable(
        format!("the record ({scope}, {key}) changed under every attempt to claim it").into(),
    )
}

/// Runs `release` for a claim in the background, on the current Tokio runtime if there is one.
pub(crate) fn spawn_release<F>(scope: &str, key: &str, release: F)
where
    F: std::future::Future<Output = Result<(), Error>> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(async move {
                if let Err(e) = release.await
                    && !matches!(e, Error::FenceLost { .. })
                {
                    tracing::warn!(target: "idem", error = %e, "releasing a dropped claim failed; it is re-claimed when its lease runs out");
                }
            });
        }
        Err(_) => tracing::warn!(
            target: "idem",
            scope,
            key,
            "a claim was dropped outside a Tokio runtime; it is re-claimed when its lease runs out"
        ),
    }
}
