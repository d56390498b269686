#!/usr/bin/env python3
"""What a setting of the agent costs a native request: two agents side by
side, same build, different `serve` arguments (docs/BENCHMARKS.md,
"Statistics and metrics" and "Tenants").

By default: one with request timing on (the default: every request's
stages are timed for the statistics and the Prometheus histograms) and
one started with `--no-request-timing` (counts only). `--agent
'NAME=ARGS'` twice compares any two settings instead (the first is the
one measured, the second the baseline). Each round runs `tensorwire ping`
(empty `identity` requests, one client) against each agent over shm and
unix, in an order rotated by the round's number so machine drift cancels.
Prints, per transport and setting, the p50 (median over rounds [min-max])
and the median p99, and the per-round ratio and difference of p50s
first / second.

  python3 scripts/bench-request-timing.py --bin target/release/tensorwire --rounds 10 -n 20000
  python3 scripts/bench-request-timing.py --bin target/release/tensorwire --rounds 10 -n 20000 \
      --agent 'tenants=--tenants /tmp/tenants.toml' --agent 'open='
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
    ap.add_argument(
        "--agent",
        action="append",
        metavar="NAME=ARGS",
        help="an agent to compare: its name and its serve arguments (give two)",
    )
    a = ap.parse_args()
    specs = a.agent or ["timing on=", "timing off=--no-request-timing"]
    if len(specs) != 2 or any("=" not in x for x in specs):
        raise SystemExit("--agent NAME=ARGS: give exactly two")
    tmp = tempfile.mkdtemp(prefix="tw-timing-")
    agents = {}
    for i, spec in enumerate(specs):
        name, args = spec.split("=", 1)
        agents[name] = start(a.bin, tmp, f"a{i}", args.split())
    first, second = list(agents)
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
    print(
        f"| transport | agent | p50 (median [min–max]) | p99 (median) "
        f"| p50 {first} / {second} (median [min–max]) | p50 {first} − {second}, ns (median [min–max]) |"
    )
    print("|---|---|---|---|---|---|")
    for t in ("shm", "unix"):
        for s in agents:
            p50 = [x[0] for x in res[(t, s)]]
            p99 = [x[1] for x in res[(t, s)]]
            ratio = diff = ""
            if s == first:
                pairs = list(zip(res[(t, s)], res[(t, second)]))
                r = [x / y for (x, _), (y, _) in pairs]
                d = [(x - y) * 1000 for (x, _), (y, _) in pairs]
                ratio = f"{statistics.median(r):.3f} [{min(r):.3f}–{max(r):.3f}]"
                diff = f"{statistics.median(d):.0f} [{min(d):.0f}–{max(d):.0f}]"
            print(
                f"| {t} | {s} | {statistics.median(p50):.2f} [{min(p50):.2f}–{max(p50):.2f}] "
                f"| {statistics.median(p99):.2f} | {ratio} | {diff} |"
            )


if __name__ == "__main__":
    main()
