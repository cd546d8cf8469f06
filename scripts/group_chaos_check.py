#!/usr/bin/env python3
"""The log checker of scripts/group-chaos.sh: reads WORK/run.json (what the driver did and
measured), WORK/sent.log (every message written to a member, `m<i>.<inc>.<r|u>.<k> TIME`)
and every incarnation's JSON lines (WORK/m<i>.<inc>.out; a restarted member is a new
incarnation and a separate log), checks them and prints the summary and PASS or FAIL
(exit status 1 on FAIL). `python3 group_chaos_check.py WORK`

`python3 group_chaos_check.py --selftest WORK` (WORK kept from a passing run with
`group-chaos.sh --keep`) corrupts copies of its logs by hand, one way each, and requires
that the check named for each corruption fails.

Owns: what the chaos run's logs must satisfy. Must not drive anything (group_chaos.py).

Checks (the names printed in the summary):
  integrity   every delivery decodes to a message some member's current incarnation was
              sent (sent.log), on the channel it was sent on, and the deliver event's
              `sender` is that member's id (nothing from nowhere); no incarnation delivers
              one message twice (nothing twice); no error line other than refused sends.
  fifo        reliable messages of one sender incarnation are delivered in the order sent.
  view-order  every reliable delivery carries the view its log is in, and its `order` is
              the count of reliable deliveries before it in that view in that log (0, 1,
              2, ...: no gap, no repeat).
  total-order two logs that go from view V to the same next view, or both stay in V until
              the driver stops them, delivered the same sequence in V, one a prefix of the
              other (logs whose process was killed in V are left out for V).
  agreement   two logs that go from V to the same next view delivered exactly the same
              reliable messages in V, in the same order (virtual synchrony); and the logs
              that end in the final view (after the drain) delivered the same there.
  self        an incarnation stopped at the end (never killed) delivered every reliable
              message it was sent, except at most as many as its refused sends.
  key-epochs  every view event and every status line naming one view (id and members)
              names one key epoch, and every status line naming it one key fingerprint.
  heals       (from the driver) one view of all nine with one key within the limit after
              every fault, no member exited by itself.
  rss         VmRSS of each long-lived member grew less than 10% from the end of the
              warm-up to the end of the run (not checked, and printed so, when run.json
              has `rss_skip`: scripts/group_nats_netns.py runs members several to a process).
"""
import base64, collections, json, re, statistics, sys

RSS_LIMIT = 0.10
MSG = re.compile(r"m(\d+)\.(\d+)\.([ru])\.(\d+)")


def lines(path):
    out = []
    with open(path, "rb") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def vkey(v):
    """A view, named by its id and its members (the printed id is short, and a restarted
    member may reuse a view id of its earlier incarnation)."""
    return (v["view_id"], tuple(v["members"]))


def main(work):
    run = json.load(open(f"{work}/run.json"))
    ids = {m["i"]: m["id"] for m in run["members"]}
    problems = collections.defaultdict(list)
    sent = {}
    for line in open(f"{work}/sent.log"):
        text, t = line.split()
        sent[text] = float(t)

    deliveries = {"reliable": 0, "unreliable": 0}
    delivered_msgs = set()
    segments = collections.defaultdict(list)  # view key -> [(log, [msgs], next)]
    epochs = collections.defaultdict(set)      # view key -> key epochs (view events)
    status_keys = collections.defaultdict(set)  # view key -> (fingerprint, epoch) (status)
    final_counts = {}
    for inc in run["incarnations"]:
        name = f"m{inc['member']}.{inc['inc']}"
        ls = lines(f"{work}/{inc['out']}")
        seen, refused, last_k = set(), 0, {}
        current, cur_list = None, None
        for l in ls:
            e = l.get("event")
            if e == "view":
                k = vkey(l)
                epochs[k].add(l["key_epoch"])
                if current is not None:
                    segments[current].append((name, cur_list, k))
                current, cur_list = k, []
            elif e == "expelled":
                if current is not None:
                    segments[current].append((name, cur_list, ("expelled", name)))
                current, cur_list = None, None
            elif e == "status":
                v = l.get("view")
                if v and l.get("key_fingerprint"):
                    status_keys[vkey(v)].add((l["key_fingerprint"], v["key_epoch"]))
            elif e == "error":
                if l.get("cmd") == "send":
                    refused += 1
                else:
                    problems["integrity"].append(f"{name} answered with an error: {l}")
            elif e == "deliver":
                ch = l.get("channel")
                deliveries[ch] = deliveries.get(ch, 0) + 1
                try:
                    text = base64.b64decode(l["data"]).decode()
                except Exception:
                    text = repr(l.get("data"))
                m = MSG.fullmatch(text)
                if not m or text not in sent:
                    problems["integrity"].append(f"{name} delivered {text!r} ({ch}), never sent")
                    continue
                si, sinc, c, k = int(m[1]), int(m[2]), m[3], int(m[4])
                if l.get("sender") != ids.get(si):
                    problems["integrity"].append(
                        f"{name} delivered {text} with sender {l.get('sender')}, not m{si}'s id")
                if {"r": "reliable", "u": "unreliable"}[c] != ch:
                    problems["integrity"].append(f"{name} delivered {text} on the {ch} channel")
                if text in seen:
                    problems["integrity"].append(f"{name} delivered {text} twice")
                seen.add(text)
                delivered_msgs.add(text)
                if ch != "reliable":
                    continue
                if k <= last_k.get((si, sinc), -1):
                    problems["fifo"].append(f"{name} delivered {text} after m{si}.{sinc}.r.{last_k[(si, sinc)]}")
                last_k[(si, sinc)] = k
                if current is None:
                    problems["view-order"].append(f"{name} delivered {text} outside a view")
                    continue
                if l.get("view_id") != current[0] or l.get("order") != len(cur_list):
                    problems["view-order"].append(
                        f"{name} delivered {text} as {l.get('order')} of view {l.get('view_id')},"
                        f" expected {len(cur_list)} of {current[0]}")
                cur_list.append(text)
        if current is not None:
            nxt = ("killed", name) if inc["killed"] else None
            segments[current].append((name, cur_list, nxt))
            if nxt is None:
                final_counts[name] = (current, len(cur_list))
        if not inc["killed"]:
            # Self delivery: every reliable message this incarnation was sent.
            mine = [t for t in sent if t.startswith(f"m{inc['member']}.{inc['inc']}.r.")]
            missing = [t for t in mine if t not in seen]
            if len(missing) > refused:
                problems["self"].append(
                    f"{name}: {len(missing)} of its {len(mine)} reliable messages never delivered at"
                    f" itself, {refused} sends refused: {sorted(missing, key=lambda t: int(t.split('.')[3]))[:6]}")

    transitions = 0
    for k, segs in segments.items():
        for a in range(len(segs)):
            for b in range(a + 1, len(segs)):
                (na, la, xa), (nb, lb, xb) = segs[a], segs[b]
                if xa != xb or (xa is not None and xa[0] in ("killed", "expelled")):
                    continue
                n = min(len(la), len(lb))
                if la[:n] != lb[:n]:
                    i = next(j for j in range(n) if la[j] != lb[j])
                    problems["total-order"].append(
                        f"view {k[0]} ({len(k[1])} members): {na} and {nb} differ at position {i}:"
                        f" {la[i]} vs {lb[i]}")
                elif la != lb:
                    what = f"to view {xa[0]}" if xa else "and stay in it (the final view)"
                    problems["agreement"].append(
                        f"{na} and {nb} leave view {k[0]} ({len(k[1])} members) {what} having"
                        f" delivered {len(la)} and {len(lb)} messages there")
        transitions += len({x for _, _, x in segs if x is not None and x[0] not in ("killed", "expelled")})
    for k, es in epochs.items():
        if len(es) > 1:
            problems["key-epochs"].append(f"view {k[0]}: view events name key epochs {sorted(es)}")
    for k, fs in status_keys.items():
        if len(fs) > 1:
            problems["key-epochs"].append(f"view {k[0]}: status lines name keys {sorted(fs)}")

    for p in run["problems"]:
        problems["heals"].append(p)

    # RSS: warm-up is the first third of the chaos phase (at least 20 s, at most 300 s);
    # the baseline is the median of the samples in the 5 s after it, the end the median of
    # the last 5 samples.
    rss_lines = []
    times = run.get("times")
    if run.get("rss_skip"):  # a driver that samples no member's memory says why
        rss_lines.append(f"not checked: {run['rss_skip']}")
    elif times:
        t_chaos, t_end = times[0], times[1]
        warm = min(max(20.0, (t_end - t_chaos) / 3), 300.0)
        for i in run["long_lived"]:
            s = run["rss"].get(str(i), [])
            base = [kb for t, kb in s if t_chaos + warm <= t <= t_chaos + warm + 5]
            tail = [kb for _, kb in s[-5:]]
            if not base or not tail:
                problems["rss"].append(f"m{i}: too few RSS samples ({len(s)})")
                continue
            b, e = statistics.median(base), statistics.median(tail)
            growth = e / b - 1
            first = s[0][1]
            rss_lines.append(f"m{i}: {first} kB at the start of the chaos, {b:.0f} kB after the"
                             f" {warm:.0f} s warm-up, {e:.0f} kB at the end ({growth * 100:+.1f}%),"
                             f" max {max(kb for _, kb in s)} kB")
            if growth >= RSS_LIMIT:
                problems["rss"].append(f"m{i} grew {growth * 100:.1f}% after the warm-up ({b:.0f} -> {e:.0f} kB)")
    else:
        problems["rss"].append("no chaos phase ran")

    # Final view: every log that stays in it delivered the same (after the drain).
    finals = {c for c, _ in final_counts.values()}
    if len(finals) > 1:
        problems["agreement"].append(f"the logs that ran to the end end in {len(finals)} different views")

    # Summary.
    faults = run["faults"]
    kinds = collections.Counter(f["kind"] for f in faults)
    heals = sorted(f["heal_s"] for f in faults if f.get("heal_s") is not None)
    print(f"summary ({run['mode']} mode, seed {run['seed']}, {run['minutes']} min of chaos):")
    print("  faults:", ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none",
          f"(total {len(faults)})")
    if not heals:
        print(f"  heals: 0 of {len(faults)} within the resync limit")
    else:
        print(f"  heals: {len(heals)} of {len(faults)} within the resync limit; time to one view and"
              f" one key: min {heals[0]:.2f}s, median {statistics.median(heals):.2f}s,"
              f" max {heals[-1]:.2f}s (limit {run['heal_limit']}s);"
              f" over the limit: {sum(1 for h in heals if h > run['heal_limit'])}")
    print(f"  incarnations: {len(run['incarnations'])} logs"
          f" ({sum(1 for i in run['incarnations'] if i['killed'])} ended by kill -9)")
    print(f"  sent: {run['sent']['reliable']} reliable, {run['sent']['unreliable']} unreliable;"
          f" deliveries: {deliveries.get('reliable', 0)} reliable, {deliveries.get('unreliable', 0)}"
          f" unreliable; distinct messages delivered: {len(delivered_msgs)}")
    full = {k: v for k, v in run.get("pipe_full", {}).items() if v}
    if full:
        print("  commands not written (member's stdin pipe full): "
              + ", ".join(f"{k} {v}" for k, v in sorted(full.items())))
    print(f"  views checked: {len(segments)} (with {transitions} distinct view changes)")
    for l in rss_lines:
        print("  rss", l)
    ok = True
    for name in ["integrity", "fifo", "view-order", "total-order", "agreement", "self",
                 "key-epochs", "heals", "rss"]:
        ps = problems.get(name, [])
        if name == "rss" and run.get("rss_skip"):
            print("  check rss: not run")
            continue
        print(f"  check {name}: {'ok' if not ps else f'FAILED ({len(ps)})'}")
        for p in ps[:10]:
            print(f"    {p}")
        if len(ps) > 10:
            print(f"    ... and {len(ps) - 10} more")
        ok = ok and not ps
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def selftest(work):
    """Copies a passing run's WORK eight times, corrupts each copy by hand in one way and
    requires that the check named for it fails: the checker can fail."""
    import contextlib, io, os, shutil, tempfile

    def run_check(d):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = main(d)
        return status, [l.strip() for l in out.getvalue().splitlines() if "FAILED" in l]

    status, failed = run_check(work)
    if status != 0:
        print(f"selftest needs a passing run; this one fails: {failed}")
        return 2
    run = json.load(open(f"{work}/run.json"))
    live = [i for i in run["incarnations"] if not i["killed"]]
    log = max(live, key=lambda i: os.path.getsize(f"{work}/{i['out']}"))["out"]
    me = run["members"][int(log[1:].split(".")[0]) - 1]["id"]

    def rel(l):
        return '"event":"deliver"' in l and '"channel":"reliable"' in l

    def corrupt_log(L, how):
        views = [k for k, l in enumerate(L) if '"event":"view"' in l] + [len(L)]
        if how == "dup":  # a reliable delivery twice
            i = next(k for k, l in enumerate(L) if rel(l))
            L.insert(i + 1, L[i])
        elif how == "nowhere":  # a delivery of a message nobody sent
            i = next(k for k, l in enumerate(L) if '"event":"deliver"' in l)
            o = json.loads(L[i])
            o["data"] = base64.b64encode(b"m3.1.u.999999").decode()
            L[i] = json.dumps(o, separators=(",", ":")) + "\n"
        elif how == "swap":  # two reliable deliveries of different senders swapped
            r = [k for k, l in enumerate(L) if rel(l)]
            for a, b in zip(r[10:], r[11:]):
                oa, ob = json.loads(L[a]), json.loads(L[b])
                if oa["sender"] != ob["sender"] and oa["view_id"] == ob["view_id"]:
                    oa["order"], ob["order"] = ob["order"], oa["order"]
                    L[a] = json.dumps(ob, separators=(",", ":")) + "\n"
                    L[b] = json.dumps(oa, separators=(",", ":")) + "\n"
                    break
        elif how == "agreement":  # the last reliable delivery of a view that has a successor
            for x in range(len(views) - 2):
                ks = [j for j in range(views[x], views[x + 1]) if rel(L[j])]
                if ks:
                    del L[ks[-1]]
                    break
        elif how == "epoch":  # a view event names another key epoch
            o = json.loads(L[views[1]])
            o["key_epoch"] += 1000
            L[views[1]] = json.dumps(o, separators=(",", ":")) + "\n"
        elif how == "self":  # its own last reliable messages never delivered at itself
            ks = [j for j in range(views[-2], len(L)) if rel(L[j]) and me in L[j]]
            for j in reversed(ks[-30:]):
                del L[j]

    cases = [("dup", "integrity"), ("nowhere", "integrity"), ("swap", "total-order"),
             ("agreement", "agreement"), ("epoch", "key-epochs"), ("self", "self"),
             ("rss", "rss"), ("heal", "heals")]
    bad = 0
    for how, check in cases:
        d = tempfile.mkdtemp()
        try:
            shutil.copytree(work, d, dirs_exist_ok=True)
            if how == "rss":  # a long-lived member's last samples 20% higher
                r = json.load(open(f"{d}/run.json"))
                for x in r["rss"][str(r["long_lived"][0])][-5:]:
                    x[1] = int(x[1] * 1.2)
                json.dump(r, open(f"{d}/run.json", "w"))
            elif how == "heal":  # a heal over the limit, as the driver records it
                r = json.load(open(f"{d}/run.json"))
                r["problems"].append("fault 1 (corrupted): heal took 6.00s (limit 5.0s)")
                json.dump(r, open(f"{d}/run.json", "w"))
            else:
                L = open(f"{d}/{log}").readlines()
                corrupt_log(L, how)
                open(f"{d}/{log}", "w").writelines(L)
            status, failed = run_check(d)
            caught = status == 1 and any(l.startswith(f"check {check}:") for l in failed)
            bad += not caught
            print(f"  {how} in {log if how not in ('rss', 'heal') else 'run.json'}:"
                  f" {'caught' if caught else 'NOT CAUGHT'} ({'; '.join(failed) or 'PASS'})")
        finally:
            shutil.rmtree(d)
    print("selftest: every corruption caught" if not bad else f"selftest: {bad} corruption(s) not caught")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--selftest":
        sys.exit(selftest(sys.argv[2]))
    sys.exit(main(sys.argv[1]))
