#!/usr/bin/env bash
# A chaos soak of an ALPHA path of real `cohort hop run` processes: endpoints and relays are
# killed (-9) and restarted and links go down and up at random, for MINUTES, while messages
# flow both ways all the time and a forger attacks the path all the time.
#
#   netns A                 netns R1                   netns R2                 netns B
#   endpoint 10.78.1.1 ─veth─ 10.78.1.2:7500 relay R1    relay R2 10.78.3.1:7500 ─veth─
#   (stdio)                 10.78.2.1 ─────── veth ────── 10.78.2.2          endpoint 10.78.3.2
#                           10.78.4.1
#                             │ veth
#                           netns F: forger 10.78.4.2 (`cohort hop forge`, over and over)
#
# A connects to B through R1 and R2 (static routes; each relay listens on one address and
# the other reaches it through their link); B waits to be called. R1 and R2 do not forward
# IP: the only way through is the relays' UDP sockets. Each endpoint
# sends a message every 100 ms (stdio mode: `send` lines in, `received` lines out). Faults,
# one at a time, a few seconds apart after a 20 s warm-up:
#   * kill -9 relay R1, restart it 0.2 to 3 s later (it comes back with no state);
#   * kill -9 endpoint B, restart it 0.2 to 3 s later (new chains, it waits to be called);
#   * take one link of the path down for 1 to 8 s (ip link set down/up).
# A and R2 are never restarted: their memory is followed. Checks (scripts/hop_chaos_q.py):
# nothing forged or from nowhere is delivered, nothing twice; after each fault ends
# traffic is back both ways within 10 s (each recovery time is printed); VmRSS of A and R2
# grows by under 10 % from the end of the warm-up to the end.
#
# The namespace skeleton (checks, start, failure dump, cleanup) is scripts/lib/netns.sh;
# the namespaces with IPv6 off, the key files and the relay config, scripts/lib/hop-netns.sh.
#
# Usage: scripts/hop-chaos.sh PATH/TO/cohort MINUTES [SEED]
# Needs root, `ip` (iproute2) with netns support and python3 (fails loudly if missing).
# Prints one line per fault, a summary and PASS or FAIL; exits non-zero on failure. Only
# addresses inside the namespaces it creates carry traffic; everything is removed on exit.
set -euo pipefail
LIB="$(cd "$(dirname "$0")" && pwd)/lib"
# shellcheck source=lib/netns.sh
. "$LIB/netns.sh"
# shellcheck source=lib/hop-netns.sh
. "$LIB/hop-netns.sh"

[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: $0 PATH/TO/cohort MINUTES [SEED]" >&2; exit 2; }
MINUTES=$2
SEED=${3:-$$}
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 1 else 1)" "$MINUTES" 2>/dev/null \
  || { echo "MINUTES must be a number, at least 1" >&2; exit 2; }
netns_init "network namespaces" "$1"
CHAOS_Q="$(cd "$(dirname "$0")" && pwd)/hop_chaos_q.py"
[ -f "$CHAOS_Q" ] || fail "$CHAOS_Q is missing"
dump() {
  local n
  for n in a r1 r2 b; do
    dump_log "$WORK/$n.out" 15 '"event":"counters"'
    dump_log "$WORK/$n.err" 20
  done
}

TAG=$$
NS_A=hc-a-$TAG; NS_R1=hc-r1-$TAG; NS_R2=hc-r2-$TAG; NS_B=hc-b-$TAG; NS_F=hc-f-$TAG
hop_netns "$NS_A" "$NS_R1" "$NS_R2" "$NS_B" "$NS_F"
netns_veth "$NS_A" ca$TAG 10.78.1.1/24 "$NS_R1" cra$TAG 10.78.1.2/24
netns_veth "$NS_R1" crr$TAG 10.78.2.1/24 "$NS_R2" crs$TAG 10.78.2.2/24
netns_veth "$NS_B" cb$TAG 10.78.3.2/24 "$NS_R2" crb$TAG 10.78.3.1/24
netns_veth "$NS_F" cf$TAG 10.78.4.2/24 "$NS_R1" crf$TAG 10.78.4.1/24
# The relays reach each other's listening address over their link, the forger reaches R1's.
# (Taking a link down drops these routes; hop_chaos_q.py puts them back after each flap.)
ROUTES='[["'$NS_R1'", "10.78.3.0/24", "10.78.2.2"], ["'$NS_R2'", "10.78.1.0/24", "10.78.2.1"], ["'$NS_F'", "10.78.1.0/24", "10.78.4.1"]]'
python3 -c 'import json,subprocess,sys
for ns, net, gw in json.loads(sys.argv[1]):
    subprocess.run(["ip", "-n", ns, "route", "replace", net, "via", gw], check=True)' "$ROUTES"
for ns in "$NS_R1" "$NS_R2"; do
  [ "$(ip netns exec "$ns" cat /proc/sys/net/ipv4/ip_forward)" = 0 ] || die "$ns forwards IP"
done

hop_keys_and_relay 10.78.1.2:7500 'ctl = "r1.sock"
[[peer]]
address = "10.78.3.2:7500"
via = "10.78.3.1:7500"'
mv "$WORK/r.toml" "$WORK/r1.toml"
cat >"$WORK/r2.toml" <<EOF
role = "relay"
listen = "10.78.3.1:7500"
trust = ["$KA", "$KB"]
ctl = "r2.sock"
[[peer]]
address = "10.78.1.1:7500"
via = "10.78.1.2:7500"
EOF
cat >"$WORK/a.toml" <<EOF
role = "endpoint"
identity = "a.key"
listen = "10.78.1.1:7500"
ctl = "a.sock"
mode = "m:8"
associations = 1
[[peer]]
address = "10.78.3.2:7500"
via = "10.78.1.2:7500"
trust = "$KB"
EOF
cat >"$WORK/b.toml" <<EOF
role = "endpoint"
identity = "b.key"
listen = "10.78.3.2:7500"
ctl = "b.sock"
mode = "m:8"
associations = 1
[[peer]]
address = "10.78.1.1:7500"
via = "10.78.3.1:7500"
trust = "$KA"
connect = false
EOF
cat >"$WORK/setup.json" <<EOF
{
  "cohort": "$COHORT", "work": "$WORK", "minutes": $MINUTES, "seed": $SEED,
  "marker": "FORGED-$TAG",
  "forger_ns": "$NS_F", "forge_to": "10.78.1.2:7500", "routes": $ROUTES,
  "nodes": [
    {"name": "r1", "ns": "$NS_R1", "config": "$WORK/r1.toml", "endpoint": false},
    {"name": "r2", "ns": "$NS_R2", "config": "$WORK/r2.toml", "endpoint": false},
    {"name": "a", "ns": "$NS_A", "config": "$WORK/a.toml", "endpoint": true},
    {"name": "b", "ns": "$NS_B", "config": "$WORK/b.toml", "endpoint": true}
  ],
  "links": [["$NS_A", "ca$TAG", "A-R1"], ["$NS_R1", "crr$TAG", "R1-R2"],
            ["$NS_B", "cb$TAG", "R2-B"]]
}
EOF
echo "hop-chaos: A - R1 - R2 - B for $MINUTES min, seed $SEED, $(basename "$COHORT") at $COHORT"
python3 "$CHAOS_Q" "$WORK/setup.json" || die "hop-chaos failed (logs below)"
