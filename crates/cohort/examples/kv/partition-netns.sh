#!/usr/bin/env bash
# The kv example through a real partition: five `kv` processes in two network namespaces
# joined by one veth pair, cut by taking the link down, then healed.
#
#   netns kvappsA (10.98.0.1)                       netns kvappsB (10.98.0.2)
#     m0 :7101  m1 :7102  m2 :7103  ── veth ── cut ──  m3 :7104  m4 :7105
#
# Checks: one view of five; a write reaches everyone; after the cut each side installs its
# own view and accepts writes (to keys of its own and to one key both write); after the heal
# the sides merge into one view of five, the small side's members report state transfer and
# send their old store, and every member dumps the same store holding both sides' writes.
#
# Usage: crates/cohort/examples/kv/partition-netns.sh target/debug/examples/kv \
#            target/debug/examples/chat
# (build both with `cargo build -p cohort --examples`). Needs root and `ip` with netns.
# Prints PASS or FAIL (with every member's output); exits non-zero on failure.
set -euo pipefail

KV=$(realpath "${1:?usage: $0 PATH/TO/kv PATH/TO/chat}")
CHAT=$(realpath "${2:?usage: $0 PATH/TO/kv PATH/TO/chat}")
[ "$(id -u)" -eq 0 ] || { echo "FAIL: kv partition-netns needs root (network namespaces)"; exit 1; }
command -v ip >/dev/null || { echo "FAIL: kv partition-netns needs ip (iproute2)"; exit 1; }

DIR=$(mktemp -d /tmp/kvapps.XXXXXX)
NS=(kvappsA kvappsA kvappsA kvappsB kvappsB)
ADDR=(10.98.0.1 10.98.0.1 10.98.0.1 10.98.0.2 10.98.0.2)
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  ip netns del kvappsA 2>/dev/null || true
  ip netns del kvappsB 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for i in 0 1 2 3 4; do echo "--- m$i"; cat "$DIR/out$i" 2>/dev/null || true; done
  exit 1
}

# wait_for FILE WHAT AWK-CONDITION: until some line of FILE satisfies the awk condition.
wait_for() {
  local file=$1 what=$2 cond=$3
  for _ in $(seq 1 200); do
    if awk "$cond { found = 1 } END { exit !found }" "$file" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  fail "$(basename "$file"): no $what within 20 s"
}
# A view line with N members: "* view SEQ:ID: a b c".
view_of() { echo "/^\\* view / && split(substr(\$0, index(\$0, \": \") + 2), m, \" \") == $1"; }
# Input to member I.
say() { echo "$2" >&"${IN[$1]}"; }

ip netns add kvappsA
ip netns add kvappsB
ip link add kvappsa type veth peer name kvappsb
ip link set kvappsa netns kvappsA
ip link set kvappsb netns kvappsB
ip -n kvappsA addr add 10.98.0.1/24 dev kvappsa
ip -n kvappsB addr add 10.98.0.2/24 dev kvappsb
for n in kvappsA kvappsB; do ip -n "$n" link set lo up; done
ip -n kvappsA link set kvappsa up
ip -n kvappsB link set kvappsb up

"$CHAT" setup "$DIR" 5 7101 >/dev/null
for i in 0 1 2 3 4; do
  for j in 0 1 2 3 4; do
    sed -i "s/127\.0\.0\.1:$((7101 + j))/${ADDR[$j]}:$((7101 + j))/" "$DIR/m$i.toml"
  done
  # Fast failure detection, as the other tests use.
  printf 'heartbeat_ms = 50\nsuspect_ms = 600\nflush_ms = 300\n' >>"$DIR/m$i.toml"
done

IN=()
for i in 0 1 2 3 4; do
  mkfifo "$DIR/in$i"
  ip netns exec "${NS[$i]}" "$KV" "$DIR/m$i.toml" <"$DIR/in$i" >"$DIR/out$i" 2>&1 &
  PIDS+=($!)
  exec {fd}>"$DIR/in$i"
  IN+=("$fd")
done

for i in 0 1 2 3 4; do wait_for "$DIR/out$i" "view of 5" "$(view_of 5)"; done
say 0 "put before 0"
for i in 0 1 2 3 4; do wait_for "$DIR/out$i" "the first write" '/^(ok|applied) put before /'; done

echo "cut"
ip -n kvappsA link set kvappsa down
ip -n kvappsB link set kvappsb down
for i in 0 1 2; do wait_for "$DIR/out$i" "view of 3" "$(view_of 3)"; done
for i in 3 4; do wait_for "$DIR/out$i" "view of 2" "$(view_of 2)"; done

say 1 "put big-only b"
say 2 "put shared from-big"
for k in 1 2 3 4; do say 3 "put shared from-small-$k"; done
say 4 "put small-only s"
wait_for "$DIR/out1" "big-only written" '/^ok put big-only /'
wait_for "$DIR/out4" "small-only written" '/^ok put small-only /'
wait_for "$DIR/out3" "the small side's last write" '/^ok put shared @/ { n++ } n == 4'
for i in 0 1 2; do
  ! grep -q "small-only" "$DIR/out$i" || fail "m$i saw a write from across the cut"
done

echo "heal"
ip -n kvappsA link set kvappsa up
ip -n kvappsB link set kvappsb up
for i in 0 1 2 3 4; do wait_for "$DIR/out$i" "view of 5 after the heal" "/^\\* view / { v++ } v > 1 && $(view_of 5)"; done
for i in 0 1 2; do wait_for "$DIR/out$i" "the small side's merge" '/^merged /'; done
for i in 3 4; do wait_for "$DIR/out$i" "state transfer" '/^state .* keys clock /'; done
sleep 2

for i in 0 1 2 3 4; do
  before=$(wc -l <"$DIR/out$i")
  say "$i" "dump"
  wait_for "$DIR/out$i" "a dump" "NR > $before && /^dump /"
  tail -n +"$((before + 1))" "$DIR/out$i" | grep -E ' = |^dump ' >"$DIR/dump$i"
done
for i in 1 2 3 4; do
  cmp -s "$DIR/dump0" "$DIR/dump$i" || fail "m0 and m$i hold different stores: $(cat "$DIR/dump0") / $(cat "$DIR/dump$i")"
done
for want in "before = 0" "big-only = b" "small-only = s" "shared = from-small-4"; do
  grep -qx "$want" "$DIR/dump0" || fail "the merged store lacks '$want': $(cat "$DIR/dump0")"
done
echo "merged store: $(tr '\n' ';' <"$DIR/dump0")"
echo "PASS: kv partition-netns"
