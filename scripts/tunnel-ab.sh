#!/usr/bin/env bash
# scripts/tunnel-ab.sh: two builds of `cohort tunnel server` side by side on loopback, in
# one run, alternating old and new each round so that a shared machine's drift affects
# both: the server's CPU per connection and per GB, from /proc/PID/stat.
#
#   load ─▶ cohort tunnel client (CLIENT binary) ══▶ cohort tunnel server (OLD or NEW) ─▶ target
#
# For each round and each binary:
#   * connections: scripts/peers/tunnel_rr.c, 4 concurrent, each a 100-byte request and
#     reply, SECONDS long after a 1 s warm-up, with full handshakes on both sides
#     (`--no-resume`), for the default KEM and for x25519: the server's user + system CPU
#     time per connection;
#   * bulk: iperf3, 1 stream, SECONDS long (default KEM): the rate and the server's CPU
#     seconds per GB.
# Then the medians per binary and the ratio new / old.
#
# Usage: scripts/tunnel-ab.sh OLD_BINARY NEW_BINARY [SECONDS] [ROUNDS]   (defaults 4 and 3)
# The client end is NEW_BINARY unless CLIENT is set. Needs iperf3 and a C compiler.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OLD=$1
NEW=$2
SECS=${3:-4}
ROUNDS=${4:-3}
CLIENT=${CLIENT:-$NEW}
# shellcheck source=lib/tunnel-peers.sh
. scripts/lib/tunnel-peers.sh
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

IPERF=$(port); TARGET_RR=$(port)
iperf3 -s -p "$IPERF" -B 127.0.0.1 >"$WORK/iperf.log" 2>&1 & PIDS+=($!)
"$RR" server "$TARGET_RR" & PIDS+=($!)

start() { # BINARY TARGET KEM [extra client flags] -> SERVER, CLIENT_PID, ENTRY
  local bin=$1 target=$2 kem=$3 s c; shift 3
  s=$(port); c=$(port)
  "$bin" tunnel server --listen "127.0.0.1:$s" --forward "127.0.0.1:$target" 2>/dev/null & SERVER=$!
  "$CLIENT" tunnel client --listen "127.0.0.1:$c" --connect "127.0.0.1:$s" --kem "$kem" "$@" 2>/dev/null & CLIENT_PID=$!
  ENTRY=$c
  sleep 0.4
}
stop() { kill "$CLIENT_PID" "$SERVER" 2>/dev/null || true; wait "$CLIENT_PID" "$SERVER" 2>/dev/null || true; }

RESULTS="$WORK/results.tsv"
: >"$RESULTS"
for round in $(seq 1 "$ROUNDS"); do
  for which in old new; do
    bin=$OLD; [ "$which" = new ] && bin=$NEW
    for kem in x25519-mlkem768 x25519; do
      start "$bin" "$TARGET_RR" "$kem" --no-resume
      "$RR" client "$ENTRY" 4 1 >/dev/null
      t0=$(ticks "$SERVER")
      out=$("$RR" client "$ENTRY" 4 "$SECS")
      t1=$(ticks "$SERVER")
      read -r _ n _ rate _ _ _ _ _ errs <<<"$out"
      printf 'us_per_conn_%s\t%s\t%s\n' "$kem" "$which" "$(python3 -c "print('%.1f' % (($t1-$t0)/$HZ*1e6/max($n,1)))")" >>"$RESULTS"
      printf 'conn_per_s_%s\t%s\t%s\n' "$kem" "$which" "$rate" >>"$RESULTS"
      stop
    done
    start "$bin" "$IPERF" x25519-mlkem768
    t0=$(ticks "$SERVER")
    out=$(iperf3 -c 127.0.0.1 -p "$ENTRY" -t "$SECS" -J)
    t1=$(ticks "$SERVER")
    read -r gbps bytes < <(python3 -c 'import json,sys; s=json.load(sys.stdin)["end"]["sum_received"]; print("%.2f %d" % (s["bits_per_second"]/1e9, s["bytes"]))' <<<"$out")
    printf 'bulk_gbps\t%s\t%s\n' "$which" "$gbps" >>"$RESULTS"
    printf 'cpu_s_per_gb\t%s\t%s\n' "$which" "$(python3 -c "print('%.3f' % (($t1-$t0)/$HZ/($bytes/1e9)))")" >>"$RESULTS"
    stop
    echo "round $round $which done" >&2
  done
done

echo "tunnel server A/B: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores, ${SECS}s per point, $ROUNDS rounds"
python3 - "$RESULTS" <<'EOF'
import statistics, sys
from collections import defaultdict
vals = defaultdict(list)
for line in open(sys.argv[1]):
    key, which, v = line.rstrip("\n").split("\t")
    vals[(key, which)].append(float(v))
keys = []
for key, _ in vals:
    if key not in keys:
        keys.append(key)
print("| | old (each round) | new (each round) | old median | new median | new / old |")
print("|---|---|---|---|---|---|")
for key in keys:
    o, n = vals[(key, "old")], vals[(key, "new")]
    mo, mn = statistics.median(o), statistics.median(n)
    print("| %s | %s | %s | %.2f | %.2f | %.2f |" % (
        key, " ".join("%g" % v for v in o), " ".join("%g" % v for v in n), mo, mn, mn / mo if mo else 0))
EOF
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
