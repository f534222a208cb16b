#!/usr/bin/env bash
# Instructions PostgreSQL's server spends on a call's two statements (a separate-commits call's,
# or a transactional one's in one commit), per layout of the records table
# (benches/pgbench/single.py): each layout's script of N calls and
# of BASE calls runs in a stand-alone backend (`postgres --single`) under callgrind, on a copy of
# a database cluster made once; the difference divided by N - BASE is one call's work, its
# prepared statements' first executions and the start-up left out.
#
#   benches/pg_instructions.sh [N] [layouts]     (default N = 2200, every layout)
#
# Needs PostgreSQL's server programs (PG_BIN, default /usr/lib/postgresql/15/bin) and valgrind.
# Run as root, it runs the server as the user `postgres`.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2200}
layouts=${2:-handwritten,domain,table_check,no_check,no_times,no_retention_index,no_partial_indexes,narrow,resume_index_only,work_index_only,plain_indexes,tx_lock,tx_lock_with,tx_no_lock,tx_handwritten}
base=200
bin=${PG_BIN:-/usr/lib/postgresql/15/bin}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
as_server=()
if [ "$(id -u)" = 0 ]; then
  chown postgres "$work"
  as_server=(runuser -u postgres --)
fi
"${as_server[@]}" "$bin/initdb" -D "$work/template" -A trust > /dev/null
ir() { # layout calls
  rm -rf "$work/run"
  "${as_server[@]}" cp -a "$work/template" "$work/run"
  python3 benches/pgbench/single.py "$1" "$2" > "$work/calls.sql"
  chmod 644 "$work/calls.sql"
  "${as_server[@]}" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
    "$bin/postgres" --single -j -D "$work/run" -c fsync=off -c synchronous_commit=off \
    -c full_page_writes=off postgres < "$work/calls.sql" 2> "$work/valgrind.txt" > "$work/out.txt"
  # The backend writes its errors to standard error, beside valgrind's lines.
  if grep -q ERROR "$work/valgrind.txt"; then
    grep -m1 ERROR "$work/valgrind.txt" >&2
    exit 1
  fi
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$work/valgrind.txt"
}
for layout in ${layouts//,/ }; do
  low=$(ir "$layout" "$base")
  high=$(ir "$layout" "$n")
  echo "INSTRUCTIONS postgres layout=$layout per_call=$(( (high - low) / (n - base) ))"
done
