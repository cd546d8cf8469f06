#!/usr/bin/env bash
# scripts/peers/group-jgroups.sh: cohort's groups against JGroups 2.12 (Debian
# libjgroups-java) on loopback (issue 18, section 3), side by side in one run.
#
# For each member count (MEMBERS, default "4 16") it runs, ROUNDS times:
#   * JGroups: scripts/peers/JGroupsBench.java, N JChannels in one JVM, each with its own UDP
#     socket on 127.0.0.1 (no IP multicast: a multicast goes out as one unicast per member,
#     as cohort's UDP fan-out does), SEQUENCER (total order through the coordinator),
#     pbcast.NAKACK + UNICAST (reliability), UFC/MFC flow control, and with encryption
#     ENCRYPT(sym_algorithm=AES, sym_init=128). WARMUP seconds of sending for the JIT, then
#     SECONDS measured;
#   * cohort: `cohort group bench` with the same members, payload (SIZE, 1024 bytes),
#     senders (every member) and counting, gear aes-128-gcm and, in the same process,
#     gear none (--baseline), on RUNTIME (default sharded: a current-thread runtime per core,
#     or SHARDS of them, or one per member with SHARDS=member; members spread over them;
#     both sides may use every core), bundles of up to BUNDLE bytes (default 65507: JGroups
#     bundles messages into datagrams of up to 64 KB, and loopback's MTU is 65,536, so
#     neither side fragments; cohort's own default, 1452, is for 1500-byte paths and puts
#     one 1 KiB message in a datagram: BUNDLE=1452 measures it).
# Besides msgs/s it prints each side's process CPU time (user + system, all threads, over
# the measured seconds) per wall second, and msgs per CPU-second: on a machine shared with
# other work, wall msgs/s also measure how much CPU the scheduler gave each side (a JVM
# with dozens of threads gets more than a process with two).
# cohort's checks column ends with the packets per datagram its members sent over the
# counted seconds (aes-128-gcm/none; the bench's JSON "udp" has the bundle counts).
# Counting on both sides: a message counts once every member has delivered it (the smallest
# per-member delivery count over the measured period), with its total-order position and
# per-sender order checked at every member; a run whose view did not hold is flagged.
#
# JGroups 2.12's ENCRYPT is AES in ECB mode (Cipher.getInstance("AES") is
# AES/ECB/PKCS5Padding in the JDK), with no message authentication (no MAC, no AEAD: a
# changed ciphertext block decrypts to garbage that is delivered), and with
# encrypt_entire_message=false (its default) the headers (sender, sequence numbers, view)
# travel in clear. cohort's aes-128-gcm authenticates every packet, headers included. The
# printed table says so next to every encrypted JGroups number.
#
# Usage: scripts/peers/group-jgroups.sh            (env: MEMBERS SIZE WARMUP SECS ROUNDS
#                                                   RUNTIME SHARDS BUNDLE COHORT SKIP_BUILD)
# Installs libjgroups-java, default-jre-headless and default-jdk-headless (javac) from
# Debian when missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
MEMBERS=${MEMBERS:-"4 16"}
SIZE=${SIZE:-1024}
WARMUP=${WARMUP:-10}
SECS=${SECS:-10}
ROUNDS=${ROUNDS:-1}
RUNTIME=${RUNTIME:-sharded}
SHARDS=${SHARDS:-}
BUNDLE=${BUNDLE:-65507}
JAR=/usr/share/java/jgroups.jar

need=()
[ -f "$JAR" ] || need+=(libjgroups-java)
command -v java >/dev/null || need+=(default-jre-headless)
command -v javac >/dev/null || need+=(default-jdk-headless)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing from Debian: ${need[*]}" >&2
  sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

mkdir -p target/peers/jgroups
javac -nowarn -cp "$JAR" -d target/peers/jgroups scripts/peers/JGroupsBench.java
COHORT=${COHORT:-target/release/cohort}
[ -n "${SKIP_BUILD:-}" ] || cargo build --quiet --release --locked -p cohort
LOG=target/peers/jgroups/run.log
: > "$LOG"

# jgroups N ENCRYPT(0/1) -> prints msgs/s, cpu/wall and the checks
jgroups() {
  local enc=()
  [ "$2" = 1 ] && enc=(--encrypt)
  local line
  line=$(java -Djava.net.preferIPv4Stack=true -Xms512m -cp "$JAR:target/peers/jgroups" \
    JGroupsBench --members "$1" --size "$SIZE" --warmup "$WARMUP" --seconds "$SECS" \
    "${enc[@]}" 2>>"$LOG" | tee -a "$LOG" | grep '^RESULT' || true)
  [ -n "$line" ] || { echo "jgroups: no result (see $LOG)" >&2; echo "0 0 failed"; return; }
  local rate cpu held order
  rate=$(sed -n 's/.* msgs_per_sec=\([0-9.]*\).*/\1/p' <<<"$line")
  cpu=$(sed -n 's/.* cpu_per_wall=\([0-9.]*\).*/\1/p' <<<"$line")
  held=$(sed -n 's/.* view_held=\([a-z]*\).*/\1/p' <<<"$line")
  order=$(sed -n 's/.* lost=\([0-9]*\) same_order=\([a-z]*\) gaps=\([0-9]*\) reordered=\([0-9]*\).*/lost=\1,same-order=\2,gaps=\3,reordered=\4/p' <<<"$line")
  echo "$rate $cpu view-held=$held,$order"
}

# cohort N -> prints aes-128-gcm msgs/s, none msgs/s, cpu/wall (gcm), cpu/wall (none), checks
cohort() {
  local out shards=()
  case "$SHARDS" in
    '') ;;
    member) shards=(--shards "$1") ;;
    *) shards=(--shards "$SHARDS") ;;
  esac
  out=$("$COHORT" group bench "${shards[@]}" --members "$1" --size "$SIZE" --gear aes-128-gcm \
    --seconds "$SECS" --warmup "$WARMUP" --runtime "$RUNTIME" --bundle "$BUNDLE" --baseline --json \
    2>>"$LOG" | tee -a "$LOG" | tail -1 || true)
  [ -n "$out" ] || { echo "cohort: no result (see $LOG)" >&2; echo "0 0 0 0 failed"; return; }
  python3 -c '
import json, sys
r = json.loads(sys.argv[1])
per = lambda u: "%.1f" % u["packets_per_datagram_sent"] if u and u.get("packets_per_datagram_sent") else "-"
print("%.0f %.0f %.2f %.2f view-held=%s/%s,order-checked=%s/%s,packets-per-datagram=%s/%s" % (
    r["msgs_per_sec"], r["baseline_msgs_per_sec"], r.get("cpu_per_wall") or 0,
    (r.get("baseline_cpu_seconds") or 0) / r["seconds"],
    str(r["view_held"]).lower(), str(r["baseline_view_held"]).lower(),
    str(r.get("order_ok")).lower(), str(r.get("baseline_order_ok")).lower(),
    per(r.get("udp")), per(r.get("baseline_udp"))))' "$out"
}

echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores;" \
  "libjgroups-java $(dpkg-query -W -f='${Version}' libjgroups-java 2>/dev/null || echo '?')," \
  "$(java -version 2>&1 | head -1)"
echo "# $SIZE-byte messages, every member sends; msgs/s delivered at every member;" \
  "JGroups: ${WARMUP} s warm-up, then ${SECS} s; cohort: $RUNTIME runtime${SHARDS:+ (shards: $SHARDS)}, UDP bundles up to $BUNDLE bytes${COHORT_UDP_BATCH:+, COHORT_UDP_BATCH=$COHORT_UDP_BATCH}, ${WARMUP} s warm-up, ${SECS} s"
echo "# JGroups ENCRYPT = AES-ECB, no authentication, headers in clear; cohort aes-128-gcm = AEAD over header and payload"
row() { # members round side msgs/s cpu/wall checks
  local per
  per=$(python3 -c 'import sys; r, c = map(float, sys.argv[1:]); print("%.0f" % (r / c) if c > 0 else "-")' "$4" "${5/-/0}")
  printf '%-8s %-5s %-46s %10s %9s %12s  %s\n' "$1" "$2" "$3" "$4" "$5" "$per" "$6"
}
printf '%-8s %-5s %-46s %10s %9s %12s  %s\n' members round side msgs/s cpu/wall msgs/cpu-s checks
for n in $MEMBERS; do
  for r in $(seq 1 "$ROUNDS"); do
    read -r jp jpc jpx <<<"$(jgroups "$n" 0)"
    read -r je jec jex <<<"$(jgroups "$n" 1)"
    read -r cg cn cc cnc cx <<<"$(cohort "$n")"
    row "$n" "$r" "JGroups, no encryption" "$jp" "$jpc" "$jpx"
    row "$n" "$r" "JGroups ENCRYPT (AES-ECB, no auth, hdr clear)" "$je" "$jec" "$jex"
    row "$n" "$r" "cohort, gear none" "$cn" "$cnc" "$cx"
    row "$n" "$r" "cohort, aes-128-gcm (AEAD)" "$cg" "$cc" "$cx"
    python3 -c '
import sys
n, cg, cc, cn, cnc, je, jec, jp, jpc = sys.argv[1], *map(float, sys.argv[2:])
q = lambda a, b: "%.2f" % (a / b) if b > 0 else "n/a"
print("%-8s cohort aes-128-gcm / JGroups ENCRYPT (AES-ECB, no auth, headers in clear): %s msgs/s, %s per CPU-s (goal >= 2 msgs/s)"
      % (n, q(cg, je), q(cg / cc if cc else 0, je / jec if jec else 0)))
print("%-8s cohort none / JGroups none: %s msgs/s, %s per CPU-s"
      % (n, q(cn, jp), q(cn / cnc if cnc else 0, jp / jpc if jpc else 0)))' \
      "$n" "$cg" "$cc" "$cn" "$cnc" "$je" "$jec" "$jp" "$jpc"
  done
done
echo "# full output: $LOG"
