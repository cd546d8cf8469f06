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
# namespaces it creates carry traffic; everything is removed on exit. The namespace
# skeleton is scripts/lib/netns.sh; the setup shared with hop-netns.sh is in
# scripts/lib/hop-netns.sh.
set -euo pipefail
LIB="$(cd "$(dirname "$0")" && pwd)/lib"
# shellcheck source=lib/netns.sh
. "$LIB/netns.sh"
# shellcheck source=lib/hop-netns.sh
. "$LIB/hop-netns.sh"

[ $# -ge 1 ] || { echo "usage: $0 PATH/TO/cohort [SECONDS] [DELAY_MS]" >&2; exit 2; }
SECS=${2:-2}
DELAY=${3:-5}
# HOP_MODES / HOP_ASSOCS / HOP_DELAYS narrow a run (e.g. HOP_MODES="none m:32").
# HOP_TUN_OFFLOAD=off opens the TUN devices without the kernel's offloads (one packet per
# read and per write), for before/after runs in one build.
# HOP_STATUS=1 prints each endpoint's TUN and UDP counters after every point (stderr).
# HOP_STREAMS (default 1) is iperf3's parallel TCP connections: the tunnel keeps each
# connection on one association, so spreading over associations needs several streams.
# HOP_WINDOW sets the endpoints' `window` (rounds in flight per association, 1..=8; absent:
# cohort's default), e.g. HOP_WINDOW=1 for the one-round-at-a-time protocol.
STREAMS=${HOP_STREAMS:-1}
WINDOW_LINE=""
[ -n "${HOP_WINDOW:-}" ] && WINDOW_LINE="window = $HOP_WINDOW"
OFFLOAD=true; [ "${HOP_TUN_OFFLOAD:-on}" = off ] && OFFLOAD=false
read -r -a MODES <<< "${HOP_MODES:-none n c:32 m:32}"
read -r -a ASSOCS <<< "${HOP_ASSOCS:-1 2 4 8}"
netns_init "network namespaces, TUN devices" "$1"
need_tool iperf3 "iperf3 not found (Debian: apt-get install iperf3)"
[ -c /dev/net/tun ] || fail "/dev/net/tun is missing (no TUN support)"

TAG=$$
NS_A=hopt-a-$TAG; NS_R=hopt-r-$TAG; NS_B=hopt-b-$TAG
A_PID=""; B_PID=""
hop_netns "$NS_A" "$NS_R" "$NS_B"
netns_veth "$NS_A" ta$TAG 10.78.1.1/24 "$NS_R" tra$TAG 10.78.1.2/24
netns_veth "$NS_B" tb$TAG 10.78.2.2/24 "$NS_R" trb$TAG 10.78.2.1/24
ip -n "$NS_B" route add 10.78.1.0/24 via 10.78.2.1

hop_keys_and_relay 10.78.1.2:7500
endpoint_config() { # NAME KEY LISTEN TUN_ADDR PEER CONNECT PEER_KEY
  cat >"$WORK/$1.toml" <<EOF
role = "endpoint"
identity = "$1.key"
listen = "$3"
app = "tun"
$WINDOW_LINE
[tun]
name = "hop0"
address = "$4"
offload = $OFFLOAD
[[peer]]
address = "$5"
via = "10.78.1.2:7500"
trust = "$7"
connect = $6
EOF
}
endpoint_config a "$KA" 10.78.1.1:7500 10.200.0.1/24 10.78.2.2:7500 true "$KB"
endpoint_config b "$KB" 10.78.2.2:7500 10.200.0.2/24 10.78.1.1:7500 false "$KA"

netns_start r "$NS_R" /dev/null "$COHORT" hop run --config "$WORK/r.toml"
R_PID=$STARTED
# cpu_ticks PID...: user + system time of the processes so far, in clock ticks.
cpu_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }

open_out() { "$COHORT" hop ctl --socket "$WORK/$1.sock" --json status 2>/dev/null | q open_out 2>/dev/null || echo 0; }

stop_endpoints() {
  local p
  for p in $A_PID $B_PID; do stop_process "$p"; done
  A_PID=""; B_PID=""
}

# point MODE ASSOCS DELAY_MS: sets RESULT to Mbit/s (or "fail"). Not run in a subshell:
# it keeps the endpoints' process ids for the next point and for the cleanup.
point() {
  local mode=$1 n=$2 delay=$3 end server
  RESULT=fail
  stop_endpoints
  netns_start b "$NS_B" /dev/null "$COHORT" hop run --config "$WORK/b.toml" --mode "$mode" \
    --associations "$n" --delay-ms "$delay"
  B_PID=$STARTED
  end=$((SECONDS + 10))
  until [ -S "$WORK/b.sock" ]; do [ $SECONDS -lt $end ] || return 0; sleep 0.1; done
  netns_start a "$NS_A" /dev/null "$COHORT" hop run --config "$WORK/a.toml" --mode "$mode" \
    --associations "$n" --delay-ms "$delay"
  A_PID=$STARTED
  end=$((SECONDS + 15))
  until [ "$(open_out a)" -ge "$n" ] && [ "$(open_out b)" -ge "$n" ]; do
    [ $SECONDS -lt $end ] || return 0
    sleep 0.1
  done
  netns_start iperf-s "$NS_B" /dev/null iperf3 -s -1 -B 10.200.0.2
  server=$STARTED
  sleep 0.3
  local ticks0; ticks0=$(cpu_ticks "$A_PID" "$R_PID" "$B_PID")
  if ip netns exec "$NS_A" timeout $((SECS + 15)) iperf3 -c 10.200.0.2 -t "$SECS" -P "$STREAMS" -J >"$WORK/iperf.json" 2>/dev/null; then
    RESULT=$(q rate <"$WORK/iperf.json" 2>/dev/null || echo fail)
  fi
  if [ -n "${HOP_STATUS:-}" ]; then # the daemons' CPU, each endpoint's counters, on stderr
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); b=d["end"]["sum_received"]["bytes"]
print("%s: the three daemons used %.2f CPU s per GB carried (%d ticks, %.0f MB)" % (sys.argv[2], (int(sys.argv[3]) / int(sys.argv[4])) / (b / 1e9), int(sys.argv[3]), b / 1e6))' \
      "$WORK/iperf.json" "$mode" $(($(cpu_ticks "$A_PID" "$R_PID" "$B_PID") - ticks0)) "$(getconf CLK_TCK)" >&2 || true
    for e in a b; do
      echo "$mode $e $("$COHORT" hop ctl --socket "$WORK/$e.sock" --json status 2>/dev/null |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({k: d.get(k) for k in ("tun", "udp")}))')" >&2
    done
  fi
  stop_process "$server"
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
    # The ratio needs both modes measured; HOP_MODES may leave either out.
    if [ "${rate[none]:-fail}" != fail ] && [ "${rate[m:32]:-fail}" != fail ]; then
      printf ' %10s\n' "$(python3 -c "print('%.2f' % (${rate[m:32]} / max(${rate[none]}, 0.001)))")"
    else
      printf ' %10s\n' -
    fi
    unset rate
  done
done
stop_endpoints
[ "$FAILED" -eq 0 ] || fail "$FAILED points failed (see the endpoints' logs in a rerun)"
