#!/usr/bin/env python3
"""The driver of scripts/group-chaos.sh: starts nine `cohort group run` members in three
network namespaces (made by the shell script), sends numbered reliable and unreliable
messages from every member all the time, injects seeded random faults (kill -9 and restart,
of the leader too; a namespace cut off; one direction cut with iptables DROP; trust removed
and given back; rekeys), measures each heal (one view and one key at every live member
within 5 s), samples the resident memory of the members it never kills, and at the end runs
scripts/group_chaos_check.py over every log.

Owns: the fault schedule, the processes of the members and what happens to them, the sent
log (WORK/sent.log), the heal and RSS measurements (WORK/run.json). Must not hold the log
checks (group_chaos_check.py) nor the namespaces (group-chaos.sh).

`python3 group_chaos.py --work DIR --cohort BIN --minutes M --seed S --mode identity|kdc
 --ns A,B,C --addr 10.98.0.1,10.98.0.2,10.98.0.3 [--kdc-addr IP:PORT]`"""
import argparse, base64, json, os, random, signal, subprocess, threading, time

HEAL_LIMIT = 5.0        # seconds from the end of a fault to one view and one key at all
RESYNC_LIMIT = 30.0     # after that, how long the driver waits before it goes on anyway
SEND_PERIOD = 0.1       # each live member sends one reliable and one unreliable message this often
N = 9
KINDS = ["kill", "kill_leader", "cut_ns", "cut_dir", "trust", "rekey"]


def log(*a):
    print(*a, flush=True)


def jsonl(path, start=0):
    """The complete JSON lines of PATH from byte START, and the offset after the last one."""
    out = []
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out, start + end


class Member:
    """One member: its namespace, address, config, and its incarnations (one process each)."""

    def __init__(self, i, ns, addr, work):
        self.i, self.ns, self.addr, self.work = i, ns, addr, work
        self.inc = 0
        self.proc = None
        self.fd = None
        self.out = None
        self.id = None
        self.lock = threading.Lock()
        self.k = 0  # next message number of the current incarnation
        self.pipe_full = 0  # commands not written because this member's stdin pipe was full

    def name(self):
        return f"m{self.i}"

    def start(self, cohort):
        self.inc += 1
        self.k = 0
        base = f"{self.work}/m{self.i}.{self.inc}"
        self.out = base + ".out"
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, cohort, "group", "run", "--config",
             f"{self.work}/m{self.i}.toml"],
            stdin=subprocess.PIPE, stdout=open(self.out, "wb"), stderr=open(base + ".err", "wb"))
        self.fd = self.proc.stdin.fileno()
        # Non-blocking: a member that stops reading its commands (stalled, or stopped by a
        # fault) must not block the one sender thread that feeds every member. A line is far
        # below PIPE_BUF, so a write is whole or refused, never half a command.
        os.set_blocking(self.fd, False)
        return self.inc

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def write(self, obj):
        """One command line, one write (atomic on a pipe); False if the process is gone or
        its pipe is full (then the command is not sent, and not recorded as sent)."""
        line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        with self.lock:
            if self.proc is None:
                return False
            try:
                os.write(self.fd, line)
                return True
            except BlockingIOError:
                self.pipe_full += 1
                return False
            except OSError:
                return False

    def kill9(self):
        with self.lock:
            p = self.proc
            self.proc = None
        if p is not None:
            try:
                p.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            try:
                p.stdin.close()
            except OSError:
                pass
        return p

    def rss_kb(self):
        p = self.proc
        if p is None:
            return None
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None


class Chaos:
    def __init__(self, a):
        self.a = a
        self.work = a.work
        self.rng = random.Random(a.seed)              # the fault schedule
        self.rng_ll = random.Random(a.seed * 7 + 1)   # the long-lived members
        nss, addrs = a.ns.split(","), a.addr.split(",")
        self.members = [Member(i, nss[(i - 1) // 3], f"{addrs[(i - 1) // 3]}:{7200 + i}", a.work)
                        for i in range(1, N + 1)]
        self.nss, self.ns_addr = nss, addrs
        self.stop_sending = threading.Event()
        self.stop_all = threading.Event()
        self.sent = open(f"{a.work}/sent.log", "w")
        self.sent_lock = threading.Lock()
        self.sent_count = {"reliable": 0, "unreliable": 0}
        self.incarnations = []   # dicts: member, inc, out, killed, exited, start, end
        self.problems = []       # run-time check failures
        self.faults = []         # dicts: kind, what, start, end, heal, heal_s
        self.rss = {}            # member index -> [(t, kB)]
        self.unexpected_exits = []
        self.iptables = []       # (ns, args) rules in force, for the restore

    # ---------------------------------------------------------------- setup
    def write_configs(self):
        ids = []
        if self.a.mode == "identity":
            for m in self.members:
                out = subprocess.run([self.a.cohort, "keygen", "--out", f"{self.work}/m{m.i}.key"],
                                     check=True, capture_output=True, text=True).stdout.strip()
                ids.append(out)
        else:
            ids = [f"kdc:m{m.i}" for m in self.members]
        trust = ",".join(f'"{t}"' for t in ids)
        for m in self.members:
            if self.a.mode == "identity":
                auth = f'identity = "m{m.i}.key"'
            else:
                auth = f'auth = "kdc"\nprincipal_key = "m{m.i}.key"\nkdc = "{self.a.kdc_addr}"'
            peers = ",".join(f'"{o.addr}"' for o in self.members if o is not m)
            with open(f"{self.work}/m{m.i}.toml", "w") as f:
                f.write(f'{auth}\ngroup = "chaos"\nlisten = "{m.addr}"\npeers = [{peers}]\n'
                        f"trust = [{trust}]\nheartbeat_ms = 50\nsuspect_ms = 600\nflush_ms = 300\n")
            m.id = ids[m.i - 1]

    def start(self, m):
        inc = m.start(self.a.cohort)
        self.incarnations.append({"member": m.i, "inc": inc, "out": os.path.basename(m.out),
                                  "killed": False, "start": time.time(), "end": None})
        return inc

    def record_end(self, m, killed):
        for rec in reversed(self.incarnations):
            if rec["member"] == m.i and rec["inc"] == m.inc:
                rec["killed"] = killed
                rec["end"] = time.time()
                break

    # ---------------------------------------------------------------- traffic
    def sender(self):
        """Every SEND_PERIOD: one reliable and one unreliable message from every live member,
        numbered per incarnation: `m<i>.<inc>.<r|u>.<k>`."""
        while not self.stop_sending.is_set():
            t0 = time.time()
            for m in self.members:
                if m.proc is None:
                    continue
                k, inc = m.k, m.inc
                m.k += 1
                for ch, c in (("reliable", "r"), ("unreliable", "u")):
                    text = f"m{m.i}.{inc}.{c}.{k}"
                    if m.write({"cmd": "send", "channel": ch,
                                "data": base64.b64encode(text.encode()).decode()}):
                        with self.sent_lock:
                            self.sent.write(f"{text} {time.time():.6f}\n")
                            self.sent_count[ch] += 1
            with self.sent_lock:
                self.sent.flush()
            self.stop_sending.wait(max(0.0, SEND_PERIOD - (time.time() - t0)))

    def sampler(self):
        """VmRSS of the long-lived members every second."""
        while not self.stop_all.is_set():
            for i in list(self.long_lived):
                kb = self.members[i - 1].rss_kb()
                if kb is not None:
                    self.rss.setdefault(i, []).append((time.time(), kb))
            self.stop_all.wait(1.0)

    def watcher(self):
        """A member that exits without being killed is a failure; it is restarted."""
        while not self.stop_all.is_set():
            for m in self.members:
                p = m.proc
                if p is not None and p.poll() is not None and m.proc is p:
                    err = open(m.out[:-4] + ".err", errors="replace").read()[-600:]
                    msg = f"{m.name()} (incarnation {m.inc}) exited by itself with status {p.returncode}: {err!r}"
                    log("problem:", msg)
                    self.problems.append(msg)
                    self.unexpected_exits.append(msg)
                    m.kill9()
                    self.record_end(m, killed=True)
                    self.start(m)
            self.stop_all.wait(0.5)

    # ---------------------------------------------------------------- status
    def status_all(self, timeout=2.0):
        """Asks every live member for its status: {i: status line}."""
        starts, asked = {}, []
        self.unasked = set()  # live members whose status request was not written
        for m in self.members:
            if m.proc is not None:
                starts[m.i] = (m.out, os.path.getsize(m.out))
                if m.write({"cmd": "status"}):
                    asked.append(m.i)
                else:
                    self.unasked.add(m.i)
        got, end = {}, time.time() + timeout
        while len(got) < len(asked) and time.time() < end:
            for i in asked:
                if i in got:
                    continue
                path, start = starts[i]
                ls, _ = jsonl(path, start)
                s = [l for l in ls if l.get("event") == "status"]
                if s:
                    got[i] = s[0]
            if len(got) < len(asked):
                time.sleep(0.02)
        return got

    def one_view(self):
        """(True, view) when every live member reports one view of all N, one view id, one
        key fingerprint and no view change going on; else (False, summary)."""
        live = [m.i for m in self.members if m.proc is not None]
        st = self.status_all()
        first, bad = None, []
        for i in live:
            s = st.get(i)
            v = s and s.get("view")
            if not v:
                # Three different failures, told apart: a member that answers without a
                # view, one that does not answer, one whose stdin pipe is full.
                why = ("no view" if s else "no status: stdin pipe full" if i in self.unasked
                       else "no status within 2 s")
                bad.append(f"m{i}: {why}")
                continue
            key = (v["view_id"], s.get("key_fingerprint"), v["key_epoch"])
            if len(v["members"]) != N or s.get("changing_view") or not s.get("key_fingerprint"):
                bad.append(f"m{i}: {len(v['members'])} members, view {v['view_id']}, changing {s.get('changing_view')}")
            if first is None:
                first = key
            elif key != first:
                bad.append(f"m{i}: view {key[0]} key {key[1]} epoch {key[2]} (m{live[0]}: {first[0]} {first[1]} {first[2]})")
        if not bad and len(live) == N:
            return True, {"view_id": first[0], "key": first[1], "epoch": first[2]}
        return False, "; ".join(bad[:9]) or f"only {len(live)} live"

    def leader(self):
        """The leader of the view most live members report (None if none)."""
        st = self.status_all()
        count = {}
        for s in st.values():
            v = s.get("view")
            if v and v.get("leader"):
                count[v["leader"]] = count.get(v["leader"], 0) + len(v["members"])
        if not count:
            return None
        lid = max(count, key=count.get)
        for m in self.members:
            if m.id == lid:
                return m
        return None

    def wait_heal(self, t0, label):
        """Polls until one view and one key; records the time from T0 (the fault's end)."""
        while True:
            ok, info = self.one_view()
            t = time.time() - t0
            if ok:
                return t, info
            if t > RESYNC_LIMIT:
                return None, info
            time.sleep(0.05)

    # ---------------------------------------------------------------- faults
    def ipt(self, ns, *args):
        subprocess.run(["ip", "netns", "exec", ns, "iptables", *args], check=True)

    def schedule(self):
        """The seeded schedule: the same draws for every step whatever its kind, so a seed
        fixes kinds, targets, subsets and durations."""
        steps = []
        for _ in range(2000):
            kind = self.rng.choice(self.kinds)
            target = self.rng.randrange(N)
            other = self.rng.randrange(3)
            shift = self.rng.randrange(1, 3)
            subset = self.rng.sample(range(N), 4)[: self.rng.randrange(1, 5)]
            hold = round(self.rng.uniform(0.5, 4.0), 2)
            calm = round(self.rng.uniform(1.0, 2.5), 2)
            rekeys = self.rng.randrange(1, 4)
            with_leader = self.rng.randrange(3)  # trust: 0 plain, 1 the leader distrusts, 2 distrusted
            steps.append((kind, target, other, shift, subset, hold, calm, rekeys, with_leader))
        return steps

    def killable(self, idx):
        """The member at IDX, or the next one that is not long-lived."""
        while (idx % N) + 1 in self.long_lived:
            idx += 1
        return self.members[idx % N]

    def run_fault(self, step, n):
        kind, target, other, shift, subset, hold, calm, rekeys, with_leader = step
        f = {"n": n, "kind": kind, "hold": hold}
        if kind in ("kill", "kill_leader"):
            m = self.killable(target)
            if kind == "kill_leader":
                lead = self.leader()
                if lead is not None and lead.i not in self.long_lived:
                    m = lead
                elif lead is not None and len(self.long_lived) > 2:
                    # Leaders are killed too: a long-lived leader once (it leaves the RSS
                    # sample; two long-lived members stay).
                    m = lead
                    self.long_lived.remove(lead.i)
                    self.rss.pop(lead.i, None)
                    f["note"] = f"the leader {lead.name()} was long-lived: no longer sampled"
                else:
                    f["kind"] = "kill"
                    f["note"] = f"the leader {lead.name() if lead else '?'} is long-lived: killed a member"
            f["what"] = f"kill -9 {m.name()} (incarnation {m.inc}), restart after {hold}s"
            log(f"fault {n}: {f['what']}" + (f" ({f['note']})" if "note" in f else ""))
            f["start"] = time.time()
            m.kill9()
            self.record_end(m, killed=True)
            time.sleep(hold)
            self.start(m)
            f["end"] = time.time()
        elif kind == "cut_ns":
            ns = self.nss[other]
            f["what"] = f"namespace {'ABC'[other]} (m{3 * other + 1}-m{3 * other + 3}) cut off for {hold}s"
            log(f"fault {n}: {f['what']}")
            f["start"] = time.time()
            self.ipt(ns, "-A", "INPUT", "!", "-i", "lo", "-j", "DROP")
            self.ipt(ns, "-A", "OUTPUT", "!", "-o", "lo", "-j", "DROP")
            time.sleep(hold)
            self.ipt(ns, "-F", "INPUT")
            self.ipt(ns, "-F", "OUTPUT")
            f["end"] = time.time()
        elif kind == "cut_dir":
            to = (other + shift) % 3
            f["what"] = f"one direction cut, namespace {'ABC'[other]} -> {'ABC'[to]}, for {hold}s"
            log(f"fault {n}: {f['what']}")
            f["start"] = time.time()
            self.ipt(self.nss[other], "-A", "OUTPUT", "-d", self.ns_addr[to], "-j", "DROP")
            time.sleep(hold)
            self.ipt(self.nss[other], "-F", "OUTPUT")
            f["end"] = time.time()
        elif kind == "trust":
            # A third of them plain (random members stop trusting a random member), a third
            # with the leader among those who stop trusting (it removes the member), a third
            # aimed at the leader (those who stop trusting it leave and go on alone).
            lead = self.leader() if with_leader else None
            if with_leader == 2 and lead is not None:
                target = lead.i - 1
            t = self.members[target]
            at = [self.members[j] for j in subset if j != target] or [self.members[(target + 1) % N]]
            if with_leader == 1 and lead is not None and lead is not t and lead not in at:
                at = [lead] + at[:-1]
            if lead is t:
                f["note"] = "the member is the leader"
            names = ",".join(m.name() for m in at)
            f["what"] = f"{names} stop trusting {t.name()}{' (the leader)' if 'note' in f else ''} for {hold}s"
            log(f"fault {n}: {f['what']}")
            f["start"] = time.time()
            for m in at:
                if not m.write({"cmd": "trust", "remove": [t.id]}):
                    self.problems.append(f"fault {n}: could not send trust to {m.name()}")
            time.sleep(hold)
            for m in at:
                # A member restarted meanwhile starts from its config, which trusts all.
                m.write({"cmd": "trust", "add": [t.id]})
            f["end"] = time.time()
        elif kind == "rekey":
            who = [self.members[j] for j in subset[:rekeys]]
            f["what"] = f"rekey at {','.join(m.name() for m in who)} over {hold}s"
            log(f"fault {n}: {f['what']}")
            f["start"] = time.time()
            for m in who:
                m.write({"cmd": "rekey"})
                time.sleep(hold / len(who))
            f["end"] = time.time()
        t, info = self.wait_heal(f["end"], f"fault {n}")
        f["heal_s"] = t
        if t is None:
            msg = f"fault {n} ({f['what']}): no one view and one key within {RESYNC_LIMIT:.0f}s: {info}"
            self.problems.append(msg)
            log("problem:", msg)
        else:
            f["view"] = info
            over = t > HEAL_LIMIT
            if over:
                self.problems.append(f"fault {n} ({f['what']}): heal took {t:.2f}s (limit {HEAL_LIMIT}s)")
            log(f"  healed in {t:.2f}s{' (OVER THE LIMIT)' if over else ''}: view {info['view_id']},"
                f" key epoch {info['epoch']}, key {info['key']}")
        self.faults.append(f)
        return calm

    # ---------------------------------------------------------------- the run
    def run(self):
        a = self.a
        self.kinds = KINDS
        log(f"seed {a.seed} (scripts/group-chaos.sh ... --seed {a.seed} repeats this schedule)")
        steps = self.schedule()
        self.write_configs()
        t_begin = time.time()
        for m in self.members:
            self.start(m)
        threading.Thread(target=self.watcher, daemon=True).start()
        t, info = self.wait_heal(t_begin, "formation")
        if t is None:
            self.problems.append(f"no view of {N} with one key within {RESYNC_LIMIT:.0f}s of the start: {info}")
            return self.finish(t_begin, None)
        log(f"formed: view of {N} {info['view_id']}, key epoch {info['epoch']}, key {info['key']} after {t:.2f}s")
        # Long-lived members: one per namespace, drawn from the seed among those that do
        # not lead the first view (so that kill_leader has a leader to kill), never killed.
        lead = self.leader()
        self.long_lived = []
        for k in range(3):
            pick = [3 * k + j + 1 for j in range(3) if lead is None or 3 * k + j + 1 != lead.i]
            self.long_lived.append(pick[self.rng_ll.randrange(len(pick))])
        log(f"long-lived (never killed, RSS sampled): {', '.join(f'm{i}' for i in self.long_lived)}")
        threading.Thread(target=self.sampler, daemon=True).start()
        sender = threading.Thread(target=self.sender, daemon=True)
        sender.start()
        t_chaos = time.time()
        deadline = t_chaos + a.minutes * 60
        n = 0
        while time.time() < deadline and n < len(steps):
            n += 1
            calm = self.run_fault(steps[n - 1], n)
            time.sleep(calm)
        t_end_chaos = time.time()
        log(f"chaos over after {t_end_chaos - t_chaos:.1f}s: {n} faults; final check of one view")
        t, info = self.wait_heal(t_end_chaos, "final")
        if t is None:
            self.problems.append(f"at the end: no one view and one key: {info}")
        # Stop sending, let everything arrive, then the final status.
        time.sleep(1.0)
        self.stop_sending.set()
        sender.join()
        t_stop = time.time()
        self.drain()
        return self.finish(t_begin, (t_chaos, t_end_chaos, t_stop))

    def drain(self):
        """Up to 15 s until every live member reports the same reliable delivery count twice
        in a row (the last messages are stable everywhere)."""
        end, last = time.time() + 15, None
        while time.time() < end:
            st = self.status_all()
            counts = tuple(sorted((i, s.get("delivered_reliable"), s.get("pending"),
                                   (s.get("view") or {}).get("view_id")) for i, s in st.items()))
            if counts == last and len({c[3] for c in counts}) == 1 and all(c[2] == 0 for c in counts):
                return
            last = counts
            time.sleep(0.5)
        log("note: the delivery counts did not settle within 15 s of the last send")

    def finish(self, t_begin, times):
        self.stop_all.set()
        for m in self.members:
            if m.proc is not None:
                m.kill9()
                self.record_end(m, killed=False)  # stopped by the driver at the end, after the drain
        self.sent.close()
        run = {
            "seed": self.a.seed, "mode": self.a.mode, "minutes": self.a.minutes,
            "members": [{"i": m.i, "id": m.id, "ns": m.ns, "addr": m.addr} for m in self.members],
            "incarnations": self.incarnations, "faults": self.faults,
            "problems": self.problems, "rss": {str(k): v for k, v in self.rss.items()},
            "long_lived": getattr(self, "long_lived", []),
            "times": times, "sent": self.sent_count, "heal_limit": HEAL_LIMIT,
            "pipe_full": {m.name(): m.pipe_full for m in self.members},
        }
        with open(f"{self.work}/run.json", "w") as f:
            json.dump(run, f)
        return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    p.add_argument("--cohort", required=True)
    p.add_argument("--minutes", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--mode", choices=["identity", "kdc"], required=True)
    p.add_argument("--ns", required=True)
    p.add_argument("--addr", required=True)
    p.add_argument("--kdc-addr")
    a = p.parse_args()
    c = Chaos(a)
    try:
        c.run()
    finally:
        c.stop_all.set()
        c.stop_sending.set()
        for m in c.members:
            m.kill9()
        for ns in c.nss:
            subprocess.run(["ip", "netns", "exec", ns, "iptables", "-F"], stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
