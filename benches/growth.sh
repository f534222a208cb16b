#!/usr/bin/env bash
# Latency against the size of the records table on one store: benches/programs/scale.rs fills the table
# to each size in turn and measures claim + complete and replays there; the GROWTH lines go to
# benches/results/growth-<store>.txt and the plot to growth-<store>.svg.
#
#   benches/growth.sh postgres|sqlite|mysql [100000,1000000,10000000] [samples]
#
# PostgreSQL needs DATABASE_URL, MySQL IDEM_MYSQL_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
store="${1:?usage: benches/growth.sh postgres|sqlite|mysql [sizes] [samples]}"
sizes="${2:-100000,1000000,10000000}"
samples="${3:-3000}"
out="benches/results/growth-$store.txt"
mkdir -p benches/results
cargo build --release -q -p idem-tests --example scale
./target/release/examples/scale --store "$store" growth --sizes "$sizes" --samples "$samples" | tee "$out"
python3 benches/plot.py growth "$out" "benches/results/growth-$store.svg"
