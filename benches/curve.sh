#!/usr/bin/env bash
# Throughput against concurrency on one store: runs benches/programs/bench.rs once per concurrency with
# the given variants, prints a CURVE line per variant and concurrency, and plots them.
#
#   benches/curve.sh postgres [1,2,4,8,16,32,64,128] [unguarded,separate,handwritten,transactional]
#
# Writes benches/results/curve-<store>.txt (the CURVE lines) and curve-<store>.svg (the plot).
# PostgreSQL needs DATABASE_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
store="${1:?usage: benches/curve.sh postgres|sqlite|memory [concurrencies] [variants]}"
levels="${2:-1,2,4,8,16,32,64,128}"
variants="${3:-separate,handwritten,transactional}"
seconds="${SECONDS_PER_VARIANT:-3}"
rounds="${ROUNDS:-2}"
out="benches/results/curve-$store.txt"
mkdir -p benches/results
cargo build --release -q -p idem-tests --example bench
: > "$out"
for c in ${levels//,/ }; do
  ./target/release/examples/bench --store "$store" --concurrency "$c" --seconds "$seconds" \
    --rounds "$rounds" --variants "$variants" \
    | sed -n "s/^RESULT store=\([a-z]*\) /CURVE store=\1 concurrency=$c /p" | tee -a "$out"
done
python3 benches/plot.py curve "$out" "benches/results/curve-$store.svg"
