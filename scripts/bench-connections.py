#!/usr/bin/env python3
"""What idle and hostile connections cost an agent, and what a good client
feels meanwhile (docs/BENCHMARKS.md, "Idle and hostile connections").

Scenarios, each on a fresh `tensorwire serve --listen unix://...`:

  idle     N post-Hello sessions (`tensorwire hold --clients N`: Hello, one
           Ping, one empty request each, then silence), from the same uid;
           the agent's per-peer and agent-wide limits are raised to N+100.
  idle shm 1000 shm sessions (each holds 3 fds in the agent), good client
           over shm.
  hostile  3000 bare connections that never say Hello (`hold --no-hello
           --keep-going`) from uid 65534 (nobody; needs root), against an
           agent with default limits and a 600 s handshake deadline so they
           stay for the whole measurement.

For each: the agent's threads, open fds and RSS (/proc) quiet and under the
flood, and the good client's empty-request round trip (`tensorwire ping
--connect unix://... --json`, p50/p99) quiet vs during the flood. Quiet and
flooded measurements alternate in rotating order over --rounds rounds (the
flood is started and stopped each round), so machine drift lands on both.
--bin-old runs the same scenarios with another build's agent (e.g. the
previous commit; clients are always --bin's), for a before/after, and adds
a hot-path A/B: the empty request over unix, tcp and shm, and over unix with
the agent's socket spin off (`--socket-spin-us 0`: every request then waits
in the agent's epoll set, the worst case for parking), each build's agent
started afresh per round, builds in rotating order. Nothing is pinned: this
is the placement a user gets.

  python3 scripts/bench-connections.py --bin target/release/tensorwire \\
      --sessions 10000 --rounds 3 --out docs/bench/connections
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def proc_stats(pid):
    """(threads, fds, rss_kib) of process pid."""
    threads = rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return threads, fds, rss


class Agent:
    def __init__(self, binary, args, workdir):
        self.sock = os.path.join(workdir, "s.sock")
        self.uri = "unix://" + self.sock
        self.err = open(os.path.join(workdir, "agent.err"), "w")
        self.p = subprocess.Popen(
            [binary, "serve", "--listen", self.uri] + args,
            stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.uris = []
        for _ in range(1 + args.count("--listen")):
            line = self.p.stdout.readline()
            if not line.startswith("listening on"):
                raise SystemExit(f"agent did not start: {line!r}")
            self.uris.append(line.split()[-1])
        os.chmod(workdir, 0o755)
        os.chmod(self.sock, 0o777)

    def stats(self):
        return proc_stats(self.p.pid)

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.err.close()


def hold(binary, uri, args, as_nobody=False):
    """Starts `tensorwire hold`; returns (process, held, refused) once it holds."""
    kw = {}
    if as_nobody:
        kw = {"user": 65534, "group": 65534}
    p = subprocess.Popen([binary, "hold", "--connect", uri, "--seconds", "3600"] + args,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    line = p.stdout.readline()
    if not line.startswith("holding"):
        p.kill()
        raise RuntimeError(f"hold failed: {line!r} {p.stderr.read()[:500]!r}")
    words = line.split()
    return p, int(words[1]), int(words[3])


def ping(binary, uri, n):
    """The good client: n empty requests; (p50, p99) in µs, or None if it failed."""
    r = subprocess.run([binary, "ping", "--connect", uri, "-n", str(n), "--json"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr else "failed"
    v = json.loads(r.stdout)
    return (v["p50_us"], v["p99_us"]), None


def stop_hold(p):
    p.kill()
    p.wait()


def wait_fds(agent, want, limit=30.0):
    """Waits until the agent's fd count falls back to `want` (the flood left)."""
    t = time.time()
    while time.time() - t < limit:
        if agent.stats()[1] <= want:
            return
        time.sleep(0.2)


def scenario(binary, client, name, agent_args, flood_args, as_nobody, rounds, n, on=0):
    """Quiet vs flooded rounds; the flood and the good client use the
    agent's endpoint number `on` (0 = its unix socket)."""
    rows = {"quiet": [], "flood": []}
    usage = {"quiet": [], "flood": []}
    failures = []
    with tempfile.TemporaryDirectory() as d:
        agent = Agent(binary, agent_args, d)
        try:
            # Warm the agent's path once.
            uri = agent.uris[on]
            ping(client, uri, 2000)
            base = agent.stats()
            for r in range(rounds):
                order = ["quiet", "flood"] if r % 2 == 0 else ["flood", "quiet"]
                for what in order:
                    if what == "quiet":
                        usage["quiet"].append(agent.stats())
                        got, err = ping(client, uri, n)
                    else:
                        try:
                            h, held, refused = hold(client, uri, flood_args, as_nobody)
                        except RuntimeError as e:
                            failures.append(f"flood round {r}: {e}")
                            wait_fds(agent, base[1] + 2)
                            continue
                        time.sleep(1.0)  # let sessions settle (and park)
                        usage["flood"].append(agent.stats() + (held, refused))
                        got, err = ping(client, uri, n)
                        stop_hold(h)
                        wait_fds(agent, base[1] + 2)
                    if got is None:
                        failures.append(f"{what} round {r}: {err}")
                    else:
                        rows[what].append(got)
        finally:
            agent.stop()
    return {"scenario": name, "bin": binary, "rows": rows, "usage": usage,
            "base": base, "failures": failures}


def hotpath(builds, client, rounds, n):
    """Empty request p50/p99 per (build, path), builds in rotating order."""
    paths = ["unix", "tcp", "shm", "unix, agent spin 0"]
    got = {(b, p): [] for b in builds for p in paths}
    for r in range(rounds):
        order = builds[r % len(builds):] + builds[:r % len(builds)]
        for b in order:
            for spin0 in (False, True):
                with tempfile.TemporaryDirectory() as d:
                    shm = f"shm://connbench{os.getpid()}r{r}{int(spin0)}"
                    args = ["--listen", "tcp://127.0.0.1:0", "--listen", shm]
                    if spin0:
                        args += ["--socket-spin-us", "0"]
                    agent = Agent(b, args, d)
                    try:
                        targets = ([("unix, agent spin 0", agent.uris[0])] if spin0 else
                                   list(zip(["unix", "tcp", "shm"], agent.uris)))
                        for path, uri in targets:
                            ping(client, uri, 2000)
                            res, err = ping(client, uri, n)
                            if res:
                                got[(b, path)].append(res)
                    finally:
                        agent.stop()
    print("\n== hot path: empty request, nothing pinned (median of rounds [min-max], µs)")
    label = {builds[0]: "new"}
    if len(builds) > 1:
        label[builds[1]] = "old"
    for p in paths:
        cells = []
        for b in builds:
            p50 = [x[0] for x in got[(b, p)]]
            p99 = [x[1] for x in got[(b, p)]]
            if p50:
                cells.append(f"{label[b]}: p50 {med(p50):.2f} [{min(p50):.2f}-{max(p50):.2f}] "
                             f"p99 {med(p99):.2f}")
        ratio = ""
        if len(builds) == 2 and got[(builds[0], p)] and got[(builds[1], p)]:
            new50 = med([x[0] for x in got[(builds[0], p)]])
            old50 = med([x[0] for x in got[(builds[1], p)]])
            ratio = f"  new/old p50 {new50 / old50:.2f}x"
        print(f"  {p:20} " + " | ".join(cells) + ratio)
    return {f"{b}|{p}": v for (b, p), v in got.items()}


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def report(res, sessions):
    print(f"\n== {res['scenario']} ({res['bin']})")
    base = res["base"]
    print(f"agent quiet: threads {base[0]}, fds {base[1]}, RSS {base[2] / 1024:.1f} MiB")
    for u in res["usage"]["flood"]:
        th, fds, rss, held, refused = u
        print(f"  under flood: held {held} refused {refused}: threads {th}, fds {fds}, "
              f"RSS {rss / 1024:.1f} MiB (+{(rss - base[2]) / max(held, 1):.2f} KiB per held)")
    for what in ("quiet", "flood"):
        rs = res["rows"][what]
        if rs:
            p50 = [r[0] for r in rs]
            p99 = [r[1] for r in rs]
            print(f"  good client {what:5}: p50 {med(p50):.2f} µs [{min(p50):.2f}-{max(p50):.2f}]  "
                  f"p99 {med(p99):.2f} µs [{min(p99):.2f}-{max(p99):.2f}]  ({len(rs)} rounds)")
    q, f = res["rows"]["quiet"], res["rows"]["flood"]
    if q and f:
        print(f"  flood / quiet: p50 {med([r[0] for r in f]) / med([r[0] for r in q]):.2f}x  "
              f"p99 {med([r[1] for r in f]) / med([r[1] for r in q]):.2f}x")
    for fl in res["failures"]:
        print(f"  FAILED: {fl}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="target/release/tensorwire")
    ap.add_argument("--bin-old", help="another build to run the same scenarios on")
    ap.add_argument("--sessions", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--out", help="directory for results.json")
    ap.add_argument("--scenarios", default="hot,idle,shm,hostile",
                    help="which to run: hot (needs --bin-old), idle, shm, hostile")
    a = ap.parse_args()
    want = set(a.scenarios.split(","))
    if not want <= {"hot", "idle", "shm", "hostile"}:
        raise SystemExit(f"unknown scenario in --scenarios {a.scenarios}")
    if not (1 <= a.sessions <= 15000 and 1 <= a.rounds <= 20 and 100 <= a.iterations <= 10**6):
        raise SystemExit("--sessions 1..=15000, --rounds 1..=20, --iterations 100..=1000000")
    root = os.geteuid() == 0
    os.environ.setdefault("TENSORWIRE_SHM_DIR", tempfile.mkdtemp(prefix="connbench-"))
    results = []
    hot = None
    if a.bin_old and "hot" in want:
        hot = hotpath([a.bin, a.bin_old], a.bin, a.rounds * 2, a.iterations)
    for binary in [a.bin] + ([a.bin_old] if a.bin_old else []):
        new = binary == a.bin
        # Before one descriptor per connection, an agent needed two: at most
        # 9000 sessions fit this machine's 20000.
        sessions = a.sessions if new else min(a.sessions, 9000)
        limit = str(sessions + 100)
        idle_args = ["--max-connections", limit]
        if new:
            idle_args += ["--max-connections-per-peer", limit]
        if "idle" in want:
            results.append(scenario(binary, a.bin,
                                    f"idle: {sessions} post-Hello sessions, same uid",
                                    idle_args, ["--clients", str(sessions)], False,
                                    a.rounds, a.iterations))
            report(results[-1], sessions)
        shm_args = ["--listen", f"shm://connidle{os.getpid()}{int(new)}"]
        if "shm" in want:
            results.append(scenario(binary, a.bin, "idle shm: 1000 sessions, same uid",
                                    shm_args, ["--clients", "1000"], False,
                                    a.rounds, a.iterations, on=1))
            report(results[-1], 1000)
        if "hostile" not in want:
            pass
        elif root:
            hostile_args = ["--handshake-timeout-ms", "600000"] if new else []
            results.append(scenario(binary, a.bin, "hostile: 3000 bare connections from uid 65534",
                                    hostile_args,
                                    ["--clients", "3000", "--no-hello", "--keep-going"],
                                    True, a.rounds, a.iterations))
            report(results[-1], 3000)
        else:
            print("hostile scenario skipped: it runs the flood as uid 65534, which needs root")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump({"command": " ".join(sys.argv), "results": results, "hotpath": hot},
                      f, indent=1)


if __name__ == "__main__":
    main()
