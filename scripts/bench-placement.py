#!/usr/bin/env python3
"""Where the scheduler puts things, and what it costs: the empty request over
shm, unix and tcp on fresh agent + client starts with nothing pinned, next to
the raw floors and the pinned figures (docs/BENCHMARKS.md, "Placement").

One *start* is, for each build (--bin, and --bin-old if given), transport
and client count: a fresh `tensorwire serve --listen URI` and N fresh
`tensorwire ping --connect URI --duration D` processes at once, as a user
would start them (each client's p50 and p99; the aggregate requests/s is
the sum of each client's 1 / mean round trip). Unpinned for 1, 2 and 4 clients; pinned (agent
`taskset -c 1`, client `taskset -c 0`) for 1 client. Then the raw floors,
polling as tensorwire's transports do (`tensorwire ping --raw K --spin-us
200`: both ends poll 200 µs before they block; shm always polls), unpinned
and pinned (`taskset -c 0` + `--peer-cpu 1`). Every measurement of a start
runs in an order rotated by the start's number, so machine drift spreads
over all of them. Clients are always --bin's (--bin-old compares agents).

  python3 scripts/bench-placement.py --bin target/release/tensorwire \\
      [--bin-old /tmp/old/tensorwire] --starts 10 --out docs/bench/placement
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TRANSPORTS = ["shm", "unix", "tcp"]


def uri_for(transport, workdir, start):
    if transport == "shm":
        return f"shm://twplace{os.getpid()}-{start}"
    if transport == "unix":
        return "unix://" + os.path.join(workdir, "a.sock")
    return "tcp://127.0.0.1:0"


def serve(binary, uri, pin, err):
    cmd = ([] if pin is None else ["taskset", "-c", str(pin)]) + [
        binary, "serve", "--listen", uri]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    line = p.stdout.readline()
    if not line.startswith("listening on"):
        p.kill()
        raise SystemExit(f"agent did not start ({' '.join(cmd)}): {line!r}")
    return p, line.split()[-1]


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def ping_clients(binary, uri, clients, duration, pin):
    """`clients` fresh `tensorwire ping` processes at once, each timing
    round trips for `duration` seconds: the median and the worst of their
    p50s, the median p99, and the aggregate requests/s (the sum of each
    client's 1 / mean round trip)."""
    cmd = ([] if pin is None else ["taskset", "-c", str(pin)]) + [
        binary, "ping", "--connect", uri, "-n", "100000000",
        "--duration", str(duration), "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for _ in range(clients)]
    rs = []
    for p in procs:
        out, err = p.communicate(timeout=duration * 10 + 60)
        if p.returncode != 0:
            raise SystemExit(f"ping failed: {err.strip()}")
        rs.append(json.loads(out))
    p50s = [r["p50_us"] for r in rs]
    return {"p50_us": statistics.median(p50s), "worst_p50_us": max(p50s),
            "p99_us": statistics.median([r["p99_us"] for r in rs]),
            "rps": sum(1e6 / r["mean_us"] for r in rs),
            "per_client_rps": [1e6 / r["mean_us"] for r in rs]}


def raw_floor(binary, kind, pinned, n):
    cmd = (["taskset", "-c", "0"] if pinned else []) + [
        binary, "ping", "--raw", kind, "--spin-us", "200", "-n", str(n),
        "--json"] + (["--peer-cpu", "1"] if pinned else [])
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                  text=True, timeout=120).stdout)
    return {"p50_us": r["p50_us"], "worst_p50_us": r["p50_us"],
            "p99_us": r["p99_us"], "rps": 1e6 / r["mean_us"]}


def measurements(builds, clients, transports):
    """The labels (build, transport, clients, placement) of one start."""
    out = []
    for build in builds:
        for t in transports:
            out += [(build, t, c, "unpinned") for c in clients]
            out.append((build, t, 1, "pinned"))
    for t in transports:
        out += [("raw", t, 1, "unpinned"), ("raw", t, 1, "pinned")]
    return out


def run_one(label, bins, duration, n, start):
    build, transport, clients, placement = label
    pinned = placement == "pinned"
    if build == "raw":
        return raw_floor(bins["new"], transport, pinned, n)
    with tempfile.TemporaryDirectory() as d:
        err_path = os.path.join(d, "agent.err")
        with open(err_path, "w") as err:
            agent, uri = serve(bins[build], uri_for(transport, d, start),
                               1 if pinned else None, err)
            try:
                time.sleep(0.2)
                r = ping_clients(bins["new"], uri, clients, duration,
                                 0 if pinned else None)
            finally:
                stop(agent)
        with open(err_path) as f:
            m = re.search(r"moved off a client's CPU (\d+) times", f.read())
        # The previous build does not report it.
        r["agent_moves"] = int(m.group(1)) if m else None
        return r


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def report(results, builds, clients):
    by = {}
    for r in results:
        by.setdefault(tuple(r["label"]), []).append(r)

    def p50s(label):
        return [r["p50_us"] for r in by.get(label, [])]

    lines = ["| build | transport | clients | placement | p50 µs: median [min–max] over starts | worst start | p99 µs median | requests/s median | vs pinned | vs raw floor, unpinned |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for build in builds + ["raw"]:
        for t in TRANSPORTS:
            for c in clients:
                for placement in ["unpinned", "pinned"]:
                    label = (build, t, c, placement)
                    rs = by.get(label)
                    if not rs:
                        continue
                    p = p50s(label)
                    pin = med(p50s((build, t, 1, "pinned")))
                    raw = med(p50s(("raw", t, 1, "unpinned")))
                    vs_pin = f"{med(p) / pin:.2f}×" if build != "raw" and c == 1 and placement == "unpinned" else ""
                    vs_raw = f"{med(p) / raw:.2f}×" if build != "raw" and c == 1 and placement == "unpinned" else ""
                    lines.append(
                        f"| {build} | {t} | {c} | {placement} | "
                        f"{med(p):.2f} [{min(p):.2f}–{max(p):.2f}] | "
                        f"{max(r['worst_p50_us'] for r in rs):.2f} | "
                        f"{med([r['p99_us'] for r in rs]):.2f} | "
                        f"{med([r['rps'] for r in rs]):,.0f} | {vs_pin} | {vs_raw} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--bin-old")
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--clients", default="1,2,4")
    ap.add_argument("--transports", default="shm,unix,tcp")
    ap.add_argument("--duration", type=float, default=1.0,
                    help="seconds each agent measurement runs")
    ap.add_argument("--raw-n", type=int, default=20000,
                    help="round trips of each raw floor")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.starts < 1 or a.duration <= 0 or a.raw_n < 1:
        raise SystemExit("--starts, --duration and --raw-n must be positive")
    clients = [int(c) for c in a.clients.split(",")]
    if any(c < 1 or c > 64 for c in clients):
        raise SystemExit("--clients: each between 1 and 64")
    bins = {"new": os.path.abspath(a.bin)}
    if a.bin_old:
        bins["old"] = os.path.abspath(a.bin_old)
    for b in bins.values():
        if not os.access(b, os.X_OK):
            raise SystemExit(f"{b}: not an executable")
    builds = list(bins)
    transports = a.transports.split(",")
    if any(t not in TRANSPORTS for t in transports):
        raise SystemExit(f"--transports: each one of {TRANSPORTS}")
    plan = measurements(builds, clients, transports)
    results = []
    t0 = time.time()
    for s in range(a.starts):
        k = s % len(plan)
        order = plan[k:] + plan[:k]
        for label in order:
            r = run_one(label, bins, a.duration, a.raw_n, s)
            r["label"] = list(label)
            r["start"] = s
            results.append(r)
        print(f"start {s + 1}/{a.starts} done ({time.time() - t0:.0f} s)",
              file=sys.stderr)
    table = report(results, builds, clients)
    print(table)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump({"command": " ".join(sys.argv), "started_unix": t0,
                       "elapsed_s": time.time() - t0, "results": results},
                      f, indent=1)
        with open(os.path.join(a.out, "table.md"), "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
