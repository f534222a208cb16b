CREATE TABLE user_profile (
    user_id  INTEGER PRIMARY KEY,
    nickname TEXT NOT NULL,
    revision TEXT NOT NULL DEFAULT '0'
);

ALTER TABLE orders ADD COLUMN note TEXT;
