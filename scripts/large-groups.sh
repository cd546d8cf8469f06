#!/usr/bin/env bash
# Issue 14's simulator benchmarks (crates/cohort-group/benches/large_groups.rs), in one run:
# rekey after one leave for each rekey method, one view change (a join and a leave), forming
# a group from cold, steady-state datagrams a second at the leader and at a member, the
# removal of a crashed member and a takeover after the leader and ranks 1..3 crash, and the
# simulator's own cost per step. Prints markdown tables (docs/performance.md, "Large groups
# (issue 14)").
#
# Usage: scripts/large-groups.sh [quick|full|big]
#   quick  100 members; forming at 100 and 200; the simulator alone at 1,000 nodes (a minute)
#   full   1,000 members; forming at 250, 500, 1,000, 2,500, 5,000 and 10,000; the simulator
#          alone at 1,000 and 10,000 nodes (the default; about half an hour on 2 cores)
#   big    10,000 members (forming, steady state, rekeys, a view change, failures; about
#          an hour on 2 cores and about 10 GB of memory)
# LARGE_GROUPS_MODES=identity,kdc adds KDC mode (one-message rekey only). Forming runs each
# size in a process of its own, so that each resident-memory figure starts from a fresh
# process. Other LARGE_GROUPS_* variables (see the benchmark's head comment) pass through.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-full}" in
quick) SIZES=100 FORM="100 200" SIM=1000 ;;
full) SIZES=1000 FORM="250 500 1000 2500 5000 10000" SIM=1000,10000 ;;
big) SIZES=10000 FORM="10000" SIM=10000 ;;
*)
    echo "usage: $0 [quick|full|big]" >&2
    exit 2
    ;;
esac

bench() {
    nice -n 5 cargo bench -q -p cohort-group --bench large_groups
}

grep -m1 'model name' /proc/cpuinfo || true
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
nice -n 5 cargo bench -q -p cohort-group --bench large_groups --no-run
for n in $FORM; do
    LARGE_GROUPS=form LARGE_GROUPS_FORM_SIZES=$n bench
done
LARGE_GROUPS=steady,rekey,change,fail LARGE_GROUPS_SIZES=$SIZES bench
LARGE_GROUPS=sim LARGE_GROUPS_SIM_SIZES=$SIM bench
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
