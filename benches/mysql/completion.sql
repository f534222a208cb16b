-- The completion on MariaDB's server alone, as MySqlStore sends it before and after it asked
-- only for the live claim of its fence: a table as MySqlStore creates it, 5,000 in-progress
-- records written by fill(n, tag), and one procedure per statement that completes them in one
-- transaction (no client, no round trip). Run:
--   mysql -uroot test < benches/mysql/completion.sql
--   mysql -uroot idem_cbench -e "CALL fill(5000, 'a1')"; time mysql -uroot idem_cbench -e "CALL old_complete(5000, 'a1')"
--   mysql -uroot idem_cbench -e "CALL fill(5000, 'b1')"; time mysql -uroot idem_cbench -e "CALL new_complete(5000, 'b1')"
-- alternating, with a new tag for each pair. DROP DATABASE idem_cbench afterwards.
DROP DATABASE IF EXISTS idem_cbench; CREATE DATABASE idem_cbench; USE idem_cbench;
CREATE TABLE r (
    scope VARBINARY(1024) NOT NULL, `key` VARBINARY(1024) NOT NULL, fingerprint VARBINARY(64) NOT NULL,
    state VARCHAR(16) CHARACTER SET ascii NOT NULL CHECK (state IN ('in_progress', 'completed', 'released', 'parked')),
    fence BIGINT NOT NULL, lease_until BIGINT NOT NULL, expires_at BIGINT NOT NULL, recovery_point LONGBLOB,
    attempt INT NOT NULL DEFAULT 1, response_status INT, response_error BOOLEAN NOT NULL DEFAULT FALSE,
    response_body LONGBLOB, request LONGBLOB, resume_at BIGINT, note TEXT, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
    work_fence BIGINT AS (CASE WHEN request IS NOT NULL OR note IS NOT NULL THEN fence END) VIRTUAL,
    PRIMARY KEY (scope, `key`), INDEX (expires_at), INDEX (resume_at, created_at), INDEX (work_fence, created_at)
) ENGINE = InnoDB;
DELIMITER //
CREATE PROCEDURE fill(n INT, tag VARCHAR(8))
BEGIN
  DECLARE i INT DEFAULT 0;
  START TRANSACTION;
  WHILE i < n DO
    INSERT INTO r (scope, `key`, fingerprint, state, fence, lease_until, expires_at, created_at, updated_at)
    VALUES ('bench', CONCAT(tag, i), REPEAT('x', 32), 'in_progress', i, 9e15, 9e15, 0, 0);
    SET i = i + 1;
  END WHILE;
  COMMIT;
END //
CREATE PROCEDURE old_complete(n INT, tag VARCHAR(8))
BEGIN
  DECLARE i INT DEFAULT 0; DECLARE k VARBINARY(64);
  START TRANSACTION;
  WHILE i < n DO
    SET k = CONCAT(tag, i);
    UPDATE r SET state = 'completed', response_status = 201, response_error = FALSE, response_body = '{"id":1}', recovery_point = NULL, request = NULL, resume_at = NULL, note = NULL,
      updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)
    WHERE scope = 'bench' AND `key` = k AND ((fence = i AND state = 'in_progress' AND (expires_at > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) OR (state = 'parked' OR (state = 'in_progress' AND (request IS NOT NULL OR note IS NOT NULL)))))
      OR (fence = i AND state = 'completed' AND expires_at > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AND response_status <=> 201 AND response_error = FALSE AND response_body = '{"id":1}'));
    SET i = i + 1;
  END WHILE;
  COMMIT;
END //
CREATE PROCEDURE new_complete(n INT, tag VARCHAR(8))
BEGIN
  DECLARE i INT DEFAULT 0; DECLARE k VARBINARY(64);
  START TRANSACTION;
  WHILE i < n DO
    SET k = CONCAT(tag, i);
    UPDATE r SET state = 'completed', response_status = 201, response_error = FALSE, response_body = '{"id":1}', recovery_point = NULL, request = NULL, resume_at = NULL, note = NULL,
      updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)
    WHERE scope = 'bench' AND `key` = k AND (fence = i AND state = 'in_progress' AND (expires_at > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) OR (state = 'parked' OR (state = 'in_progress' AND (request IS NOT NULL OR note IS NOT NULL)))));
    SET i = i + 1;
  END WHILE;
  COMMIT;
END //
DELIMITER ;
