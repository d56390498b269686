#!/usr/bin/env python3
"""The tweet classifier from Python next to `tensorwire classify`, same
agent, same run (docs/BENCHMARKS.md, "Python client").

One `tensorwire serve` (release build) serves the classifier on unix, shm
and tcp. Each round runs, for every URI (and the embedded `inproc://`,
where each tool starts its own agent in-process), `tensorwire classify -f
tweets.txt --json` and `examples/classifier/classify.py -f tweets.txt
--json`, in an order rotated by the round's number. Per run: the median
per-line time (tokenize + request + response) over lines 5–100 (the first
4 are warm-up, as the CLI's average). Reported per URI: the median over
rounds of each tool's figure, the median and range of the per-round ratio
Python / CLI, and whether every run's labels were identical with logits
equal (max absolute difference).

  python3 scripts/bench-classify-python.py --rounds 10 --out docs/bench/python
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILE = os.path.join(ROOT, "examples", "classifier", "tweets.txt")
MODEL = os.path.join(ROOT, "models", "build", "tweet_classifier.onnx")


def run(cmd, uri):
    out = subprocess.run([*cmd, "-f", FILE, "--json", "--connect", uri], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=600).stdout
    lines = json.loads(out)["lines"]
    return statistics.median(l["ms"] for l in lines[4:]), lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "tensorwire"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="twcls")
    uris = {"unix": f"unix://{work}/a.sock", "shm": f"shm://twcls{os.getpid()}", "tcp": "tcp://127.0.0.1:0"}
    args = [a.bin, "serve", "--model", f"classifier={MODEL}"]
    for u in uris.values():
        args += ["--listen", u]
    agent = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    for _ in range(3):
        line = agent.stdout.readline()
        if line.startswith("listening on tcp://"):
            uris["tcp"] = line.split()[-1]
    uris["inproc"] = "inproc://"
    tools = {"cli": [a.bin, "classify"], "python": [a.python, os.path.join(ROOT, "examples", "classifier", "classify.py")]}
    jobs = [(t, u) for u in ("inproc", "unix", "shm", "tcp") for t in ("cli", "python")]
    res = {}
    worst = {u: 0.0 for u in uris}
    same = {u: True for u in uris}
    try:
        for r in range(a.rounds):
            k = (r * 3) % len(jobs)
            got = {}
            for tool, u in jobs[k:] + jobs[:k]:
                ms, lines = run(tools[tool], uris[u])
                res.setdefault(f"{tool}/{u}", []).append(ms)
                got[(tool, u)] = lines
            for u in uris:
                for x, y in zip(got[("cli", u)], got[("python", u)]):
                    same[u] &= x["prediction"] == y["prediction"]
                    worst[u] = max(worst[u], max(abs(p - q) for p, q in zip(x["logits"], y["logits"])))
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
    rows = ["| URI | CLI ms/line, median [min–max] | Python ms/line | Python / CLI, per round: median [min–max] | labels identical, max logit diff |",
            "|---|---|---|---|---|"]
    for u in ("inproc", "unix", "shm", "tcp"):
        c, p = res[f"cli/{u}"], res[f"python/{u}"]
        q = [y / x for x, y in zip(c, p)]
        rows.append(f"| {u} | {statistics.median(c):.2f} [{min(c):.2f}–{max(c):.2f}] | {statistics.median(p):.2f} [{min(p):.2f}–{max(p):.2f}] | "
                    f"{statistics.median(q):.3f} [{min(q):.2f}–{max(q):.2f}] | {'yes' if same[u] else 'NO'}, {worst[u]:.1e} |")
    table = "\n".join(rows)
    print(table)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "classify.json"), "w") as f:
            json.dump({"rounds": a.rounds, "ms_per_line": res, "labels_identical": same, "max_logit_diff": worst}, f, indent=1)
        with open(os.path.join(a.out, "classify.md"), "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
