#!/usr/bin/env python3
"""Two priority levels at overload: what a high-priority request waits when
low-priority clients keep the model busy (docs/BENCHMARKS.md, "Priorities
at overload").

Two agents (`tensorwire serve --config`, release build) serve MobileNetV2
on Unix sockets with `priority_levels = 2` (requests that name no level
get the lowest, 2), one run at a time: `wait` lets a high-priority request
wait for the run in progress, `preempt` (`preempt = true`) stops that run
for it (the stopped request runs again at its turn). A *probe* process
sends requests one at a time with a short pause between them and times
each (`time.perf_counter_ns` around `m.infer`); *load* processes each send
low-priority requests back to back (closed loop), more of them than the
model can serve, so its queue never empties. Each round measures five
phases, in an order rotated by the round's number:

- `unloaded` (each agent): the probe alone, priority 1 (its floor:
  compute + path);
- `loaded, priority 1` (each agent): the probe at priority 1 while the
  load runs;
- `loaded, priority 2` (`wait` agent): the probe at the load's own level
  (what it would wait without priorities: first come, first served behind
  the load).

Per phase: p50 and p99 of the probe's calls (median over rounds
[min–max]), p99 over the unloaded p99 of the same round and agent, and the
load's throughput meanwhile (what the low level got; with `preempt` it
loses the stopped runs' partial work). The target (issue 15):
high-priority p99 at overload within 1.5× of its unloaded p99. Without
preemption a high-priority request still waits for the run in progress
(up to one compute time).

  .venv/bin/python scripts/bench-priority.py --bin target/release/tensorwire \\
      --rounds 5 --out docs/bench/priority

`--intra-spinning off` runs both agents with ONNX Runtime's intra-op
threads not spinning (TOML `intra_spinning = false`).
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
AGENTS = ("wait", "preempt")
PHASES = (
    ("wait", "unloaded"),
    ("wait", "loaded, priority 1"),
    ("wait", "loaded, priority 2"),
    ("preempt", "unloaded"),
    ("preempt", "loaded, priority 1"),
)


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


def load_worker(uri, stop, counting, done):
    """A low-priority client: back-to-back requests until `stop` is set;
    counts the answers that arrive while `counting` is set into `done`."""
    import tensorwire as tw

    c = tw.connect(uri)
    m = c.model("mobilenet")
    x = inputs(m)
    while not stop.is_set():
        try:
            m.infer(x, priority=2)
            if counting.is_set():
                with done.get_lock():
                    done.value += 1
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
    ap.add_argument("--transport", choices=("unix", "shm"), default="unix")
    ap.add_argument("--intra-threads", type=int, default=2, help="the agents' ONNX Runtime intra-op threads")
    ap.add_argument("--intra-spinning", choices=("on", "off"), default="on",
                    help="whether the agents' intra-op threads spin (serve --intra-spinning; default on, as serve)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.rounds < 1 or a.n < 10 or a.load < 1:
        ap.error("--rounds ≥ 1, -n ≥ 10, --load ≥ 1")
    command = shlex.join([sys.executable, *sys.argv])
    work = tempfile.mkdtemp(prefix="twprio")
    procs, uris = [], {}
    ctx = mp.get_context("spawn")
    results = {p: [] for p in PHASES}
    load_rps = {p: [] for p in PHASES}
    try:
        for name in AGENTS:
            sock = os.path.join(work, f"{name}.sock")
            listen = f"unix://{sock}" if a.transport == "unix" else f"shm://twprio-{os.getpid()}-{name}"
            cfg = os.path.join(work, f"{name}.toml")
            with open(cfg, "w") as f:
                f.write(f'listen = ["{listen}"]\nintra_threads = {a.intra_threads}\n'
                        f'intra_spinning = {"true" if a.intra_spinning == "on" else "false"}\n\n'
                        f'[[model]]\nname = "mobilenet"\npath = "{MODEL}"\n'
                        f"priority_levels = 2\npreempt = {'true' if name == 'preempt' else 'false'}\n")
            agent = subprocess.Popen([a.bin, "serve", "--config", cfg], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
            procs.append(agent)
            line = agent.stdout.readline()
            if not line.startswith("listening on "):
                sys.exit(f"the {name} agent did not start: {line!r}")
            uris[name] = line.split()[-1]
        for r in range(a.rounds):
            k = r % len(PHASES)
            for key in PHASES[k:] + PHASES[:k]:
                name, phase = key
                uri = uris[name]
                stop, counting, done = ctx.Event(), ctx.Event(), ctx.Value("q", 0)
                loaders = []
                if phase != "unloaded":
                    loaders = [ctx.Process(target=load_worker, args=(uri, stop, counting, done))
                               for _ in range(a.load)]
                    for p in loaders:
                        p.start()
                    time.sleep(1.0)  # the queue fills
                counting.set()
                began = time.perf_counter()
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
                counting.clear()
                load_rps[key].append(done.value / (time.perf_counter() - began))
                pr.join()
                stop.set()
                for p in loaders:
                    p.join(timeout=60)
                results[key].append(t)
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        for agent in procs:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=60)

    lines = ["| agent | phase | probe p50 µs | probe p99 µs | p99 / unloaded p99, per round | load req/s |",
             "|---|---|---|---|---|---|"]
    summary = {}
    med = statistics.median
    for key in PHASES:
        name, phase = key
        p50 = [pct(t, 0.5) for t in results[key]]
        p99 = [pct(t, 0.99) for t in results[key]]
        ratio = [x / pct(u, 0.99) for x, u in zip(p99, results[(name, "unloaded")])]
        rps = load_rps[key]
        summary[f"{name}: {phase}"] = {"p50_us": p50, "p99_us": p99, "p99_ratio": ratio, "load_rps": rps}
        load = f"{med(rps):.0f} [{min(rps):.0f}–{max(rps):.0f}]" if phase != "unloaded" else "—"
        lines.append(f"| {name} | {phase} | {med(p50):.0f} [{min(p50):.0f}–{max(p50):.0f}] | "
                     f"{med(p99):.0f} [{min(p99):.0f}–{max(p99):.0f}] | "
                     f"{med(ratio):.2f}× [{min(ratio):.2f}–{max(ratio):.2f}] | {load} |")
    print(command, file=sys.stderr)
    write_results(a.out, "\n".join(lines), {
        "command": command, "rounds": a.rounds, "n": a.n, "load": a.load, "pause_ms": a.pause_ms,
        "summary": summary, "times_us": {f"{n}: {p}": t for (n, p), t in results.items()},
    })


if __name__ == "__main__":
    main()
