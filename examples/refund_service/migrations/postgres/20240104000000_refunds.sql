-- Refunds as a sub-flow: PAID → REFUNDING (won by one refund request, named in
-- `refund_request`) → CANCELLED once the gateway moved the money (`refund_id`), or back to PAID
-- when it declined.
ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_status_check;

ALTER TABLE orders
    ADD CONSTRAINT orders_status_check
    CHECK (status IN ('PENDING', 'PAID', 'REFUNDING', 'SHIPPED', 'DONE', 'CANCELLED'));

ALTER TABLE orders ADD COLUMN refund_request TEXT;

ALTER TABLE orders ADD COLUMN refund_id TEXT;
