CREATE TABLE orders (
    id       BIGSERIAL PRIMARY KEY,
    order_no TEXT NOT NULL UNIQUE,
    status   TEXT NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'PAID'))
);

-- A statement no SQL parser here reads: what it does to `orders` is unknown.
ALTER TABLE orders FROBNICATE COLUMN status;
