-- A hand-written guard's two statements, each in its own commit: the PROCESSING row, then DONE
-- with the answer.
\set k random(1000000, 2000000000)
INSERT INTO idem_pgbench.handwritten_records (key, request_hash, status) VALUES (:k::text, 'abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789', 'PROCESSING');
UPDATE idem_pgbench.handwritten_records SET status = 'DONE', result = '{"order_no":"r0","amount":100}' WHERE key = :k::text;
