#!/usr/bin/env python3
"""Triton's system shared-memory extension on the agent's KServe front
doors, from the stock Python clients (docs/BENCHMARKS.md, "Python client").

One agent (`tensorwire serve --listen grpc://... --listen http://...`,
release build). Each *round* runs every row as its own fresh process, in an
order rotated by the round's number (as scripts/bench-python.py does):
`identity` with one UINT8 tensor of 1 KiB and of 16 MiB, through

- `tritonclient.grpc` and `tritonclient.http`, the tensor in and out
  through system shared memory (`tritonclient.utils.shared_memory`
  regions registered with the agent: the request and response carry no
  tensor bytes; the agent reads the input in place and copies the output
  into its region once), and
- the same clients with the tensor inline (gRPC `raw_input_contents`,
  HTTP binary tensor data), for comparison.

Each call is timed with `time.perf_counter_ns`; every row checks the
output's bytes once after its loop. Prints per row the p50 (median over
rounds [min–max]), the median p99, and the 16 MiB / 1 KiB ratio of p50s
per round; writes `results.json` and `table.md` to --out if given.

  .venv/bin/python scripts/bench-kserve-shm.py --bin target/release/tensorwire \\
      --rounds 10 -n 2000 --out docs/bench/kserve-shm
"""

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _bench_python():
    """scripts/bench-python.py as a module (its name has a dash)."""
    spec = importlib.util.spec_from_file_location("bench_python", os.path.join(HERE, "bench-python.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_bp = _bench_python()
run_json, write_results = _bp.run_json, _bp.write_results

SIZES = (1 << 10, 16 << 20)

PY_ROW = r"""
import json, sys, time, uuid, numpy as np
kind, addr, mode, size, n, warm = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
if kind == "grpc":
    import tritonclient.grpc as mod
else:
    import tritonclient.http as mod
c = mod.InferenceServerClient(addr)
data = (np.arange(size) % 251).astype(np.uint8)
inp = mod.InferInput("t", [size], "UINT8")
out = mod.InferRequestedOutput("t")
handles, names = [], []
if mode == "shm":
    import tritonclient.utils.shared_memory as shm
    tag = uuid.uuid4().hex[:10]
    for what in ("in", "out"):
        name, key = f"b{what}{tag}", f"/tw-bench-{what}-{tag}"
        handles.append(shm.create_shared_memory_region(name, key, size))
        c.register_system_shared_memory(name, key, size)
        names.append(name)
    shm.set_shared_memory_region(handles[0], [data])
    inp.set_shared_memory(names[0], size)
    out.set_shared_memory(names[1], size)
else:
    inp.set_data_from_numpy(data)
try:
    for _ in range(warm):
        r = c.infer("identity", [inp], outputs=[out])
    t = []
    clock = time.perf_counter_ns
    for _ in range(n):
        a = clock(); r = c.infer("identity", [inp], outputs=[out]); t.append(clock() - a)
    got = shm.get_contents_as_numpy(handles[1], np.uint8, [size]) if mode == "shm" else r.as_numpy("t")
    assert np.array_equal(got, data), "identity returned other bytes"
finally:
    for name in names:
        c.unregister_system_shared_memory(name)
    for h in handles:
        shm.destroy_shared_memory_region(h)
t.sort()
print(json.dumps({"p50_us": t[len(t) // 2] / 1e3, "p99_us": t[len(t) * 99 // 100] / 1e3,
                  "mean_us": sum(t) / len(t) / 1e3, "n": n}))
"""


def start_agent(binary):
    """`tensorwire serve` behind both KServe doors on free ports."""
    args = [binary, "serve", "--listen", "grpc://127.0.0.1:0", "--listen", "http://127.0.0.1:0"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    got = {}
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("listening on "):
            uri = line.split()[-1]
            scheme, _, addr = uri.partition("://")
            got[scheme] = addr
    if len(got) < 2:
        p.kill()
        sys.exit("the agent did not start")
    return p, got


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/tensorwire")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("-n", type=int, default=2000, help="calls per 1 KiB row (16 MiB rows: n/20, at least 20)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    try:
        import tritonclient.grpc  # noqa: F401
        import tritonclient.http  # noqa: F401
    except ImportError:
        sys.exit("tritonclient[grpc,http] is not installed")
    agent, addrs = start_agent(a.bin)
    tmp = os.path.join(tempfile.mkdtemp(prefix="twkshm"), "out.json")
    jobs = [(kind, mode, size) for kind in ("grpc", "http") for mode in ("shm", "inline") for size in SIZES]
    rows = {}
    try:
        for r in range(a.rounds):
            k = r % len(jobs)
            for kind, mode, size in jobs[k:] + jobs[:k]:
                n = a.n if size <= 1 << 10 else max(a.n // 20, 20)
                warm = max(n // 10, 5)
                res = run_json([a.python, "-c", PY_ROW, kind, addrs[kind], mode, str(size), str(n), str(warm)], tmp)
                rows.setdefault(f"{kind}/{mode}/{size}", []).append(res)
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)

    def med(key, field):
        v = [x[field] for x in rows[key]]
        return statistics.median(v), min(v), max(v)

    small, big = SIZES
    lines = [
        "| door | tensor in and out | 1 KiB p50 µs: median [min–max] | 1 KiB p99 | "
        "16 MiB p50 µs: median [min–max] | 16 MiB p99 | 16 MiB / 1 KiB p50, per round |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = {}
    for kind, door in (("grpc", "`tritonclient.grpc`"), ("http", "`tritonclient.http`")):
        for mode, how in (("shm", "system shared memory"), ("inline", "inline (in the message)")):
            s, b = f"{kind}/{mode}/{small}", f"{kind}/{mode}/{big}"
            sp, bp = med(s, "p50_us"), med(b, "p50_us")
            ratio = [y["p50_us"] / x["p50_us"] for x, y in zip(rows[s], rows[b])]
            q = statistics.median(ratio)
            summary[f"{kind}/{mode}"] = {"small_p50": sp, "big_p50": bp, "ratio": q}
            lines.append(
                f"| {door} | {how} | {sp[0]:.1f} [{sp[1]:.1f}–{sp[2]:.1f}] | {med(s, 'p99_us')[0]:.1f} | "
                f"{bp[0]:.1f} [{bp[1]:.1f}–{bp[2]:.1f}] | {med(b, 'p99_us')[0]:.1f} | "
                f"{q:.2f}× [{min(ratio):.2f}–{max(ratio):.2f}] |"
            )
    write_results(a.out, "\n".join(lines), {"rounds": a.rounds, "n": a.n, "runs": rows, "summary": summary})


if __name__ == "__main__":
    main()
