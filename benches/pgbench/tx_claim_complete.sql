-- A transactional first claim as the SQL stores send it: the claim, a business insert, the
-- completion, one commit.
\set k random(1, 2000000000)
BEGIN;
INSERT INTO idem_pgbench.idem_records (scope, key, fingerprint, state, fence, lease_until, expires_at, created_at, updated_at) VALUES ('bench', :k::text || 'x' || :client_id, '\x0102030405060708091011121314151617181920212223242526272829303132'::bytea, 'in_progress', (EXTRACT(EPOCH FROM now()) * 1000)::int8, now() + 300000::int8 * interval '1 millisecond', now() + 86400000::int8 * interval '1 millisecond', now(), now()) ON CONFLICT (scope, key) DO NOTHING RETURNING fence;
INSERT INTO idem_pgbench.orders (order_no, amount) VALUES (:k::text, 42);
UPDATE idem_pgbench.idem_records SET state = 'completed', response_status = NULL, response_error = false, response_body = '\x7b226f726465725f6e6f223a2231323334222c22616d6f756e74223a34327d'::bytea, recovery_point = NULL, updated_at = now() WHERE scope = 'bench' AND key = :k::text || 'x' || :client_id AND ((fence = 1 AND state = 'in_progress' AND expires_at > now()) OR true) RETURNING fence;
COMMIT;
