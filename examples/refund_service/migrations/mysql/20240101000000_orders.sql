-- Orders. `status` moves through the lifecycle of `OrderStatus` (db.rs): the ENUM lists its
-- states, and the macros refuse at compile time a transition to a state not listed here.
-- Text is compared byte for byte (`utf8mb4_bin`), as on the other databases: `ord-1` is not
-- `ORD-1`.
CREATE TABLE IF NOT EXISTS orders (
    id           BIGINT AUTO_INCREMENT PRIMARY KEY,
    order_no     VARCHAR(64) NOT NULL UNIQUE,
    user_id      BIGINT NOT NULL,
    sku_id       BIGINT NOT NULL,
    qty          BIGINT NOT NULL,
    amount_cents BIGINT NOT NULL,
    status       ENUM('PENDING', 'PAID', 'SHIPPED', 'DONE', 'CANCELLED') NOT NULL DEFAULT 'PENDING',
    paid_at      DATETIME(6),
    created_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
