CREATE TABLE user_profile (
  user_id  BIGINT NOT NULL PRIMARY KEY,
  nickname VARCHAR(64) NOT NULL,
  revision VARCHAR(16) NOT NULL DEFAULT '0',
  version  INT UNSIGNED NOT NULL DEFAULT 0
) ENGINE=InnoDB;

-- A payment's reference was unique until a payment could be retried under it.
ALTER TABLE orders ADD COLUMN payment_ref VARCHAR(64) NULL, ADD UNIQUE KEY orders_payment_ref (payment_ref);
ALTER TABLE orders DROP INDEX orders_payment_ref;
ALTER TABLE orders CHANGE COLUMN paid_by paid_by_user VARCHAR(64) NULL;
