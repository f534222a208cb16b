#!/usr/bin/env python3
"""What each statement of a separate-commits call costs SQLite, against a hand-written guard's.

    cargo run -q -p idem-cli -- schema --store sqlite | python3 benches/sqlite_statements.py [N] [ROUNDS]

Reads the records table's DDL as `idem schema` prints it (the text the store creates its table
from), then times, on one connection in autocommit (WAL, `synchronous = NORMAL`, as
`SqliteStore` opens its file), each statement of N calls (default 10,000) of:

- `handwritten`: the usual hand-written guard: insert a PROCESSING row, the business insert,
  update it DONE with the answer;
- `idem`: the store's first claim (`INSERT … ON CONFLICT DO NOTHING RETURNING fence`), the
  business insert, its completion (the fenced `UPDATE … RETURNING fence`), as
  `idem-runtime/src/store/sql/statements.rs` writes them for SQLite;
- `idem_no_<index>`: the same on the table without one of its secondary indexes, so that each
  index's share of the claim shows.

Every variant runs ROUNDS times (default 3), interleaved, each on a new file; the lowest time of
each statement across rounds is printed, in microseconds per call:

    STATEMENTS sqlite variant=idem claim_us=… business_us=… complete_us=… call_us=…

The statements run in the process (Python's `sqlite3`, whose SQLite may be older than the one
sqlx bundles): this is the database's own work, without the hand-off to sqlx's worker thread
that every statement of the store pays as well.
"""

import hashlib
import os
import re
import sys
import tempfile
import time

import sqlite3

# The store's clock, milliseconds since the Unix epoch (`unixepoch('subsec')` where available).
NOW = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
HOLDS = ("(state = 'in_progress' OR (state = 'parked' AND "
         "(request IS NOT NULL OR note IS NOT NULL)))")
LIVE = f"(expires_at > {NOW} OR {HOLDS})"
OWNED = f"fence = ?3 AND state = 'in_progress' AND {LIVE}"
CLAIM = (
    "INSERT INTO idem_records (scope, key, fingerprint, state, fence, lease_until, expires_at, "
    "request, resume_at, created_at, updated_at) "
    f"VALUES (?1, ?2, ?3, 'in_progress', {NOW}, {NOW} + ?4, {NOW} + ?5, ?6, "
    f"CASE WHEN ?6 IS NULL THEN NULL ELSE {NOW} END, {NOW}, {NOW}) "
    "ON CONFLICT (scope, key) DO NOTHING RETURNING fence"
)
COMPLETE = (
    "UPDATE idem_records SET state = 'completed', response_status = ?4, response_error = ?5, "
    "response_body = ?6, recovery_point = NULL, request = NULL, resume_at = NULL, note = NULL, "
    f"updated_at = {NOW} WHERE scope = ?1 AND key = ?2 AND (({OWNED}) OR (fence = ?3 "
    f"AND state = 'completed' AND expires_at > {NOW} AND response_status IS ?4 "
    "AND response_error = ?5 AND response_body = ?6)) RETURNING fence"
)
HANDWRITTEN = [
    "CREATE TABLE handwritten_records (key TEXT PRIMARY KEY, request_hash TEXT NOT NULL, "
    "status TEXT NOT NULL, result TEXT)",
]
ORDERS = "CREATE TABLE bench_orders (order_no TEXT PRIMARY KEY, amount BIGINT NOT NULL)"


def records_ddl(text):
    """The records table's statements from `idem schema`'s output: the CREATE TABLE and its
    indexes, each as (index name or None, statement)."""
    statements = [s.strip() for s in re.sub(r"^--.*$", "", text, flags=re.M).split(";")]
    out = []
    for s in statements:
        if '"idem_records"' not in s:
            continue
        index = re.search(r'INDEX IF NOT EXISTS "idem_records_(\w+)_idx"', s)
        out.append((index.group(1) if index else None, s))
    if not out or out[0][0] is not None:
        sys.exit("no records table in the input: pipe `idem schema --store sqlite` in")
    return out


def run(variant, ddl, n, directory):
    path = os.path.join(directory, f"{variant}.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute(ORDERS)
    if variant == "handwritten":
        for s in HANDWRITTEN:
            db.execute(s)
    else:
        for index, s in ddl:
            if variant != f"idem_no_{index}":
                db.execute(s)
    fingerprint = hashlib.sha256(b"100").digest()
    answer = b'{"order_no":"o1","amount":100}'
    claim = business = complete = 0.0
    for i in range(n):
        key = f"k{i}"
        t0 = time.perf_counter()
        if variant == "handwritten":
            db.execute(
                "INSERT INTO handwritten_records (key, request_hash, status) "
                "VALUES (?, ?, 'PROCESSING')",
                (key, fingerprint.hex()),
            )
            fence = None
        else:
            (fence,) = db.execute(CLAIM, ("bench", key, fingerprint, 30_000, 86_400_000, None)).fetchone()
        t1 = time.perf_counter()
        db.execute("INSERT INTO bench_orders (order_no, amount) VALUES (?, ?)", (f"o{i}", 100))
        t2 = time.perf_counter()
        if variant == "handwritten":
            db.execute(
                "UPDATE handwritten_records SET status = 'DONE', result = ? WHERE key = ?",
                (answer.decode(), key),
            )
        else:
            done = db.execute(COMPLETE, ("bench", key, fence, None, 0, answer)).fetchall()
            assert done == [(fence,)], "the completion applied"
        t3 = time.perf_counter()
        claim += t1 - t0
        business += t2 - t1
        complete += t3 - t2
    db.close()
    return [x / n * 1e6 for x in (claim, business, complete)]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    ddl = records_ddl(sys.stdin.read())
    variants = ["handwritten", "idem"] + [f"idem_no_{i}" for i, _ in ddl if i is not None]
    best = {}
    for _ in range(rounds):
        for variant in variants:
            with tempfile.TemporaryDirectory() as directory:
                times = run(variant, ddl, n, directory)
            best[variant] = [min(a, b) for a, b in zip(best.get(variant, times), times)]
    for variant in variants:
        claim, business, complete = best[variant]
        print(
            f"STATEMENTS sqlite variant={variant} claim_us={claim:.1f} business_us={business:.1f} "
            f"complete_us={complete:.1f} call_us={claim + business + complete:.1f}"
        )


if __name__ == "__main__":
    main()
