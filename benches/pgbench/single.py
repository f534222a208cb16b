#!/usr/bin/env python3
"""A separate-commits call's two statements, N times, as a script for `postgres --single`.

    python3 benches/pgbench/single.py LAYOUT N > calls.sql

`benches/pg_instructions.sh` runs the script under callgrind, in a stand-alone backend of a
database of its own: the server's own work, counted in instructions, without the client, the
network or the machine's load. The calls are a PL/pgSQL loop (`DO`), whose statements are
planned once and kept, as a client's prepared statements are: each call is the first claim (the
store's `INSERT … ON CONFLICT DO NOTHING RETURNING fence`) and the fenced completion (the store's
`UPDATE … RETURNING fence`, with the fence the claim returned), each committed on its own.

LAYOUT is the records table:

- `handwritten`: a hand-written guard's (key, request hash, status, result): a PROCESSING row,
  then DONE with the answer;
- `domain`: the table as `PgStore` creates it, its states a domain's check;
- `table_check`: the same with the states in the table's own check, as before;
- `no_check`: with no check on the states at all;
- `no_times`, `no_retention_index`, `no_partial_indexes`: `domain` without `created_at` and
  `updated_at`, without the index on `expires_at`, without the two partial indexes;
- `narrow`: the key, the fingerprint, the fence, one time and the answer;
- `resume_index_only`, `work_index_only`: `domain` with one of its two partial indexes, the
  completers' (`resume_at`) or the unfinished work's (`fence`); `plain_indexes`: with both as
  indexes of every row, without their conditions.

A transactional call's two statements instead, one commit for both (the body's own statement
left out), on the `domain` table:

- `tx_lock`: the claim as `PgStore` sends it, the identity's advisory lock the condition of the
  insert's `SELECT`;
- `tx_lock_with`: the claim as it was, a `WITH` that takes the lock, inserts, and answers both;
- `tx_no_lock`: the single-row claim, without a lock;
- `tx_handwritten`: the hand-written guard's two statements, in one commit.
"""

import sys

FP = "'\\x02d1d181ed009737948bb4ef95456ceea18d01ba5a6aa5baff8f3b9a50922e0e'::bytea"
BODY = "'\\x7b226f726465725f6e6f223a227230222c22616d6f756e74223a3130307d'::bytea"
STATES = "('in_progress', 'completed', 'released', 'parked')"
COLUMNS = """scope text COLLATE "C" NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL,
    state {state}, fence bigint NOT NULL, lease_until timestamptz NOT NULL,
    expires_at timestamptz NOT NULL, recovery_point bytea, attempt integer NOT NULL DEFAULT 1,
    response_status integer, response_error boolean NOT NULL DEFAULT false, response_body bytea,
    request bytea, resume_at timestamptz, note text{times}, PRIMARY KEY (scope, key)"""
TIMES = ", created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL"

out = []


def stmt(s):
    out.append(s.strip() + ";\n\n")


def loop(claim, done, one_commit=False):
    """A DO block of N calls: `claim` returns the fence into `f`, `done` is fenced by `f`; each
    committed on its own, or both in one commit."""
    between = "" if one_commit else "COMMIT; "
    return ("DO $$ DECLARE f int8; g int8; locked bool; BEGIN FOR i IN 1..{n} LOOP "
            f"{claim}; {between}{done}; "
            "IF NOT FOUND THEN RAISE EXCEPTION 'call %: the completion matched no row', i; END IF; "
            "COMMIT; END LOOP; END $$")


def records(check="domain", times=True, retention=True, partial=True, tx=None):
    if check == "domain":
        stmt(f"CREATE DOMAIN idem_state AS text CHECK (VALUE IN {STATES})")
        state = "idem_state NOT NULL"
    elif check == "table":
        state = f"text NOT NULL CHECK (state IN {STATES})"
    else:
        state = "text NOT NULL"
    columns = COLUMNS.format(state=state, times=TIMES if times else "")
    stmt(f"CREATE TABLE t ({columns}) WITH (fillfactor = 80)")
    if retention:
        stmt("CREATE INDEX ON t (expires_at)")
    if partial in (True, "resume"):
        stmt("CREATE INDEX ON t (resume_at) WHERE resume_at IS NOT NULL")
    if partial in (True, "work"):
        stmt("CREATE INDEX ON t (fence) WHERE request IS NOT NULL OR note IS NOT NULL")
    if partial == "plain":
        stmt("CREATE INDEX ON t (resume_at)")
        stmt("CREATE INDEX ON t (fence)")
    tc, tv, tu = (", created_at, updated_at", ", now(), now()", ", updated_at = now()") if times else ("", "", "")
    columns = ("scope, key, fingerprint, state, fence, lease_until, expires_at, request, "
               f"resume_at{tc}")
    values = (f"'bench', 'k' || i, {FP}, 'in_progress', "
              "(EXTRACT(EPOCH FROM now()) * 1000)::int8, now() + 300000::int8 * interval '1 millisecond', "
              "now() + 86400000::int8 * interval '1 millisecond', NULL::bytea, "
              f"CASE WHEN NULL::bytea IS NULL THEN NULL ELSE now() END{tv}")
    conflict = "ON CONFLICT (scope, key) DO NOTHING RETURNING fence"
    if tx == "lock":
        claim = (f"INSERT INTO t ({columns}) SELECT {values} WHERE pg_try_advisory_xact_lock(i) "
                 f"{conflict} INTO f")
    elif tx == "lock_with":
        claim = ("WITH lock AS (SELECT pg_try_advisory_xact_lock(i) AS got), "
                 f"claimed AS (INSERT INTO t ({columns}) SELECT {values} FROM lock WHERE lock.got "
                 f"{conflict}) SELECT (SELECT got FROM lock) AS got, "
                 "(SELECT fence FROM claimed) AS fence INTO locked, f")
    else:
        claim = f"INSERT INTO t ({columns}) VALUES ({values}) {conflict} INTO f"
    return loop(
        claim,
        "UPDATE t SET state = 'completed', response_status = NULL, response_error = false, "
        f"response_body = {BODY}, recovery_point = NULL, request = NULL, resume_at = NULL, "
        f"note = NULL{tu} WHERE scope = 'bench' AND key = 'k' || i AND fence = f "
        "AND state = 'in_progress' AND (expires_at > now() OR (state = 'parked' "
        "OR (state = 'in_progress' AND (request IS NOT NULL OR note IS NOT NULL)))) "
        "RETURNING fence INTO g",
        one_commit=tx is not None)


def handwritten(one_commit=False):
    stmt("CREATE TABLE t (key text PRIMARY KEY, request_hash text NOT NULL, status text NOT NULL, result text)")
    return loop(
        "INSERT INTO t (key, request_hash, status) VALUES ('k' || i, "
        "'abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789', 'PROCESSING')",
        "UPDATE t SET status = 'DONE', result = '{\"order_no\":\"r0\",\"amount\":100}' "
        "WHERE key = 'k' || i", one_commit=one_commit)


def narrow():
    stmt('CREATE TABLE t (scope text COLLATE "C" NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL, '
         "fence bigint NOT NULL, until_ms bigint NOT NULL, response bytea, PRIMARY KEY (scope, key)) "
         "WITH (fillfactor = 80)")
    return loop(
        "INSERT INTO t (scope, key, fingerprint, fence, until_ms) VALUES ('bench', 'k' || i, "
        f"{FP}, (EXTRACT(EPOCH FROM now()) * 1000)::int8, 300000) "
        "ON CONFLICT (scope, key) DO NOTHING RETURNING fence INTO f",
        f"UPDATE t SET response = {BODY} WHERE scope = 'bench' AND key = 'k' || i "
        "AND fence = f AND response IS NULL")


LAYOUTS = {
    "handwritten": handwritten,
    "domain": records,
    "table_check": lambda: records(check="table"),
    "no_check": lambda: records(check=None),
    "no_times": lambda: records(times=False),
    "no_retention_index": lambda: records(retention=False),
    "no_partial_indexes": lambda: records(partial=False),
    "narrow": narrow,
    "resume_index_only": lambda: records(partial="resume"),
    "work_index_only": lambda: records(partial="work"),
    "plain_indexes": lambda: records(partial="plain"),
    "tx_lock": lambda: records(tx="lock"),
    "tx_lock_with": lambda: records(tx="lock_with"),
    "tx_no_lock": lambda: records(tx="none"),
    "tx_handwritten": lambda: handwritten(one_commit=True),
}

if __name__ == "__main__":
    layout, n = sys.argv[1], int(sys.argv[2])
    if layout not in LAYOUTS:
        sys.exit(f"unknown layout {layout!r}: one of {', '.join(LAYOUTS)}")
    calls = LAYOUTS[layout]()
    stmt(calls.replace("{n}", str(n)))
    sys.stdout.write("".join(out))
