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
/// work, else `NULL`, as MySQL has no partial index). The table's comment names the
/// [format](super::RECORDS_FORMAT) of its records.
///
/// With no partial index, every record has an entry in the last two indexes, `NULL` for almost
/// all of them. InnoDB orders equal entries by the primary key, so a new record's `NULL` entry
/// would land at a random place (keys are random), a page read and a page write outside the
/// buffer pool once the table outgrows it. `created_at` after the indexed column orders those
/// entries by time instead: a new record's goes where the last one's went, and the queries
/// that read the indexes (by `resume_at`, by `work_fence`) use them as before.
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
    INDEX `idem_records_resume_at_idx` (resume_at, created_at),
    INDEX `idem_records_work_idx` (work_fence, created_at)
) ENGINE = InnoDB COMMENT = 'idem records, format 1'"];

/// The outbox table of MySQL and MariaDB (`idem_outbox`) and its indexes, declared in the
/// table: waiting events by partition (a relay's check that an event heads its partition reads
/// only the partition's unsent, unparked events), events by when they were sent (the relays'
/// scan of unsent events in order, and the purge) and parked events.
///
/// Ids, topics and partition keys are `VARBINARY(255)`, as long as an event may have them
/// ([`Event::validate`](crate::outbox::Event::validate)): an id is unique byte for byte, and
/// two partition keys that differ only in case are two partitions.
pub const MYSQL_OUTBOX: &[&str] = &["CREATE TABLE IF NOT EXISTS `idem_outbox` (
    seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id VARBINARY(255) NOT NULL,
    topic VARBINARY(255) NOT NULL,
    partition_key VARBINARY(255) NOT NULL,
    payload LONGBLOB NOT NULL,
    created_at BIGINT NOT NULL,
    sent_at BIGINT,
    lease_until BIGINT,
    lease_owner TEXT,
    attempts INT NOT NULL DEFAULT 0,
    failures INT NOT NULL DEFAULT 0,
    parked_at BIGINT,
    last_error LONGTEXT,
    UNIQUE (id),
    INDEX `idem_outbox_pending_idx` (partition_key, sent_at, parked_at, seq),
    INDEX `idem_outbox_sent_idx` (sent_at),
    INDEX `idem_outbox_parked_idx` (parked_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4"];
