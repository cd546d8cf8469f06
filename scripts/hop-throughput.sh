#!/usr/bin/env bash
# The ALPHA implementation report's experiments (its figures 4 and 5), measured in one run:
# iperf3 TCP throughput through the TUN tunnel, for modes none (unprotected baseline), n,
# c:32 and m:32, for 1, 2, 4 and 8 associations, without and with a user-space delay, and
# the ratio m:32 / none.
#
#   netns A                         netns R                        netns B
#   iperf3 -c ─▶ tun 10.200.0.1 ─▶ endpoint ─veth─▶ relay ─veth─▶ endpoint ─▶ tun 10.200.0.2 ─▶ iperf3 -s
#
# The delay is `--delay-ms` on both endpoints (tc netem is not available here): every
# datagram an endpoint sends is held that long, so the round trip grows by twice the delay.
# The relay verifies and forwards every packet, as the report's second setup did.
#
# Usage: scripts/hop-throughput.sh PATH/TO/cohort [SECONDS_PER_POINT] [DELAY_MS]
# (defaults 2 s and 5 ms; a release build gives the meaningful numbers). Needs root, ip,
# /dev/net/tun, python3 and iperf3; fails loudly without them. Only addresses inside the
# namespaces it creates carry traffic; everything is removed on exit.
set -euo pipefail

fail() { echo "FAIL: $*" >&2; exit 1; }
[ $# -ge 1 ] || { echo "usage: $0 PATH/TO/cohort [SECONDS] [DELAY_MS]" >&2; exit 2; }
[ -x "$1" ] || fail "$1 is not an executable"
COHORT=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
SECS=${2:-2}
DELAY=${3:-5}
# HOP_MODES / HOP_ASSOCS / HOP_DELAYS narrow a run (e.g. HOP_MODES="none m:32").
# HOP_STREAMS (default 1) is iperf3's parallel TCP connections: the tunnel keeps each
# connection on one association, so spreading over associations needs several streams.
STREAMS=${HOP_STREAMS:-1}
read -r -a MODES <<< "${HOP_MODES:-none n c:32 m:32}"
read -r -a ASSOCS <<< "${HOP_ASSOCS:-1 2 4 8}"
[ "$(id -u)" -eq 0 ] || fail "needs root (network namespaces, TUN devices)"
command -v ip >/dev/null || fail "ip (iproute2) not found"
command -v python3 >/dev/null || fail "python3 not found"
command -v iperf3 >/dev/null || fail "iperf3 not found (Debian: apt-get install iperf3)"
[ -c /dev/net/tun ] || fail "/dev/net/tun is missing (no TUN support)"

TAG=$$
NS_A=hopt-a-$TAG; NS_R=hopt-r-$TAG; NS_B=hopt-b-$TAG
WORK=$(mktemp -d)
PIDS=()
A_PID=""; B_PID=""
cleanup() {
  for p in "${PIDS[@]}" $A_PID $B_PID; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in "$NS_A" "$NS_R" "$NS_B"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

for ns in "$NS_A" "$NS_R" "$NS_B"; do
  ip netns add "$ns" || fail "cannot create network namespace $ns"
  ip -n "$ns" link set lo up
  ip netns exec "$ns" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6'
done
link() {
  ip link add "$2" type veth peer name "$5" || fail "cannot create a veth pair"
  ip link set "$2" netns "$1"; ip link set "$5" netns "$4"
  ip -n "$1" addr add "$3" dev "$2"; ip -n "$4" addr add "$6" dev "$5"
  ip -n "$1" link set "$2" up; ip -n "$4" link set "$5" up
}
link "$NS_A" ta$TAG 10.78.1.1/24 "$NS_R" tra$TAG 10.78.1.2/24
link "$NS_B" tb$TAG 10.78.2.2/24 "$NS_R" trb$TAG 10.78.2.1/24
ip -n "$NS_B" route add 10.78.1.0/24 via 10.78.2.1

KA=$("$COHORT" keygen --out "$WORK/a.key")
KB=$("$COHORT" keygen --out "$WORK/b.key")
cat >"$WORK/r.toml" <<EOF
role = "relay"
listen = "10.78.1.2:7500"
trust = ["$KA", "$KB"]
EOF
endpoint_config() { # NAME KEY LISTEN TUN_ADDR PEER CONNECT PEER_KEY
  cat >"$WORK/$1.toml" <<EOF
role = "endpoint"
identity = "$1.key"
listen = "$3"
app = "tun"
[tun]
name = "hop0"
address = "$4"
[[peer]]
address = "$5"
via = "10.78.1.2:7500"
trust = "$7"
connect = $6
EOF
}
endpoint_config a "$KA" 10.78.1.1:7500 10.200.0.1/24 10.78.2.2:7500 true "$KB"
endpoint_config b "$KB" 10.78.2.2:7500 10.200.0.2/24 10.78.1.1:7500 false "$KA"

ip netns exec "$NS_R" "$COHORT" hop run --config "$WORK/r.toml" </dev/null >"$WORK/r.out" 2>"$WORK/r.err" &
PIDS+=($!)

cat >"$WORK/q.py" <<'EOF'
import json, sys
v = json.load(sys.stdin)
if sys.argv[1] == "open_out":
    print(sum(1 for a in v.get("associations", []) if a["dir"] == "out" and a["assoc"] != 0 and a["open"]))
elif sys.argv[1] == "rate":
    print("%.1f" % (v["end"]["sum_received"]["bits_per_second"] / 1e6))
EOF
q() { python3 "$WORK/q.py" "$@"; }
open_out() { "$COHORT" hop ctl --socket "$WORK/$1.sock" --json status 2>/dev/null | q open_out 2>/dev/null || echo 0; }

stop_endpoints() {
  for p in $A_PID $B_PID; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  A_PID=""; B_PID=""
}

# point MODE ASSOCS DELAY_MS: sets RESULT to Mbit/s (or "fail"). Not run in a subshell:
# it keeps the endpoints' process ids for the next point and for the cleanup.
point() {
  local mode=$1 n=$2 delay=$3 end server
  RESULT=fail
  stop_endpoints
  ip netns exec "$NS_B" "$COHORT" hop run --config "$WORK/b.toml" --mode "$mode" \
    --associations "$n" --delay-ms "$delay" </dev/null >"$WORK/b.out" 2>"$WORK/b.err" &
  B_PID=$!
  end=$((SECONDS + 10))
  until [ -S "$WORK/b.sock" ]; do [ $SECONDS -lt $end ] || return 0; sleep 0.1; done
  ip netns exec "$NS_A" "$COHORT" hop run --config "$WORK/a.toml" --mode "$mode" \
    --associations "$n" --delay-ms "$delay" </dev/null >"$WORK/a.out" 2>"$WORK/a.err" &
  A_PID=$!
  end=$((SECONDS + 15))
  until [ "$(open_out a)" -ge "$n" ] && [ "$(open_out b)" -ge "$n" ]; do
    [ $SECONDS -lt $end ] || return 0
    sleep 0.1
  done
  ip netns exec "$NS_B" iperf3 -s -1 -B 10.200.0.2 >/dev/null 2>&1 &
  server=$!
  sleep 0.3
  if ip netns exec "$NS_A" timeout $((SECS + 15)) iperf3 -c 10.200.0.2 -t "$SECS" -P "$STREAMS" -J >"$WORK/iperf.json" 2>/dev/null; then
    RESULT=$(q rate <"$WORK/iperf.json" 2>/dev/null || echo fail)
  fi
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}

echo "iperf3 TCP ($STREAMS stream(s)) through the ALPHA tunnel A -> relay -> B, ${SECS}s per point, $(nproc) cores, $(basename "$COHORT") $("$COHORT" --version | cut -d' ' -f2)"
echo "rates in Mbit/s; delay = user-space delay on each endpoint's sends (RTT + 2 x delay)"
printf '%-8s %-7s' delay assocs
for m in "${MODES[@]}"; do printf ' %9s' "$m"; done
printf ' %10s\n' "m:32/none"
FAILED=0
read -r -a DELAYS <<< "${HOP_DELAYS:-0 $DELAY}"
for delay in "${DELAYS[@]}"; do
  for n in "${ASSOCS[@]}"; do
    printf '%-8s %-7s' "${delay}ms" "$n"
    declare -A rate=()
    for m in "${MODES[@]}"; do
      point "$m" "$n" "$delay"
      r=$RESULT
      rate[$m]=$r
      [ "$r" != fail ] || FAILED=$((FAILED + 1))
      printf ' %9s' "$r"
    done
    if [ "${rate[none]}" != fail ] && [ "${rate[m:32]}" != fail ]; then
      printf ' %10s\n' "$(python3 -c "print('%.2f' % (${rate[m:32]} / max(${rate[none]}, 0.001)))")"
    else
      printf ' %10s\n' -
    fi
    unset rate
  done
done
stop_endpoints
[ "$FAILED" -eq 0 ] || fail "$FAILED points failed (see the endpoints' logs in a rerun)"
