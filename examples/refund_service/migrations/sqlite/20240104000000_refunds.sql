-- Refunds as a sub-flow: PAID → REFUNDING (won by one refund request, named in
-- `refund_request`) → CANCELLED once the gateway moved the money (`refund_id`), or back to PAID
-- when it declined. SQLite cannot change a CHECK constraint in place: the table is rebuilt with
-- the new state and columns, its rows copied.
CREATE TABLE orders_new (
    id             INTEGER PRIMARY KEY,
    order_no       TEXT NOT NULL UNIQUE,
    user_id        INTEGER NOT NULL,
    sku_id         INTEGER NOT NULL,
    qty            INTEGER NOT NULL,
    amount_cents   INTEGER NOT NULL,
    status         TEXT NOT NULL DEFAULT 'PENDING'
                   CHECK (status IN ('PENDING', 'PAID', 'REFUNDING', 'SHIPPED', 'DONE', 'CANCELLED')),
    paid_at        TEXT,
    created_at     TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
    refund_request TEXT,
    refund_id      TEXT
);

INSERT INTO orders_new (id, order_no, user_id, sku_id, qty, amount_cents, status, paid_at, created_at)
SELECT id, order_no, user_id, sku_id, qty, amount_cents, status, paid_at, created_at FROM orders;

DROP TABLE orders;

ALTER TABLE orders_new RENAME TO orders;
