ALTER TABLE orders ADD COLUMN paid_at DATETIME(3) NULL AFTER status, ADD COLUMN paid_by VARCHAR(64) NULL;

-- An order can be refunded: the ENUM grows a state.
ALTER TABLE orders MODIFY COLUMN status
    ENUM('PENDING', 'PAID', 'SHIPPED', 'DONE', 'REFUNDED', 'CANCELLED') NOT NULL DEFAULT 'PENDING';

-- Refund states are a CHECK list.
CREATE TABLE refunds (
  id           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  order_no     VARCHAR(64) NOT NULL,
  state        VARCHAR(16) NOT NULL DEFAULT 'REQUESTED',
  amount_cents BIGINT NOT NULL,
  CONSTRAINT refund_state CHECK (state IN ('REQUESTED', 'SENT', 'FAILED')),
  CONSTRAINT refunds_order FOREIGN KEY (order_no) REFERENCES orders (order_no)
) ENGINE=InnoDB;
