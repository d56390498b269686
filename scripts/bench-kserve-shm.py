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
  HTTP binary tensor data), for comparison, and
- a floor, not a request: *the one copy the identity engine must make*.
  `identity`'s output is a copy of its input, and through shared memory
  the agent makes exactly that copy, input region → output region. This
  row makes the same copy in a Python process of its own, rotated with the
  others: two regions of the size created as the shm rows create theirs
  (`tritonclient.utils.shared_memory`, /dev/shm, not registered with the
  agent), and `np.copyto(out_view, in_view)` timed per call. It is the
  memory's price, which no protocol can avoid.

The shm rows also make that copy themselves, paired with every call: the
same regions, input → output, right before or right after the call
(alternating), so the copy and the call see the same pages, caches and
moment. A copy of 16 MiB varies by ±25 % between processes and runs here,
so the tax is taken per pair: call − its paired copy.

Each call is timed with `time.perf_counter_ns`; every row checks the
output's bytes once after its loop. Prints per row the p50 (median over
rounds [min–max]), the median p99, and the 16 MiB / 1 KiB ratio of p50s
per round; then, per shm row and size, the *tax*: the median over its
calls of (call − paired copy), its median over rounds [min–max], and the
ratio of taxes 16 MiB / 1 KiB per round: about 1 if what the protocol adds
does not grow with the tensor. (The paired copy also runs at 1 KiB, where
it is ~1 µs.) Writes `results.json` and `table.md` to --out if
given.

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
src = dst = None
try:
    for _ in range(warm):
        r = c.infer("identity", [inp], outputs=[out])
    t, f = [], []
    clock = time.perf_counter_ns
    if mode == "shm":
        # Paired with each call, in alternating order: the copy the agent
        # makes for it (input region -> output region), made here.
        src, dst = (shm.get_contents_as_numpy(h, np.uint8, [size]) for h in handles)
        for _ in range(warm):
            np.copyto(dst, src)
        for i in range(n):
            if i % 2:
                a = clock(); r = c.infer("identity", [inp], outputs=[out]); b = clock()
                np.copyto(dst, src); e = clock()
                t.append(b - a); f.append(e - b)
            else:
                a = clock(); np.copyto(dst, src); b = clock()
                r = c.infer("identity", [inp], outputs=[out]); e = clock()
                f.append(b - a); t.append(e - b)
        dst[:] = 0  # the check below must see the agent's bytes
        r = c.infer("identity", [inp], outputs=[out])
        got = dst
    else:
        for _ in range(n):
            a = clock(); r = c.infer("identity", [inp], outputs=[out]); t.append(clock() - a)
        got = r.as_numpy("t")
    assert np.array_equal(got, data), "identity returned other bytes"
finally:
    src = dst = got = None  # no view may outlive its region
    for name in names:
        c.unregister_system_shared_memory(name)
    for h in handles:
        shm.destroy_shared_memory_region(h)
d = sorted(x - y for x, y in zip(t, f))
f.sort()
t.sort()
res = {"p50_us": t[len(t) // 2] / 1e3, "p99_us": t[len(t) * 99 // 100] / 1e3,
       "mean_us": sum(t) / len(t) / 1e3, "n": n}
if f:
    res.update({"paired_copy_p50_us": f[len(f) // 2] / 1e3, "paired_tax_p50_us": d[len(d) // 2] / 1e3})
print(json.dumps(res))
"""

# The floor: the one copy the identity engine must make, region to region.
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
    jobs += [("floor", "copy", size) for size in SIZES]
    rows = {}
    try:
        for r in range(a.rounds):
            k = r % len(jobs)
            for kind, mode, size in jobs[k:] + jobs[:k]:
                n = a.n if size <= 1 << 10 else max(a.n // 20, 20)
                warm = max(n // 10, 5)
                if kind == "floor":
                    res = run_json([a.python, "-c", PY_FLOOR, str(size), str(n), str(warm)], tmp)
                else:
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
    fs, fb = f"floor/copy/{small}", f"floor/copy/{big}"
    fsp, fbp = med(fs, "p50_us"), med(fb, "p50_us")
    fratio = [y["p50_us"] / x["p50_us"] for x, y in zip(rows[fs], rows[fb])]
    summary["floor/copy"] = {"small_p50": fsp, "big_p50": fbp, "ratio": statistics.median(fratio)}
    lines.append(
        f"| floor: no door, no request | the one copy the identity engine must make: `np.copyto`, "
        f"input region → output region | {fsp[0]:.1f} [{fsp[1]:.1f}–{fsp[2]:.1f}] | {med(fs, 'p99_us')[0]:.1f} | "
        f"{fbp[0]:.1f} [{fbp[1]:.1f}–{fbp[2]:.1f}] | {med(fb, 'p99_us')[0]:.1f} | "
        f"{statistics.median(fratio):.2f}× [{min(fratio):.2f}–{max(fratio):.2f}] |"
    )

    # The protocol's tax per size, shm rows: per call, the request minus
    # the paired copy made right before or after it in the same process
    # (median per run; median over rounds [min–max]), and the ratio of
    # taxes 16 MiB / 1 KiB per round.
    def spread(v, fmt):
        return f"{fmt(statistics.median(v))} [{fmt(min(v))}–{fmt(max(v))}]"

    lines += [
        "",
        "| door | 1 KiB tax µs: call − paired copy | 16 MiB paired copy µs | 16 MiB tax µs | "
        "16 MiB / 1 KiB tax, per round |",
        "|---|---|---|---|---|",
    ]
    for kind, door in (("grpc", "`tritonclient.grpc`"), ("http", "`tritonclient.http`")):
        s_, b = f"{kind}/shm/{small}", f"{kind}/shm/{big}"
        st = [x["paired_tax_p50_us"] for x in rows[s_]]
        bt = [x["paired_tax_p50_us"] for x in rows[b]]
        bc = [x["paired_copy_p50_us"] for x in rows[b]]
        tr = [y / x for x, y in zip(st, bt)]
        summary[f"{kind}/shm"].update(
            {"small_tax": [statistics.median(st), min(st), max(st)],
             "big_tax": [statistics.median(bt), min(bt), max(bt)],
             "big_paired_copy": [statistics.median(bc), min(bc), max(bc)],
             "tax_ratio": [statistics.median(tr), min(tr), max(tr)]})
        lines.append(f"| {door}, system shared memory | {spread(st, '{:.1f}'.format)} | "
                     f"{spread(bc, '{:.1f}'.format)} | {spread(bt, '{:.1f}'.format)} | "
                     f"{spread(tr, '{:.2f}×'.format)} |")
    write_results(a.out, "\n".join(lines), {"rounds": a.rounds, "n": a.n, "runs": rows, "summary": summary})


if __name__ == "__main__":
    main()
