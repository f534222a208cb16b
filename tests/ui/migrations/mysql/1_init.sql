-- The order lifecycle's states are the column's ENUM.
CREATE TABLE `orders` (
  `id`           BIGINT NOT NULL AUTO_INCREMENT,
  `order_no`     VARCHAR(64) NOT NULL,
  `user_id`      BIGINT NOT NULL,
  `amount_cents` BIGINT NOT NULL,
  `status`       ENUM('PENDING', 'PAID', 'SHIPPED', 'DONE', 'CANCELLED') NOT NULL DEFAULT 'PENDING',
  `express`      TINYINT(1) NOT NULL DEFAULT 0,
  `created_at`   DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (`id`),
  UNIQUE KEY `orders_order_no` (`order_no`),
  KEY `orders_by_user` (`user_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
