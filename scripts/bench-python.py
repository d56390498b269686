#!/usr/bin/env python3
"""The Python client next to the Rust client, same agent, same run
(docs/BENCHMARKS.md, "Python client").

One agent (`tensorwire serve`, release build) listens on shm, unix and tcp.
Each *round* measures, in an order rotated by the round's number so machine
drift spreads over all of them:

- for each transport, the empty request through `identity`: the Rust client
  (`tensorwire ping --connect URI -n N`, its own process) and the Python
  client (`python3 -c ...`: `m.infer({})` N times, each timed with
  `time.perf_counter_ns`, in its own process); both poll 200 µs before they
  block (ping's default, passed to the Python client as `spin_us=200`);
- the figure users compare with: the same empty request from Python through
  `tritonclient.grpc` (KServe v2 `ModelInfer`), to the agent's own gRPC
  front door (`serve --listen grpc://…`: through the agent's queues) and to
  the bench's tonic gRPC peer (`tensorwire peer-serve --peer grpc`: the same
  stack calling the engine directly), tcp (skipped if tritonclient is
  absent);
- over shm, the identity model with a 1 KiB and a 16 MiB `c.empty` buffer
  (sent where it lies; the identity's output is the same memory): Python
  p50 per size, the ratio 16 MiB / 1 KiB says whether anything was copied.

Nothing is pinned (what a user gets). Prints a table and writes
`results.json` and `table.md` to --out.

  python3 scripts/bench-python.py --bin target/release/tensorwire \\
      --rounds 10 -n 20000 --out docs/bench/python
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

PY_EMPTY = r"""
import json, sys, time, tensorwire as tw
uri, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = tw.connect(uri, spin_us=200).model("identity")
for _ in range(warm):
    m.infer({})
t = []
clock = time.perf_counter_ns
for _ in range(n):
    a = clock(); m.infer({}); t.append(clock() - a)
t.sort()
print(json.dumps({"p50_us": t[len(t) // 2] / 1e3, "p99_us": t[len(t) * 99 // 100] / 1e3,
                  "mean_us": sum(t) / len(t) / 1e3}))
"""

PY_TRITON = r"""
import json, sys, time, tritonclient.grpc as grpcclient
addr, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = grpcclient.InferenceServerClient(addr)
for _ in range(warm):
    c.infer("identity", [])
t = []
clock = time.perf_counter_ns
for _ in range(n):
    a = clock(); c.infer("identity", []); t.append(clock() - a)
t.sort()
print(json.dumps({"p50_us": t[len(t) // 2] / 1e3, "p99_us": t[len(t) * 99 // 100] / 1e3,
                  "mean_us": sum(t) / len(t) / 1e3}))
"""

PY_SIZES = r"""
import json, sys, time, numpy as np, tensorwire as tw
uri, n = sys.argv[1], int(sys.argv[2])
c = tw.connect(uri, spin_us=200)
m = c.model("identity")
out = {}
for size in (1 << 10, 16 << 20):
    buf = c.empty(size, np.uint8)
    buf[:] = 1
    copied = c.copy_stats()["input_bytes_copied"]
    reps = n if size <= 1 << 10 else max(n // 10, 200)
    for _ in range(200):
        m.infer({"t": buf})
    t = []
    clock = time.perf_counter_ns
    for _ in range(reps):
        a = clock(); r = m.infer({"t": buf}); t.append(clock() - a)
    assert r["t"].ctypes.data == buf.ctypes.data  # the output is the input's memory
    t.sort()
    out[str(size)] = {"p50_us": t[len(t) // 2] / 1e3, "p99_us": t[len(t) * 99 // 100] / 1e3,
                      "copied": c.copy_stats()["input_bytes_copied"] - copied, "n": reps}
print(json.dumps(out))
"""


def start_agent(binary, workdir, tag):
    uris = [f"shm://twpy{os.getpid()}-{tag}", "unix://" + os.path.join(workdir, "a.sock"), "tcp://127.0.0.1:0",
            "grpc://127.0.0.1:0"]
    args = [binary, "serve"]
    for u in uris:
        args += ["--listen", u]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    got = {}
    deadline = time.monotonic() + 30
    while len(got) < 4 and time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("listening on "):
            u = line.split()[-1]
            got[u.split(":")[0]] = u
    if len(got) < 4:
        p.kill()
        sys.exit("the agent did not start")
    return p, got


def start_grpc_peer(binary):
    """The bench's KServe v2 gRPC peer on a free loopback port, or None."""
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    p = subprocess.Popen([binary, "peer-serve", "--peer", "grpc", "--listen", f"tcp://127.0.0.1:{port}"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    if not line.startswith("listening on"):
        p.kill()
        return None, None
    return p, f"127.0.0.1:{port}"


def run_json(args, out_file):
    with open(out_file, "w") as f:
        subprocess.run(args, stdout=f, stderr=subprocess.DEVNULL, check=True, timeout=600)
    with open(out_file) as f:
        return json.loads(f.read())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/tensorwire")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="twpy")
    agent, uris = start_agent(a.bin, work, "b")
    try:
        import tritonclient.grpc  # noqa: F401

        peer, peer_addr = start_grpc_peer(a.bin)
    except ImportError:
        print("tritonclient is not installed: no KServe gRPC row", file=sys.stderr)
        peer, peer_addr = None, None
    tmp = os.path.join(work, "out.json")
    rows = {}  # key -> list of per-round dicts
    try:
        jobs = []
        for t in ("shm", "unix", "tcp"):
            jobs.append(("rust", t))
            jobs.append(("python", t))
        jobs.append(("python-sizes", "shm"))
        if peer_addr:
            jobs.append(("tritonclient", "tcp"))
            jobs.append(("tritonclient", "grpc"))
        for r in range(a.rounds):
            k = r % len(jobs)
            for who, t in jobs[k:] + jobs[:k]:
                if who == "rust":
                    res = run_json([a.bin, "ping", "--connect", uris[t], "-n", str(a.n), "--json"], tmp)
                elif who == "python":
                    res = run_json([a.python, "-c", PY_EMPTY, uris[t], str(a.n), "1000"], tmp)
                elif who == "tritonclient":
                    addr = peer_addr if t == "tcp" else uris["grpc"][len("grpc://"):]
                    res = run_json([a.python, "-c", PY_TRITON, addr, str(max(a.n // 10, 1000)), "200"], tmp)
                else:
                    res = run_json([a.python, "-c", PY_SIZES, uris[t], str(a.n)], tmp)
                rows.setdefault(f"{who}/{t}", []).append(res)
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
        if peer:
            peer.kill()
            peer.wait(timeout=30)

    def med(key, field):
        v = [x[field] for x in rows[key]]
        return statistics.median(v), min(v), max(v)

    lines = [
        "| transport | client | p50 µs: median [min–max] over rounds | p99 µs median | Python − Rust p50 | Python / Rust |",
        "|---|---|---|---|---|---|",
    ]
    summary = {}
    for t in ("shm", "unix", "tcp"):
        rp50 = med(f"rust/{t}", "p50_us")
        pp50 = med(f"python/{t}", "p50_us")
        rp99 = med(f"rust/{t}", "p99_us")[0]
        pp99 = med(f"python/{t}", "p99_us")[0]
        # Per-round differences: the two ran minutes apart at most.
        diffs = [p["p50_us"] - r["p50_us"] for p, r in zip(rows[f"python/{t}"], rows[f"rust/{t}"])]
        ratios = [p["p50_us"] / r["p50_us"] for p, r in zip(rows[f"python/{t}"], rows[f"rust/{t}"])]
        d, q = statistics.median(diffs), statistics.median(ratios)
        summary[t] = {"rust_p50": rp50, "python_p50": pp50, "diff_us": d, "ratio": q}
        lines.append(f"| {t} | Rust (`tensorwire ping`) | {rp50[0]:.2f} [{rp50[1]:.2f}–{rp50[2]:.2f}] | {rp99:.2f} | | |")
        lines.append(
            f"| {t} | Python (`m.infer({{}})`) | {pp50[0]:.2f} [{pp50[1]:.2f}–{pp50[2]:.2f}] | {pp99:.2f} | "
            f"+{d:.2f} µs [{min(diffs):+.2f}–{max(diffs):+.2f}] | {q:.2f}× [{min(ratios):.2f}–{max(ratios):.2f}] |"
        )
    if "tritonclient/tcp" in rows:
        pyt = summary["tcp"]["python_p50"][0]
        for key, what in (("tritonclient/grpc", "agent's gRPC front door (`serve --listen grpc://`)"),
                          ("tritonclient/tcp", "tonic peer (`peer-serve --peer grpc`)")):
            tp50 = med(key, "p50_us")
            tp99 = med(key, "p99_us")[0]
            lines.append(
                f"| tcp | Python `tritonclient.grpc` → KServe v2 gRPC, {what} | {tp50[0]:.2f} [{tp50[1]:.2f}–{tp50[2]:.2f}] | "
                f"{tp99:.2f} | | {tp50[0] / pyt:.1f}× tensorwire Python tcp |"
            )
            summary[key] = {"p50": tp50}
        front = [f["p50_us"] / p["p50_us"] for f, p in zip(rows["tritonclient/grpc"], rows["tritonclient/tcp"])]
        lines.append(f"| | front door / tonic peer, per round | {statistics.median(front):.2f}× [{min(front):.2f}–{max(front):.2f}] | | | |")
    small = [x["1024"]["p50_us"] for x in rows["python-sizes/shm"]]
    big = [x[str(16 << 20)]["p50_us"] for x in rows["python-sizes/shm"]]
    ratio = [b / s for b, s in zip(big, small)]
    copied = sum(x["1024"]["copied"] + x[str(16 << 20)]["copied"] for x in rows["python-sizes/shm"])
    lines += [
        "",
        "| shm, identity, `c.empty` buffer | p50 µs: median [min–max] | p99 µs median | bytes copied (all rounds) |",
        "|---|---|---|---|",
        f"| 1 KiB | {statistics.median(small):.2f} [{min(small):.2f}–{max(small):.2f}] | "
        f"{statistics.median(x['1024']['p99_us'] for x in rows['python-sizes/shm']):.2f} | |",
        f"| 16 MiB | {statistics.median(big):.2f} [{min(big):.2f}–{max(big):.2f}] | "
        f"{statistics.median(x[str(16 << 20)]['p99_us'] for x in rows['python-sizes/shm']):.2f} | {copied} |",
        f"| 16 MiB / 1 KiB | {statistics.median(ratio):.2f}× [{min(ratio):.2f}–{max(ratio):.2f}] | | |",
    ]
    write_results(a.out, "\n".join(lines), {"rounds": a.rounds, "n": a.n, "runs": rows, "summary": summary})


def write_results(out, table, results):
    """Prints `table`; with `out`, writes results.json and table.md there."""
    print(table)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(out, "table.md"), "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
