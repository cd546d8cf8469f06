#!/usr/bin/env python3
"""The driver of scripts/group-nats-netns.sh (issue 15, parts 2 and 3): a cluster of three
nats-server processes with routes, one per network namespace (made by the shell script),
and a cohort group over it whose members run several to a process (`cohort group many`),
each member attached to the server of its own namespace first (its `nats` list: that
server, then the other two).

Two modes:

check (default, --members 24): every member sends one numbered reliable and one unreliable
  message every SEND_PERIOD all along; then
    fault 1 (cut_ns): namespace C is cut off (iptables DROP of everything but loopback):
      the routes to its server break, the group splits into C's members and the others,
      each side with its own view and key; the cut is restored and within HEAL_LIMIT s
      all members are in one view with one key again (the Exchange merged the sides);
    fault 2 (kill_server): the nats-server of namespace B is killed (-9): B's members
      reconnect to another server of the cluster, and nobody installs a new view (no
      member vanished): no view event at any member after the kill, every member
      reports a `transport` event of B's members' reconnection, and one view with one key
      holds.
  It writes WORK/run.json and WORK/sent.log in the form scripts/group_chaos_check.py reads,
  which then checks every log (integrity, FIFO, order, total order, agreement, self
  delivery, key epochs, heals).

viewchange (--members 256 --kills K): no application traffic; K members run alone in their
  own process (spread over the namespaces); once one view of all has formed, they are
  killed (-9) one at a time, and each kill's view-change time is the time from the kill to
  the last survivor's view event without the victim (the events' `t` field, written by
  `group many`). Prints every time, the median, p95 (nearest rank) and max, and whether
  p95 <= GOAL_S; writes WORK/viewchange.json.

Owns: the cluster's servers and the members' processes, the faults and their timing. Must
not hold the log checks (group_chaos_check.py) nor the namespaces (group-nats-netns.sh).
"""
import argparse, base64, json, math, os, signal, statistics, subprocess, threading, time

HEAL_LIMIT = 5.0     # seconds from a fault's end to one view and one key at all members
RESYNC_LIMIT = 30.0  # how long the driver waits for that before it goes on anyway
SEND_PERIOD = 0.2    # check mode: each member sends one reliable and one unreliable message this often
GOAL_S = 1.5         # viewchange mode: the p95 goal
NATS_PORT, ROUTE_PORT = 4222, 6222


def log(*a):
    print(*a, flush=True)


class Member:
    """One member: its namespace, name, config, command fifo and event log."""

    def __init__(self, i, ns_index, addr, work):
        self.i, self.k, self.addr, self.work = i, ns_index, addr, work
        self.toml = f"{work}/m{i}.toml"
        self.out = f"{work}/m{i}.out"
        self.fd = None
        self.id = None
        self.proc = None   # its process (shared with the other members of the process)
        self.n = 0         # next message number
        self.offset = 0    # how far the driver has read its log
        self.lock = threading.Lock()

    def name(self):
        return f"m{self.i}"

    def write(self, obj):
        line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        with self.lock:
            if self.fd is None:
                return False
            try:
                os.write(self.fd, line)  # one write: atomic on a fifo
                return True
            except OSError:
                return False

    def new_lines(self):
        """The complete JSON lines written since the last call."""
        with open(self.out, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out


class Run:
    def __init__(self, a):
        self.a = a
        self.work = a.work
        self.nss, self.ips = a.ns.split(","), a.addr.split(",")
        n = a.members
        # Contiguous blocks: m1.. in A, then B, then C.
        self.members = [Member(i, (i - 1) * 3 // n, f"{self.ips[(i - 1) * 3 // n]}:{7300 + i}", a.work)
                        for i in range(1, n + 1)]
        self.servers = [None, None, None]
        self.procs = []          # (Popen, [members])
        self.problems = []
        self.faults = []
        self.stop_sending = threading.Event()
        self.sent = None
        self.sent_lock = threading.Lock()
        self.sent_count = {"reliable": 0, "unreliable": 0}
        self.unsent = 0          # sends not written: the member's fifo was full

    # ------------------------------------------------------------------ servers
    def start_servers(self):
        for k in range(3):
            routes = ", ".join(f"nats-route://{self.ips[j]}:{ROUTE_PORT}" for j in range(3) if j != k)
            conf = f"{self.work}/nats{k}.conf"
            with open(conf, "w") as f:
                # ping_interval/ping_max: a route whose peer went silent (a cut) is closed
                # after about 2-3 s, so the cluster really splits; explicit routes are
                # redialled every second and come back after the heal.
                f.write(f'server_name: "n{"ABC"[k]}"\nlisten: "{self.ips[k]}:{NATS_PORT}"\n'
                        f'http: "127.0.0.1:8222"\nping_interval: "1s"\nping_max: 2\nwrite_deadline: "2s"\n'
                        f'cluster {{\n  name: "cohort"\n  listen: "{self.ips[k]}:{ROUTE_PORT}"\n'
                        f"  routes: [{routes}]\n}}\n")
            self.start_server(k)
        end = time.time() + 20
        while True:
            routes = [self.num_routes(k) for k in range(3)]
            if all(r == 2 for r in routes):
                break
            if time.time() > end:
                raise SystemExit(f"FAIL: the nats cluster did not form in 20 s (routes per server: {routes})")
            time.sleep(0.2)
        log(f"nats cluster: 3 servers, 2 routes each ({', '.join(f'{self.ips[k]}:{NATS_PORT}' for k in range(3))})")

    def start_server(self, k):
        err = open(f"{self.work}/nats{k}.log", "ab")
        self.servers[k] = subprocess.Popen(
            ["ip", "netns", "exec", self.nss[k], "nats-server", "-c", f"{self.work}/nats{k}.conf"],
            stdout=err, stderr=err)

    def num_routes(self, k):
        """The routes server K reports (its monitoring endpoint), -1 if it does not answer."""
        r = subprocess.run(
            ["ip", "netns", "exec", self.nss[k], "python3", "-c",
             "import json,urllib.request;"
             "print(json.load(urllib.request.urlopen('http://127.0.0.1:8222/routez',timeout=1))['num_routes'])"],
            capture_output=True, text=True)
        try:
            return int(r.stdout.strip())
        except ValueError:
            return -1

    # ------------------------------------------------------------------ members
    def write_configs(self):
        for m in self.members:
            r = subprocess.run([self.a.cohort, "keygen", "--out", f"{self.work}/m{m.i}.key"],
                               check=True, capture_output=True, text=True)
            m.id = r.stdout.strip()
        trust = ",".join(f'"{m.id}"' for m in self.members)
        # Contacts: the first two members of each namespace.
        contacts = [m for m in self.members if sum(1 for o in self.members if o.k == m.k and o.i < m.i) < 2]
        for m in self.members:
            urls = [f"nats://{self.ips[m.k]}:{NATS_PORT}"] + \
                   [f"nats://{self.ips[j]}:{NATS_PORT}" for j in range(3) if j != m.k]
            peers = ",".join(f'"{c.addr}"' for c in contacts if c is not m)
            with open(m.toml, "w") as f:
                f.write(f'identity = "m{m.i}.key"\ngroup = "natsnet"\ntransport = "nats"\n'
                        f"nats = [{','.join(chr(34) + u + chr(34) for u in urls)}]\n"
                        f'listen = "{m.addr}"\npeers = [{peers}]\ntrust = [{trust}]\n'
                        f"heartbeat_ms = {self.a.heartbeat_ms}\nsuspect_ms = {self.a.suspect_ms}\n"
                        f"flush_ms = {self.a.flush_ms}\n")
            os.mkfifo(f"{self.work}/m{m.i}.in")
            # Read and write: opening does not wait for the reader, and the member sees the
            # end of its input only when the driver closes it.
            # Non-blocking: a member whose send waits for its window (its fifo full) must not
            # hold up the others' sends; a command that does not fit is not sent (and not
            # logged as sent).
            m.fd = os.open(f"{self.work}/m{m.i}.in", os.O_RDWR | os.O_NONBLOCK)

    def start_process(self, group):
        p = len(self.procs)
        args = ["ip", "netns", "exec", self.nss[group[0].k], self.a.cohort, "group", "many"]
        for m in group:
            args += ["--config", m.toml]
        proc = subprocess.Popen(args, stdout=open(f"{self.work}/p{p}.out", "wb"),
                                stderr=open(f"{self.work}/p{p}.err", "wb"))
        for m in group:
            m.proc = proc
        self.procs.append((proc, group))

    def start_members(self, singles=()):
        """Each namespace's members in processes of at most --per-process; the members in
        SINGLES each in a process of its own."""
        for k in range(3):
            rest = [m for m in self.members if m.k == k and m not in singles]
            for j in range(0, len(rest), self.a.per_process):
                self.start_process(rest[j:j + self.a.per_process])
        for m in singles:
            self.start_process([m])
        end = time.time() + 60
        waiting = list(self.members)
        while waiting:
            for m in list(waiting):
                if os.path.exists(m.out) and b'"event":"started"' in open(m.out, "rb").read(4096):
                    waiting.remove(m)
            dead = [(p, g) for p, g in self.procs if p.poll() is not None]
            if dead:
                p, g = dead[0]
                err = open(f"{self.work}/p{self.procs.index((p, g))}.err", errors="replace").read()[-500:]
                raise SystemExit(f"FAIL: a member process ({', '.join(m.name() for m in g)}) exited: {err}")
            if time.time() > end:
                raise SystemExit(f"FAIL: {len(waiting)} members did not start within 60 s")
            time.sleep(0.1)
        log(f"{len(self.members)} members in {len(self.procs)} processes started"
            f" ({', '.join(str(sum(1 for m in self.members if m.k == k)) for k in range(3))} per namespace)")

    def live(self):
        return [m for m in self.members if m.fd is not None and m.proc.poll() is None]

    # ------------------------------------------------------------------ status
    def status_all(self, members, timeout=3.0):
        starts = {m.i: os.path.getsize(m.out) for m in members}
        for m in members:
            m.write({"cmd": "status"})
        got, end = {}, time.time() + timeout
        while len(got) < len(members) and time.time() < end:
            for m in members:
                if m.i in got:
                    continue
                with open(m.out, "rb") as f:
                    f.seek(starts[m.i])
                    data = f.read()
                for line in data.splitlines():
                    if b'"event":"status"' in line:
                        try:
                            got[m.i] = json.loads(line)
                            break
                        except ValueError:
                            pass
            if len(got) < len(members):
                time.sleep(0.05)
        return got

    def one_view(self, members):
        """(True, info) when every one of MEMBERS reports one view of exactly MEMBERS, one
        view id, one key fingerprint and no view change going on; else (False, summary)."""
        st = self.status_all(members)
        want = sorted(m.id for m in members)
        first, bad = None, []
        for m in members:
            s = st.get(m.i)
            v = s and s.get("view")
            if not v:
                bad.append(f"{m.name()}: no status or no view")
                continue
            key = (v["view_id"], s.get("key_fingerprint"), v["key_epoch"])
            if sorted(v["members"]) != want or s.get("changing_view") or not s.get("key_fingerprint"):
                bad.append(f"{m.name()}: {len(v['members'])} members, view {v['view_id']},"
                           f" changing {s.get('changing_view')}")
            if first is None:
                first = key
            elif key != first:
                bad.append(f"{m.name()}: view {key[0]} key {key[1]} (first: {first[0]} {first[1]})")
        if not bad:
            return True, {"view_id": first[0], "key": first[1], "epoch": first[2]}
        return False, f"{len(bad)} off: " + "; ".join(bad[:6])

    def wait_view(self, sides, t0, limit=RESYNC_LIMIT):
        """Polls until each list of members in SIDES is one view with one key; the time from
        T0, or None after LIMIT s; and the views (or the last summary)."""
        while True:
            res = [self.one_view(s) for s in sides]
            t = time.time() - t0
            if all(ok for ok, _ in res):
                return t, [info for _, info in res]
            if t > limit:
                return None, "; ".join(str(info) for ok, info in res if not ok)
            time.sleep(0.1)

    # ------------------------------------------------------------------ traffic
    def sender(self):
        """Every SEND_PERIOD: one reliable and one unreliable message from every member, as
        group_chaos_check.py reads them: `m<i>.1.<r|u>.<k>`."""
        while not self.stop_sending.is_set():
            t0 = time.time()
            for m in self.members:
                k = m.n
                m.n += 1
                for ch, c in (("reliable", "r"), ("unreliable", "u")):
                    text = f"m{m.i}.1.{c}.{k}"
                    if m.write({"cmd": "send", "channel": ch,
                                "data": base64.b64encode(text.encode()).decode()}):
                        with self.sent_lock:
                            self.sent.write(f"{text} {time.time():.6f}\n")
                            self.sent_count[ch] += 1
                    else:
                        self.unsent += 1
            with self.sent_lock:
                self.sent.flush()
            self.stop_sending.wait(max(0.0, SEND_PERIOD - (time.time() - t0)))

    def ipt(self, k, *args):
        subprocess.run(["ip", "netns", "exec", self.nss[k], "iptables", *args], check=True)

    def heal(self, f, t_end):
        t, info = self.wait_view([self.members], t_end)
        f["heal_s"] = t
        if t is None:
            self.problems.append(f"{f['what']}: no one view and one key within {RESYNC_LIMIT:.0f}s: {info}")
            log("problem:", self.problems[-1])
        else:
            f["view"] = info[0]
            if t > HEAL_LIMIT:
                self.problems.append(f"{f['what']}: heal took {t:.2f}s (limit {HEAL_LIMIT}s)")
            log(f"  one view of {len(self.members)} with one key {t:.2f}s after the fault's end"
                f"{' (OVER THE LIMIT)' if t > HEAL_LIMIT else ''}: view {info[0]['view_id']},"
                f" key {info[0]['key']}")

    # ------------------------------------------------------------------ check mode
    def check(self):
        self.sent = open(f"{self.work}/sent.log", "w")
        self.start_servers()
        self.write_configs()
        t_begin = time.time()
        self.start_members()
        t, info = self.wait_view([self.members], t_begin, limit=60)
        if t is None:
            self.problems.append(f"no one view of {len(self.members)} within 60 s: {info}")
            return self.finish(None)
        log(f"formed: one view of {len(self.members)} ({info[0]['view_id']}, key {info[0]['key']}) after {t:.2f}s")
        sender = threading.Thread(target=self.sender, daemon=True)
        sender.start()
        t_chaos = time.time()
        time.sleep(3)

        # Fault 1: namespace C cut off.
        c = [m for m in self.members if m.k == 2]
        ab = [m for m in self.members if m.k != 2]
        f = {"n": 1, "kind": "cut_ns", "what": f"namespace C (nats server nC, m{c[0].i}-m{c[-1].i}) cut off"}
        log(f"fault 1: {f['what']}")
        f["start"] = time.time()
        self.ipt(2, "-A", "INPUT", "!", "-i", "lo", "-j", "DROP")
        self.ipt(2, "-A", "OUTPUT", "!", "-o", "lo", "-j", "DROP")
        t, info = self.wait_view([ab, c], f["start"])
        if t is None:
            self.problems.append(f"fault 1: the sides did not settle into two views within {RESYNC_LIMIT:.0f}s: {info}")
            log("problem:", self.problems[-1])
        else:
            f["split_s"] = t
            log(f"  split in {t:.2f}s: A+B {info[0]['view_id']} key {info[0]['key']},"
                f" C {info[1]['view_id']} key {info[1]['key']}")
            if info[0]["key"] == info[1]["key"]:
                self.problems.append("fault 1: the two sides hold the same key")
        # The cluster splits too: nC closes its routes when their writes stall past the
        # servers' write_deadline (nA and nB may keep a dead route from nC longer: nothing
        # is written to it). nC's monitor answers on its own loopback, which stays up.
        while True:
            routes = self.num_routes(2)
            if routes == 0 or time.time() - f["start"] > 20:
                break
            time.sleep(0.2)
        f["routes_s"] = time.time() - f["start"]
        log(f"  nC has {routes} routes {f['routes_s']:.2f}s after the cut")
        if routes != 0:
            self.problems.append(f"fault 1: the cluster did not split in 20 s (nC still has {routes} routes)")
        time.sleep(2)
        self.ipt(2, "-F", "INPUT")
        self.ipt(2, "-F", "OUTPUT")
        f["end"] = time.time()
        log("  restored")
        self.heal(f, f["end"])
        # The cluster itself takes longer to be whole again: the side that was not cut
        # keeps its dead route from nC until that connection fails (nC's FIN, dropped
        # during the cut, is retransmitted with backoff, or a write stalls past the
        # deadline), and refuses nC's new route as a duplicate until then. The group
        # heals without it (over the routes that work); the server kill below needs the
        # whole cluster, or B's members would move to a server that C cannot reach.
        while True:
            routes = [self.num_routes(k) for k in range(3)]
            t = time.time() - f["end"]
            if routes == [2, 2, 2] or t > RESYNC_LIMIT:
                break
            time.sleep(0.2)
        f["cluster_whole_s"] = t
        log(f"  nats cluster whole again (2 routes at each server) {t:.2f}s after the restore")
        if routes != [2, 2, 2]:
            self.problems.append(f"fault 1: the nats cluster was not whole {RESYNC_LIMIT:.0f}s after the restore (routes {routes})")
        self.faults.append(f)
        time.sleep(3)

        # Fault 2: the nats-server of namespace B killed.
        b = [m for m in self.members if m.k == 1]
        f = {"n": 2, "kind": "kill_server", "what": f"nats-server nB killed (-9); its members m{b[0].i}-m{b[-1].i} reconnect"}
        log(f"fault 2: {f['what']}")
        f["start"] = f["end"] = t_kill = time.time()
        self.servers[1].send_signal(signal.SIGKILL)
        self.servers[1].wait()
        # The view should never break; one view with one key is required at once and
        # again HEAL_LIMIT s later, with no view event in between.
        self.heal(f, t_kill)
        time.sleep(max(0.0, t_kill + HEAL_LIMIT - time.time()))
        ok, info = self.one_view(self.members)
        if not ok:
            self.problems.append(f"fault 2: {HEAL_LIMIT}s after the kill not one view and one key: {info}")
            log("problem:", self.problems[-1])
        after = {}
        for m in self.members:
            for l in open(m.out, "rb"):
                try:
                    e = json.loads(l)
                except ValueError:
                    continue
                if e.get("t", 0) > t_kill and e.get("event") in ("view", "transport"):
                    after.setdefault(m.i, []).append(e)
        views = [(i, e) for i, es in after.items() for e in es if e["event"] == "view"]
        if views:
            self.problems.append(f"fault 2: {len(views)} view events after the server's kill, at"
                                 f" {', '.join(sorted({f'm{i}' for i, _ in views}))} (nobody vanished)")
        # Reconnected: a `connected` event after the kill (a `disconnected` alone is not).
        moved = [m.i for m in b if any(e["event"] == "transport" and e.get("what") == "connected"
                                       for e in after.get(m.i, []))]
        log(f"  members of B reconnected (a `connected` event after the kill): {len(moved)} of {len(b)};"
            f" view events after the kill: {len(views)}")
        if len(moved) != len(b):
            self.problems.append(f"fault 2: only {len(moved)} of B's {len(b)} members reconnected")
        others = [e["what"] for i, es in after.items() if i not in {m.i for m in b}
                  for e in es if e["event"] == "transport"]
        if others:
            log(f"  (connection events at members of A and C: {len(others)}, e.g. {others[0]!r})")
        self.faults.append(f)
        time.sleep(2)

        t_end_chaos = time.time()
        self.stop_sending.set()
        sender.join()
        t_stop = time.time()
        log(f"sending stopped: {self.sent_count['reliable']} reliable and"
            f" {self.sent_count['unreliable']} unreliable messages written, {self.unsent} not"
            f" written (a member's command fifo was full)")
        self.drain()
        return self.finish((t_chaos, t_end_chaos, t_stop))

    def drain(self):
        """Up to 15 s until every member reports the same reliable delivery count twice in a
        row with nothing pending."""
        end, last = time.time() + 15, None
        while time.time() < end:
            st = self.status_all(self.members)
            counts = tuple(sorted((i, s.get("delivered_reliable"), s.get("pending"),
                                   (s.get("view") or {}).get("view_id")) for i, s in st.items()))
            if counts == last and len({c[3] for c in counts}) == 1 and all(c[2] == 0 for c in counts):
                return
            last = counts
            time.sleep(0.5)
        log("note: the delivery counts did not settle within 15 s of the last send")

    def finish(self, times):
        self.kill_all()
        self.sent.close()
        run = {
            "seed": 0, "mode": "nats cluster", "minutes": round((times[1] - times[0]) / 60, 2) if times else 0,
            "members": [{"i": m.i, "id": m.id, "ns": self.nss[m.k], "addr": m.addr} for m in self.members],
            "incarnations": [{"member": m.i, "inc": 1, "out": os.path.basename(m.out), "killed": False}
                             for m in self.members],
            "faults": self.faults, "problems": self.problems, "times": times,
            "rss": {}, "long_lived": [],
            "rss_skip": "members share processes here; memory is group-chaos.sh's check",
            "sent": self.sent_count, "heal_limit": HEAL_LIMIT,
        }
        with open(f"{self.work}/run.json", "w") as f:
            json.dump(run, f)

    # ------------------------------------------------------------------ viewchange mode
    def viewchange(self):
        self.start_servers()
        self.write_configs()
        # Victims: spread over the namespaces, none of the contacts (the first two of each).
        pools = [[m for m in self.members if m.k == k][2:] for k in range(3)]
        victims = []
        for j in range(self.a.kills):
            pool = pools[j % 3]
            victims.append(pool[(j // 3) * max(1, len(pool) // (self.a.kills // 3 + 1)) % len(pool)])
        assert len(set(victims)) == len(victims), "victims collide"
        t_begin = time.time()
        self.start_members(singles=victims)
        t, info = self.wait_view([self.members], t_begin, limit=self.a.form_limit)
        if t is None:
            raise SystemExit(f"FAIL: no one view of {len(self.members)} within {self.a.form_limit}s: {info}")
        log(f"formed: one view of {len(self.members)} ({info[0]['view_id']}) after {t:.2f}s")
        time.sleep(2)
        for m in self.members:
            m.new_lines()  # skip what came before
        times, survivors, results = [], list(self.members), []
        cpu0, wall0 = self.cpu(), time.time()
        for v in victims:
            survivors = [m for m in survivors if m is not v]
            want = sorted(m.id for m in survivors)
            t0 = time.time()
            v.proc.send_signal(signal.SIGKILL)
            v.proc.wait()
            with v.lock:
                os.close(v.fd)
                v.fd = None
            done = {}
            while len(done) < len(survivors) and time.time() - t0 < 20:
                for m in survivors:
                    if m.i in done:
                        continue
                    for e in m.new_lines():
                        if e.get("event") == "view" and sorted(e["members"]) == want:
                            done[m.i] = e["t"]
                            break
                time.sleep(0.05)
            if len(done) < len(survivors):
                self.problems.append(f"kill of {v.name()}: {len(survivors) - len(done)} survivors"
                                     f" never installed the view without it within 20 s")
                log("problem:", self.problems[-1])
                break
            took = max(done.values()) - t0
            first = min(done.values()) - t0
            times.append(took)
            load = open("/proc/loadavg").read().split()[0]
            results.append({"victim": v.name(), "s": took, "first_s": first, "loadavg": load,
                            "members_before": len(survivors) + 1})
            log(f"  kill -9 {v.name()} (namespace {'ABC'[v.k]}): all {len(survivors)} survivors in the new"
                f" view after {took:.3f}s (first after {first:.3f}s; load average {load})")
            settled, info = self.wait_view([survivors], time.time(), limit=10)
            if settled is None:
                self.problems.append(f"after the kill of {v.name()}: no one view and one key: {info}")
            time.sleep(1)
        cpu1, wall = self.cpu(), time.time() - wall0
        members_cpu = sum(cpu1[0].get(p, 0) - c for p, c in cpu0[0].items())
        servers_cpu = sum(cpu1[1].get(p, 0) - c for p, c in cpu0[1].items())
        log(f"during the kills ({wall:.1f}s): the member processes used {members_cpu:.1f} CPU s"
            f" ({members_cpu / wall:.2f} cores; the victims' own processes not counted), the nats-servers"
            f" {servers_cpu:.1f} CPU s ({servers_cpu / wall:.2f} cores) (utime+stime, /proc/PID/stat);"
            f" load average {open('/proc/loadavg').read().split()[0]}")
        self.kill_all()
        out = {"members": len(self.members), "processes": len(self.procs), "kills": results,
               "problems": self.problems, "wall_s": wall, "members_cpu_s": members_cpu,
               "servers_cpu_s": servers_cpu}
        if times:
            s = sorted(times)
            p95 = s[math.ceil(0.95 * len(s)) - 1]
            out.update(median=statistics.median(s), p95=p95, max=s[-1], goal=GOAL_S, met=p95 <= GOAL_S)
            log(f"view change after kill -9 of one member, {len(s)} kills, {len(self.members)} members:"
                f" median {out['median']:.3f}s, p95 {p95:.3f}s, max {s[-1]:.3f}s:"
                f" goal p95 <= {GOAL_S}s {'MET' if out['met'] else 'NOT MET'}")
        with open(f"{self.work}/viewchange.json", "w") as f:
            json.dump(out, f)
        if self.problems or not times:
            raise SystemExit("FAIL: " + "; ".join(self.problems or ["no kill measured"]))

    def cpu(self):
        """CPU seconds (user + system) so far of the member processes and of the servers:
        ({pid: s}, {pid: s}). A process gone keeps its last reading."""
        tick = os.sysconf("SC_CLK_TCK")

        def read(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                return None
        last = getattr(self, "_cpu_last", ({}, {}))
        out = ({}, {})
        for k, procs in enumerate(([p for p, _ in self.procs], [s for s in self.servers if s])):
            for p in procs:
                v = read(p.pid)
                out[k][p.pid] = v if v is not None else last[k].get(p.pid, 0.0)
        self._cpu_last = out
        return out

    def kill_all(self):
        self.stop_sending.set()
        for p, _ in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        for m in self.members:
            with m.lock:
                if m.fd is not None:
                    os.close(m.fd)
                    m.fd = None
        for s in self.servers:
            if s is not None and s.poll() is None:
                s.send_signal(signal.SIGKILL)
                s.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    p.add_argument("--cohort", required=True)
    p.add_argument("--ns", required=True)
    p.add_argument("--addr", required=True)
    p.add_argument("--members", type=int, default=24)
    p.add_argument("--per-process", type=int, default=4)
    p.add_argument("--mode", choices=["check", "viewchange"], default="check")
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--form-limit", type=float, default=300)
    # The members' timers (the defaults are group-netns.sh's and group-chaos.sh's).
    p.add_argument("--heartbeat-ms", type=int, default=50)
    p.add_argument("--suspect-ms", type=int, default=600)
    p.add_argument("--flush-ms", type=int, default=300)
    a = p.parse_args()
    r = Run(a)
    try:
        if a.mode == "check":
            r.check()
        else:
            r.viewchange()
    finally:
        r.kill_all()
        for ns in r.nss:
            subprocess.run(["ip", "netns", "exec", ns, "iptables", "-F"], stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
