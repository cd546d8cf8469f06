#!/usr/bin/env bash
# A cohort group over a real (virtual) network, cut in two: four `cohort group run` members,
# two in each of two network namespaces joined by a veth pair.
#
#   netns A (10.99.0.1)                          netns B (10.99.0.2)
#     m1 :7101  m2 :7102  ── veth ── cut ── veth ──  m3 :7103  m4 :7104
#
# 1. all four install one view of 4;
# 2. the link goes down: each side installs its own view of 2, with its own leader and a
#    new key epoch, and keeps delivering reliable messages within its side (and only there);
# 3. the link comes back up (merging the components is a later issue: not checked).
#
# Usage: scripts/group-netns.sh PATH/TO/cohort
# Needs root, `ip` (iproute2) with netns support, and python3. Prints PASS or FAIL; exits
# non-zero on failure, including when network namespaces are unavailable. Traffic stays on
# the namespaces' own veth pair and loopbacks; everything is removed on exit.
set -euo pipefail

fail() { echo "FAIL: $*" >&2; exit 1; }

[ $# -eq 1 ] || { echo "usage: $0 PATH/TO/cohort" >&2; exit 2; }
[ -x "$1" ] || fail "$1 is not an executable"
COHORT=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
[ "$(id -u)" -eq 0 ] || fail "needs root (network namespaces)"
command -v ip >/dev/null || fail "ip (iproute2) not found"
command -v python3 >/dev/null || fail "python3 not found"

TAG=$$
NS_A=cohort-a-$TAG
NS_B=cohort-b-$TAG
VETH_A=cga$TAG
VETH_B=cgb$TAG
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
dump() {
  for i in 1 2 3 4; do
    echo "--- m$i stdout (last 15 lines)"; tail -n 15 "$WORK/m$i.out" 2>/dev/null || true
    echo "--- m$i stderr"; cat "$WORK/m$i.err" 2>/dev/null || true
  done
}
die() { echo "FAIL: $*" >&2; dump >&2; exit 1; }

ip netns add "$NS_A" || fail "cannot create network namespace $NS_A (ip netns unavailable?)"
ip netns add "$NS_B" || fail "cannot create network namespace $NS_B"
ip link add "$VETH_A" type veth peer name "$VETH_B" || fail "cannot create a veth pair"
ip link set "$VETH_A" netns "$NS_A"
ip link set "$VETH_B" netns "$NS_B"
ip -n "$NS_A" addr add 10.99.0.1/24 dev "$VETH_A"
ip -n "$NS_B" addr add 10.99.0.2/24 dev "$VETH_B"
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set "$VETH_A" up
ip -n "$NS_B" link set "$VETH_B" up
ip -n "$NS_A" route get 10.99.0.2 >/dev/null 2>&1 || fail "namespace A has no route to 10.99.0.2"

# Reads a member's JSON lines (python3: the lines are JSON, bash is not a JSON parser).
cat >"$WORK/q.py" <<'EOF'
import base64, json, sys
def lines(path):
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out
cmd, path = sys.argv[1], sys.argv[2]
ls = lines(path)
if cmd == "view":      # count view_id leader key_epoch members(comma) of the last view
    views = [l for l in ls if l.get("event") == "view"]
    if views:
        v = views[-1]
        print(len(v["members"]), v["view_id"], v["leader"], v["key_epoch"], ",".join(v["members"]))
    else:
        print("0 - - -1 -")
elif cmd == "id":
    print(next(l["id"] for l in ls if l.get("event") == "started"))
elif cmd == "delivered":  # how many reliable deliveries of this text
    want = base64.b64encode(sys.argv[3].encode()).decode()
    print(sum(1 for l in ls if l.get("event") == "deliver" and l.get("channel") == "reliable" and l.get("data") == want))
EOF
q() { python3 "$WORK/q.py" "$@"; }

ADDRS=(10.99.0.1:7101 10.99.0.1:7102 10.99.0.2:7103 10.99.0.2:7104)
NSS=("$NS_A" "$NS_A" "$NS_B" "$NS_B")
TRUST=()
for i in 1 2 3 4; do
  TRUST+=("\"$("$COHORT" keygen --out "$WORK/m$i.key")\"")
done
trust_list=$(IFS=,; echo "${TRUST[*]}")
for i in 1 2 3 4; do
  peers=()
  for j in 1 2 3 4; do [ "$j" = "$i" ] || peers+=("\"${ADDRS[$((j-1))]}\""); done
  cat >"$WORK/m$i.toml" <<EOF
identity = "m$i.key"
group = "netns"
listen = "${ADDRS[$((i-1))]}"
peers = [$(IFS=,; echo "${peers[*]}")]
trust = [$trust_list]
heartbeat_ms = 50
suspect_ms = 600
flush_ms = 300
EOF
  mkfifo "$WORK/m$i.in"
  ip netns exec "${NSS[$((i-1))]}" "$COHORT" group run --config "$WORK/m$i.toml" \
    <"$WORK/m$i.in" >"$WORK/m$i.out" 2>"$WORK/m$i.err" &
  PIDS+=($!)
  # Hold each member's stdin open (fd 11..14) so that commands can be written later.
  eval "exec $((10+i))>\"\$WORK/m$i.in\""
done
cmd() { echo "$2" >&$((10+$1)); }
send() { cmd "$1" "{\"cmd\":\"send\",\"channel\":\"reliable\",\"data\":\"$(printf %s "$2" | base64 -w0)\"}"; }

# wait_for SECONDS DESCRIPTION COMMAND...: polls until COMMAND succeeds.
wait_for() {
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@"; do
    [ $SECONDS -lt $end ] || die "no $what within ${limit}s"
    sleep 0.2
  done
}

for i in 1 2 3 4; do
  wait_for 10 "start of m$i" grep -q '"event":"started"' "$WORK/m$i.out"
done
ID=()
for i in 1 2 3 4; do ID+=("$(q id "$WORK/m$i.out")"); done

view_of() { q view "$WORK/m$1.out"; }
one_view_of_4() {
  local first="" v
  for i in 1 2 3 4; do
    read -r n vid _ _ _ <<<"$(view_of "$i")"
    [ "$n" = 4 ] || return 1
    [ -z "$first" ] || [ "$vid" = "$first" ] || return 1
    first=$vid
  done
}
wait_for 30 "view of 4 at every member" one_view_of_4
read -r _ VID4 LEADER4 EPOCH4 _ <<<"$(view_of 1)"
echo "view of 4: $VID4, leader ${LEADER4:0:20}..., key epoch $EPOCH4"

echo "cutting the link between the namespaces"
ip -n "$NS_A" link set "$VETH_A" down

# side A B C D: the two members of one side agree on a view of exactly those two, with a
# key epoch above the view of 4's.
side_view() {
  local a=$1 b=$2 na va la ea ma nb vb lb eb mb
  read -r na va la ea ma <<<"$(view_of "$a")"
  read -r nb vb lb eb mb <<<"$(view_of "$b")"
  [ "$na" = 2 ] && [ "$nb" = 2 ] && [ "$va" = "$vb" ] || return 1
  [ "$ea" -gt "$EPOCH4" ] && [ "$eb" = "$ea" ] || return 1
  case "$ma" in *"${ID[$((a-1))]}"*) ;; *) return 1 ;; esac
  case "$ma" in *"${ID[$((b-1))]}"*) ;; *) return 1 ;; esac
  [ "$la" = "${ID[$((a-1))]}" ] || [ "$la" = "${ID[$((b-1))]}" ] || return 1
}
wait_for 30 "view of 2 in namespace A" side_view 1 2
wait_for 30 "view of 2 in namespace B" side_view 3 4
read -r _ VIDA LEADA EPOCHA _ <<<"$(view_of 1)"
read -r _ VIDB LEADB EPOCHB _ <<<"$(view_of 3)"
[ "$VIDA" != "$VIDB" ] || die "both sides report the same view id $VIDA"
[ "$LEADA" != "$LEADB" ] || die "both sides report the same leader"
echo "side A: view $VIDA, key epoch $EPOCHA; side B: view $VIDB, key epoch $EPOCHB"

for k in 1 2 3; do
  send 1 "side-A-$k"; send 2 "side-A-from-m2-$k"
  send 3 "side-B-$k"; send 4 "side-B-from-m4-$k"
done
delivered_within() { # member text
  [ "$(q delivered "$WORK/m$1.out" "$2")" = 1 ]
}
for k in 1 2 3; do
  for i in 1 2; do
    wait_for 15 "delivery of side-A-$k at m$i" delivered_within "$i" "side-A-$k"
    wait_for 15 "delivery of side-A-from-m2-$k at m$i" delivered_within "$i" "side-A-from-m2-$k"
  done
  for i in 3 4; do
    wait_for 15 "delivery of side-B-$k at m$i" delivered_within "$i" "side-B-$k"
    wait_for 15 "delivery of side-B-from-m4-$k at m$i" delivered_within "$i" "side-B-from-m4-$k"
  done
done
for k in 1 2 3; do
  for i in 3 4; do [ "$(q delivered "$WORK/m$i.out" "side-A-$k")" = 0 ] || die "m$i got side A's message across the cut"; done
  for i in 1 2; do [ "$(q delivered "$WORK/m$i.out" "side-B-$k")" = 0 ] || die "m$i got side B's message across the cut"; done
done
echo "each side delivers its own reliable messages, and only its own"

echo "restoring the link (merging after a heal is not checked yet)"
ip -n "$NS_A" link set "$VETH_A" up
sleep 1
for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || die "a member exited"; done
echo "PASS: group-netns"
