#!/usr/bin/env bash
# Instructions per call on SQLite, counted by callgrind, for each variant of
# benches/programs/bench.rs: SQLite runs in the process, so the count holds the database's work
# as well as the guard's and sqlx's. Each variant runs N calls (`bench --calls N`, one task) and
# then none; the difference, less the unguarded insert's own (measured the same way), divided by
# N, is what the variant adds to the business insert. Counts barely move from run to run,
# whatever else the machine does, so they compare two versions of the code where timings on a
# shared machine cannot.
#
#   benches/sql_instructions.sh [N] [variants]
#       (defaults: 2000; separate,handwritten,transactional,handwritten_tx)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000}
variants=${2:-separate,handwritten,transactional,handwritten_tx}
cargo build --release -q -p idem-tests --example bench
bin=${CARGO_TARGET_DIR:-target}/release/examples/bench
ir() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" --store sqlite \
    --concurrency 1 --rounds 1 --calls "$2" --variants "$1" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
unguarded=$(( $(ir unguarded "$n") - $(ir unguarded 0) ))
echo "INSTRUCTIONS sqlite variant=unguarded per_call=$(( unguarded / n ))"
for v in ${variants//,/ }; do
  added=$(( $(ir "$v" "$n") - $(ir "$v" 0) - unguarded ))
  echo "INSTRUCTIONS sqlite variant=$v per_call_over_unguarded=$(( added / n ))"
done
