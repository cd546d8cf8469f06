#!/usr/bin/env python3
"""The helper of scripts/group-netns.sh and scripts/group-kdc-netns.sh: reads the members' JSON
lines, polls their status, sends the numbered messages and checks the deliveries (the
lines are JSON, and bash is not a JSON parser). `python3 group_netns_q.py CMD ARGS...`."""
import base64, collections, json, os, re, sys, time

def lines(path, start=0):
    out = []
    with open(path, "rb") as f:
        f.seek(start)
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out

def write(work, i, obj):
    fd = os.open(f"{work}/m{i}.in", os.O_WRONLY)
    try:
        os.write(fd, (json.dumps(obj, separators=(",", ":")) + "\n").encode())  # one write: atomic
    finally:
        os.close(fd)

cmd = sys.argv[1]
if cmd == "view":      # count view_id leader key_epoch members(comma) of the last view event
    views = [l for l in lines(sys.argv[2]) if l.get("event") == "view"]
    if views:
        v = views[-1]
        print(len(v["members"]), v["view_id"], v["leader"], v["key_epoch"], ",".join(v["members"]))
    else:
        print("0 - - -1 -")
elif cmd == "id":
    print(next(l["id"] for l in lines(sys.argv[2]) if l.get("event") == "started"))
elif cmd == "status":  # WORK N: asks every member for its status; per member one line:
    # count view_id leader key_epoch key_fingerprint changing_view
    work, n = sys.argv[2], int(sys.argv[3])
    starts = {i: os.path.getsize(f"{work}/m{i}.out") for i in range(1, n + 1)}
    for i in range(1, n + 1):
        write(work, i, {"cmd": "status"})
    got, end = {}, time.time() + 2
    while len(got) < n and time.time() < end:
        for i in range(1, n + 1):
            if i not in got:
                s = [l for l in lines(f"{work}/m{i}.out", starts[i]) if l.get("event") == "status"]
                if s:
                    got[i] = s[0]
        time.sleep(0.01)
    for i in range(1, n + 1):
        s = got.get(i)
        v = s and s.get("view")
        if not v:
            print("0 - - -1 - -")
        else:
            print(len(v["members"]), v["view_id"], v["leader"], v["key_epoch"],
                  s.get("key_fingerprint") or "-", "yes" if s.get("changing_view") else "no")
elif cmd == "seen":    # ID FILE...: the files in which ID is a member of a view (event or status)
    who = sys.argv[2]
    for path in sys.argv[3:]:
        for l in lines(path):
            v = l if l.get("event") == "view" else (l.get("view") if l.get("event") == "status" else None)
            if v and who in (v.get("members") or []):
                print(path)
                break
elif cmd == "refused":  # FILE: addr and reason of every refused event, one a line
    for l in lines(sys.argv[2]):
        if l.get("event") == "refused":
            print(l.get("addr"), l.get("reason"))
elif cmd == "sender":  # WORK N PERIOD_MS: numbered reliable messages until WORK/stop exists
    work, n, period = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) / 1000
    k = 0
    with open(f"{work}/sent.log", "w") as log:
        while not os.path.exists(f"{work}/stop"):
            for i in range(1, n + 1):
                text = f"m{i}-{k}"
                write(work, i, {"cmd": "send", "channel": "reliable",
                                "data": base64.b64encode(text.encode()).decode()})
                log.write(f"{i} {k} {time.time():.6f}\n")
                log.flush()
            k += 1
            time.sleep(period)
elif cmd == "delivered":  # WORK N: how many reliable deliveries each member reported
    work, n = sys.argv[2], int(sys.argv[3])
    print(" ".join(str(sum(1 for l in lines(f"{work}/m{i}.out")
                           if l.get("event") == "deliver" and l.get("channel") == "reliable"))
                   for i in range(1, n + 1)))
elif cmd == "check":  # WORK N SIDE_A(1,2,3) T_SIDES T_RESTORE T_MERGE [wait]: the deliveries
    work, n = sys.argv[2], int(sys.argv[3])
    side_a = {int(x) for x in sys.argv[4].split(",")}
    t_sides, t_restore, t_merge = map(float, sys.argv[5:8])
    final = len(sys.argv) <= 8  # without "wait": report every problem
    side = {i: ("A" if i in side_a else "B") for i in range(1, n + 1)}
    sent = collections.defaultdict(list)  # member -> [(text, time)]
    for line in open(f"{work}/sent.log"):
        i, k, t = line.split()
        sent[int(i)].append((f"m{i}-{k}", float(t)))
    got, refused, problems = {}, {}, []
    for i in range(1, n + 1):
        ls = lines(f"{work}/m{i}.out")
        texts = [base64.b64decode(l["data"]).decode(errors="replace") for l in ls
                 if l.get("event") == "deliver" and l.get("channel") == "reliable"]
        counts = collections.Counter(texts)
        dups = sorted(t for t, c in counts.items() if c > 1)
        if dups:
            problems.append(f"m{i} delivered {len(dups)} messages twice or more: {dups[:5]}")
        junk = sorted(t for t in counts if not re.fullmatch(r"m\d+-\d+", t))
        if junk:
            problems.append(f"m{i} delivered messages nobody sent: {junk[:5]}")
        got[i] = set(counts)
        refused[i] = [l.get("error") for l in ls if l.get("event") == "error" and l.get("cmd") == "send"]
        other = [l for l in ls if l.get("event") == "error" and l.get("cmd") != "send"]
        if other:
            problems.append(f"m{i} answered with errors: {other[:3]}")
    for i in range(1, n + 1):
        # Self delivery: what a member sent and did not deliver itself must be as many as
        # the sends it refused (a refused send is never sent), all within the merge.
        missing = [(t, s) for t, s in sent[i] if t not in got[i]]
        if len(missing) != len(refused[i]):
            problems.append(f"m{i}: {len(missing)} of its {len(sent[i])} messages never delivered"
                            f" at itself, but {len(refused[i])} sends refused: missing"
                            f" {[t for t, _ in missing[:8]]}, refusals {refused[i][:3]}")
        outside = [t for t, s in missing if not (t_restore <= s <= t_merge + 1)]
        if outside and len(missing) == len(refused[i]):
            problems.append(f"m{i}: sends refused outside the merge: {outside[:8]}")
        # After the merge: at all six.
        for t, s in sent[i]:
            if s > t_merge:
                lacking = [j for j in range(1, n + 1) if t not in got[j]]
                if lacking:
                    problems.append(f"{t} (sent {s - t_merge:.2f}s after the merge) not delivered at "
                                    + ",".join(f"m{j}" for j in lacking))
        # During the cut: on its own side only.
        for t, s in sent[i]:
            if t_sides < s < t_restore:
                lacking = [j for j in range(1, n + 1) if side[j] == side[i] and t not in got[j]]
                crossed = [j for j in range(1, n + 1) if side[j] != side[i] and t in got[j]]
                if lacking:
                    problems.append(f"{t} (sent during the cut) not delivered on its side at "
                                    + ",".join(f"m{j}" for j in lacking))
                if crossed:
                    problems.append(f"{t} (sent during the cut) crossed it to "
                                    + ",".join(f"m{j}" for j in crossed))
    if final:
        for i in range(1, n + 1):
            print(f"  m{i} (side {side[i]}): sent {len(sent[i])}, delivered {len(got[i])},"
                  f" refused {len(refused[i])}"
                  + (f" ({collections.Counter(refused[i]).most_common(1)[0][0]})" if refused[i] else ""))
        for p in problems[:40]:
            print("problem:", p)
        if len(problems) > 40:
            print(f"problem: ... and {len(problems) - 40} more")
    sys.exit(1 if problems else 0)
