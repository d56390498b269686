#!/usr/bin/env python3
"""Triton's system shared-memory extension on the agent's KServe front
doors, from the stock Python clients (docs/BENCHMARKS.md, "Triton system
shared memory").

Two agents (`tensorwire serve --listen grpc://... --listen http://...`,
release build), one per data mover the agent may copy an output with:
`--mover memcpy` (what an uncalibrated machine uses) and `--mover nt`
(streaming stores, what `tensorwire calibrate` picks here for 16 MiB).
Each *round* runs every row as its own fresh process, in an order rotated
by the round's number (as scripts/bench-python.py does): `identity` with
one UINT8 tensor through

- `tritonclient.grpc` and `tritonclient.http`, the tensor in and out
  through system shared memory (`tritonclient.utils.shared_memory`
  regions registered with the agent: the request and response carry no
  tensor bytes; the agent reads the input in place and copies the output
  into its region once, the copy identity must make), 1 KiB and 16 MiB;
- the same at 1 KiB *after a sweep*: before each call (untimed) the
  client copies 16 MiB between two buffers of its own, so the call starts
  from the cache a 16 MiB call starts from (the previous call's copy
  moved 32 MiB through this machine's 32 MiB last-level cache, evicting
  the client's, the door's and the agent's working sets);
- the same clients with the tensor inline (gRPC `raw_input_contents`,
  HTTP binary tensor data), for comparison (memcpy agent only);
- a floor, not a request: a copy of the size in a Python process of its
  own (`np.copyto` between two shared-memory regions).

Each call is timed with `time.perf_counter_ns`; every row checks the
output's bytes once after its loop. The agent times its own copy: the
model's `compute_output` statistic (`get_inference_statistics`, read
before and after the row's calls) holds it, so its mean per call is the
copy the agent made for that row. The *tax* of a shm row is its p50
minus that mean: what the call costs beyond the copy. Printed per row:
p50 (median over rounds [min–max]) and median p99; per shm door and
mover: the agent's copy, the taxes, and per round the ratios 16 MiB tax /
1 KiB tax (warm) and / 1 KiB tax after a sweep (the same cache state).
Writes `results.json` and `table.md` to --out if given.

  .venv/bin/python scripts/bench-kserve-shm.py --bin target/release/tensorwire \\
      --rounds 5 -n 300 --out docs/bench/kserve-shm
"""

import argparse
import importlib.util
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
SWEEP = 16 << 20
MOVERS = ("memcpy", "nt")

PY_ROW = r"""
import json, sys, time, uuid, numpy as np
kind, addr, mode, size, n, warm = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
sweep = int(sys.argv[7])
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


def compute_output():
    # The model's compute_output statistic: (count, ns) so far.
    s = c.get_inference_statistics("identity", as_json=True) if kind == "grpc" else c.get_inference_statistics("identity")
    s = s["model_stats"][0]["inference_stats"]["compute_output"]
    return int(s["count"]), int(s["ns"])


swept = (np.ones(sweep, np.uint8), np.zeros(sweep, np.uint8)) if sweep else None
got = None
try:
    for _ in range(warm):
        r = c.infer("identity", [inp], outputs=[out])
    t = []
    clock = time.perf_counter_ns
    before = compute_output()
    for _ in range(n):
        if swept:
            np.copyto(swept[1], swept[0])
        a = clock(); r = c.infer("identity", [inp], outputs=[out]); t.append(clock() - a)
    after = compute_output()
    if mode == "shm":
        got = shm.get_contents_as_numpy(handles[1], np.uint8, [size])
    else:
        got = r.as_numpy("t")
    assert np.array_equal(got, data), "identity returned other bytes"
finally:
    got = None  # no view may outlive its region
    for name in names:
        c.unregister_system_shared_memory(name)
    for h in handles:
        shm.destroy_shared_memory_region(h)
t.sort()
calls = after[0] - before[0]
assert calls == n, f"{calls} calls counted by the agent, {n} made"
agent_us = (after[1] - before[1]) / calls / 1e3
p50 = t[len(t) // 2] / 1e3
print(json.dumps({"p50_us": p50, "p99_us": t[len(t) * 99 // 100] / 1e3,
                  "mean_us": sum(t) / len(t) / 1e3, "n": n,
                  "agent_output_us": agent_us, "tax_us": p50 - agent_us}))
"""

# The floor: a copy of the size, region to region, in a process of its own.
PY_FLOOR = r"""
import json, sys, time, uuid, numpy as np
import tritonclient.utils.shared_memory as shm
size, n, warm = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
data = (np.arange(size) % 251).astype(np.uint8)
tag = uuid.uuid4().hex[:10]
handles = [shm.create_shared_memory_region(f"f{what}{tag}", f"/tw-bench-f{what}-{tag}", size) for what in ("in", "out")]
try:
    shm.set_shared_memory_region(handles[0], [data])
    src, dst = (shm.get_contents_as_numpy(h, np.uint8, [size]) for h in handles)  # views of the regions
    for _ in range(warm):
        np.copyto(dst, src)
    dst[:] = 0
    t = []
    clock = time.perf_counter_ns
    for _ in range(n):
        a = clock(); np.copyto(dst, src); t.append(clock() - a)
    assert np.array_equal(dst, data), "the copy is not the input"
finally:
    src = dst = None  # no view may outlive its region
    for h in handles:
        shm.destroy_shared_memory_region(h)
t.sort()
print(json.dumps({"p50_us": t[len(t) // 2] / 1e3, "p99_us": t[len(t) * 99 // 100] / 1e3,
                  "mean_us": sum(t) / len(t) / 1e3, "n": n}))
"""


def start_agent(binary, mover):
    """`tensorwire serve --mover MOVER` behind both KServe doors on free ports."""
    args = [binary, "serve", "--mover", mover, "--listen", "grpc://127.0.0.1:0", "--listen", "http://127.0.0.1:0"]
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


def jobs():
    """Every row: (door, mover, mode, size, sweep bytes)."""
    small, big = SIZES
    rows = []
    for kind in ("grpc", "http"):
        for mover in MOVERS:
            rows += [(kind, mover, "shm", small, 0), (kind, mover, "shm", big, 0), (kind, mover, "shm", small, SWEEP)]
        rows += [(kind, MOVERS[0], "inline", size, 0) for size in SIZES]
    rows += [("floor", "", "copy", size, 0) for size in SIZES]
    return rows


def key(kind, mover, mode, size, sweep):
    return f"{kind}/{mover}/{mode}/{size}" + ("/swept" if sweep else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/tensorwire")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=300, help="calls per 1 KiB row (16 MiB rows: n/5, at least 20)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.rounds < 1 or a.n < 1:
        sys.exit("--rounds and -n must be at least 1")
    try:
        import tritonclient.grpc  # noqa: F401
        import tritonclient.http  # noqa: F401
    except ImportError:
        sys.exit("tritonclient[grpc,http] is not installed")
    agents = {}
    tmp = os.path.join(tempfile.mkdtemp(prefix="twkshm"), "out.json")
    rows = {}
    todo = jobs()
    try:
        for mover in MOVERS:
            agents[mover] = start_agent(a.bin, mover)
        for r in range(a.rounds):
            k = r % len(todo)
            for kind, mover, mode, size, sweep in todo[k:] + todo[:k]:
                n = a.n if size <= 1 << 10 else max(a.n // 5, 20)
                warm = max(n // 10, 5)
                if kind == "floor":
                    res = run_json([a.python, "-c", PY_FLOOR, str(size), str(n), str(warm)], tmp)
                else:
                    addr = agents[mover][1][kind]
                    res = run_json([a.python, "-c", PY_ROW, kind, addr, mode, str(size), str(n), str(warm),
                                    str(sweep)], tmp)
                rows.setdefault(key(kind, mover, mode, size, sweep), []).append(res)
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        for p, _ in agents.values():
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)
    table, summary = report(rows)
    write_results(a.out, table, {"rounds": a.rounds, "n": a.n, "runs": rows, "summary": summary})


def spread(v, fmt="{:.1f}"):
    """median [min–max] of `v`."""
    return f"{fmt.format(statistics.median(v))} [{fmt.format(min(v))}–{fmt.format(max(v))}]"


def report(rows):
    small, big = SIZES
    doors = (("grpc", "`tritonclient.grpc`"), ("http", "`tritonclient.http`"))

    def field(k, f):
        return [x[f] for x in rows[k]]

    lines = [
        "| door | mover | tensor in and out | 1 KiB p50 µs | 1 KiB p99 | 16 MiB p50 µs | 16 MiB p99 | "
        "16 MiB / 1 KiB p50, per round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    summary = {}
    for kind, door in doors:
        for mover, mode in [(m, "shm") for m in MOVERS] + [(MOVERS[0], "inline")]:
            s, b = key(kind, mover, mode, small, 0), key(kind, mover, mode, big, 0)
            ratio = [y / x for x, y in zip(field(s, "p50_us"), field(b, "p50_us"))]
            how = "system shared memory" if mode == "shm" else "inline (in the message)"
            lines.append(
                f"| {door} | {mover if mode == 'shm' else '—'} | {how} | {spread(field(s, 'p50_us'))} | "
                f"{statistics.median(field(s, 'p99_us')):.1f} | {spread(field(b, 'p50_us'))} | "
                f"{statistics.median(field(b, 'p99_us')):.1f} | {spread(ratio, '{:.2f}×')} |"
            )
            summary[f"{kind}/{mover}/{mode}"] = {"small_p50": field(s, "p50_us"), "big_p50": field(b, "p50_us"),
                                                 "ratio": ratio}
    fs, fb = key("floor", "", "copy", small, 0), key("floor", "", "copy", big, 0)
    fratio = [y / x for x, y in zip(field(fs, "p50_us"), field(fb, "p50_us"))]
    lines.append(
        f"| floor: no door, no request | — | a copy of the size, `np.copyto`, region → region | "
        f"{spread(field(fs, 'p50_us'))} | {statistics.median(field(fs, 'p99_us')):.1f} | "
        f"{spread(field(fb, 'p50_us'))} | {statistics.median(field(fb, 'p99_us')):.1f} | {spread(fratio, '{:.2f}×')} |"
    )
    summary["floor/copy"] = {"small_p50": field(fs, "p50_us"), "big_p50": field(fb, "p50_us"), "ratio": fratio}

    # The tax: a call's p50 minus the agent's own copy for it (its
    # compute_output, mean per call), per row; ratios per round.
    lines += [
        "",
        "| door | mover | agent's copy, 16 MiB µs | tax 1 KiB µs | tax 1 KiB after a sweep | tax 16 MiB µs | "
        "16 MiB / 1 KiB tax | 16 MiB / 1 KiB-after-a-sweep tax |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, door in doors:
        for mover in MOVERS:
            s, w, b = (key(kind, mover, "shm", small, 0), key(kind, mover, "shm", small, SWEEP),
                       key(kind, mover, "shm", big, 0))
            st, wt, bt = field(s, "tax_us"), field(w, "tax_us"), field(b, "tax_us")
            warm = [y / x for x, y in zip(st, bt)]
            same = [y / x for x, y in zip(wt, bt)]
            summary[f"{kind}/{mover}/shm"].update(
                {"big_agent_copy": field(b, "agent_output_us"), "small_tax": st, "small_swept_tax": wt,
                 "big_tax": bt, "tax_ratio": warm, "tax_ratio_same_cache": same})
            lines.append(
                f"| {door} | {mover} | {spread(field(b, 'agent_output_us'))} | {spread(st)} | {spread(wt)} | "
                f"{spread(bt)} | {spread(warm, '{:.2f}×')} | {spread(same, '{:.2f}×')} |"
            )
    return "\n".join(lines), summary


if __name__ == "__main__":
    main()
