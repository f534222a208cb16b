-- Profiles, updated with optimistic locking on `version`.
CREATE TABLE IF NOT EXISTS user_profile (
    user_id  INTEGER PRIMARY KEY,
    nickname TEXT NOT NULL,
    version  INTEGER NOT NULL
);

-- The demo users, so the profile endpoints have something to update.
INSERT INTO user_profile (user_id, nickname, version)
VALUES (1, 'demo', 0), (2, 'alice', 0), (3, 'bob', 0)
ON CONFLICT (user_id) DO NOTHING;
