#!/usr/bin/env bash
# A chaos soak for groups: nine `cohort group run` members in three network namespaces
# (three each, joined by a bridge in a fourth), all sending numbered reliable and unreliable
# messages all the time (one of each per member every 100 ms), through MINUTES of seeded
# random faults, each held for 0.5-4 s and followed by a heal:
#
#   netns A (10.98.0.1)          netns B (10.98.0.2)          netns C (10.98.0.3)
#     m1 m2 m3 [KDC :7600]         m4 m5 m6                     m7 m8 m9      (ports 7201-7209)
#          \__________________________ |  __________________________/
#                               bridge in netns H
#
#   kill        kill -9 a member, restart it (a new incarnation, a new log) after the hold
#   kill_leader the same to the current leader (a long-lived leader once, which then leaves
#               the RSS sample; after that a killed member instead when the leader is
#               long-lived, noted)
#   cut_ns      a namespace cut off: iptables DROP of everything in and out but loopback
#   cut_dir     one direction only: namespace X drops what it sends to namespace Y
#   trust       one to four members stop trusting another member, then trust it again
#   rekey       one to three members ask for a rekey during the hold
#
# After every fault: within 5 s, all nine live members report (status, polled every 50 ms;
# the time from the fault's end is printed) one view of nine, one view id and one key
# fingerprint, with no view change going on. Three long-lived members (one per namespace,
# drawn from the seed) are never killed; their VmRSS is sampled every second. At the end the
# sending stops, the deliveries settle, and scripts/group_chaos_check.py checks every log:
# integrity (nothing from nowhere, nothing twice), FIFO, order within each view, total order
# and Agreement among the logs that go to the same next view, self delivery, one key epoch
# and fingerprint per view, the heals, and RSS growth under 10% after the warm-up (the first
# third of the chaos, 20-300 s). The checker's header says what each check claims.
#
# With --kdc, the members run in KDC mode: `cohort kdc serve` in namespace A, m1..m9
# registered with `cohort kdc add-principal` (as scripts/group-kdc-netns.sh does); a cut of
# namespace A also cuts B and C off from the KDC.
#
# Usage: scripts/group-chaos.sh PATH/TO/cohort MINUTES [--kdc] [--seed N] [--keep DIR]
# MINUTES (decimals allowed) is the chaos phase; forming, the final heal, the drain and the
# check add about 15-25 s. The seed is printed; --seed N repeats the schedule of fault
# kinds, targets and durations (the leader a kill_leader hits is whoever leads then, and
# timings differ from run to run). --keep DIR copies the logs there on exit. Needs root, ip
# (iproute2) with netns support, iptables and python3. Prints a summary and PASS or FAIL;
# exits 1 on FAIL, 2 on a usage error. Everything it made is removed on exit, except the
# logs of a FAIL: they are copied to /tmp/group-chaos-fail-SEED-TIME (path printed) unless
# --keep is given, and the tail of each member the failure names is printed.
# GROUP_CHAOS_NS_PREFIX (default gch) prefixes the names of the namespaces it makes.
set -euo pipefail
DIR="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib/netns.sh
. "$DIR/lib/netns.sh"

usage() { echo "usage: $0 PATH/TO/cohort MINUTES [--kdc] [--seed N] [--keep DIR]" >&2; exit 2; }
[ $# -ge 2 ] || usage
BIN=$1 MINUTES=$2
shift 2
MODE=identity SEED="" KEEP=""
while [ $# -gt 0 ]; do
  case $1 in
    --kdc) MODE=kdc ;;
    --seed) [ $# -ge 2 ] || usage; SEED=$2; shift ;;
    --keep) [ $# -ge 2 ] || usage; KEEP=$2; shift ;;
    *) usage ;;
  esac
  shift
done
[[ $MINUTES =~ ^[0-9]+(\.[0-9]+)?$ ]] || usage
[ -z "$SEED" ] || [[ $SEED =~ ^[0-9]+$ ]] || usage
[ -x "$BIN" ] || fail "$BIN is not an executable"
COHORT=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
[ "$(id -u)" -eq 0 ] || fail "needs root (network namespaces, iptables)"
need_tool ip "ip (iproute2) not found"
need_tool python3 "python3 not found"
need_tool iptables "iptables not found (the link cuts are iptables DROP rules)"
[ -n "$SEED" ] || SEED=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')

TAG=$$
P=${GROUP_CHAOS_NS_PREFIX:-gch}  # namespace names: PREFIX-h-PID, PREFIX-a-PID, ...
HUB=$P-h-$TAG
NSS=($P-a-$TAG $P-b-$TAG $P-c-$TAG)
ADDRS=(10.98.0.1 10.98.0.2 10.98.0.3)
KDC_ADDR=10.98.0.1:7600
DRIVER=""
WORK=$(mktemp -d)
chaos_cleanup() {
  local ns p
  [ -z "$DRIVER" ] || kill "$DRIVER" 2>/dev/null || true
  # Whatever still runs in the namespaces this script made (members the driver started).
  for ns in "${NSS[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  done
  if [ -n "$KEEP" ]; then mkdir -p "$KEEP" && cp -r "$WORK"/. "$KEEP"/ || true; fi
  netns_cleanup
}
trap chaos_cleanup EXIT

netns_add "$HUB" "${NSS[@]}"
ip -n "$HUB" link add br0 type bridge
ip -n "$HUB" link set br0 up
for k in 0 1 2; do
  ip link add "gcx$k$TAG" type veth peer name "gcy$k$TAG" || fail "cannot create a veth pair"
  ip link set "gcx$k$TAG" netns "${NSS[$k]}"
  ip link set "gcy$k$TAG" netns "$HUB"
  ip -n "${NSS[$k]}" addr add "${ADDRS[$k]}/24" dev "gcx$k$TAG"
  ip -n "${NSS[$k]}" link set "gcx$k$TAG" up
  ip -n "$HUB" link set "gcy$k$TAG" master br0
  ip -n "$HUB" link set "gcy$k$TAG" up
  ip netns exec "${NSS[$k]}" iptables -L INPUT >/dev/null 2>&1 \
    || fail "iptables does not work in network namespace ${NSS[$k]}"
done

if [ "$MODE" = kdc ]; then
  mkdir "$WORK/kdc"
  printf 'listen = "%s"\ndatabase = "kdc.db"\n' "$KDC_ADDR" >"$WORK/kdc/kdc.toml"
  for i in $(seq 9); do
    "$COHORT" kdc add-principal "m$i" --config "$WORK/kdc/kdc.toml" --out "$WORK" >/dev/null \
      || fail "cohort kdc add-principal m$i failed"
  done
  netns_start kdc "${NSS[0]}" /dev/null "$COHORT" kdc serve --config "$WORK/kdc/kdc.toml"
  KDC=$STARTED
  watch_alive "$KDC" "the KDC"
  wait_for 10 "KDC listening on $KDC_ADDR" grep -qs "listening on $KDC_ADDR" "$WORK/kdc.err"
  echo "KDC on $KDC_ADDR (namespace A), m1..m9 registered"
fi
dump() { dump_log "$WORK/kdc.err" 20; }

echo "group chaos: $MODE mode, $MINUTES min, seed $SEED, 9 members in 3 namespaces"
T0=$SECONDS
python3 "$DIR/group_chaos.py" --work "$WORK" --cohort "$COHORT" --minutes "$MINUTES" \
  --seed "$SEED" --mode "$MODE" --ns "$(IFS=,; echo "${NSS[*]}")" \
  --addr "$(IFS=,; echo "${ADDRS[*]}")" --kdc-addr "$KDC_ADDR" &
DRIVER=$!
# On FAIL the logs outlive the run without --keep: copied to /tmp/group-chaos-fail-SEED-TIME
# (or kept in the --keep directory), and the tail of every member the problems or failed
# checks name is printed (scripts/group_chaos_fail.py).
failed() {
  local where=$KEEP
  if [ -z "$where" ]; then
    where=/tmp/group-chaos-fail-$SEED-$(date -u +%Y%m%dT%H%M%SZ)
    mkdir -p "$where" && cp -r "$WORK"/. "$where"/ || true
  fi
  python3 "$DIR/group_chaos_fail.py" "$WORK" || true
  echo "logs kept in $where"
}
wait "$DRIVER" || { failed; die "the driver failed"; }
DRIVER=""
[ -f "$WORK/run.json" ] || { failed; die "the driver wrote no run.json"; }
if [ "$MODE" = kdc ]; then alive; stop_process "$KDC"; fi
status=0
python3 "$DIR/group_chaos_check.py" "$WORK" >"$WORK/check.txt" || status=$?
cat "$WORK/check.txt"
echo "ran for $((SECONDS - T0)) s"
[ $status -eq 0 ] || { failed; echo "FAIL: group-chaos ($MODE mode, seed $SEED)"; exit 1; }
echo "PASS: group-chaos ($MODE mode, seed $SEED)"
