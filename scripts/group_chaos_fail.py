#!/usr/bin/env python3
"""The failure report of scripts/group-chaos.sh (run only on FAIL): for every member that
the driver's problems (WORK/run.json) or the checker's failed checks (WORK/check.txt) name,
prints the tail of its last incarnation's log: its last status line (view, members, leader,
changing_view, key epoch, pending), its last view events (view, merging, expelled, removed,
stalled, lost, ...; deliveries and status lines left out) and the end of its stderr.

Owns: what a FAIL prints about the members it names. Must not check anything
(group_chaos_check.py) nor keep the logs (group-chaos.sh copies them).

`python3 group_chaos_fail.py WORK`"""
import json, os, re, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group_chaos_check  # noqa: E402  (its parser of the members' logs)

QUIET = {"deliver", "status", "received"}
EVENTS = 12
ERR_LINES = 8


def lines(path):
    """The JSON lines of a member's log (group_chaos_check.lines); none if it is missing."""
    try:
        return group_chaos_check.lines(path)
    except OSError:
        return []


def short(obj, limit=300):
    s = json.dumps(obj, separators=(",", ":"))
    return s if len(s) <= limit else s[:limit] + "..."


def named(work, run):
    """The member numbers the problems and the failed checks name."""
    text = "\n".join(run.get("problems", []))
    try:
        with open(os.path.join(work, "check.txt")) as f:
            text += "\n" + "\n".join(l for l in f if l.startswith("    "))
    except OSError:
        pass
    # "m1: no view" (a heal), "m3 (incarnation 2) exited by itself", "m5.2.out" (a check);
    # not the members a fault's description lists ("namespace B (m4-m6) cut off").
    return sorted({int(x) for x in re.findall(r"\bm(\d)(?:: | \(incarnation )", text)}
                  | {int(x) for x in re.findall(r"\bm(\d)\.\d+\.out\b", text)})


def report(work):
    try:
        with open(os.path.join(work, "run.json")) as f:
            run = json.load(f)
    except (OSError, ValueError):
        run = {}
    ms = named(work, run)
    if not ms:
        print("failure report: no member named by the problems or the failed checks")
        return
    incs = {}
    for rec in run.get("incarnations", []):
        incs.setdefault(rec["member"], []).append(rec)
    for i in ms:
        recs = incs.get(i) or []
        rec = recs[-1] if recs else {"inc": 1, "out": f"m{i}.1.out", "killed": False}
        print(f"--- m{i}: incarnation {rec['inc']} of {len(recs)} "
              f"({'killed by the driver' if rec.get('killed') else 'stopped at the end'}), {rec['out']}")
        ls = lines(os.path.join(work, rec["out"]))
        st = [l for l in ls if l.get("event") == "status"]
        if st:
            s = st[-1]
            v = s.get("view")
            if v:
                print(f"  last status ({len(st)} in all): view {v.get('view_id')} of {len(v.get('members', []))},"
                      f" leader {str(v.get('leader'))[:16]}, key epoch {v.get('key_epoch')},"
                      f" changing_view {s.get('changing_view')}, pending {s.get('pending')},"
                      f" delivered_reliable {s.get('delivered_reliable')}")
            else:
                print(f"  last status ({len(st)} in all): NO VIEW: {short(s)}")
        else:
            print("  no status line at all in this incarnation's log")
        ev = [l for l in ls if l.get("event") not in QUIET]
        print(f"  last {min(EVENTS, len(ev))} of {len(ev)} events other than deliver/status/received:")
        for l in ev[-EVENTS:]:
            print("   ", short(l))
        err = os.path.join(work, rec["out"][:-4] + ".err")
        try:
            with open(err, errors="replace") as f:
                tail = f.read().splitlines()[-ERR_LINES:]
        except OSError:
            tail = []
        if tail:
            print(f"  stderr (last {len(tail)} lines):")
            for l in tail:
                print("   ", l[:300])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    report(sys.argv[1])
