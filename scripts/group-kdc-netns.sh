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
# The steps shared with scripts/group-netns.sh are in scripts/lib/group-netns.sh; the
# namespace skeleton (checks, start, failure dump, cleanup) is scripts/lib/netns.sh.
#
# Usage: scripts/group-kdc-netns.sh PATH/TO/cohort
# Needs root, `ip` (iproute2) with netns support, and python3. Prints the merge time and
# PASS or FAIL; exits non-zero on failure, including when network namespaces are
# unavailable. Traffic stays on the namespaces' own veth pair and loopbacks; everything is
# removed on exit. Runs for about 20 s.
set -euo pipefail
LIB="$(cd "$(dirname "$0")" && pwd)/lib"
# shellcheck source=lib/netns.sh
. "$LIB/netns.sh"
# shellcheck source=lib/group-netns.sh
. "$LIB/group-netns.sh"

REFUSE_LIMIT=10 # seconds from starting the stranger to the leader's refusal
KDC_ADDR=10.99.0.1:7600
STRANGER_ADDR=10.99.0.2:7107

netns_init "network namespaces" "$@"
dump() {
  group_dump
  dump_log "$WORK/stranger.out" 15
  dump_log "$WORK/stranger.err"
  dump_log "$WORK/kdc.err" 30
}
group_netns
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

netns_start kdc "$NS_A" /dev/null "$COHORT" kdc serve --config "$WORK/kdc/kdc.toml"
KDC=$STARTED
watch_alive "$KDC" "the KDC"
wait_for 10 "KDC listening on $KDC_ADDR" grep -qs "listening on $KDC_ADDR" "$WORK/kdc.err"

TRUST=()
for i in $(seq $N); do TRUST+=("\"kdc:m$i\""); done
six=$(IFS=,; echo "${TRUST[*]}")
# principal NAME: the identity lines of principal NAME (m1..m6 are given as 1..6).
principal() {
  local name=$1
  case "$name" in [0-9]*) name=m$name ;; esac
  printf 'auth = "kdc"\nprincipal_key = "%s.key"\nkdc = "%s"' "$name" "$KDC_ADDR"
}
# kdc:stranger is trusted on purpose: step 2 checks that the KDC is what keeps a principal
# it does not know out. An untrusted name would be refused by the trust policy before the
# KDC is asked, which would prove nothing about the KDC.
group_start_members principal "$six,\"kdc:stranger\""
for i in $(seq $N); do
  [ "${ID[$((i-1))]}" = "kdc:m$i" ] || die "m$i started as ${ID[$((i-1))]}, not kdc:m$i"
done

# refused_lines WHO: WHO's refused events, "  WHO: addr reason" a line.
refused_lines() { q refused "$WORK/$1.out" | sed "s/^/  $1: /"; }
no_stranger_in_views() {
  local seen
  seen=$(q seen kdc:stranger "$WORK"/m{1..6}.out)
  [ -z "$seen" ] || die "kdc:stranger is a member of a view at: $(xargs -n1 basename <<<"$seen" | tr '\n' ' ')"
}

# 1. One view of 6 with one key.
group_form
case "$LEADER6" in kdc:m[1-6]) LEADER=${LEADER6#kdc:m} ;; *) die "the leader is $LEADER6, not one of the six" ;; esac

# 2. The stranger: registered, but not with this KDC. The leader (or whichever member it
# reaches) asks the KDC for a pair key with it and is told the KDC does not know it.
STRANGER_REASON="the KDC does not know this principal"
HINT_REASON="refused (unauthenticated hint): the KDC does not know this principal"
group_toml "$(principal stranger)" "$STRANGER_ADDR" "$(group_peers 0)" "$six" >"$WORK/stranger.toml"
T_STRANGER=$(now)
# Its stdin is a fifo held open (fd 17): end of input would make it leave and exit.
mkfifo "$WORK/stranger.in"
netns_start stranger "$NS_B" "$WORK/stranger.in" "$COHORT" group run --config "$WORK/stranger.toml"
STRANGER=$STARTED
exec 17>"$WORK/stranger.in"
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
stop_process "$STRANGER"
echo "the stranger stayed out of every view; stopped it"

# 3. Messages all along, then the cut.
group_send

echo "cutting the link between the namespaces (side B loses the KDC)"
KDC_LINES_CUT=$(wc -l <"$WORK/kdc.err")
REFUSED_CUT=()
for i in $(seq $N); do REFUSED_CUT+=("$(q refused "$WORK/m$i.out" | wc -l)"); done
group_cut
echo "during the cut: the KDC answered $(($(wc -l <"$WORK/kdc.err") - KDC_LINES_CUT)) request(s); refused events:"
for i in $(seq $N); do
  q refused "$WORK/m$i.out" | tail -n +$((REFUSED_CUT[i-1] + 1)) | sort | uniq -c \
    | sed "s/^ *\([0-9]*\) \(.*\)$/  m$i: \2 (x\1)/"
done
alive

# 4. The heal.
echo "restoring the link"
KDC_LINES_RESTORE=$(wc -l <"$WORK/kdc.err")
group_restore
echo "KDC requests from restoring the link to the merge:"
tail -n +$((KDC_LINES_RESTORE + 1)) "$WORK/kdc.err" | sed 's/^/  /'
group_merge_events
# The stranger's ticket_sent events (step 2) do not count: one must go to a member.
grep -qsE '"event":"ticket_sent","to":"kdc:m[1-6]"' "$WORK"/m{1..6}.out \
  || die "no member reported ticket_sent to another member"
group_require key_exchanged merging

# 5. The deliveries; the stranger never got in, over the whole run.
group_drain
no_stranger_in_views
alive
stop_process "$KDC"
echo "KDC: $(grep -F 'stopping:' "$WORK/kdc.err" | sed 's/^cohort kdc: //')"

group_merge_time
echo "PASS: group-kdc-netns"
