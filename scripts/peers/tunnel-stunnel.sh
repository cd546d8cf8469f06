#!/usr/bin/env bash
# scripts/peers/tunnel-stunnel.sh: the cohort tunnel against stunnel4 on loopback (issue 18,
# section 2), side by side in one run.
#
#   plain:   load ─────────────────────────────────────────────────▶ target
#   relay:   load ─▶ socat ──────────────────────▶ socat ─────────────▶ target   (no crypto)
#   stunnel: load ─▶ stunnel client ══ TLS 1.3 ══▶ stunnel server ─────▶ target
#   cohort:  load ─▶ cohort tunnel client ═══════▶ cohort tunnel server ─▶ target
#
# stunnel4 runs TLS 1.3 with X25519 only and an ECDSA P-256 certificate that the client
# verifies (verifyChain, checkHost). cohort runs its default KEM (X25519+ML-KEM-768) and
# again x25519, with authentication mode none (encryption only: stunnel's certificate check
# is stronger; `--auth signature` adds a batch signature, see docs/performance.md).
#
# It measures, ROUNDS times, then prints the medians and the ratios:
#   * bulk: iperf3, 1 and 4 streams, SECONDS each;
#   * new connections per second at 4 concurrent connections, each sending a 100-byte
#     request and reading a 100-byte reply (scripts/peers/tunnel_rr.c), SECONDS each after a
#     1 s warm-up: as shipped; with full handshakes forced on both sides (stunnel:
#     sessionResume = no on both ends and no tickets; cohort: `tunnel client --no-resume`);
#   * the share of resumed handshakes as shipped (cohort: its metrics; stunnel: its log at
#     debug = info, which the stunnel server runs at as shipped, and at its default notice
#     level otherwise). Both stunnel ends run with syslog = no: without a /dev/log, stunnel
#     writes each log line to /dev/console as well, which cost it 10-20 ms per connection;
#   * cohort's tunnel server runs with its defaults (one thread, per-connection log lines
#     to a file), its client with `--kem` set;
#   * the server-side tunnel end's CPU (user + system, with reaped children: socat forks one
#     per connection) from /proc/PID/stat, per connection and per GB of iperf3 payload;
#   * the median (and 99th percentile) time from connect() to the last byte of the reply.
#
# Usage: scripts/peers/tunnel-stunnel.sh [SECONDS] [ROUNDS]      (defaults 5 and 3)
# Installs stunnel4, socat, iperf3 (and openssl, gcc) from Debian when missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
SECS=${1:-5}
ROUNDS=${2:-3}
CONC=4

need=()
for tool in stunnel4:stunnel4 socat:socat iperf3:iperf3 openssl:openssl cc:gcc curl:curl; do
  command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing from Debian: ${need[*]}" >&2
  sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && $sudo apt-get install -y -qq "${need[@]}"
fi
COHORT=${COHORT:-target/release/cohort}
[ -n "${SKIP_BUILD:-}" ] || cargo build --quiet --release --locked -p cohort
# shellcheck source=../lib/tunnel-peers.sh
. scripts/lib/tunnel-peers.sh

ticks() { # pid -> utime + stime + cutime + cstime (clock ticks)
  awk '{ print $14 + $15 + $16 + $17 }' "/proc/$1/stat"
}
HZ=$(getconf CLK_TCK)

# The targets: iperf3 for bulk, the reply server for connections.
IPERF=$(port); TARGET_RR=$(port)
iperf3 -s -p "$IPERF" -B 127.0.0.1 >"$WORK/iperf.log" 2>&1 & PIDS+=($!)
"$RR" server "$TARGET_RR" & PIDS+=($!)

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=localhost -addext subjectAltName=DNS:localhost \
  -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null

# start_STACK TARGET [VARIANT] -> sets ENTRY (the port the load connects to), SERVER (the
# pid of the server-side end), STOP (pids to kill afterwards), LOG (the server's log).
start_plain() { ENTRY=$1; SERVER=; STOP=(); LOG=; }
start_relay() {
  local a b; a=$(port); b=$(port)
  socat -b 65536 "TCP-LISTEN:$b,fork,reuseaddr,bind=127.0.0.1" "TCP:127.0.0.1:$1,nodelay" 2>/dev/null & SERVER=$!
  socat -b 65536 "TCP-LISTEN:$a,fork,reuseaddr,bind=127.0.0.1" "TCP:127.0.0.1:$b,nodelay" 2>/dev/null & STOP=($! "$SERVER")
  ENTRY=$a; LOG=
}
start_stunnel() { # TARGET shipped|full
  local s c resume=yes level=info; s=$(port); c=$(port)
  [ "$2" = full ] && resume=no && level=notice
  LOG="$WORK/stunnel-server-$s.log"
  cat >"$WORK/s-$s.conf" <<EOF
foreground = yes
pid =
syslog = no
debug = $level
output = $LOG
[tunnel]
accept = 127.0.0.1:$s
connect = 127.0.0.1:$1
cert = $WORK/cert.pem
key = $WORK/key.pem
sslVersionMin = TLSv1.3
curves = X25519
socket = l:TCP_NODELAY=1
socket = r:TCP_NODELAY=1
sessionResume = $resume
EOF
  [ "$2" = full ] && echo "options = NO_TICKET" >>"$WORK/s-$s.conf"
  cat >"$WORK/c-$c.conf" <<EOF
foreground = yes
pid =
syslog = no
debug = notice
output = $WORK/stunnel-client-$c.log
[tunnel]
client = yes
accept = 127.0.0.1:$c
connect = 127.0.0.1:$s
CAfile = $WORK/cert.pem
verifyChain = yes
checkHost = localhost
sslVersionMin = TLSv1.3
curves = X25519
socket = l:TCP_NODELAY=1
socket = r:TCP_NODELAY=1
sessionResume = $resume
EOF
  stunnel4 "$WORK/s-$s.conf" >/dev/null 2>&1 & SERVER=$!
  stunnel4 "$WORK/c-$c.conf" >/dev/null 2>&1 & STOP=($! "$SERVER")
  ENTRY=$c
}
start_cohort() { # TARGET KEM shipped|full
  local s c m extra=(); s=$(port); c=$(port); m=$(port)
  [ "$3" = full ] && extra=(--no-resume)
  LOG="$WORK/cohort-server-$s.log"
  "$COHORT" tunnel server --listen "127.0.0.1:$s" --forward "127.0.0.1:$1" \
    --metrics "127.0.0.1:$m" 2>"$LOG" & SERVER=$!
  "$COHORT" tunnel client --listen "127.0.0.1:$c" --connect "127.0.0.1:$s" --kem "$2" \
    "${extra[@]}" 2>"$WORK/cohort-client-$c.log" & STOP=($! "$SERVER")
  ENTRY=$c; METRICS=$m
}
stop() { for p in "${STOP[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }

resumed_count() { # STACK -> "resumed full" handshakes so far on the server
  case $1 in
    stunnel) echo "$(grep -c 'previous session reused' "$LOG" || true) $(grep -c 'new session negotiated' "$LOG" || true)" ;;
    cohort*) curl -s "http://127.0.0.1:$METRICS/metrics" | python3 -c '
import re, sys
t = sys.stdin.read()
def get(kind):
    m = re.search(r"cohort_tunnel_handshakes_total\{kind=\"%s\"\} (\d+)" % kind, t)
    return int(m.group(1)) if m else 0
print(get("resumed"), get("full"))' ;;
    *) echo "0 0" ;;
  esac
}

RESULTS="$WORK/results.tsv"
: >"$RESULTS"
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$RESULTS"; } # key stack value

bulk() { # STACK_NAME start-args...
  local name=$1; shift
  "start_$1" "$IPERF" "${@:2}"; sleep 0.5
  for streams in 1 4; do
    local t0=0 t1=0 out
    [ -n "$SERVER" ] && t0=$(ticks "$SERVER")
    out=$(iperf3 -c 127.0.0.1 -p "$ENTRY" -t "$SECS" -P "$streams" -J)
    [ -n "$SERVER" ] && t1=$(ticks "$SERVER")
    read -r gbps bytes < <(python3 -c 'import json,sys; s=json.load(sys.stdin)["end"]["sum_received"]; print("%.2f %d" % (s["bits_per_second"]/1e9, s["bytes"]))' <<<"$out")
    record "bulk$streams" "$name" "$gbps"
    [ -n "$SERVER" ] && [ "$streams" = 1 ] && record cpu_per_gb "$name" "$(python3 -c "print('%.3f' % (($t1-$t0)/$HZ/($bytes/1e9)))")"
  done
  stop
}

conns() { # KEY STACK_NAME start-args...
  local key=$1 name=$2; shift 2
  "start_$1" "$TARGET_RR" "${@:2}"; sleep 0.5
  "$RR" client "$ENTRY" "$CONC" 1 >/dev/null # warm-up
  local t0=0 t1=0 r0=(0 0) r1=(0 0) out
  read -r -a r0 < <(resumed_count "$1")
  [ -n "$SERVER" ] && t0=$(ticks "$SERVER")
  out=$("$RR" client "$ENTRY" "$CONC" "$SECS")
  [ -n "$SERVER" ] && t1=$(ticks "$SERVER")
  sleep 0.2
  read -r -a r1 < <(resumed_count "$1")
  local n rate med p99 errs
  read -r _ n _ rate _ med _ p99 _ errs <<<"$out"
  record "conn_$key" "$name" "$rate"
  record "lat_$key" "$name" "$med"
  record "errors_$key" "$name" "$errs"
  [ -n "$SERVER" ] && record "cpu_$key" "$name" "$(python3 -c "print('%.0f' % (($t1-$t0)/$HZ*1e6/max($n,1)))")"
  local res=$((r1[0] - r0[0])) full=$((r1[1] - r0[1]))
  [ $((res + full)) -gt 0 ] && record "resumed_$key" "$name" "$(python3 -c "print('%.1f' % (100*$res/($res+$full)))")"
  stop
}

cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
echo "tunnel against stunnel on loopback: $cpu, $(nproc) cores, ${SECS}s per point, $ROUNDS rounds, $CONC concurrent connections"
echo "stunnel: $(stunnel4 -version 2>&1 | grep -m1 '^stunnel'), $(stunnel4 -version 2>&1 | grep -m1 'Compiled with')"
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round: bulk" >&2
  bulk plain plain
  bulk relay relay
  bulk stunnel stunnel shipped
  bulk cohort cohort x25519-mlkem768 shipped
  bulk cohort-x25519 cohort x25519 shipped
  echo "round $round: connections" >&2
  conns shipped plain plain
  conns shipped relay relay
  conns shipped stunnel stunnel shipped
  conns full stunnel stunnel full
  conns shipped cohort cohort x25519-mlkem768 shipped
  conns full cohort cohort x25519-mlkem768 full
  conns shipped cohort-x25519 cohort x25519 shipped
  conns full cohort-x25519 cohort x25519 full
done

python3 - "$RESULTS" <<'EOF'
import statistics, sys
from collections import defaultdict
vals = defaultdict(list)
for line in open(sys.argv[1]):
    key, stack, v = line.rstrip("\n").split("\t")
    vals[(key, stack)].append(float(v))
med = {k: statistics.median(v) for k, v in vals.items()}
stacks = ["plain", "relay", "stunnel", "cohort", "cohort-x25519"]
rows = [
    ("bulk, 1 stream (Gb/s)", "bulk1", "%.1f"),
    ("bulk, 4 streams (Gb/s)", "bulk4", "%.1f"),
    ("server CPU s per GB (1 stream)", "cpu_per_gb", "%.2f"),
    ("conn/s as shipped", "conn_shipped", "%.0f"),
    ("% resumed as shipped", "resumed_shipped", "%.1f"),
    ("server us/conn as shipped", "cpu_shipped", "%.0f"),
    ("median us/conn as shipped", "lat_shipped", "%.0f"),
    ("conn/s, full handshakes", "conn_full", "%.0f"),
    ("% resumed, full forced", "resumed_full", "%.1f"),
    ("server us/conn, full", "cpu_full", "%.0f"),
    ("median us/conn, full", "lat_full", "%.0f"),
    ("failed connections (sum)", "errors_shipped", "%.0f"),
]
print()
print("medians of %d rounds" % max(len(v) for v in vals.values()))
print("| | " + " | ".join(stacks) + " |")
print("|---" * (len(stacks) + 1) + "|")
for title, key, fmt in rows:
    cells = []
    for s in stacks:
        if key.startswith("errors"):
            v = sum(vals.get((key, s), [])) + sum(vals.get(("errors_full", s), []))
            cells.append("%d" % v if (key, s) in vals else "-")
        else:
            cells.append(fmt % med[(key, s)] if (key, s) in med else "-")
    print("| %s | %s |" % (title, " | ".join(cells)))
print()
def ratio(title, key, a, b, goal=None, lower=False):
    if (key, a) in med and (key, b) in med and med[(key, b)]:
        r = med[(key, a)] / med[(key, b)]
        verdict = ""
        if goal is not None:
            ok = r <= goal if lower else r >= goal
            verdict = "  goal %s %.2f: %s" % ("<=" if lower else ">=", goal, "met" if ok else "NOT met")
        print("%-48s %6.2f%s" % (title, r, verdict))
for s in ["cohort", "cohort-x25519"]:
    print("%s:" % s)
    ratio("  bulk 1 stream / stunnel", "bulk1", s, "stunnel", 2.0)
    ratio("  bulk 4 streams / stunnel", "bulk4", s, "stunnel", 2.0)
    ratio("  bulk 1 stream / relay", "bulk1", s, "relay", 0.9)
    ratio("  bulk 4 streams / relay", "bulk4", s, "relay", 0.9)
    ratio("  conn/s as shipped / stunnel", "conn_shipped", s, "stunnel")
    ratio("  conn/s full / stunnel full", "conn_full", s, "stunnel", 3.0)
    ratio("  server CPU per conn, full / stunnel", "cpu_full", s, "stunnel")
    ratio("  server CPU per GB / stunnel", "cpu_per_gb", s, "stunnel")
    if ("cpu_full", s) in med:
        v = med[("cpu_full", s)]
        print("%-48s %6.0f  goal <= 150: %s" % ("  server us per full-handshake conn", v, "met" if v <= 150 else "NOT met"))
    if ("resumed_shipped", s) in med:
        v = med[("resumed_shipped", s)]
        print("%-48s %6.1f  goal >= 95: %s" % ("  % resumed as shipped", v, "met" if v >= 95 else "NOT met"))
EOF
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
