-- The plain first-claim insert both SQL stores send first (`INSERT … ON CONFLICT DO NOTHING`).
\set k random(1000000, 2000000000)
INSERT INTO idem_pgbench.idem_records (scope, key, fingerprint, state, fence, lease_until, expires_at, created_at, updated_at) VALUES ('bench', :k::text, '\x00'::bytea, 'in_progress', (EXTRACT(EPOCH FROM now()) * 1000)::int8, now() + 300000::int8 * interval '1 millisecond', now() + 86400000::int8 * interval '1 millisecond', now(), now()) ON CONFLICT (scope, key) DO NOTHING RETURNING fence;
