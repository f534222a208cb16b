-- pair_records.sql on a narrow row: the key, the fingerprint, the fence, one time, the answer.
\set k random(1000000, 2000000000)
INSERT INTO idem_pgbench.records_narrow (scope, key, fingerprint, fence, until_ms) VALUES ('bench', :k::text, '\x02d1d181ed009737948bb4ef95456ceea18d01ba5a6aa5baff8f3b9a50922e0e'::bytea, (EXTRACT(EPOCH FROM now()) * 1000)::int8, 300000) ON CONFLICT (scope, key) DO NOTHING RETURNING fence \gset
UPDATE idem_pgbench.records_narrow SET response = '\x7b226f726465725f6e6f223a227230222c22616d6f756e74223a3130307d'::bytea WHERE scope = 'bench' AND key = :k::text AND fence = :fence AND response IS NULL;
