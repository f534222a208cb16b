//! MySQL's and MariaDB's tables.
//!
//! Scopes and keys are `VARBINARY`: compared byte by byte, as every other store compares them
//! (a `_ci` collation would make two keys that differ in case one record, and `PAD SPACE` two
//! that differ in trailing spaces), and short enough together for InnoDB's 3,072-byte key.
//! Times are `BIGINT` milliseconds since the Unix epoch, read from the server's clock in UTC,
//! so that no session's time zone changes what a lease means. Indexes are declared in the
//! table: MySQL 8 has no `CREATE INDEX IF NOT EXISTS`, and neither has partial indexes.

/// The records table of MySQL and MariaDB (`idem_records`) with its indexes on `expires_at`
/// (the purge, the operators' listings), `resume_at` (the completers) and `work_fence` (the
/// operators' index of unfinished work: a virtual column, the fence of a record that may hold
/// work, else `NULL`, as MySQL has no partial index).
pub const MYSQL_RECORDS: &[&str] = &["CREATE TABLE IF NOT EXISTS `idem_records` (
    scope VARBINARY(1024) NOT NULL,
    `key` VARBINARY(1024) NOT NULL,
    fingerprint VARBINARY(64) NOT NULL,
    state VARCHAR(16) CHARACTER SET ascii NOT NULL CHECK (state IN ('in_progress', 'completed', 'released', 'parked')),
    fence BIGINT NOT NULL,
    lease_until BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    recovery_point LONGBLOB,
    attempt INT NOT NULL DEFAULT 1,
    response_status INT,
    response_error BOOLEAN NOT NULL DEFAULT FALSE,
    response_body LONGBLOB,
    request LONGBLOB,
    resume_at BIGINT,
    note TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    work_fence BIGINT AS (CASE WHEN request IS NOT NULL OR note IS NOT NULL THEN fence END) VIRTUAL,
    PRIMARY KEY (scope, `key`),
    INDEX `idem_records_expires_at_idx` (expires_at),
    INDEX `idem_records_resume_at_idx` (resume_at),
    INDEX `idem_records_work_idx` (work_fence)
) ENGINE = InnoDB"];
