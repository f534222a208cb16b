-- The simulated payment gateway's ledger: one money move per idempotency key, the first one
-- answered again. It lives here so that a restart keeps it, as a real gateway's would.
CREATE TABLE IF NOT EXISTS gateway_moves (
    seq             BIGINT AUTO_INCREMENT PRIMARY KEY,
    idempotency_key VARCHAR(255) NOT NULL UNIQUE,
    order_no        VARCHAR(64) NOT NULL,
    amount_cents    BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
