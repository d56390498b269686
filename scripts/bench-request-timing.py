#!/usr/bin/env python3
"""What the per-model statistics cost a native request (docs/BENCHMARKS.md,
"Statistics and metrics").

Two agents side by side, same build: one with request timing on (the
default: every request's stages are timed for the statistics and the
Prometheus histograms) and one started with `--no-request-timing` (counts
only). Each round runs `tensorwire ping` (empty `identity` requests, one
client) against each agent over shm and unix, in an order rotated by the
round's number so machine drift cancels. Prints, per transport and
setting, the p50 (median over rounds [min-max]) and the median p99, and
the per-round ratio of p50s timing-on / timing-off.

  python3 scripts/bench-request-timing.py --bin target/release/tensorwire --rounds 10 -n 20000
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import uuid


def start(bin_path, tmp, tag, extra):
    uris = {
        "shm": f"shm://bench-timing-{tag}-{uuid.uuid4().hex[:8]}",
        "unix": f"unix://{tmp}/{tag}.sock",
    }
    args = [bin_path, "serve", "--grace", "1", "--listen", uris["shm"], "--listen", uris["unix"], *extra]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen = 0
    while seen < 2:
        line = p.stdout.readline()
        if not line:
            raise SystemExit(f"{args} exited")
        seen += line.startswith("listening on ")
    return p, uris


def ping(bin_path, uri, n):
    out = subprocess.run(
        [bin_path, "ping", "--connect", uri, "-n", str(n), "--warmup", "2000", "--json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    s = json.loads(out)
    return s["p50_us"], s["p99_us"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/tensorwire")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("-n", type=int, default=20000)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tw-timing-")
    agents = {
        "timing on": start(a.bin, tmp, "on", []),
        "timing off": start(a.bin, tmp, "off", ["--no-request-timing"]),
    }
    rows = [(t, s) for t in ("shm", "unix") for s in agents]
    res = {r: [] for r in rows}
    try:
        for rnd in range(a.rounds):
            k = rnd % len(rows)
            for t, s in rows[k:] + rows[:k]:
                res[(t, s)].append(ping(a.bin, agents[s][1][t], a.n))
    finally:
        for p, _ in agents.values():
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=20)
    print(f"{a.rounds} rounds x {a.n} empty identity round trips, one client; µs")
    print("| transport | request timing | p50 (median [min–max]) | p99 (median) | p50 on/off (median [min–max]) |")
    print("|---|---|---|---|---|")
    for t in ("shm", "unix"):
        for s in agents:
            p50 = [x[0] for x in res[(t, s)]]
            p99 = [x[1] for x in res[(t, s)]]
            ratio = ""
            if s == "timing on":
                r = [on / off for (on, _), (off, _) in zip(res[(t, s)], res[(t, "timing off")])]
                ratio = f"{statistics.median(r):.3f} [{min(r):.3f}–{max(r):.3f}]"
            print(
                f"| {t} | {s.split()[1]} | {statistics.median(p50):.2f} [{min(p50):.2f}–{max(p50):.2f}] "
                f"| {statistics.median(p99):.2f} | {ratio} |"
            )


if __name__ == "__main__":
    main()
