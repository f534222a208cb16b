CREATE TABLE user_profile (
    user_id  BIGINT PRIMARY KEY,
    nickname TEXT NOT NULL,
    version  BIGINT NOT NULL DEFAULT 0
);

ALTER TYPE order_status ADD VALUE 'REFUNDED' AFTER 'DONE';
