-- The records table as PgStore creates it, in a schema of its own, with 400,000 completed
-- records for the replay scripts. Run: psql -f benches/pgbench/setup.sql
DROP SCHEMA IF EXISTS idem_pgbench CASCADE;
CREATE SCHEMA idem_pgbench;
CREATE TABLE idem_pgbench.idem_records (
    scope text NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL, state text NOT NULL,
    fence bigint NOT NULL, lease_until timestamptz NOT NULL, expires_at timestamptz NOT NULL,
    recovery_point bytea, response_status integer, response_error boolean NOT NULL DEFAULT false,
    response_body bytea, created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, key)
) WITH (fillfactor = 80);
CREATE INDEX ON idem_pgbench.idem_records (expires_at);
CREATE TABLE idem_pgbench.inbox (key text PRIMARY KEY, request_hash text NOT NULL, result text);
CREATE TABLE idem_pgbench.orders (order_no text NOT NULL, amount bigint NOT NULL);
CREATE TABLE idem_pgbench.handwritten_records (
    key text PRIMARY KEY, request_hash text NOT NULL, status text NOT NULL, result text
);
INSERT INTO idem_pgbench.idem_records (scope, key, fingerprint, state, fence, lease_until, expires_at, response_body)
SELECT 'bench', g::text, '\x00', 'completed', 1, now(), now() + interval '1 day', '\x7b7d'
  FROM generate_series(1, 400000) g;
VACUUM ANALYZE idem_pgbench.idem_records;
-- For the pair_*.sql scripts: the records table as PgStore creates it now (format 1, with the
-- columns of resumable work and their partial indexes), and a narrow one (the key, the
-- fingerprint, the fence, one time, the answer) that shows what the row's width costs.
CREATE TABLE idem_pgbench.records_now (
    scope text COLLATE "C" NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL,
    state text NOT NULL CHECK (state IN ('in_progress', 'completed', 'released', 'parked')),
    fence bigint NOT NULL, lease_until timestamptz NOT NULL, expires_at timestamptz NOT NULL,
    recovery_point bytea, attempt integer NOT NULL DEFAULT 1, response_status integer,
    response_error boolean NOT NULL DEFAULT false, response_body bytea, request bytea,
    resume_at timestamptz, note text, created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL, PRIMARY KEY (scope, key)
) WITH (fillfactor = 80);
CREATE INDEX ON idem_pgbench.records_now (expires_at);
CREATE INDEX ON idem_pgbench.records_now (resume_at) WHERE resume_at IS NOT NULL;
CREATE INDEX ON idem_pgbench.records_now (fence) WHERE request IS NOT NULL OR note IS NOT NULL;
CREATE TABLE idem_pgbench.records_narrow (
    scope text COLLATE "C" NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL,
    fence bigint NOT NULL, until_ms bigint NOT NULL, response bytea, PRIMARY KEY (scope, key)
) WITH (fillfactor = 80);
-- records_now without its retention index (`expires_at`), for pair_records_no_retention_index.sql.
CREATE TABLE idem_pgbench.records_no_retention_index (
    LIKE idem_pgbench.records_now INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 80);
CREATE INDEX ON idem_pgbench.records_no_retention_index (resume_at) WHERE resume_at IS NOT NULL;
CREATE INDEX ON idem_pgbench.records_no_retention_index (fence) WHERE request IS NOT NULL OR note IS NOT NULL;
-- records_now with its retention index spread over sixteen parts, each in order, so that
-- concurrent claims do not all insert at the right edge of one B-tree: by a hash of the key
-- (pair_records_bucketed.sql) and by the fence (pair_records_fencebucket.sql).
CREATE TABLE idem_pgbench.records_bucketed (
    LIKE idem_pgbench.records_now INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 80);
CREATE INDEX ON idem_pgbench.records_bucketed ((hashtext(key) & 15), expires_at);
CREATE INDEX ON idem_pgbench.records_bucketed (resume_at) WHERE resume_at IS NOT NULL;
CREATE INDEX ON idem_pgbench.records_bucketed (fence) WHERE request IS NOT NULL OR note IS NOT NULL;
CREATE TABLE idem_pgbench.records_fencebucket (
    LIKE idem_pgbench.records_now INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 80);
CREATE INDEX ON idem_pgbench.records_fencebucket ((fence & 15), expires_at);
CREATE INDEX ON idem_pgbench.records_fencebucket (resume_at) WHERE resume_at IS NOT NULL;
CREATE INDEX ON idem_pgbench.records_fencebucket (fence) WHERE request IS NOT NULL OR note IS NOT NULL;
