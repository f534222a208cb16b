//! SQLite's tables.

use super::{PARKED_INDEX, PENDING_INDEX, RESUME_INDEX, SENT_INDEX, WORK_INDEX};

/// The records table of SQLite (`idem_records`) and its indexes on `expires_at` and
/// `resume_at`, and of the records that may hold unfinished work. Timestamps are
/// integer milliseconds since the Unix epoch, read from SQLite's own clock. A comment in the
/// table's definition, which SQLite keeps, names the [format](super::RECORDS_FORMAT) of its
/// records. The check on `state` is written as comparisons, not `IN (…)`: SQLite evaluates an
/// `IN` list of more than two values through a temporary index, which every write that sets
/// the state would build again.
pub const SQLITE_RECORDS: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS \"idem_records\" ( -- idem records, format 1
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint BLOB NOT NULL,
    state TEXT NOT NULL CHECK (state = 'in_progress' OR state = 'completed' OR state = 'released' OR state = 'parked'),
    fence INTEGER NOT NULL,
    lease_until INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    recovery_point BLOB,
    attempt INTEGER NOT NULL DEFAULT 1,
    response_status INTEGER,
    response_error INTEGER NOT NULL DEFAULT 0,
    response_body BLOB,
    request BLOB,
    resume_at INTEGER,
    note TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS \"idem_records_expires_at_idx\" ON \"idem_records\" (expires_at)",
    RESUME_INDEX,
    WORK_INDEX,
];

/// The outbox table of SQLite (`idem_outbox`) and its indexes, as [`POSTGRES_OUTBOX`](super::POSTGRES_OUTBOX).
pub const SQLITE_OUTBOX: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS \"idem_outbox\" (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    topic TEXT NOT NULL,
    partition_key TEXT NOT NULL,
    payload BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    sent_at INTEGER,
    lease_until INTEGER,
    lease_owner TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    parked_at INTEGER,
    last_error TEXT
)",
    PENDING_INDEX,
    SENT_INDEX,
    PARKED_INDEX,
];
