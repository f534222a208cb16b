-- The placeholder insert of a hand-written guard (insert a PROCESSING row, work, update it).
\set k random(1000000, 2000000000)
INSERT INTO idem_pgbench.handwritten_records (key, request_hash, status) VALUES (:k::text, 'abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789', 'PROCESSING') ON CONFLICT DO NOTHING;
