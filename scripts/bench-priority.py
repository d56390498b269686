#!/usr/bin/env python3
"""Two priority levels at overload: what a high-priority request waits when
low-priority clients keep the model busy (docs/BENCHMARKS.md, "Priorities
at overload").

One agent (`tensorwire serve --config`, release build) serves MobileNetV2
on a Unix socket with `priority_levels = 2` (requests that name no level
get the lowest, 2). A *probe* process sends requests one at a time with a
short pause between them and times each (`time.perf_counter_ns` around
`m.infer`); *load* processes each send low-priority requests back to back
(closed loop), more of them than the model can serve, so its queue never
empties. Each round measures three phases, in an order rotated by the
round's number:

- `unloaded`: the probe alone, priority 1 (its floor: compute + path);
- `loaded, priority 1`: the probe at priority 1 while the load runs;
- `loaded, priority 2`: the probe at the load's own level (what it would
  wait without priorities: first come, first served behind the load).

Per phase: p50 and p99 of the probe's calls (median over rounds
[min–max]), and p99 over the unloaded p99 of the same round. The target
(issue 15): high-priority p99 at overload within 1.5× of its unloaded p99.
The model runs one request at a time (one engine instance), so a
high-priority request still waits for the run in progress: up to one
compute time, which is the floor of what priorities can do without
preemption.

  .venv/bin/python scripts/bench-priority.py --bin target/release/tensorwire \\
      --rounds 5 --out docs/bench/priority
"""

import argparse
import importlib.util
import multiprocessing as mp
import os
import queue
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL = os.path.join(ROOT, "models", "build", "mobilenetv2.onnx")
PHASES = ("unloaded", "loaded, priority 1", "loaded, priority 2")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


write_results = _load("bench_python", os.path.join(HERE, "bench-python.py")).write_results


def inputs(m):
    """One input per model input, zeros of its shape (dynamic dims 1)."""
    import numpy as np

    return [np.zeros([d if d else 1 for d in t.shape], dtype=t.dtype) for t in m.inputs]


def load_worker(uri, stop):
    """A low-priority client: back-to-back requests until `stop` is set."""
    import tensorwire as tw

    c = tw.connect(uri)
    m = c.model("mobilenet")
    x = inputs(m)
    while not stop.is_set():
        try:
            m.infer(x, priority=2)
        except tw.TensorwireError:
            time.sleep(0.001)
    c.close()


def probe(uri, priority, n, pause_s, out):
    """`n` timed requests at `priority`, one at a time; µs into `out`."""
    import tensorwire as tw

    c = tw.connect(uri)
    m = c.model("mobilenet")
    x = inputs(m)
    for _ in range(5):
        m.infer(x, priority=priority)
    t = []
    for _ in range(n):
        a = time.perf_counter_ns()
        m.infer(x, priority=priority)
        t.append((time.perf_counter_ns() - a) / 1e3)
        time.sleep(pause_s)
    c.close()
    out.put(t)


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * q))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "tensorwire"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=200, help="probe calls per phase")
    ap.add_argument("--load", type=int, default=4, help="low-priority load processes")
    ap.add_argument("--pause-ms", type=float, default=2.0, help="probe's pause between calls")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.rounds < 1 or a.n < 10 or a.load < 1:
        ap.error("--rounds ≥ 1, -n ≥ 10, --load ≥ 1")
    command = shlex.join([sys.executable, *sys.argv])
    work = tempfile.mkdtemp(prefix="twprio")
    sock = os.path.join(work, "a.sock")
    cfg = os.path.join(work, "agent.toml")
    with open(cfg, "w") as f:
        f.write(f'listen = ["unix://{sock}"]\n\n[[model]]\nname = "mobilenet"\npath = "{MODEL}"\n'
                "priority_levels = 2\n")
    agent = subprocess.Popen([a.bin, "serve", "--config", cfg], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    ctx = mp.get_context("spawn")
    results = {p: [] for p in PHASES}
    try:
        line = agent.stdout.readline()
        if not line.startswith("listening on "):
            sys.exit(f"the agent did not start: {line!r}")
        uri = line.split()[-1]
        for r in range(a.rounds):
            k = r % len(PHASES)
            for phase in PHASES[k:] + PHASES[:k]:
                stop = ctx.Event()
                loaders = []
                if phase != "unloaded":
                    loaders = [ctx.Process(target=load_worker, args=(uri, stop)) for _ in range(a.load)]
                    for p in loaders:
                        p.start()
                    time.sleep(1.0)  # the queue fills
                out = ctx.Queue()
                prio = 2 if phase.endswith("priority 2") else 1
                pr = ctx.Process(target=probe, args=(uri, prio, a.n, a.pause_ms / 1e3, out))
                pr.start()
                t = None
                while t is None:
                    try:
                        t = out.get(timeout=1)
                    except queue.Empty:
                        if not pr.is_alive():
                            stop.set()
                            sys.exit(f"the probe process failed (exit code {pr.exitcode})")
                pr.join()
                stop.set()
                for p in loaders:
                    p.join(timeout=60)
                results[phase].append(t)
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)

    lines = ["| phase | probe p50 µs | probe p99 µs | p99 / unloaded p99, per round |", "|---|---|---|---|"]
    summary = {}
    for phase in PHASES:
        p50 = [pct(t, 0.5) for t in results[phase]]
        p99 = [pct(t, 0.99) for t in results[phase]]
        ratio = [x / pct(u, 0.99) for x, u in zip(p99, results["unloaded"])]
        summary[phase] = {"p50_us": p50, "p99_us": p99, "p99_ratio": ratio}
        med = statistics.median
        lines.append(f"| {phase} | {med(p50):.0f} [{min(p50):.0f}–{max(p50):.0f}] | "
                     f"{med(p99):.0f} [{min(p99):.0f}–{max(p99):.0f}] | "
                     f"{med(ratio):.2f}× [{min(ratio):.2f}–{max(ratio):.2f}] |")
    print(command, file=sys.stderr)
    write_results(a.out, "\n".join(lines), {
        "command": command, "rounds": a.rounds, "n": a.n, "load": a.load, "pause_ms": a.pause_ms,
        "summary": summary, "times_us": results,
    })


if __name__ == "__main__":
    main()
