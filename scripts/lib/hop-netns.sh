# shellcheck shell=bash
# The pieces scripts/hop-netns.sh and scripts/hop-throughput.sh share (sourced after
# lib/netns.sh, never run): namespaces with IPv6 off, the two endpoints' key files and the
# relay's config, and the JSON reader scripts/hop_netns_q.py.
#
# Owns: the setup both ALPHA path scripts repeat. Must not hold either one's addresses,
# namespace names, endpoint configs or checks: each script passes its own.

HOP_Q="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/hop_netns_q.py"
# q CMD [ARG] < JSON: one number from a JSON document (see scripts/hop_netns_q.py).
q() { python3 "$HOP_Q" "$@"; }

# hop_netns NS...: makes the namespaces (netns_add), with IPv6 off: no router
# solicitations or MLD reports wander into the tunnels, so the counters see only the
# script's own traffic.
hop_netns() {
  local ns
  [ -f "$HOP_Q" ] || fail "$HOP_Q is missing"
  netns_add "$@"
  for ns in "$@"; do
    ip netns exec "$ns" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6'
  done
}

# hop_keys_and_relay LISTEN [LINE]: the endpoints' key files a.key and b.key in WORK (KA and
# KB are their public keys), and the config r.toml of a relay on LISTEN trusting both, with
# LINE added.
hop_keys_and_relay() {
  KA=$("$COHORT" keygen --out "$WORK/a.key")
  KB=$("$COHORT" keygen --out "$WORK/b.key")
  cat >"$WORK/r.toml" <<END
role = "relay"
listen = "$1"
trust = ["$KA", "$KB"]
${2:-}
END
}
