#!/usr/bin/env bash
# Floods against the tunnel server (issue 17, section 4), in a network namespace of its own:
#
#   tunnel_flood half ──100,000 x half a ClientHello, then hang──┐
#   tunnel_flood idle ──10,000 x full handshake, then idle───────┤
#   curl ──▶ cohort tunnel client ══════════════════════════════▶ cohort tunnel server ──▶ HTTP server
#
# While both floods run, curl fetches a file through the tunnel again and again: every
# request must succeed in under 1 s. The server's resident memory (VmRSS) and open file
# descriptors are sampled every 0.2 s and must stay within the bounds that
# `cohort tunnel server --help` states for its limits (the defaults are used). Every
# half-hello connection must be closed by the server (deadline or eviction), and no more
# idle tunnels than --max-established may stay open.
#
# Usage: scripts/tunnel-flood.sh PATH/TO/cohort [SCALE]
#   SCALE divides the flood sizes: 1 (default) is 100,000 half hellos and 10,000 idle
#   handshakes; CI runs 10 (10,000 and 1,000). The flood tool is the `tunnel_flood` example
#   next to the binary (`cargo build --release -p cohort --example tunnel_flood`), or
#   $TUNNEL_FLOOD. Needs root (a namespace, its port range, ulimit -n), python3 and curl.
# Ports: the namespace's ip_local_port_range is widened to 1024-65535 and the flood's
# connections come from 127.0.0.2-127.0.0.9 in turn, so ephemeral ports never run out.
# Prints a summary and PASS, or FAIL and the logs (exit 1).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/netns.sh
source scripts/lib/netns.sh
SCALE=${2:-1}
[[ $SCALE =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 PATH/TO/cohort [SCALE]" >&2; exit 2; }
netns_init "a network namespace, its port range and ulimit -n" "$1"
FLOOD=${TUNNEL_FLOOD:-$(dirname "$COHORT")/examples/tunnel_flood}
[ -x "$FLOOD" ] || fail "$FLOOD is not an executable (cargo build --release -p cohort --example tunnel_flood)"
need_tool curl "curl not found"

HALF=$((100000 / SCALE))
IDLE=$((10000 / SCALE))
# The server's defaults, as `cohort tunnel server --help` states them.
HANDSHAKE_TIMEOUT=5
MAX_PENDING=1024
MAX_ESTABLISHED=1024
FD_BOUND=$((MAX_PENDING + 2 * MAX_ESTABLISHED + 64))
# The stated memory bound: the process, plus each pending connection and each tunnel at its
# stated worst-case cost (a tunnel that has moved data holds its copy buffers).
BASE_KIB=$((16 * 1024))
PENDING_KIB=12
ESTABLISHED_KIB=210
MEM_BOUND_KIB=$((BASE_KIB + MAX_PENDING * PENDING_KIB + MAX_ESTABLISHED * ESTABLISHED_KIB))

NS=tflood$$
netns_add "$NS"
ip netns exec "$NS" sysctl -q -w net.ipv4.ip_local_port_range="1024 65535"
# The half-hello flood holds at most 3,000 connections at once, less than the server's listen
# queue (4096): a flood with more in flight than the queue holds fills it, and then the
# kernel drops every new SYN, a real client's too, which it retries only after 1 s; no
# policy in the server can change that. ulimit -n is raised for the floods and the server.
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[ "$(ulimit -n)" -ge 8192 ] || fail "ulimit -n is $(ulimit -n); need 8192"
HALF_CONCURRENCY=3000
IDLE_CONCURRENCY=10000
# The idle handshakes are opened at 1,000 a second (all 10,000 held at once): a burst of
# 10,000 connects at once would fill the listen queue in the same way.
IDLE_RATE=$((1000 / SCALE > 100 ? 1000 / SCALE : 100))

dump() {
  local f
  for f in "$WORK"/*.err "$WORK"/*.out; do
    dump_log "$f" 20 "closed cleanly|session [0-9a-f]{64} (kem|ended)|^ |^Traceback|Error|^-+$|Exception"
  done
}

mkdir -p "$WORK/www"
head -c 65536 /dev/urandom >"$WORK/www/file.bin"
# A small real HTTP server on asyncio: one thread for every connection would make Python
# itself the bottleneck with 1024 idle tunnels' targets open and thousands replaced, and
# http.server's listen queue is 5.
netns_start http "$NS" /dev/null python3 -c '
import asyncio, sys
body = open(sys.argv[1], "rb").read()
head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
async def serve(reader, writer):
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head + body)
        await writer.drain()
    except Exception:
        pass
    writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 8000, backlog=4096)
    await server.serve_forever()
asyncio.run(main())
' "$WORK/www/file.bin"
watch_alive "$STARTED" "the HTTP server"
netns_start server "$NS" /dev/null "$COHORT" tunnel server --listen 127.0.0.1:7400 --forward 127.0.0.1:8000
SERVER=$STARTED
watch_alive "$SERVER" "the tunnel server"
netns_start client "$NS" /dev/null "$COHORT" tunnel client --listen 127.0.0.1:7401 --connect 127.0.0.1:7400
watch_alive "$STARTED" "the tunnel client"
wait_for 10 "tunnel server listening" grep -q listening "$WORK/server.err"
wait_for 10 "tunnel client listening" grep -q listening "$WORK/client.err"
grep -q "at most $FD_BOUND file descriptors" "$WORK/server.err" \
  || die "the server does not state the fd bound $FD_BOUND"

fetch() { # one request through the tunnel: "SECONDS HTTP_CODE"
  local out
  out=$(ip netns exec "$NS" curl -s -o /dev/null --max-time 5 -w '%{time_total} %{http_code}' \
    http://127.0.0.1:7401/file.bin) || true
  echo "${out:-5.0 000}"
}
wait_for 10 "request through the idle tunnel" sh -c "$(declare -f fetch); NS=$NS; fetch | grep -q ' 200\$'"
base_rss=$(awk '/VmRSS/ {print $2}' "/proc/$SERVER/status")

sample() { # every 0.2 s: "RSS_KIB FDS LISTEN_QUEUE TIME" of the server
  while kill -0 "$SERVER" 2>/dev/null; do
    local rss fds
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$SERVER/status" 2>/dev/null) || break
    fds=$(find "/proc/$SERVER/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    # The listen queue: connections the kernel completed that the server has not accepted.
    queue=$(ip netns exec "$NS" ss -ltnH 'sport = :7400' | awk '{print $2; exit}')
    echo "$rss $fds ${queue:-0} $(date +%s.%N)"
    sleep 0.2
  done
}
sample >"$WORK/samples" &
NETNS_PIDS+=("$!")

echo "flooding: $HALF half hellos (up to $HALF_CONCURRENCY at once) and $IDLE idle handshakes (up to $IDLE_CONCURRENCY at once, $IDLE_RATE a second); curl through the tunnel meanwhile"
start=$(now)
netns_start half "$NS" /dev/null "$FLOOD" half --server 127.0.0.1:7400 --count "$HALF" \
  --concurrency "$HALF_CONCURRENCY" --sources 8 --hold 30
HALF_PID=$STARTED
netns_start idle "$NS" /dev/null "$FLOOD" idle --server 127.0.0.1:7400 --count "$IDLE" \
  --concurrency "$IDLE_CONCURRENCY" --sources 8 --hold 20 --rate "$IDLE_RATE"
IDLE_PID=$STARTED
: >"$WORK/requests"
while kill -0 "$HALF_PID" 2>/dev/null || kill -0 "$IDLE_PID" 2>/dev/null; do
  fetch >>"$WORK/requests"
  sleep 0.1
done
reap "$HALF_PID" || die "the half-hello flood failed"
reap "$IDLE_PID" || die "the idle flood failed"
took=$(elapsed "$start" "$(now)")
alive
# The server prints its counters every 10 s: wait for the line that counts every half hello
# closed (by the deadline or for a newer connection).
closed_all() {
  grep "so far" "$WORK/server.err" | tail -n 1 \
    | awk -v want="$HALF" '{ if ($6 + $10 >= want) ok = 1 } END { exit !ok }'
}
wait_for 25 "server count of $HALF half hellos closed" closed_all

cat "$WORK/half.out" "$WORK/idle.out"
read -r n ok min median max slow < <(python3 - "$WORK/requests" <<'EOF'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
times = sorted(float(t) for t, _ in rows)
ok = sum(1 for _, code in rows if code == "200")
slow = sum(1 for t, code in rows if code != "200" or float(t) >= 1.0)
mid = times[len(times) // 2] if times else 0
print(len(rows), ok, f"{times[0]:.3f}" if times else 0, f"{mid:.3f}", f"{times[-1]:.3f}" if times else 0, slow)
EOF
)
read -r max_rss max_fds max_queue < <(awk 'BEGIN {r = 0; f = 0; q = 0} {if ($1 > r) r = $1; if ($2 > f) f = $2; if ($3 > q) q = $3} END {print r, f, q}' "$WORK/samples")
samples=$(wc -l <"$WORK/samples")
echo "real client: $n requests through the tunnel during the floods, $ok served; seconds: min $min median $median max $max; $slow failed or took >= 1 s"
echo "server: VmRSS $base_rss KiB before, max $max_rss KiB (bound $MEM_BOUND_KIB KiB); max $max_fds fds (bound $FD_BOUND); listen queue max $max_queue; $samples samples"
grep "so far" "$WORK/server.err" | tail -n 1 || true
echo "floods took ${took}s"

half_open=$(sed -n 's/.*still open after [0-9]* s: \([0-9]*\).*/\1/p' "$WORK/half.out")
half_sent=$(sed -n 's/.*connect failures, \([0-9]*\) half hellos sent.*/\1/p' "$WORK/half.out")
idle_done=$(sed -n 's/.*failures, \([0-9]*\) handshakes completed.*/\1/p' "$WORK/idle.out")
idle_open=$(sed -n 's/.*still open after [0-9]* s: \([0-9]*\).*/\1/p' "$WORK/idle.out")
[ "$n" -ge 10 ] || die "only $n requests ran during the floods"
[ "$slow" -eq 0 ] || die "$slow of $n requests failed or took 1 s or more"
[ "$max_rss" -le "$MEM_BOUND_KIB" ] || die "VmRSS reached $max_rss KiB, over the bound $MEM_BOUND_KIB KiB"
[ "$max_fds" -le "$FD_BOUND" ] || die "$max_fds fds open, over the bound $FD_BOUND"
[ "$half_sent" -ge $((HALF * 99 / 100)) ] || die "only $half_sent of $HALF half hellos were sent"
[ "$half_open" -eq 0 ] || die "$half_open half-hello connections were still open after 30 s"
# Some idle handshakes lose their place while pending to the half-hello flood (when the
# server has not yet read their ClientHello, they look like a stalled client).
[ "$idle_done" -ge $((IDLE * 90 / 100)) ] || die "only $idle_done of $IDLE idle handshakes completed"
[ "$idle_open" -le "$MAX_ESTABLISHED" ] || die "$idle_open idle tunnels stayed open, over --max-established $MAX_ESTABLISHED"
echo PASS
