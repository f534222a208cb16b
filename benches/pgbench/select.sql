-- A plain read by key: what a replay cannot be cheaper than.
\set k random(1, 400000)
SELECT fence, fingerprint, state, response_status, response_error, response_body, expires_at <= now() AS expired FROM idem_pgbench.idem_records WHERE scope = 'bench' AND key = :k::text;
