-- Profiles, updated with optimistic locking on `version`.
CREATE TABLE IF NOT EXISTS user_profile (
    user_id  BIGINT PRIMARY KEY,
    nickname VARCHAR(64) NOT NULL,
    version  BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The demo users, so the profile endpoints have something to update.
INSERT INTO user_profile (user_id, nickname, version)
VALUES (1, 'demo', 0), (2, 'alice', 0), (3, 'bob', 0)
ON DUPLICATE KEY UPDATE user_id = user_id;
