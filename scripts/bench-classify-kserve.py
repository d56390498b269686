#!/usr/bin/env python3
"""The tweet classifier through tritonclient (HTTP and gRPC) vs native shm:
the tax of the standard protocol (docs/BENCHMARKS.md, "KServe front doors
(issue 14)").

One agent (`tensorwire serve --model classifier=models/build/tweet_classifier.onnx
--listen shm://NAME --listen grpc://127.0.0.1:0 --listen http://127.0.0.1:0
--intra-threads N`, release build) and, in this one Python process, three
clients of it running the same model on the same tokens:

- `tensorwire shm`: the tensorwire Python SDK, `tw.connect("shm://NAME")`
  (default spin), `model.infer([...])`, as `examples/classifier/classify.py`.
- `tritonclient grpc`: `tritonclient.grpc`, the tokens as
  `raw_input_contents` (`set_data_from_numpy`), the logits from
  `as_numpy`.
- `tritonclient http`: `tritonclient.http`, binary tensor data for the
  inputs and the output (`binary_data=True`).

The baseline is `tensorwire shm`: same agent, same engine session, so the
difference is the standard protocol's stack (client library, HTTP/2 or
HTTP/1.1, the front door). The engine in-process is not a timed row here:
interleaved with the agent on two cores, an `onnxruntime` session in this
process and the agent's both keep intra-op threads spinning after each run
and slow each other down (every row's per-line time doubled, 4.6 → 9.4 ms;
with spinning off here, the local row itself slowed instead). The tax of
tensorwire over the in-process engine is measured where one engine runs
at a time: `tensorwire classify --compare local,shm` and "Python client".
A local `onnxruntime` session (spinning off) computes the reference logits
once, before anything is timed.

Every line of examples/classifier/tweets.txt is tokenized once up front,
as `classify.py` does (its own `TextTokenizer`, imported), so only the
request path is timed: `time.perf_counter_ns` around building what the
client needs (feed dict, input list, `InferInput`s with their data and the
`InferRequestedOutput`), the call, and getting the logits as an ndarray.
Each *round* sends every line through every configuration, in an order
that changes with (round + line index): the six permutations in turn, so
every configuration runs equally often in each position and right after
each other one, and neither drift nor "who ran just before" favours one of
them. Before round 1 the first --warmup lines go once through each
configuration, untimed. Every timed call's logits are checked against
the reference (allclose, 1e-5 absolute and relative) and its argmax must
be equal: any mismatch stops the run with an error.

Per configuration: the per-line p50 (each round's median over lines; the
median over rounds [min–max]), the p99 over all timed calls, the tax vs
`tensorwire shm` (per line, the median over rounds of (config − shm) in the
same round; then the median over lines, in µs and as % of the line's shm
median), the ratio to `tensorwire shm` (per line, the median over rounds of
config / shm; then the median over lines), and the largest logit difference
from the local reference. Prints a markdown table; with --out writes results.json
(every timed call, µs, and the command line) and table.md there.

  .venv/bin/python scripts/bench-classify-kserve.py --bin target/release/tensorwire \\
      --rounds 10 --out docs/bench/kserve-classify
"""

import argparse
import importlib.util
import itertools
import os
import queue
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FILE = os.path.join(ROOT, "examples", "classifier", "tweets.txt")
MODEL = os.path.join(ROOT, "models", "build", "tweet_classifier.onnx")
MODEL_NAME = "classifier"
CONFIGS = ("tensorwire shm", "tritonclient grpc", "tritonclient http")
ATOL = RTOL = 1e-5
# The orders a line's calls go in, by (round + line index) mod 6: every
# permutation, so each configuration runs as often in each position and
# right after each other one (what ran just before matters: the agent's
# ONNX Runtime pool may still spin, its shm worker may still poll).
ORDERS = list(itertools.permutations(CONFIGS))


def _load(name, path):
    """A Python file as a module (the scripts' names have dashes)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


write_results = _load("bench_python", os.path.join(HERE, "bench-python.py")).write_results
cls = _load("classify", os.path.join(ROOT, "examples", "classifier", "classify.py"))


def start_agent(binary, shm_uri, intra_threads, log):
    """`tensorwire serve` with the classifier on shm and both KServe doors
    (free ports); returns the process and {scheme: URI}."""
    args = [binary, "serve", "--model", f"{MODEL_NAME}={MODEL}", "--intra-threads", str(intra_threads),
            "--listen", shm_uri, "--listen", "grpc://127.0.0.1:0", "--listen", "http://127.0.0.1:0"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
    # A thread reads its stdout (to the end, so a full pipe never blocks it).
    q = queue.Queue()
    threading.Thread(target=lambda: ([q.put(l) for l in p.stdout], q.put(None)), daemon=True).start()
    got = {}
    deadline = time.monotonic() + 60
    try:
        while len(got) < 3:
            try:
                line = q.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise RuntimeError("the agent printed no `listening on` lines within 60 s") from None
            if line is None:
                raise RuntimeError(f"the agent exited (status {p.wait()}) before it listened")
            if line.startswith("listening on "):
                uri = line.split()[-1]
                got[uri.partition("://")[0]] = uri
    except BaseException:
        stop_agent(p)
        raise
    return p, got


def stop_agent(p):
    if p is not None and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=30)


def wait_ready(client, what, deadline_s=30):
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if client.is_model_ready(MODEL_NAME):
                return
        except Exception:  # the door is not up yet
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: model '{MODEL_NAME}' not ready after {deadline_s} s")
        time.sleep(0.1)


def make_runners(shm_uri, grpc_uri, http_uri, intra_threads, closers):
    """(the model's classify.Plan, {config: run}); run(inputs) -> (logits
    ndarray, what must stay alive until they are read), `inputs` a line's
    [(input name, int64 [1, seq] array)] in the model's order."""
    import onnxruntime as ort
    import tensorwire as tw
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    so = ort.SessionOptions()
    so.intra_op_num_threads = intra_threads
    so.inter_op_num_threads = 1
    # The reference only: no threads left spinning while the agent runs.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(MODEL, so, providers=["CPUExecutionProvider"])
    ort_types = {"tensor(int64)": "int64", "tensor(float)": "float32"}
    plan = cls.make_plan(
        MODEL,
        [(i.name, ort_types.get(i.type, i.type), len(i.shape)) for i in sess.get_inputs()],
        [(o.name, ort_types.get(o.type, o.type), len(o.shape), None) for o in sess.get_outputs()],
    )
    out_name = plan.output
    out_names = [out_name]

    def run_local(x):
        return sess.run(out_names, dict(x))[0], None

    client = tw.connect(shm_uri)
    closers.append(client.close)
    model = client.model(MODEL_NAME)
    served = [t.name for t in model.inputs]
    if served != plan.inputs:
        raise RuntimeError(f"the agent's model takes {served}, the .onnx file {plan.inputs}")

    def run_tw(x):
        out = model.infer([a for _, a in x])
        return out[out_name], out  # `out` holds the arena block until checked

    gc = grpcclient.InferenceServerClient(grpc_uri.partition("://")[2])
    closers.append(gc.close)
    wait_ready(gc, "grpc")

    def run_grpc(x):
        ins = []
        for name, a in x:
            i = grpcclient.InferInput(name, list(a.shape), "INT64")
            i.set_data_from_numpy(a)
            ins.append(i)
        r = gc.infer(MODEL_NAME, ins, outputs=[grpcclient.InferRequestedOutput(out_name)])
        return r.as_numpy(out_name), r

    hc = httpclient.InferenceServerClient(http_uri.partition("://")[2])
    closers.append(hc.close)
    wait_ready(hc, "http")

    def run_http(x):
        ins = []
        for name, a in x:
            i = httpclient.InferInput(name, list(a.shape), "INT64")
            i.set_data_from_numpy(a, binary_data=True)
            ins.append(i)
        r = hc.infer(MODEL_NAME, ins, outputs=[httpclient.InferRequestedOutput(out_name, binary_data=True)])
        return r.as_numpy(out_name), r

    return plan, run_local, dict(zip(CONFIGS, (run_tw, run_grpc, run_http)))


class Checker:
    """Every call's logits against the reference: allclose and argmax."""

    def __init__(self, ref):
        self.ref = ref
        self.worst = {c: 0.0 for c in CONFIGS}

    def __call__(self, config, i, logits, line_no):
        got = np.asarray(logits, dtype=np.float32).reshape(-1)
        want = self.ref[i]
        if got.shape != want.shape:
            raise RuntimeError(f"{config}, line {line_no}: {got.size} logits, the reference has {want.size}")
        diff = float(np.max(np.abs(got - want)))
        self.worst[config] = max(self.worst[config], diff)
        if not np.allclose(got, want, rtol=RTOL, atol=ATOL) or cls.argmax(got.tolist()) != cls.argmax(want.tolist()):
            raise RuntimeError(f"{config}, line {line_no}: logits {got.tolist()} differ from the reference "
                               f"{want.tolist()} (max abs diff {diff:.3e}; argmax {int(np.argmax(got))} vs "
                               f"{int(np.argmax(want))})")


def p99(v):
    v = sorted(v)
    return v[len(v) * 99 // 100]


def summarize(times, n_lines, rounds):
    """times[config][round][line], µs -> {config: figures}."""
    out = {}
    shm = times["tensorwire shm"]
    for c in CONFIGS:
        t = times[c]
        per_round = [statistics.median(t[r]) for r in range(rounds)]
        taxes, pcts, ratios = [], [], []
        for i in range(n_lines):
            d = statistics.median(t[r][i] - shm[r][i] for r in range(rounds))
            taxes.append(d)
            pcts.append(100 * d / statistics.median(shm[r][i] for r in range(rounds)))
            ratios.append(statistics.median(t[r][i] / shm[r][i] for r in range(rounds)))
        out[c] = {
            "p50_us": statistics.median(per_round), "p50_min_us": min(per_round), "p50_max_us": max(per_round),
            "p50_per_round_us": per_round,
            "p99_us": p99([x for row in t for x in row]),
            "tax_us": statistics.median(taxes), "tax_pct": statistics.median(pcts),
            "ratio_to_shm": statistics.median(ratios),
        }
    return out


def table(summary, worst, n_lines, rounds):
    rows = [
        f"| configuration | per-line p50 µs: median [min–max] over {rounds} rounds | p99 µs, all {n_lines * rounds} calls "
        "| tax vs shm, µs | tax, % of shm | / `tensorwire shm` | max \\|Δ logit\\| vs reference |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"tensorwire shm": "`tensorwire` SDK, shm:// (baseline)",
             "tritonclient grpc": "`tritonclient.grpc`, raw contents",
             "tritonclient http": "`tritonclient.http`, binary data"}
    for c in CONFIGS:
        s = summary[c]
        base = c == "tensorwire shm"
        tax = "" if base else f"+{s['tax_us']:.1f}" if s["tax_us"] >= 0 else f"{s['tax_us']:.1f}"
        pct = "" if base else f"{s['tax_pct']:+.1f} %"
        rows.append(f"| {names[c]} | {s['p50_us']:.1f} [{s['p50_min_us']:.1f}–{s['p50_max_us']:.1f}] | "
                    f"{s['p99_us']:.1f} | {tax} | {pct} | {s['ratio_to_shm']:.2f}× | "
                    f"{worst[c]:.1e} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "tensorwire"))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--lines", type=int, default=None, help="the first N lines of tweets.txt (default: all)")
    ap.add_argument("--warmup", type=int, default=5, help="lines sent once through each configuration, untimed")
    ap.add_argument("--intra-threads", type=int, default=2,
                    help="ONNX Runtime intra-op threads of the agent and the reference (default: serve's default, %(default)s)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.rounds < 1 or a.warmup < 0:
        ap.error("--rounds must be ≥ 1 and --warmup ≥ 0")
    command = shlex.join([sys.executable, *sys.argv])
    for mod in ("onnxruntime", "tensorwire", "tritonclient.grpc", "tritonclient.http"):
        try:
            found = importlib.util.find_spec(mod) is not None
        except ImportError:
            found = False
        if not found:
            sys.exit(f"{mod} is not installed: use the project's .venv")

    _, lines = cls.read_input(FILE)
    lines = lines[: a.lines] if a.lines else lines
    tok = cls.TextTokenizer(cls.resolve(cls.DEFAULT_TOKENIZER))
    encoded = [tok.encode(l.text, l.number).rows for l in lines]

    # SIGTERM (e.g. a timeout) runs the finally below too: the agent stops.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log = tempfile.NamedTemporaryFile("w+", prefix="twclsk-agent-", suffix=".log")
    shm_uri = f"shm://twclsk{os.getpid()}"
    agent, closers = None, []
    n, rounds = len(lines), a.rounds
    times = {c: [[0.0] * n for _ in range(rounds)] for c in CONFIGS}
    try:
        agent, uris = start_agent(a.bin, shm_uri, a.intra_threads, log)
        plan, reference, run = make_runners(uris["shm"], uris["grpc"], uris["http"], a.intra_threads, closers)
        feeds = plan.feeds()
        inputs = [[(name, rows[s]) for name, s in zip(plan.inputs, feeds)] for rows in encoded]
        ref = [np.asarray(reference(x)[0], np.float32).reshape(-1).copy() for x in inputs]
        check = Checker(ref)
        for i, x in enumerate(inputs[: a.warmup]):
            for c in CONFIGS:
                check(c, i, run[c](x)[0], lines[i].number)
        clock = time.perf_counter_ns
        for r in range(rounds):
            for i, x in enumerate(inputs):
                for c in ORDERS[(r + i) % len(ORDERS)]:
                    f = run[c]
                    t0 = clock()
                    logits, keep = f(x)
                    t1 = clock()
                    times[c][r][i] = (t1 - t0) / 1e3
                    check(c, i, logits, lines[i].number)
                    del keep
            print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    except BaseException:
        failed = True
        raise
    else:
        failed = False
    finally:
        for close in reversed(closers):
            try:
                close()
            except Exception:
                pass
        stop_agent(agent)
        log.seek(0)
        tail = log.read()[-2000:]
        log.close()
        if failed and tail.strip():
            print(f"agent stderr (last 2000 chars):\n{tail}", file=sys.stderr)

    summary = summarize(times, n, rounds)
    print(command, file=sys.stderr)
    write_results(a.out, table(summary, check.worst, n, rounds), {
        "command": command, "rounds": rounds, "lines": n, "warmup": a.warmup, "intra_threads": a.intra_threads,
        "tokens": [int(e.shape[1]) for e in encoded], "line_numbers": [l.number for l in lines],
        "configs": list(CONFIGS), "orders": ORDERS, "summary": summary, "max_logit_diff": check.worst,
        "times_us": {c: [[round(x, 2) for x in row] for row in times[c]] for c in CONFIGS},
    })


if __name__ == "__main__":
    main()
