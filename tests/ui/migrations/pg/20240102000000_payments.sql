ALTER TABLE orders ADD COLUMN paid_at TIMESTAMPTZ;
ALTER TABLE orders ADD COLUMN paid_by TEXT;

-- Refund states are a CHECK list.
CREATE TABLE refunds (
    id           BIGSERIAL PRIMARY KEY,
    order_no     TEXT NOT NULL REFERENCES orders (order_no),
    state        TEXT NOT NULL DEFAULT 'REQUESTED'
                 CONSTRAINT refund_state CHECK (state IN ('REQUESTED', 'SENT', 'FAILED')),
    amount_cents BIGINT NOT NULL
);
