#!/usr/bin/env bash
# ALPHA hop-by-hop authentication over a real (virtual) network: two endpoints in TUN mode
# and a relay between them, each in its own network namespace, plus a forger.
#
#   netns A                      netns R                       netns B
#   tun hop0 10.200.0.1/24       relay 10.77.1.2:7500          tun hop0 10.200.0.2/24
#   endpoint 10.77.1.1:7500 ─veth─ 10.77.1.2 | 10.77.2.1 ─veth─ endpoint 10.77.2.2:7500
#                                  10.77.3.1
#                                    │ veth
#                                  netns F: forger 10.77.3.2
#
# A and B have no link to each other and R does not forward IP (ip_forward stays 0), so the
# only way between them is the relay's UDP socket: A's and B's overlay traffic goes to R
# (`via`), and R passes on only packets it verified. The tunnel subnet 10.200.0.0/24 lives
# only on the TUN devices; the overlay runs on 10.77.x, so cohort's own UDP never loops
# into the tunnel.
#
# 1. ping through the tunnel (A -> B, 10.200.0.2);
# 2. iperf3 A -> B through the tunnel for a few seconds, rate printed; A's TUN device must
#    have read super-packets (offloads: at least two IP packets per read on average);
# 3. an observer at R records a few of A's datagrams during the ping; the forger (in F)
#    replays them unchanged and, for their pair id and the live associations it reads from
#    A's control socket, sends forged packets (random chain elements, MACs, keys; a marker
#    payload) at R: R must drop every forged packet, pass on nothing but verbatim replays
#    of rounds it still remembers (as retransmissions, a bounded number of times), and B
#    must deliver nothing while A sends nothing.
# 4. with policy routing as in the report's Figure 3 (unmarked traffic for B's real
#    address into the tunnel, cohort's own socket marked), ping B's real address.
#
# The namespace skeleton (checks, start, failure dump, cleanup) is scripts/lib/netns.sh.
#
# Usage: scripts/hop-netns.sh PATH/TO/cohort
# Needs root, `ip` (iproute2) with netns support, /dev/net/tun, python3, ping and iperf3 (it
# fails loudly if any is missing, never skips). Prints PASS or FAIL; exits non-zero on
# failure. Only addresses inside the namespaces it creates carry traffic; everything is
# removed on exit.
set -euo pipefail
LIB="$(cd "$(dirname "$0")" && pwd)/lib"
# shellcheck source=lib/netns.sh
. "$LIB/netns.sh"
# shellcheck source=lib/hop-netns.sh
. "$LIB/hop-netns.sh"

netns_init "network namespaces, TUN devices" "$@"
need_tool iperf3 "iperf3 not found (Debian: apt-get install iperf3)"
need_tool ping "ping not found (Debian: apt-get install iputils-ping)"
[ -c /dev/net/tun ] || fail "/dev/net/tun is missing (no TUN support)"
dump() {
  local n
  for n in a r b; do
    dump_log "$WORK/$n.out" 10
    dump_log "$WORK/$n.err"
  done
  dump_log "$WORK/capture.err"
}

TAG=$$
NS_A=hop-a-$TAG; NS_R=hop-r-$TAG; NS_B=hop-b-$TAG; NS_F=hop-f-$TAG
hop_netns "$NS_A" "$NS_R" "$NS_B" "$NS_F"
netns_veth "$NS_A" ha$TAG 10.77.1.1/24 "$NS_R" hra$TAG 10.77.1.2/24
netns_veth "$NS_B" hb$TAG 10.77.2.2/24 "$NS_R" hrb$TAG 10.77.2.1/24
netns_veth "$NS_F" hf$TAG 10.77.3.2/24 "$NS_R" hrf$TAG 10.77.3.1/24
# B and F reach the relay's address (10.77.1.2) through R; nothing reaches A or B directly.
ip -n "$NS_B" route add 10.77.1.0/24 via 10.77.2.1
ip -n "$NS_F" route add 10.77.1.0/24 via 10.77.3.1
[ "$(ip netns exec "$NS_R" cat /proc/sys/net/ipv4/ip_forward)" = 0 ] || die "R forwards IP"

ctl() { "$COHORT" hop ctl --socket "$WORK/$1.sock" --json status; }

hop_keys_and_relay 10.77.1.2:7500 'ctl = "r.sock"'
cat >"$WORK/a.toml" <<EOF
role = "endpoint"
identity = "a.key"
listen = "10.77.1.1:7500"
ctl = "a.sock"
app = "tun"
mode = "m:32"
associations = 2
[tun]
name = "hop0"
address = "10.200.0.1/24"
mtu = 1300
fwmark = 1
[[peer]]
address = "10.77.2.2:7500"
via = "10.77.1.2:7500"
trust = "$KB"
EOF
cat >"$WORK/b.toml" <<EOF
role = "endpoint"
identity = "b.key"
listen = "10.77.2.2:7500"
ctl = "b.sock"
app = "tun"
mode = "m:32"
associations = 2
[tun]
name = "hop0"
address = "10.200.0.2/24"
[[peer]]
address = "10.77.1.1:7500"
via = "10.77.1.2:7500"
trust = "$KA"
connect = false
EOF
start() { # NAME NS
  netns_start "$1" "$2" /dev/null "$COHORT" hop run --config "$WORK/$1.toml"
  watch_alive "$STARTED" "a node"
}
start r "$NS_R"
wait_for 10 "relay start" test -S "$WORK/r.sock"
start b "$NS_B"
wait_for 10 "endpoint B start" test -S "$WORK/b.sock"
start a "$NS_A"
wait_for 10 "endpoint A start" test -S "$WORK/a.sock"
both_open() {
  [ "$(ctl a | q open_out)" -ge 2 ] && [ "$(ctl b | q open_out)" -ge 2 ]
}
wait_for 20 "two open associations each way" both_open
echo "handshake through the relay done; A and B each have 2 outgoing ALPHA-M associations"

# An on-path observer at R records ALPHA datagrams from A (UDP to 10.77.1.2:7500) while
# the ping runs: the forger replays them later and attacks their pair id.
cat >"$WORK/capture.py" <<'EOF'
import socket, struct, sys, time
iface, out, want, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
s.bind((iface, 0))
s.settimeout(0.2)
got, end = [], time.time() + limit
while len(got) < want and time.time() < end:
    try:
        frame = s.recv(65535)
    except socket.timeout:
        continue
    ip = frame[14:]
    if len(ip) < 28 or ip[0] >> 4 != 4 or ip[9] != 17:
        continue
    ihl = (ip[0] & 15) * 4
    dport = struct.unpack("!H", ip[ihl + 2:ihl + 4])[0]
    if ip[16:20] == bytes([10, 77, 1, 2]) and dport == 7500:
        got.append(ip[ihl + 8:].hex())
with open(out, "w") as f:
    f.write("\n".join(got) + "\n")
EOF
netns_start capture "$NS_R" /dev/null python3 "$WORK/capture.py" hra$TAG "$WORK/captured.hex" 40 8
CAPTURE=$STARTED
sleep 0.5

# 1. ping through the tunnel.
ip netns exec "$NS_A" ping -c 3 -i 0.2 -W 2 10.200.0.2 >"$WORK/ping.out" 2>&1 \
  || { cat "$WORK/ping.out" >&2; die "ping 10.200.0.2 through the tunnel failed"; }
grep -E 'packets transmitted|rtt' "$WORK/ping.out"
ip netns exec "$NS_A" ping -c 20 -i 0.05 -W 2 10.200.0.2 >/dev/null 2>&1 || true
reap "$CAPTURE" || die "capturing at R failed"
echo "observer at R captured $(grep -c . "$WORK/captured.hex") ALPHA datagrams from A"
# Without the relay's own UDP socket there is no path: A cannot reach B's overlay address.
if ip netns exec "$NS_A" ping -c 1 -W 1 10.77.2.2 >/dev/null 2>&1; then
  die "A reaches B's overlay address without the relay"
fi

# 2. iperf3 A -> B through the tunnel.
netns_start iperf-s "$NS_B" /dev/null iperf3 -s -1 -B 10.200.0.2
sleep 0.5
ip netns exec "$NS_A" iperf3 -c 10.200.0.2 -t 3 -J >"$WORK/iperf.json" 2>"$WORK/iperf.err" \
  || { cat "$WORK/iperf.err" "$WORK/iperf.json" >&2; die "iperf3 through the tunnel failed"; }
RATE=$(q rate <"$WORK/iperf.json")
echo "iperf3 A -> B through the tunnel (ALPHA-M, batch 32, 2 associations, via the relay): $RATE Mbit/s"
python3 -c "import sys; sys.exit(0 if float('$RATE') > 0 else 1)" || die "iperf3 moved nothing"
ctl r >"$WORK/r-after-iperf.json"
# The TUN offloads: A's reads brought super-packets (several IP packets each), none failed.
ctl a >"$WORK/a-after-iperf.json"
A_READS=$(q get tun.reads <"$WORK/a-after-iperf.json")
A_SENT=$(q get tun.sent <"$WORK/a-after-iperf.json")
echo "A's TUN device: $A_SENT packets in $A_READS reads (offload $(q get tun.offload <"$WORK/a-after-iperf.json"), read errors $(q get tun.read_errors <"$WORK/a-after-iperf.json"))"
[ "$(q get tun.offload <"$WORK/a-after-iperf.json")" = True ] || die "A's TUN device has no offloads"
[ "$A_SENT" -ge $((2 * A_READS)) ] || die "A's TUN reads did not bring super-packets ($A_SENT packets in $A_READS reads)"
[ "$(q get tun.read_errors <"$WORK/a-after-iperf.json")" -eq 0 ] || die "A failed to split TUN reads"
# B wrote every packet it received: none failed the IP length checks.
[ "$(ctl b | q get tun.received_not_ip)" -eq 0 ] || die "B dropped received packets as not whole IP packets"
echo "relay after iperf3: verified $(q get counters.verified <"$WORK/r-after-iperf.json"), forwarded $(q get counters.forwarded <"$WORK/r-after-iperf.json")"
sleep 1

# 3. Forgeries at the relay, from namespace F.
R0=$(ctl r); B0=$(ctl b); A0=$(ctl a)
ip netns exec "$NS_F" "$COHORT" hop forge --to 10.77.1.2:7500 --ctl "$WORK/a.sock" \
  --replay "$WORK/captured.hex" --rounds 10 --marker "FORGED-$TAG" >"$WORK/forge.json" 2>"$WORK/forge.err" \
  || { cat "$WORK/forge.err" >&2; die "hop forge failed"; }
FORGED=$(q get sent <"$WORK/forge.json")
[ "$FORGED" -gt 0 ] || die "the forger sent nothing"
# Verbatim replays of a round the relay still remembers (an S1 or A1 of the ping's
# association, which iperf3's connection did not use) are passed on like the signer's own
# retransmissions, at most MAX_REPEATS (8) times a round; everything else must be dropped.
REPLAYS=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['kinds'].get('replay', 0))" "$WORK/forge.json")
DROPPED0=$(echo "$R0" | q dropped)
FORWARDED0=$(echo "$R0" | q get counters.forwarded)
relay_dropped_all() { [ $(( $(ctl r | q dropped) - DROPPED0 )) -ge $(( FORGED - REPLAYS )) ]; }
wait_for 10 "drop of all $(( FORGED - REPLAYS )) forged (not replayed) packets at the relay" relay_dropped_all
sleep 0.5
R1=$(ctl r); B1=$(ctl b); A1=$(ctl a)
echo "forger sent $FORGED packets ($(q get kinds <"$WORK/forge.json" | tr -d ' '), known pairs: $(q get known_pairs <"$WORK/forge.json"))"
delta() { echo $(( $(echo "$R1" | q get "counters.$1") - $(echo "$R0" | q get "counters.$1") )); }
echo "relay drops: +$(( $(echo "$R1" | q dropped) - DROPPED0 )) (forged +$(delta forged), replayed +$(delta replayed), stale +$(delta stale), unverifiable +$(delta unverifiable), unknown +$(delta unknown), malformed +$(delta malformed))"
PASSED=$(( $(echo "$R1" | q get counters.forwarded) - FORWARDED0 ))
echo "relay passed on $PASSED packets during the attack (of $REPLAYS verbatim replays; A sent nothing real)"
[ "$PASSED" -le "$REPLAYS" ] || die "the relay passed on $PASSED packets, more than the $REPLAYS replays"
[ "$(q get known_pairs <"$WORK/forge.json")" -ge 1 ] || die "the forger learned no live pair id"
[ $(( $(delta forged) + $(delta unverifiable) + $(delta replayed) + $(delta stale) )) -gt 0 ] \
  || die "no forgery for the live pair reached the relay's checks (all were unknown pairs)"
SENT_DELTA=$(( $(echo "$A1" | q get tun.sent) - $(echo "$A0" | q get tun.sent) ))
DELIV_DELTA=$(( $(echo "$B1" | q get counters.delivered) - $(echo "$B0" | q get counters.delivered) ))
WRITTEN_DELTA=$(( $(echo "$B1" | q get tun.written) - $(echo "$B0" | q get tun.written) ))
echo "during the attack: A sent $SENT_DELTA real packets; B delivered $DELIV_DELTA, wrote $WRITTEN_DELTA to its tunnel"
[ "$DELIV_DELTA" -le "$SENT_DELTA" ] || die "B delivered more than A sent: a forgery got through"
[ "$WRITTEN_DELTA" -le "$SENT_DELTA" ] || die "B wrote more to its tunnel than A sent"

# 4. The implementation report's routing (its Figure 3): an unmodified application in A
#    talks to B's *real* address. Policy routing sends every unmarked packet for it into
#    the tunnel; cohort's own UDP socket marks its packets (fwmark = 1 in A's [tun]), so
#    they take the main table to the relay and never loop back into the tunnel.
ip -n "$NS_A" rule add not fwmark 1 table 100 pref 100
ip -n "$NS_A" route add 10.77.2.2/32 dev hop0 table 100
T0=$(ctl a | q get tun.sent)
ip netns exec "$NS_A" ping -c 3 -i 0.2 -W 2 10.77.2.2 >"$WORK/ping-real.out" 2>&1 \
  || { cat "$WORK/ping-real.out" >&2; die "ping to B's real address through the tunnel failed"; }
T1=$(ctl a | q get tun.sent)
[ $(( T1 - T0 )) -ge 3 ] || die "the pings to B's real address did not go through the tunnel"
echo "ping to B's real address 10.77.2.2 went through the tunnel ($(( T1 - T0 )) packets; cohort's own marked packets bypass it)"
ip -n "$NS_A" rule del not fwmark 1 table 100 pref 100

# The path still works after the attack.
ip netns exec "$NS_A" ping -c 2 -i 0.2 -W 2 10.200.0.2 >/dev/null 2>&1 || die "ping after the attack failed"
alive
echo "PASS: hop-netns"
