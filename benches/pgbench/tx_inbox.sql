-- The same transaction through a hand-written inbox: its key, the business insert, its answer.
\set k random(1, 2000000000)
BEGIN;
INSERT INTO idem_pgbench.inbox (key, request_hash) VALUES (:k::text || 'x' || :client_id, 'abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789') ON CONFLICT (key) DO NOTHING;
INSERT INTO idem_pgbench.orders (order_no, amount) VALUES (:k::text, 42);
UPDATE idem_pgbench.inbox SET result = '{"order_no":"1234","amount":42}' WHERE key = :k::text || 'x' || :client_id;
COMMIT;
