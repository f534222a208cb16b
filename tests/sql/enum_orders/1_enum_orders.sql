-- An order whose state is a PostgreSQL enum type: text bound to it must be cast, and it is
-- read back as text.
CREATE TYPE order_state AS ENUM ('PENDING', 'PAID', 'CANCELLED');

CREATE TABLE enum_orders (
    order_no     TEXT PRIMARY KEY,
    state        order_state NOT NULL DEFAULT 'PENDING',
    amount_cents BIGINT NOT NULL
);
