-- Orders. `status` moves through the lifecycle of `OrderStatus` (db.rs): the CHECK lists its
-- states, and the macros refuse at compile time a transition to a state not listed here.
CREATE TABLE IF NOT EXISTS orders (
    id           BIGSERIAL PRIMARY KEY,
    order_no     TEXT NOT NULL UNIQUE,
    user_id      BIGINT NOT NULL,
    sku_id       BIGINT NOT NULL,
    qty          BIGINT NOT NULL,
    amount_cents BIGINT NOT NULL,
    status       TEXT NOT NULL DEFAULT 'PENDING'
                 CHECK (status IN ('PENDING', 'PAID', 'SHIPPED', 'DONE', 'CANCELLED')),
    paid_at      TIMESTAMPTZ,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
