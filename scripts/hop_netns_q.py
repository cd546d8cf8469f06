#!/usr/bin/env python3
"""The helper of scripts/hop-netns.sh and scripts/hop-throughput.sh: reads one JSON document
on stdin (`cohort hop ctl --json status`, `hop forge` or `iperf3 -J` output) and prints the
one number asked for (bash is not a JSON parser). `python3 hop_netns_q.py CMD [ARG] < JSON`."""
import json, sys
def get(v, path):
    for part in path.split("."):
        v = v[int(part)] if isinstance(v, list) else v.get(part)
        if v is None:
            return None
    return v
cmd = sys.argv[1]
v = json.load(sys.stdin)
if cmd == "get":            # get PATH: one value (0 if missing)
    x = get(v, sys.argv[2]); print(0 if x is None else x)
elif cmd == "open_out":     # open outgoing data associations
    print(sum(1 for a in v.get("associations", []) if a["dir"] == "out" and a["assoc"] != 0 and a["open"]))
elif cmd == "dropped":      # the relay's drop counters, summed
    c = v["counters"]
    print(sum(c.get(k, 0) for k in ("malformed", "unknown", "forged", "replayed", "stale", "unverifiable", "bad_cookie", "untrusted", "no_room")))
elif cmd == "rate":         # iperf3 -J: receiver Mbit/s
    print("%.1f" % (v["end"]["sum_received"]["bits_per_second"] / 1e6))
