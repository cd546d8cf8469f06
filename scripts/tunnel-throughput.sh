#!/usr/bin/env bash
# Tunnel throughput on loopback against plain TCP, in one run (issue 3's goal: >= 80%).
#
#   plain:   iperf3 client ───────────────────────────────────────────▶ iperf3 server
#   relay:   iperf3 client ─▶ socat ─────────────────▶ socat ─────────────▶ iperf3 server
#   tunnel:  iperf3 client ─▶ cohort tunnel client ══▶ cohort tunnel server ─▶ iperf3 server
#
# The relay row is two plain TCP relays without any cryptography: the same three loopback
# hops and four busy processes as the tunnel, so it shows what the shape alone costs on this
# machine, apart from cohort's own work.
# Usage: scripts/tunnel-throughput.sh [SECONDS] [KEM] [RUNS]
# Prints each run's rates and the ratio; alternates plain and tunnel runs so drift in the
# machine's speed affects both. Needs iperf3 and socat (installed if missing, via apt).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-5}
KEM=${2:-x25519-mlkem768}
RUNS=${3:-3}

if ! command -v iperf3 >/dev/null || ! command -v socat >/dev/null; then
  apt-get update -qq && apt-get install -y -qq iperf3 socat
fi
cargo build --quiet --release --locked -p cohort
COHORT=target/release/cohort

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
IPERF=$(port); SERVER=$(port); CLIENT=$(port); RELAY1=$(port); RELAY2=$(port)
LOGS=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

iperf3 -s -p "$IPERF" -B 127.0.0.1 >"$LOGS/iperf.log" 2>&1 & PIDS+=($!)
"$COHORT" tunnel server --listen "127.0.0.1:$SERVER" --forward "127.0.0.1:$IPERF" 2>"$LOGS/server.log" & PIDS+=($!)
"$COHORT" tunnel client --listen "127.0.0.1:$CLIENT" --connect "127.0.0.1:$SERVER" --kem "$KEM" 2>"$LOGS/client.log" & PIDS+=($!)
socat -b 65536 "TCP-LISTEN:$RELAY2,fork,reuseaddr,bind=127.0.0.1" "TCP:127.0.0.1:$IPERF" 2>/dev/null & PIDS+=($!)
socat -b 65536 "TCP-LISTEN:$RELAY1,fork,reuseaddr,bind=127.0.0.1" "TCP:127.0.0.1:$RELAY2" 2>/dev/null & PIDS+=($!)
sleep 1

rate() { # port -> receiver Gbit/s
  iperf3 -c 127.0.0.1 -p "$1" -t "$SECONDS_PER_RUN" -J \
    | python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'
}

echo "loopback throughput, ${SECONDS_PER_RUN}s per run, kem $KEM, $(nproc) cores"
printf '%-5s %11s %11s %12s %15s %15s\n' run "plain Gb/s" "relay Gb/s" "tunnel Gb/s" "tunnel/plain" "tunnel/relay"
for i in $(seq 1 "$RUNS"); do
  plain=$(rate "$IPERF")
  relay=$(rate "$RELAY1")
  tunnel=$(rate "$CLIENT")
  read -r vs_plain vs_relay < <(python3 -c "print('%.2f %.2f' % ($tunnel/$plain, $tunnel/$relay))")
  printf '%-5s %11s %11s %12s %15s %15s\n' "$i" "$plain" "$relay" "$tunnel" "$vs_plain" "$vs_relay"
done
grep -m1 "session" "$LOGS/client.log" || { echo "no tunnel session was logged"; cat "$LOGS"/*.log; exit 1; }
