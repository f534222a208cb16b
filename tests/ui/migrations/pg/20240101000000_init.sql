-- The order lifecycle's states are an enum type.
CREATE TYPE order_status AS ENUM ('PENDING', 'PAID', 'SHIPPED', 'DONE', 'CANCELLED');

CREATE TABLE orders (
    id           BIGSERIAL PRIMARY KEY,
    order_no     TEXT NOT NULL UNIQUE,
    user_id      BIGINT NOT NULL,
    amount_cents BIGINT NOT NULL CHECK (amount_cents >= 0),
    status       order_status NOT NULL DEFAULT 'PENDING',
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
