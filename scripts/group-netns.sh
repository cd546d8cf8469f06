#!/usr/bin/env bash
# A cohort group over a real (virtual) network, cut in two and healed: six `cohort group run`
# members, three in each of two network namespaces joined by a veth pair.
#
#   netns A (10.99.0.1)                              netns B (10.99.0.2)
#     m1 :7101  m2 :7102  m3 :7103  ── veth ── cut ── veth ──  m4 :7104  m5 :7105  m6 :7106
#
# 1. all six install one view of 6: the same view id and the same key fingerprint (status);
# 2. every member sends numbered reliable messages all along (one every 60 ms each), from
#    before the cut until after the merge;
# 3. the link goes down: each side installs its own view of 3, with its own leader and its
#    own key (the fingerprints differ between the sides), and keeps delivering within its
#    side (and only there);
# 4. the link comes back up: within 5 s all six are in one view of 6 with one key
#    fingerprint (status is polled; the time is measured and printed). The leaders' gossip
#    finds the other component, the lower principal sends a ticket (`ticket_sent`), the other
#    installs its key (`key_exchanged`) and the smaller component dissolves into the larger
#    (`merging`; of two equal ones, the one whose leader sorts higher): those events must
#    appear, and are printed;
# 5. nothing a member sent is lost: each member delivers every message it sent itself (a
#    send refused with an error line, e.g. while its component dissolves and it rejoins, was
#    never sent, and is counted and printed); every message sent after the merge completed
#    is delivered at all six; messages sent within a side during the cut are delivered at
#    that side's members and at no other; no member delivers a message twice.
#
# Timers (every member): heartbeat_ms = 50, suspect_ms = 600, flush_ms = 300 (defaults: 100,
# 1000, 500), as before the merge was checked: they keep the cut's takeover short (a side
# that lost the leader waits up to rank x suspect_ms). A leader gossips its Id every
# suspect_ms (plus up to 100 ms of jitter), which bounds how long a heal goes unnoticed; the
# rest of the merge (Id, ticket, an empty view change, the dissolve and the joins) is a few
# round trips and view changes. Measured: merges in 0.5-1.3 s with these timers, 0.3-1.2 s
# with the defaults.
#
# The steps shared with scripts/group-kdc-netns.sh are in scripts/lib/group-netns.sh; the
# namespace skeleton (checks, start, failure dump, cleanup) is scripts/lib/netns.sh.
#
# Usage: scripts/group-netns.sh PATH/TO/cohort
# Needs root, `ip` (iproute2) with netns support, and python3. Prints the merge time and
# PASS or FAIL; exits non-zero on failure, including when network namespaces are
# unavailable. Traffic stays on the namespaces' own veth pair and loopbacks; everything is
# removed on exit. Runs for about 15 s.
set -euo pipefail
LIB="$(cd "$(dirname "$0")" && pwd)/lib"
# shellcheck source=lib/netns.sh
. "$LIB/netns.sh"
# shellcheck source=lib/group-netns.sh
. "$LIB/group-netns.sh"

netns_init "network namespaces" "$@"
dump() { group_dump; }
group_netns

TRUST=()
for i in $(seq $N); do
  TRUST+=("\"$("$COHORT" keygen --out "$WORK/m$i.key")\"")
done
identity() { echo "identity = \"m$1.key\""; }
group_start_members identity "$(IFS=,; echo "${TRUST[*]}")"

group_form
group_send

echo "cutting the link between the namespaces"
group_cut
alive

echo "restoring the link"
group_restore
group_merge_events
group_require ticket_sent key_exchanged merging

group_drain
alive
group_merge_time
echo "PASS: group-netns"
