#!/usr/bin/env bash
# The long run of issue 14's simulator sweep at scale (crates/cohort-group/tests/large_sweep.rs):
# SEEDS seeds (default 10) at MEMBERS members (default 10,000), from seed FIRST (default 0),
# each in a process of its own so that each prints its own time, in a release build. A group
# formed from cold with the LKH rekey and default timers, then faults, a partition, crashes,
# leaves and the replaying adversary; every checker must hold (see the test's head comment).
# CI runs 2 seeds at 10,000; one took about 6.5 minutes and 16 GB of memory on 2 cores
# (docs/performance.md, nineteenth session).
#
#   scripts/large-sweep.sh [SEEDS [MEMBERS]]
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-10}
members=${2:-10000}
first=${FIRST:-0}
cargo test --release --locked -p cohort-group --test large_sweep --no-run
failed=()
TIMEFORMAT='%R s wall, %U s user'
for ((s = first; s < first + seeds; s++)); do
  echo "== seed $s at $members members"
  if ! time COHORT_SIM_SEED=$s COHORT_LARGE_SWEEP_MEMBERS=$members \
    cargo test --release --locked -q -p cohort-group --test large_sweep -- --nocapture; then
    failed+=("$s")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED seeds: ${failed[*]}" >&2
  exit 1
fi
echo "all $seeds seeds passed at $members members"
