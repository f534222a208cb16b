#!/usr/bin/env bash
# Instructions per guarded call on the memory store, counted by callgrind: the difference
# between N calls and none, divided by N. Counts are the same from run to run whatever else the
# machine does, so they compare two versions of the code where timings on a shared machine
# cannot.
#
#   benches/instructions.sh [N]        (default N = 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000}
cargo build --release -q -p idem-tests --example guard_instructions
bin=${CARGO_TARGET_DIR:-target}/release/examples/guard_instructions
ir() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
for mode in fresh handwritten replay; do
  base=$(ir "$mode" 0)
  total=$(ir "$mode" "$n")
  echo "INSTRUCTIONS memory mode=$mode per_call=$(( (total - base) / n ))"
done
