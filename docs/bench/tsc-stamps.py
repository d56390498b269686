#!/usr/bin/env python3
"""Joins the TSC stamp tables of docs/bench/tsc-stamps.patch (client and agent)
into a per-stage split of the empty shm round trip (docs/BENCHMARKS.md,
"Where the empty shm round trip goes").

    python3 docs/bench/tsc-stamps.py /tmp/stamps.<pid1> /tmp/stamps.<pid2> [TSC_MHZ]

The two files may come in either order (the client's is the one with point 7).
TSC_MHZ defaults to /proc/cpuinfo's "cpu MHz" (the TSC rate on the VMs we
measure on; `dmesg | grep tsc` gives it exactly). Requests 50 000..149 000 are
used (after warm-up, before the dump). Needs numpy.
"""
import sys

import numpy as np


def load(path):
    return np.fromfile(path, dtype="<u8").reshape(-1, 8).astype(np.int64)


def cpu_mhz():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1])
    raise SystemExit("no 'cpu MHz' in /proc/cpuinfo: pass TSC_MHZ")


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    a, b = load(sys.argv[1]), load(sys.argv[2])
    client, agent = (a, b) if (a[:, 7] > 0).sum() > (b[:, 7] > 0).sum() else (b, a)
    per_ns = (float(sys.argv[3]) if len(sys.argv) > 3 else cpu_mhz()) / 1000.0
    C, A = client[50_000:149_000], agent[50_000:149_000]
    ok = (C[:, 0] > 0) & (C[:, 7] > 0) & (A[:, 2] > 0) & (A[:, 5] > 0)
    C, A = C[ok], A[ok]
    if len(C) == 0:
        raise SystemExit("no request has every stamp: were both tables dumped?")
    # Model requests stamp the agent's `request()` (point 3); Ping/Pong does not.
    model = (A[:, 3] > 0).mean() > 0.5

    def row(name, d):
        d = d / per_ns
        p10, p50, p90 = np.percentile(d, [10, 50, 90])
        print(f"{name:38s} {p10:7.0f} {p50:7.0f} {p90:7.0f}")

    print(f"{len(C)} round trips ({'model requests' if model else 'Ping/Pong'}), ns:")
    print(f"{'stage':38s} {'p10':>7s} {'p50':>7s} {'p90':>7s}")
    row("client: start -> request published", C[:, 1] - C[:, 0])
    row("request published -> agent saw it", A[:, 2] - C[:, 1])
    if model:
        row("agent: saw -> request() starts", A[:, 3] - A[:, 2])
        row("agent: prepare (decode, model, checks)", A[:, 0] - A[:, 3])
        row("agent: model queue + engine run", A[:, 1] - A[:, 0])
        row("agent: outputs checked, response built", A[:, 6] - A[:, 1])
        row("agent: counters, output blocks held", A[:, 7] - A[:, 6])
        row("agent: -> response published", A[:, 5] - A[:, 7])
    else:
        row("agent: saw -> Pong published", A[:, 5] - A[:, 2])
    row("response published -> client saw it", C[:, 6] - A[:, 5])
    row("client: saw -> call returns", C[:, 7] - C[:, 6])
    row("round trip (client start -> return)", C[:, 7] - C[:, 0])
    # Positive: the client was already polling when the response came.
    row("client polling before the response", A[:, 5] - C[:, 3])


if __name__ == "__main__":
    main()
