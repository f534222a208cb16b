-- Orders. `status` moves through the lifecycle of `OrderStatus` (db.rs): the CHECK lists its
-- states, and the macros refuse at compile time a transition to a state not listed here.
CREATE TABLE IF NOT EXISTS orders (
    id           INTEGER PRIMARY KEY,
    order_no     TEXT NOT NULL UNIQUE,
    user_id      INTEGER NOT NULL,
    sku_id       INTEGER NOT NULL,
    qty          INTEGER NOT NULL,
    amount_cents INTEGER NOT NULL,
    status       TEXT NOT NULL DEFAULT 'PENDING'
                 CHECK (status IN ('PENDING', 'PAID', 'SHIPPED', 'DONE', 'CANCELLED')),
    paid_at      TEXT,
    created_at   TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
