-- Refunds as a sub-flow: PAID → REFUNDING (won by one refund request, named in
-- `refund_request`) → CANCELLED once the gateway moved the money (`refund_id`), or back to PAID
-- when it declined. One statement: MySQL commits each DDL statement on its own.
ALTER TABLE orders
    MODIFY status ENUM('PENDING', 'PAID', 'REFUNDING', 'SHIPPED', 'DONE', 'CANCELLED') NOT NULL DEFAULT 'PENDING',
    ADD COLUMN refund_request VARCHAR(255),
    ADD COLUMN refund_id VARCHAR(64);
