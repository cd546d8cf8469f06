#!/usr/bin/env bash
# scripts/group-netns.sh in KDC mode (LSGC: symmetric keys only, no public-key operation):
# six `cohort group run` members and a `cohort kdc serve` in two network namespaces joined
# by a veth pair, cut in two and healed, plus a join by a principal the KDC does not know.
#
#   netns A (10.99.0.1)                              netns B (10.99.0.2)
#     KDC :7600                                        stranger :7107 (step 2 only)
#     m1 :7101  m2 :7102  m3 :7103  ── veth ── cut ── veth ──  m4 :7104  m5 :7105  m6 :7106
#
# 0. `cohort kdc add-principal` registers m1..m6 in the KDC's database (their key files and
#    the database must be mode 0600); `stranger` is registered in a second, different
#    database that no KDC serves, so the serving KDC does not know it.
# 1. all six install one view of 6 (members kdc:m1..kdc:m6): the same view id and the same
#    key fingerprint (status);
# 2. a seventh member, `stranger`, starts in namespace B with the six as peers: the leader
#    asks the KDC for a pair key with it and is refused, so the leader reports
#    {"event":"refused","reason":"the KDC does not know this principal"} for the stranger's
#    address (required; the stranger's unauthenticated hint "refused (unauthenticated
#    hint): the KDC does not know this principal" is printed when it comes), the stranger
#    never appears in a view, never installs a key from the group (key_exchanged) or
#    merges, and the six keep their view of 6 and its key; the stranger is then stopped;
# 3. every member sends numbered reliable messages all along (one every 60 ms each); the
#    link goes down: each side installs its own view of 3 with its own leader and its own
#    key. The KDC is in namespace A, so side B cannot reach it during the cut: its view
#    change runs on the pair keys its members already hold (every "refused" event during
#    the cut, e.g. "the KDC did not answer", and the KDC's requests are printed);
# 4. the link comes back up: within 5 s all six are in one view of 6 with one key
#    fingerprint (the time is measured and printed); ticket_sent (to a member: those to
#    the stranger in step 2 do not count), key_exchanged and merging must appear (in KDC
#    mode the ticket travels over a pair channel; the KDC's requests are printed);
# 5. nothing a member sent is lost or delivered twice, as in group-netns.sh.
#
# Timers (every member): heartbeat_ms = 50, suspect_ms = 600, flush_ms = 300, as in
# group-netns.sh. Measured: the six fetch a pair key for each of the 15 pairs while
# forming, so the cut needs no KDC request (none is made, no "refused" event); after the
# restore about 11 pair keys are fetched again (the 9 pairs across the cut and some within
# side B), and every view, the merged one too, gets a fresh key. Merges in 0.45-1.4 s
# (group-netns.sh: 0.8-1.0 s on the same machine); sides of 3 in 1.4-3.0 s.
#
# Usage: scripts/group-kdc-netns.sh PATH/TO/cohort
# Needs root, `ip` (iproute2) with netns support, and python3. Prints the merge time and
# PASS or FAIL; exits non-zero on failure, including when network namespaces are
# unavailable. Traffic stays on the namespaces' own veth pair and loopbacks; everything is
# removed on exit. Runs for about 20 s.
set -euo pipefail

fail() { echo "FAIL: $*" >&2; exit 1; }

[ $# -eq 1 ] || { echo "usage: $0 PATH/TO/cohort" >&2; exit 2; }
[ -x "$1" ] || fail "$1 is not an executable"
COHORT=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
[ "$(id -u)" -eq 0 ] || fail "needs root (network namespaces)"
command -v ip >/dev/null || fail "ip (iproute2) not found"
command -v python3 >/dev/null || fail "python3 not found"

N=6
MERGE_LIMIT=5   # seconds from restoring the link to one view of 6 with one key
SEND_MS=60      # each member sends one reliable message this often
REFUSE_LIMIT=10 # seconds from starting the stranger to the leader's refusal
TAG=$$
NS_A=cohort-a-$TAG
NS_B=cohort-b-$TAG
VETH_A=cga$TAG
VETH_B=cgb$TAG
KDC_ADDR=10.99.0.1:7600
STRANGER_ADDR=10.99.0.2:7107
WORK=$(mktemp -d)
PIDS=()
KDC=""
STRANGER=""
SENDER=""
cleanup() {
  [ -z "$SENDER" ] || kill "$SENDER" 2>/dev/null || true
  [ -z "$STRANGER" ] || kill "$STRANGER" 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -z "$KDC" ] || kill "$KDC" 2>/dev/null || true
  wait 2>/dev/null || true
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
dump() {
  for i in $(seq $N); do
    echo "--- m$i stdout (last 15 lines but deliveries and status, cut at 300 characters)"
    grep -vE '"event":"(deliver|status)"' "$WORK/m$i.out" 2>/dev/null | tail -n 15 | cut -c1-300 || true
    echo "--- m$i stderr"; cat "$WORK/m$i.err" 2>/dev/null || true
  done
  echo "--- stranger stdout (last 15 lines, cut at 300 characters)"
  tail -n 15 "$WORK/stranger.out" 2>/dev/null | cut -c1-300 || true
  echo "--- stranger stderr"; cat "$WORK/stranger.err" 2>/dev/null || true
  echo "--- kdc stderr (last 30 lines)"; tail -n 30 "$WORK/kdc.err" 2>/dev/null || true
  echo "--- sender"; cat "$WORK/sender.err" 2>/dev/null || true
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

# scripts/group_netns_q.py reads the members' JSON lines, polls their status, sends the
# numbered messages and checks the deliveries.
Q="$(cd "$(dirname "$0")" && pwd)/group_netns_q.py"
[ -f "$Q" ] || fail "$Q is missing"
q() { python3 "$Q" "$@"; }

# wait_for SECONDS DESCRIPTION COMMAND...: polls until COMMAND succeeds.
wait_for() {
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@"; do
    [ $SECONDS -lt $end ] || die "no $what within ${limit}s"
    sleep 0.2
  done
}
alive() {
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || die "a member exited"; done
  kill -0 "$KDC" 2>/dev/null || die "the KDC exited"
}
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }
mode_of() { stat -c %a "$1"; }

# The KDC: m1..m6 registered in its database. The stranger is registered in another
# database that no KDC serves: a real principal key file, which the serving KDC does not
# know. umask 022 so that the 0600 checked below is the tool's doing, not the umask's.
mkdir "$WORK/kdc" "$WORK/other"
cat >"$WORK/kdc/kdc.toml" <<EOF
listen = "$KDC_ADDR"
database = "kdc.db"
EOF
cat >"$WORK/other/kdc.toml" <<EOF
listen = "127.0.0.1:7600"
database = "kdc.db"
EOF
umask 022
for i in $(seq $N); do
  "$COHORT" kdc add-principal "m$i" --config "$WORK/kdc/kdc.toml" --out "$WORK" >/dev/null \
    || fail "cohort kdc add-principal m$i failed"
done
"$COHORT" kdc add-principal stranger --config "$WORK/other/kdc.toml" --out "$WORK" >/dev/null \
  || fail "cohort kdc add-principal stranger (second database) failed"
for f in "$WORK"/m{1..6}.key "$WORK/stranger.key" "$WORK/kdc/kdc.db" "$WORK/other/kdc.db"; do
  [ -f "$f" ] || fail "${f#"$WORK"/} was not written"
  [ "$(mode_of "$f")" = 600 ] || fail "${f#"$WORK"/} has mode $(mode_of "$f"), not 600"
done
echo "registered m1..m6 (and stranger with another database); key files and databases are mode 600"

ip netns exec "$NS_A" "$COHORT" kdc serve --config "$WORK/kdc/kdc.toml" 2>"$WORK/kdc.err" &
KDC=$!
wait_for 10 "KDC listening on $KDC_ADDR" grep -qs "listening on $KDC_ADDR" "$WORK/kdc.err"

ADDRS=(10.99.0.1:7101 10.99.0.1:7102 10.99.0.1:7103 10.99.0.2:7104 10.99.0.2:7105 10.99.0.2:7106)
NSS=("$NS_A" "$NS_A" "$NS_A" "$NS_B" "$NS_B" "$NS_B")
SIDE_A=1,2,3
TRUST=()
for i in $(seq $N); do TRUST+=("\"kdc:m$i\""); done
six=$(IFS=,; echo "${TRUST[*]}")
for i in $(seq $N); do
  peers=()
  for j in $(seq $N); do [ "$j" = "$i" ] || peers+=("\"${ADDRS[$((j-1))]}\""); done
  cat >"$WORK/m$i.toml" <<EOF
auth = "kdc"
principal_key = "m$i.key"
kdc = "$KDC_ADDR"
group = "netns"
listen = "${ADDRS[$((i-1))]}"
peers = [$(IFS=,; echo "${peers[*]}")]
# kdc:stranger is trusted on purpose: step 2 checks that the KDC is what keeps a principal
# it does not know out. An untrusted name would be refused by the trust policy before the
# KDC is asked, which would prove nothing about the KDC.
trust = [$six,"kdc:stranger"]
heartbeat_ms = 50
suspect_ms = 600
flush_ms = 300
EOF
  mkfifo "$WORK/m$i.in"
  ip netns exec "${NSS[$((i-1))]}" "$COHORT" group run --config "$WORK/m$i.toml" \
    <"$WORK/m$i.in" >"$WORK/m$i.out" 2>"$WORK/m$i.err" &
  PIDS+=($!)
  # Hold each member's stdin open (fd 11..16), so that it stays open between commands.
  eval "exec $((10+i))>\"\$WORK/m$i.in\""
done

for i in $(seq $N); do
  wait_for 10 "start of m$i" grep -qs '"event":"started"' "$WORK/m$i.out"
done
ID=()
for i in $(seq $N); do
  ID+=("$(q id "$WORK/m$i.out")")
  [ "${ID[$((i-1))]}" = "kdc:m$i" ] || die "m$i started as ${ID[$((i-1))]}, not kdc:m$i"
done

# STATUS[i-1] = "count view_id leader key_epoch key_fingerprint changing_view" of member i.
STATUS=()
poll() { mapfile -t STATUS < <(q status "$WORK" $N); }
field() { local f=($1); echo "${f[$2]}"; }
status_summary() {
  local i
  for i in $(seq $N); do printf ' m%s: %s;' "$i" "$(cut -d' ' -f1,2,4- <<<"${STATUS[$((i-1))]}")"; done
}

# One view of 6, one view id and one key fingerprint at all six (and no view change going on).
one_view() {
  poll
  local first="${STATUS[0]}" s
  [ "$(field "$first" 0)" = $N ] && [ "$(field "$first" 4)" != - ] || return 1
  for s in "${STATUS[@]}"; do
    [ "$(field "$s" 0)" = $N ] && [ "$(field "$s" 5)" = no ] || return 1
    [ "$(field "$s" 1)" = "$(field "$first" 1)" ] || return 1
    [ "$(field "$s" 4)" = "$(field "$first" 4)" ] || return 1
  done
}
# side FIRST LAST: members FIRST..LAST hold one view of exactly them (same id, same key,
# a leader among them, a key epoch above the view of 6's).
side() {
  local a=$1 b=$2 i s first="${STATUS[$(($1-1))]}" members
  for i in $(seq "$a" "$b"); do
    s="${STATUS[$((i-1))]}"
    [ "$(field "$s" 0)" = 3 ] && [ "$(field "$s" 5)" = no ] || return 1
    [ "$(field "$s" 1)" = "$(field "$first" 1)" ] || return 1
    [ "$(field "$s" 4)" = "$(field "$first" 4)" ] || return 1
    [ "$(field "$s" 3)" -gt "$EPOCH6" ] || return 1
  done
  members=$(q view "$WORK/m$a.out" | cut -d' ' -f5)
  for i in $(seq "$a" "$b"); do
    case ",$members," in *",${ID[$((i-1))]},"*) ;; *) return 1 ;; esac
  done
  case " ${ID[*]:$((a-1)):$((b-a+1))} " in *" $(field "$first" 2) "*) ;; *) return 1 ;; esac
}
sides() { poll; side 1 3 && side 4 6; }

# The view events come first (cheap to read); status then confirms one view and one key.
view_of() { q view "$WORK/m$1.out"; }
six_views() {
  local first="" n vid i
  for i in $(seq $N); do
    read -r n vid _ _ _ <<<"$(view_of "$i")"
    [ "$n" = $N ] || return 1
    [ -z "$first" ] || [ "$vid" = "$first" ] || return 1
    first=$vid
  done
}
# refused_lines WHO: WHO's refused events, "  WHO: addr reason" a line.
refused_lines() { q refused "$WORK/$1.out" | sed "s/^/  $1: /"; }
no_stranger_in_views() {
  local seen
  seen=$(q seen kdc:stranger "$WORK"/m{1..6}.out)
  [ -z "$seen" ] || die "kdc:stranger is a member of a view at: $(xargs -n1 basename <<<"$seen" | tr '\n' ' ')"
}

# 1. One view of 6 with one key.
wait_for 30 "view of $N at every member" six_views
wait_for 10 "one view and one key fingerprint at all $N (status)" one_view
read -r _ VID6 LEADER6 EPOCH6 FP6 _ <<<"${STATUS[0]}"
echo "view of $N: $VID6, leader $LEADER6, key epoch $EPOCH6, key $FP6"
case "$LEADER6" in kdc:m[1-6]) LEADER=${LEADER6#kdc:m} ;; *) die "the leader is $LEADER6, not one of the six" ;; esac

# 2. The stranger: registered, but not with this KDC. The leader (or whichever member it
# reaches) asks the KDC for a pair key with it and is told the KDC does not know it.
STRANGER_REASON="the KDC does not know this principal"
HINT_REASON="refused (unauthenticated hint): the KDC does not know this principal"
cat >"$WORK/stranger.toml" <<EOF
auth = "kdc"
principal_key = "stranger.key"
kdc = "$KDC_ADDR"
group = "netns"
listen = "$STRANGER_ADDR"
peers = [$(printf '"%s",' "${ADDRS[@]}" | sed 's/,$//')]
trust = [$six]
heartbeat_ms = 50
suspect_ms = 600
flush_ms = 300
EOF
T_STRANGER=$(now)
ip netns exec "$NS_B" "$COHORT" group run --config "$WORK/stranger.toml" \
  </dev/null >"$WORK/stranger.out" 2>"$WORK/stranger.err" &
STRANGER=$!
wait_for 10 "start of the stranger" grep -qs '"event":"started"' "$WORK/stranger.out"
[ "$(q id "$WORK/stranger.out")" = kdc:stranger ] || die "the stranger started as $(q id "$WORK/stranger.out")"
leader_refused() { refused_lines "m$LEADER" | grep -qxF "  m$LEADER: $STRANGER_ADDR $STRANGER_REASON"; }
wait_for $REFUSE_LIMIT "refused event ($STRANGER_REASON) for $STRANGER_ADDR at the leader m$LEADER" leader_refused
T_REFUSED=$(now)
echo "the leader m$LEADER refused the stranger after $(elapsed "$T_STRANGER" "$T_REFUSED")s"
# Give the stranger's hint and any retry a moment, while checking that it stays out.
end=$((SECONDS + 2))
while [ $SECONDS -lt $end ]; do no_stranger_in_views; sleep 0.2; done
echo "refused events:"
for w in m{1..6} stranger; do refused_lines "$w" | sort | uniq -c | sed 's/^ *\([0-9]*\) \(.*\)$/\2 (x\1)/'; done
if refused_lines stranger | grep -qF "$HINT_REASON"; then
  echo "the stranger got the hint: $HINT_REASON"
else
  echo "the stranger got no hint (\"$HINT_REASON\"); only the leader's event is required"
fi
echo "KDC on the stranger:"
grep -F stranger "$WORK/kdc.err" | sed -E 's/^cohort kdc: [0-9.:]+: //' | sort | uniq -c | sed 's/^/  /' || true
read -r n _ _ _ members <<<"$(q view "$WORK/stranger.out")"
echo "the stranger's own last view: $n member(s): $members"
case ",$members," in *,kdc:m[1-6],*) die "the stranger installed a view with a member of the group: $members" ;; esac
# It never got the group's key: no ticket reached it (key_exchanged) and it never merged.
if grep -E '"event":"(key_exchanged|merging)"' "$WORK/stranger.out" >"$WORK/stranger.bad"; then
  die "the stranger installed a key or merged: $(head -n 3 "$WORK/stranger.bad")"
fi
# A leader that hears the stranger's Id (it gossips as the leader of its own component of
# one, with another key) and trusts it queues a ticket on a pair channel to it and reports
# ticket_sent, although that channel never opens (the KDC does not know the stranger):
# printed, not failed; the check above is what matters (the key never reaches it).
for i in $(seq $N); do
  c=$(grep -c '"event":"ticket_sent","to":"kdc:stranger"' "$WORK/m$i.out" || true)
  [ "$c" = 0 ] || echo "note: m$i reported ticket_sent to kdc:stranger $c time(s) (queued on a pair channel that never opened)"
done
no_stranger_in_views
one_view || die "the six lost their view of $N with the stranger around;" \
  "status (members view epoch key changing):$(status_summary)"
read -r _ vid _ _ fp _ <<<"${STATUS[0]}"
[ "$vid" = "$VID6" ] && [ "$fp" = "$FP6" ] \
  || die "the stranger's attempt changed the view of $N: $VID6 key $FP6 became $vid key $fp"
kill "$STRANGER"
wait "$STRANGER" 2>/dev/null || true
STRANGER=""
echo "the stranger stayed out of every view; stopped it"

# 3. Messages all along, then the cut.
python3 "$Q" sender "$WORK" $N $SEND_MS 2>"$WORK/sender.err" &
SENDER=$!
sleep 1.5
kill -0 "$SENDER" 2>/dev/null || die "the sender stopped"

echo "cutting the link between the namespaces (side B loses the KDC)"
KDC_LINES_CUT=$(wc -l <"$WORK/kdc.err")
REFUSED_CUT=()
for i in $(seq $N); do REFUSED_CUT+=("$(q refused "$WORK/m$i.out" | wc -l)"); done
T_CUT=$(now)
ip -n "$NS_A" link set "$VETH_A" down
wait_for 30 "view of 3 on each side" sides
T_SIDES=$(now)
read -r _ VIDA LEADA EPOCHA FPA _ <<<"${STATUS[0]}"
read -r _ VIDB LEADB EPOCHB FPB _ <<<"${STATUS[3]}"
[ "$VIDA" != "$VIDB" ] || die "both sides report the same view id $VIDA"
[ "$LEADA" != "$LEADB" ] || die "both sides report the same leader"
[ "$FPA" != "$FPB" ] || die "both sides report the same key fingerprint $FPA"
echo "after $(elapsed "$T_CUT" "$T_SIDES")s: side A view $VIDA, leader $LEADA, key epoch $EPOCHA, key $FPA;" \
  "side B view $VIDB, leader $LEADB, key epoch $EPOCHB, key $FPB"

# Each side keeps delivering its own messages (checked message by message at the end).
before=$(q delivered "$WORK" $N)
sleep 2
after=$(q delivered "$WORK" $N)
read -r -a b <<<"$before"; read -r -a a <<<"$after"
for i in $(seq $N); do
  [ "${a[$((i-1))]}" -gt "${b[$((i-1))]}" ] || die "m$i delivered nothing in 2 s during the cut"
done
echo "each side delivers during the cut (deliveries per member: $after)"
echo "during the cut: the KDC answered $(($(wc -l <"$WORK/kdc.err") - KDC_LINES_CUT)) request(s); refused events:"
for i in $(seq $N); do
  q refused "$WORK/m$i.out" | tail -n +$((REFUSED_CUT[i-1] + 1)) | sort | uniq -c \
    | sed "s/^ *\([0-9]*\) \(.*\)$/  m$i: \2 (x\1)/"
done
alive

# 4. The heal.
echo "restoring the link"
KDC_LINES_RESTORE=$(wc -l <"$WORK/kdc.err")
T_RESTORE=$(now)
ip -n "$NS_A" link set "$VETH_A" up
end=$((SECONDS + 25))
until one_view; do
  [ $SECONDS -lt $end ] || die "no view of $N with one key within 25s of restoring the link;" \
    "last status (members view epoch key changing):$(status_summary)"
  sleep 0.05
done
T_MERGE=$(now)
MERGE=$(elapsed "$T_RESTORE" "$T_MERGE")
read -r _ VIDM LEADM EPOCHM FPM _ <<<"${STATUS[0]}"
echo "merged after ${MERGE}s: view $VIDM, leader $LEADM, key epoch $EPOCHM, key $FPM"
echo "KDC requests from restoring the link to the merge:"
tail -n +$((KDC_LINES_RESTORE + 1)) "$WORK/kdc.err" | sed 's/^/  /'
echo "merge events:"
for i in $(seq $N); do
  grep -hE '"event":"(ticket_sent|key_exchanged|merging)"' "$WORK/m$i.out" | sed "s/^/  m$i: /" || true
done
# The stranger's ticket_sent events (step 2) do not count: one must go to a member.
grep -qsE '"event":"ticket_sent","to":"kdc:m[1-6]"' "$WORK"/m{1..6}.out \
  || die "no member reported ticket_sent to another member"
for e in key_exchanged merging; do
  grep -qs "\"event\":\"$e\"" "$WORK"/m{1..6}.out || die "no member reported $e"
done

# Keep sending after the merge, then let every message arrive.
sleep 2.5
touch "$WORK/stop"
wait "$SENDER" || die "the sender failed"
SENDER=""
alive
end=$((SECONDS + 15))
until q check "$WORK" $N $SIDE_A "$T_SIDES" "$T_RESTORE" "$T_MERGE" wait; do
  [ $SECONDS -lt $end ] || break
  sleep 0.5
done

# 5. The deliveries; the stranger never got in, over the whole run.
echo "deliveries:"
q check "$WORK" $N $SIDE_A "$T_SIDES" "$T_RESTORE" "$T_MERGE" || die "reliable messages lost, duplicated or misdelivered"
no_stranger_in_views
alive
kill "$KDC"
wait "$KDC" 2>/dev/null || true
KDC=""
echo "KDC: $(grep -F 'stopping:' "$WORK/kdc.err" | sed 's/^cohort kdc: //')"

if python3 -c "import sys; sys.exit(float(sys.argv[1]) > float(sys.argv[2]))" "$MERGE" "$MERGE_LIMIT"; then
  echo "merge time: ${MERGE}s (limit ${MERGE_LIMIT}s)"
else
  echo "merge time: ${MERGE}s (limit ${MERGE_LIMIT}s)"
  die "the merge took ${MERGE}s, more than ${MERGE_LIMIT}s"
fi
echo "PASS: group-kdc-netns"
