#!/usr/bin/env python3
"""The running part of scripts/hop-chaos.sh (never run by hand): starts the `cohort hop run`
processes of an ALPHA path A - R1 - R2 - B in the namespaces the script made, keeps messages
flowing both ways, runs a forger all the time, injects faults at random (kill -9 and restart
of relay R1 or endpoint B, a link of the path taken down and up), and checks:

* nothing forged is delivered: every message an endpoint delivers is one the other end was
  given to send, and none carries the forger's marker;
* after each fault ends, traffic is back in both directions within 10 s (each recovery time
  is printed: from the end of the fault to the first message delivered after it, each way);
* the resident memory (VmRSS) of the long-lived processes (endpoint A, relay R2) grows by
  under 10 % from the end of the warm-up to the end of the run.

Owns: the processes, the traffic, the faults, the measurements and the verdict of one chaos
run. Must not make or delete namespaces or links (the bash script does, and cleans up).

Usage: hop_chaos_q.py SETUP.json   (written by scripts/hop-chaos.sh)
Prints one line per fault, a summary and PASS or FAIL; exits 1 on failure.
"""

import base64
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

RECOVERY_LIMIT = 10.0  # seconds after a fault ends
RSS_LIMIT = 0.10  # growth after warm-up
SEND_EVERY = 0.1  # seconds between two messages, each way
WARM_UP = 20.0  # seconds before the first fault (and the memory baseline)


class Node:
    """One `cohort hop run` process (restartable), its stdin, and what it printed."""

    def __init__(self, name, ns, config, setup, endpoint):
        self.name, self.ns, self.config, self.setup = name, ns, config, setup
        self.endpoint = endpoint
        self.proc = None
        self.incarnation = 0
        self.lock = threading.Lock()
        self.received = []  # (time, bytes)
        self.events = []  # (time, event name, line)
        self.refused = 0  # send commands refused
        self.log = open(os.path.join(setup["work"], f"{name}.out"), "a")
        self.err = open(os.path.join(setup["work"], f"{name}.err"), "a")

    def start(self):
        self.incarnation += 1
        self.log.write(f"### start {self.incarnation} at {time.time():.3f}\n")
        self.log.flush()
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, self.setup["cohort"], "hop", "run",
             "--config", self.config],
            stdin=subprocess.PIPE if self.endpoint else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=self.err, cwd=self.setup["work"])
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()

    def _read(self, proc):
        for raw in proc.stdout:
            now = time.monotonic()
            line = raw.decode("utf-8", "replace").rstrip("\n")
            try:
                event = json.loads(line)
            except ValueError:
                event = {}
            name = event.get("event", "")
            with self.lock:
                if name == "received":
                    try:
                        data = base64.b64decode(event.get("data", ""))
                    except ValueError:
                        data = b"<bad base64>"
                    self.received.append((now, data))
                elif name == "error" and event.get("cmd") == "send":
                    self.refused += 1  # no open association yet (or any more)
                else:
                    self.events.append((now, name, line))
                    self.log.write(line[:400] + "\n")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def send(self, data):
        if not self.alive():
            return False
        line = json.dumps({"cmd": "send", "data": base64.b64encode(data).decode()}) + "\n"
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def rss_kib(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def first_received_after(self, t):
        with self.lock:
            for at, _ in self.received:
                if at >= t:
                    return at
        return None


def wait_for(what, limit, cond):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    print(f"FAIL: no {what} within {limit:.0f}s", file=sys.stderr)
    return False


def main():
    with open(sys.argv[1]) as f:
        setup = json.load(f)
    rng = random.Random(int(setup.get("seed", time.time())))
    work = setup["work"]
    duration = float(setup["minutes"]) * 60.0
    marker = setup["marker"].encode()
    nodes = {
        n["name"]: Node(n["name"], n["ns"], n["config"], setup, n["endpoint"])
        for n in setup["nodes"]
    }
    a, b, r1, r2 = nodes["a"], nodes["b"], nodes["r1"], nodes["r2"]
    failures = []
    sent = {"a": set(), "b": set()}
    stop = threading.Event()
    forge_stats = {"runs": 0, "sent": 0, "errors": 0}

    def sender():
        n = 0
        while not stop.is_set():
            for src in ("a", "b"):
                data = f"{src}-{n}-{'x' * 40}".encode()
                sent[src].add(data)  # added first: it may be delivered before send returns
                nodes[src].send(data)
            n += 1
            time.sleep(SEND_EVERY)

    def forger():
        # Forged and replayed packets for A's live pairs (read from A's control socket),
        # sent at R1 from namespace F, over and over.
        while not stop.is_set():
            try:
                out = subprocess.run(
                    ["ip", "netns", "exec", setup["forger_ns"], setup["cohort"], "hop",
                     "forge", "--to", setup["forge_to"], "--ctl",
                     os.path.join(work, "a.sock"), "--rounds", "4", "--marker",
                     setup["marker"]],
                    capture_output=True, timeout=20)
                forge_stats["runs"] += 1
                if out.returncode == 0:
                    forge_stats["sent"] += json.loads(out.stdout.decode()).get("sent", 0)
                else:
                    forge_stats["errors"] += 1
            except (subprocess.TimeoutExpired, ValueError, OSError):
                forge_stats["errors"] += 1
            stop.wait(0.3)

    rss = {"a": [], "r2": []}

    def sampler():
        while not stop.is_set():
            for name in rss:
                v = nodes[name].rss_kib()
                if v is not None:
                    rss[name].append((time.monotonic(), v))
            stop.wait(1.0)

    try:
        for n in (r1, r2):
            n.start()
        time.sleep(0.5)
        b.start()
        time.sleep(0.3)
        a.start()
        t0 = time.monotonic()
        threads = [threading.Thread(target=f, daemon=True) for f in (sender, forger, sampler)]
        for t in threads:
            t.start()
        if not wait_for("traffic both ways at the start", 30,
                        lambda: b.first_received_after(t0) and a.first_received_after(t0)):
            failures.append("no traffic at the start")
            raise SystemExit
        print(f"traffic flows both ways {time.monotonic() - t0:.1f}s after the start; "
              f"warm-up {WARM_UP:.0f}s, then faults for the rest of {duration:.0f}s")
        time.sleep(max(0.0, WARM_UP - (time.monotonic() - t0)))
        warm = time.monotonic()
        recoveries = []
        kinds = {}
        links = setup["links"]
        while time.monotonic() - t0 < duration - 15:
            kind = rng.choice(["restart r1", "restart b", "flap"])
            start = time.monotonic()
            if kind == "flap":
                ns, dev, label = rng.choice(links)
                down = rng.uniform(1.0, 8.0)
                kind = f"flap {label} {down:.1f}s"
                subprocess.run(["ip", "-n", ns, "link", "set", dev, "down"], check=True)
                time.sleep(down)
                subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
                for rns, net, gw in setup["routes"]:
                    subprocess.run(["ip", "-n", rns, "route", "replace", net, "via", gw],
                                   check=True)
            else:
                node = r1 if kind == "restart r1" else b
                node.kill()
                time.sleep(rng.uniform(0.2, 3.0))
                node.start()
            end = time.monotonic()
            short = " ".join(kind.split()[:2]) if kind.startswith("restart") else "flap"
            kinds[short] = kinds.get(short, 0) + 1
            ok = wait_for(f"traffic both ways after {kind}", RECOVERY_LIMIT + 5,
                          lambda: b.first_received_after(end) and a.first_received_after(end))
            ab = b.first_received_after(end)
            ba = a.first_received_after(end)
            rec_ab = (ab - end) if ab else None
            rec_ba = (ba - end) if ba else None
            worst = max(rec_ab or 999.0, rec_ba or 999.0) if ok else None
            fmt = lambda x: f"{x:.2f}s" if x is not None else "never"
            print(f"[{end - t0:6.1f}s] {kind:24s} (fault {end - start:4.1f}s): "
                  f"A->B back after {fmt(rec_ab)}, B->A after {fmt(rec_ba)}")
            sys.stdout.flush()
            if worst is None or worst > RECOVERY_LIMIT:
                failures.append(f"{kind}: traffic not back within {RECOVERY_LIMIT:.0f}s")
            recoveries.append((kind, worst))
            time.sleep(rng.uniform(2.0, 5.0))
        time.sleep(max(0.0, duration - (time.monotonic() - t0)))
    except SystemExit:
        recoveries, kinds, warm = [], {}, time.monotonic()
    finally:
        stop.set()
        time.sleep(1.5)  # the last messages in flight
        for n in nodes.values():
            n.stop()

    # Nothing forged, nothing from nowhere.
    delivered = 0
    for dst, src in (("b", "a"), ("a", "b")):
        for _, data in nodes[dst].received:
            delivered += 1
            if marker in data:
                failures.append(f"{dst} delivered a forged message: {data[:60]!r}")
            elif data not in sent[src]:
                failures.append(f"{dst} delivered a message {src} never sent: {data[:60]!r}")
    dup = sum(len(nodes[d].received) - len({x for _, x in nodes[d].received}) for d in "ab")
    if dup:
        failures.append(f"{dup} messages delivered twice")

    # Memory of the long-lived processes.
    mem_lines = []
    for name, samples in rss.items():
        after = [v for t, v in samples if t >= warm]
        if len(after) < 5:
            failures.append(f"too few memory samples of {name}")
            continue
        base = after[0]
        tail = sorted(after[-5:])[2]
        growth = (tail - base) / base
        quarters = [after[min(len(after) - 1, len(after) * q // 4)] for q in (1, 2, 3)]
        mem_lines.append(f"{name}: VmRSS {base} KiB after warm-up, {'/'.join(map(str, quarters))}"
                         f" KiB at 1/4, 1/2, 3/4 of the rest, {tail} KiB at the end "
                         f"(max {max(after)}), growth {growth * 100:+.1f}%")
        if growth >= RSS_LIMIT:
            failures.append(f"{name}'s memory grew {growth * 100:.1f}% after warm-up")

    times = [w for _, w in recoveries if w is not None and w < 999]
    print("---- summary")
    print(f"run: {duration:.0f}s; faults: {len(recoveries)} "
          f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})")
    if times:
        times.sort()
        print(f"recovery (worse direction): min {times[0]:.2f}s, median "
              f"{times[len(times) // 2]:.2f}s, max {times[-1]:.2f}s (limit {RECOVERY_LIMIT:.0f}s)")
    print(f"messages delivered: {delivered} (A->B {len(b.received)}, B->A {len(a.received)}); "
          f"sent: A {len(sent['a'])}, B {len(sent['b'])}")
    print(f"forger: {forge_stats['runs']} runs, {forge_stats['sent']} forged/replayed "
          f"packets at R1 ({forge_stats['errors']} runs failed); forged delivered: "
          f"{sum(1 for d in 'ab' for _, x in nodes[d].received if marker in x)}")
    print(f"restarts: r1 {r1.incarnation - 1}, b {b.incarnation - 1}; sends refused while no "
          f"association was open: A {a.refused}, B {b.refused}")
    for line in mem_lines:
        print(line)
    if forge_stats["sent"] == 0:
        failures.append("the forger sent nothing")
    if not recoveries:
        failures.append("no fault was injected")
    for f in failures[:20]:
        print(f"FAIL: {f}")
    if failures:
        sys.exit(1)
    print("PASS: hop-chaos")


if __name__ == "__main__":
    main()
