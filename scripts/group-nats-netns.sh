#!/usr/bin/env bash
# A cohort group over a cluster of three nats-server processes (issue 15, parts 2 and 3):
# one server per network namespace, joined by routes over a bridge in a fourth namespace,
# and the members spread over the three namespaces, several to a process (`cohort group
# many`), each attached to its own namespace's server first (`nats` lists it first, the
# other two after).
#
#   netns A (10.97.0.1)          netns B (10.97.0.2)          netns C (10.97.0.3)
#     nats-server nA :4222         nats-server nB :4222         nats-server nC :4222
#     m1..m8 (2 processes)         m9..m16                      m17..m24
#          \___________ routes :6222 over the bridge in netns H ___________/
#
# Default (check mode, 24 members, 4 to a process): all send one reliable and one
# unreliable numbered message every 200 ms, all along;
#   1. namespace C is cut off (iptables DROP of everything but loopback): the routes to nC
#      break (the servers ping every 1 s, two missed pings close a route), the group splits
#      into A+B and C, each side in one view with its own key (required);
#   2. the cut is restored: the routes come back, and within 5 s all 24 are in one view with
#      one key (the Exchange merged the sides; the time is printed);
#   3. nB is killed (-9): B's members reconnect to nA or nC and nobody installs a new view
#      (no member vanished): one view with one key right after and 5 s after the kill, no
#      view event at any member in between, a `connected` event at each of B's members;
#   4. the sending stops, the deliveries settle, and scripts/group_chaos_check.py checks
#      every member's log: nothing from nowhere or twice, FIFO, one order per view, total
#      order and agreement among the members going to the same next view, self delivery,
#      one key per view, the heals (its RSS check is not run: members share processes).
# Measured here (2 shared cores, load average 7-15 from other builds): 26 to 35 s in all.
#
# --members N [--kills K] (viewchange mode; issue 15's goal is N = 256): N members over the
# three namespaces, 32 to a process, K of them (default 20) alone in their own processes,
# no application traffic; once one view of N has formed the K are killed (-9) one at a
# time, and each view-change time (kill to the last survivor's view without the victim,
# from the `t` of the members' view events) is printed, with the median, p95 and max and
# whether p95 <= 1.5 s. --timers H,S,F sets the members' heartbeat_ms, suspect_ms and
# flush_ms (default 100,1000,500: a member's defaults; check mode always uses 50,600,300,
# as group-netns.sh does). Exits 1 if a view change does not complete, not if the goal is
# missed (the numbers are the result). Measured here: 66 s for 256 members and 20 kills.
#
# Usage: scripts/group-nats-netns.sh PATH/TO/cohort [--members N [--kills K] [--timers H,S,F]]
#        [--keep DIR]
# Needs root, ip (iproute2) with netns support, iptables, nats-server and python3. Prints
# PASS or FAIL; exits 1 on FAIL, 2 on a usage error; never skips. Everything it made
# (namespaces, servers, members, the scratch directory) is removed on every exit; --keep DIR
# copies the logs there first.
set -euo pipefail
DIR="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib/netns.sh
. "$DIR/lib/netns.sh"

usage() { echo "usage: $0 PATH/TO/cohort [--members N [--kills K] [--timers H,S,F]] [--keep DIR]" >&2; exit 2; }
[ $# -ge 1 ] || usage
BIN=$1
shift
MEMBERS="" KILLS=20 KEEP="" TIMERS=100,1000,500
while [ $# -gt 0 ]; do
  case $1 in
    --members) [ $# -ge 2 ] || usage; MEMBERS=$2; shift ;;
    --kills) [ $# -ge 2 ] || usage; KILLS=$2; shift ;;
    --timers) [ $# -ge 2 ] || usage; TIMERS=$2; shift ;;
    --keep) [ $# -ge 2 ] || usage; KEEP=$2; shift ;;
    *) usage ;;
  esac
  shift
done
[ -z "$MEMBERS" ] || [[ $MEMBERS =~ ^[0-9]+$ && $MEMBERS -ge 12 ]] || usage
[[ $KILLS =~ ^[0-9]+$ && $KILLS -ge 1 ]] || usage
[[ $TIMERS =~ ^[0-9]+,[0-9]+,[0-9]+$ ]] || usage
IFS=, read -r HEARTBEAT SUSPECT FLUSH <<<"$TIMERS"
[ -x "$BIN" ] || fail "$BIN is not an executable"
COHORT=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
[ "$(id -u)" -eq 0 ] || fail "needs root (network namespaces, iptables)"
need_tool ip "ip (iproute2) not found"
need_tool python3 "python3 not found"
need_tool iptables "iptables not found (the cut is iptables DROP rules)"
need_tool nats-server "nats-server not found (Debian: apt-get install nats-server)"
"$COHORT" group many --help >/dev/null 2>&1 || fail "$COHORT has no 'group many' (built without it?)"

TAG=$$
HUB=gnn-h-$TAG
NSS=(gnn-a-$TAG gnn-b-$TAG gnn-c-$TAG)
ADDRS=(10.97.0.1 10.97.0.2 10.97.0.3)
DRIVER=""
WORK=$(mktemp -d)
nats_cleanup() {
  local ns p
  [ -z "$DRIVER" ] || kill "$DRIVER" 2>/dev/null || true
  # Whatever still runs in the namespaces this script made (servers and members the
  # driver started, if it died before stopping them).
  for ns in "${NSS[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  done
  if [ -n "$KEEP" ]; then mkdir -p "$KEEP" && cp -r "$WORK"/. "$KEEP"/ || true; fi
  netns_cleanup
}
trap nats_cleanup EXIT
trap 'exit 1' INT TERM

netns_add "$HUB" "${NSS[@]}"
ip -n "$HUB" link add br0 type bridge
ip -n "$HUB" link set br0 up
for k in 0 1 2; do
  ip link add "gnx$k$TAG" type veth peer name "gny$k$TAG" || fail "cannot create a veth pair"
  ip link set "gnx$k$TAG" netns "${NSS[$k]}"
  ip link set "gny$k$TAG" netns "$HUB"
  ip -n "${NSS[$k]}" addr add "${ADDRS[$k]}/24" dev "gnx$k$TAG"
  ip -n "${NSS[$k]}" link set "gnx$k$TAG" up
  ip -n "$HUB" link set "gny$k$TAG" master br0
  ip -n "$HUB" link set "gny$k$TAG" up
  ip netns exec "${NSS[$k]}" iptables -L INPUT >/dev/null 2>&1 \
    || fail "iptables does not work in network namespace ${NSS[$k]}"
done
dump() {
  local f
  for f in "$WORK"/nats*.log "$WORK"/p*.err; do dump_log "$f" 15; done
}

T0=$SECONDS
NS_LIST=$(IFS=,; echo "${NSS[*]}")
ADDR_LIST=$(IFS=,; echo "${ADDRS[*]}")
if [ -z "$MEMBERS" ]; then
  echo "group over a nats cluster: 24 members (4 to a process) in 3 namespaces, one server each"
  python3 "$DIR/group_nats_netns.py" --work "$WORK" --cohort "$COHORT" --ns "$NS_LIST" \
    --addr "$ADDR_LIST" --members 24 --per-process 4 &
  DRIVER=$!
  wait "$DRIVER" || die "the driver failed"
  DRIVER=""
  [ -f "$WORK/run.json" ] || die "the driver wrote no run.json"
  status=0
  python3 "$DIR/group_chaos_check.py" "$WORK" || status=$?
  echo "ran for $((SECONDS - T0)) s"
  [ $status -eq 0 ] || { dump >&2; echo "FAIL: group-nats-netns"; exit 1; }
  echo "PASS: group-nats-netns"
else
  echo "view change over a nats cluster: $MEMBERS members (32 to a process, $KILLS alone) in 3 namespaces," \
    "heartbeat_ms $HEARTBEAT, suspect_ms $SUSPECT, flush_ms $FLUSH"
  python3 "$DIR/group_nats_netns.py" --work "$WORK" --cohort "$COHORT" --ns "$NS_LIST" \
    --addr "$ADDR_LIST" --members "$MEMBERS" --per-process 32 --mode viewchange --kills "$KILLS" \
    --heartbeat-ms "$HEARTBEAT" --suspect-ms "$SUSPECT" --flush-ms "$FLUSH" &
  DRIVER=$!
  wait "$DRIVER" || die "the driver failed"
  DRIVER=""
  echo "ran for $((SECONDS - T0)) s"
  echo "PASS: group-nats-netns --members $MEMBERS (the goal's verdict is the line above)"
fi
