-- The simulated payment gateway's ledger: one money move per idempotency key, the first one
-- answered again. It lives here so that a restart keeps it, as a real gateway's would.
CREATE TABLE IF NOT EXISTS gateway_moves (
    seq             INTEGER PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE,
    order_no        TEXT NOT NULL,
    amount_cents    INTEGER NOT NULL
);
