# shellcheck shell=bash
# The steps scripts/group-netns.sh and scripts/group-kdc-netns.sh share (sourced after
# lib/netns.sh, never run): six `cohort group run` members, three in each of two network
# namespaces joined by a veth pair; their configs, start and status; one view of 6; the
# numbered reliable messages; the cut and the two sides of 3; the restore and the merge; the
# deliveries and the merge time. scripts/group_netns_q.py reads the members' JSON lines.
#
#   netns A (10.99.0.1)                              netns B (10.99.0.2)
#     m1 :7101  m2 :7102  m3 :7103  ── veth ── cut ── veth ──  m4 :7104  m5 :7105  m6 :7106
#
# Owns: what both group scripts check, written once. Must not hold what only one of them
# checks (keys and identities, the KDC, the stranger, which ticket_sent counts): the
# scripts call these steps in order and put their own checks between them.

N=6
MERGE_LIMIT=5 # seconds from restoring the link to one view of 6 with one key
SEND_MS=60    # each member sends one reliable message this often
TAG=$$
NS_A=cohort-a-$TAG
NS_B=cohort-b-$TAG
VETH_A=cga$TAG
VETH_B=cgb$TAG
ADDRS=(10.99.0.1:7101 10.99.0.1:7102 10.99.0.1:7103 10.99.0.2:7104 10.99.0.2:7105 10.99.0.2:7106)
NSS=("$NS_A" "$NS_A" "$NS_A" "$NS_B" "$NS_B" "$NS_B")
SIDE_A=1,2,3

Q="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/group_netns_q.py"
q() { python3 "$Q" "$@"; }

# group_netns: the two namespaces and the veth pair between them.
group_netns() {
  [ -f "$Q" ] || fail "$Q is missing"
  netns_add "$NS_A" "$NS_B"
  netns_veth "$NS_A" "$VETH_A" 10.99.0.1/24 "$NS_B" "$VETH_B" 10.99.0.2/24
  ip -n "$NS_A" route get 10.99.0.2 >/dev/null 2>&1 || fail "namespace A has no route to 10.99.0.2"
}

# group_peers SKIP: the members' addresses but member SKIP's (0: all), quoted, comma-separated.
group_peers() {
  local j peers=()
  for j in $(seq $N); do [ "$j" = "$1" ] || peers+=("\"${ADDRS[$((j-1))]}\""); done
  (IFS=,; echo "${peers[*]}")
}

# group_toml AUTH LISTEN PEERS TRUST: a member's config, AUTH being its identity lines.
group_toml() {
  cat <<EOF
$1
group = "netns"
listen = "$2"
peers = [$3]
trust = [$4]
heartbeat_ms = 50
suspect_ms = 600
flush_ms = 300
EOF
}

# group_start_members AUTH TRUST: writes m1..m6's configs (`AUTH I` prints member I's
# identity lines) and starts each member in its namespace. Each one's stdin is a fifo held
# open (fd 11..16), so that it stays open between commands.
group_start_members() {
  local auth=$1 trust=$2 i
  for i in $(seq $N); do
    group_toml "$("$auth" "$i")" "${ADDRS[$((i-1))]}" "$(group_peers "$i")" "$trust" >"$WORK/m$i.toml"
    mkfifo "$WORK/m$i.in"
    netns_start "m$i" "${NSS[$((i-1))]}" "$WORK/m$i.in" "$COHORT" group run --config "$WORK/m$i.toml"
    watch_alive "$STARTED" "a member"
    eval "exec $((10+i))>\"\$WORK/m$i.in\""
  done
  for i in $(seq $N); do
    wait_for 10 "start of m$i" grep -qs '"event":"started"' "$WORK/m$i.out"
  done
  ID=()
  for i in $(seq $N); do ID+=("$(q id "$WORK/m$i.out")"); done
}

# group_dump: the members' logs (for the scripts' `dump`).
group_dump() {
  local i
  for i in $(seq $N); do
    dump_log "$WORK/m$i.out" 15 '"event":"(deliver|status)"'
    dump_log "$WORK/m$i.err"
  done
  dump_log "$WORK/sender.err"
}

# short ID: ID, cut at 20 characters.
short() { if [ ${#1} -le 20 ]; then echo "$1"; else echo "${1:0:20}..."; fi; }

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

# group_form: one view of 6 with one key; VID6 LEADER6 EPOCH6 FP6 describe it.
group_form() {
  wait_for 30 "view of $N at every member" six_views
  wait_for 10 "one view and one key fingerprint at all $N (status)" one_view
  read -r _ VID6 LEADER6 EPOCH6 FP6 _ <<<"${STATUS[0]}"
  echo "view of $N: $VID6, leader $(short "$LEADER6"), key epoch $EPOCH6, key $FP6"
}

# group_send: every member sends numbered reliable messages from now until group_drain.
group_send() {
  netns_start sender - /dev/null python3 "$Q" sender "$WORK" $N $SEND_MS
  SENDER=$STARTED
  sleep 1.5
  kill -0 "$SENDER" 2>/dev/null || die "the sender stopped"
}

# group_cut: cuts the link; each side must install its own view of 3 with its own leader
# and its own key, and keep delivering its own messages.
group_cut() {
  local before after a b i
  T_CUT=$(now)
  link_down "$NS_A" "$VETH_A"
  wait_for 30 "view of 3 on each side" sides
  T_SIDES=$(now)
  read -r _ VIDA LEADA EPOCHA FPA _ <<<"${STATUS[0]}"
  read -r _ VIDB LEADB EPOCHB FPB _ <<<"${STATUS[3]}"
  [ "$VIDA" != "$VIDB" ] || die "both sides report the same view id $VIDA"
  [ "$LEADA" != "$LEADB" ] || die "both sides report the same leader"
  [ "$FPA" != "$FPB" ] || die "both sides report the same key fingerprint $FPA"
  echo "after $(elapsed "$T_CUT" "$T_SIDES")s: side A view $VIDA, leader $(short "$LEADA")," \
    "key epoch $EPOCHA, key $FPA; side B view $VIDB, leader $(short "$LEADB"), key epoch $EPOCHB, key $FPB"

  # Each side keeps delivering its own messages (checked message by message at the end).
  before=$(q delivered "$WORK" $N)
  sleep 2
  after=$(q delivered "$WORK" $N)
  read -r -a b <<<"$before"; read -r -a a <<<"$after"
  for i in $(seq $N); do
    [ "${a[$((i-1))]}" -gt "${b[$((i-1))]}" ] || die "m$i delivered nothing in 2 s during the cut"
  done
  echo "each side delivers during the cut (deliveries per member: $after)"
}

# group_restore: restores the link; waits (25 s at most) for one view of 6 with one key;
# MERGE is the time that took. Prints the merge events.
group_restore() {
  local end i
  T_RESTORE=$(now)
  link_up "$NS_A" "$VETH_A"
  end=$((SECONDS + 25))
  until one_view; do
    [ $SECONDS -lt $end ] || die "no view of $N with one key within 25s of restoring the link;" \
      "last status (members view epoch key changing):$(status_summary)"
    sleep 0.05
  done
  T_MERGE=$(now)
  MERGE=$(elapsed "$T_RESTORE" "$T_MERGE")
  read -r _ VIDM LEADM EPOCHM FPM _ <<<"${STATUS[0]}"
  echo "merged after ${MERGE}s: view $VIDM, leader $(short "$LEADM"), key epoch $EPOCHM, key $FPM"
}

# group_merge_events: prints the members' ticket_sent, key_exchanged and merging events.
group_merge_events() {
  local i
  echo "merge events:"
  for i in $(seq $N); do
    grep -hE '"event":"(ticket_sent|key_exchanged|merging)"' "$WORK/m$i.out" | sed "s/^/  m$i: /" || true
  done
}

# group_require EVENT...: some member reported each EVENT.
group_require() {
  local e
  for e in "$@"; do
    grep -qs "\"event\":\"$e\"" "$WORK"/m{1..6}.out || die "no member reported $e"
  done
}

# group_drain: keeps sending for 2.5 s after the merge, stops, lets every message arrive
# (15 s at most) and checks the deliveries: nothing lost, duplicated or misdelivered.
group_drain() {
  local end
  sleep 2.5
  touch "$WORK/stop"
  reap "$SENDER" || die "the sender failed"
  alive
  end=$((SECONDS + 15))
  until q check "$WORK" $N $SIDE_A "$T_SIDES" "$T_RESTORE" "$T_MERGE" wait; do
    [ $SECONDS -lt $end ] || break
    sleep 0.5
  done
  echo "deliveries:"
  q check "$WORK" $N $SIDE_A "$T_SIDES" "$T_RESTORE" "$T_MERGE" || die "reliable messages lost, duplicated or misdelivered"
}

# group_merge_time: the merge took MERGE_LIMIT seconds at the most.
group_merge_time() {
  echo "merge time: ${MERGE}s (limit ${MERGE_LIMIT}s)"
  python3 -c "import sys; sys.exit(float(sys.argv[1]) > float(sys.argv[2]))" "$MERGE" "$MERGE_LIMIT" \
    || die "the merge took ${MERGE}s, more than ${MERGE_LIMIT}s"
}
