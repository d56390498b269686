#!/usr/bin/env python3
"""What tenants cost the agent, and whether it charges them right
(docs/BENCHMARKS.md, "Tenants").

1. CPU accounting against /proc: an agent with a tenants file (this uid's
   tenant, every model) serves one client's requests for `--seconds`
   (`tensorwire ping`: empty `identity` requests, or `--model digits` with
   seeded inputs) over shm and unix. The agent's CPU time is read from
   /proc/PID/stat (utime + stime) before and after; the tenant's from the
   agent's Prometheus metrics (`tensorwire_tenant_cpu_seconds_total`). The
   ratio tenant / process says how much of the agent's work the tenant was
   charged (the rest: accept threads, the reaper, the metrics listener,
   the reactor's monitor).
2. Memory per idle tenant session: `tensorwire hold --clients N` opens N
   sessions (Hello, one request, then idle) with a token, against an agent
   with a tenants file and one without; RSS before and while they are held.

  python3 scripts/bench-tenants.py --bin target/release/tensorwire --rounds 5 --seconds 3
"""

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
import urllib.request
import uuid

CLK_TCK = os.sysconf("SC_CLK_TCK")


def start(bin_path, tmp, tag, extra):
    uris = {
        "shm": f"shm://bench-tenants-{tag}-{uuid.uuid4().hex[:8]}",
        "unix": f"unix://{tmp}/{tag}.sock",
    }
    args = [
        bin_path, "serve", "--grace", "1", "--listen", uris["shm"], "--listen", uris["unix"],
        "--metrics-listen", "http://127.0.0.1:0",
        "--model", "digits=models/build/digits_mlp.onnx", "--max-connections-per-peer", "4096",
        *extra,
    ]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    metrics = None
    seen = 0
    while seen < 2 or metrics is None:
        line = p.stdout.readline()
        if not line:
            raise SystemExit(f"{args} exited")
        seen += line.startswith("listening on ")
        if line.startswith("metrics on "):
            metrics = line.split()[-1]
    return p, uris, metrics


def proc_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise SystemExit("no VmRSS")


def tenant_cpu_s(metrics, tenant):
    text = urllib.request.urlopen(f"{metrics}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("tensorwire_tenant_cpu_seconds_total{") and f'tenant="{tenant}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise SystemExit(f"no cpu metric for tenant {tenant}")


def ping_for(bin_path, uri, seconds, model):
    """Runs ping long enough to last about `seconds`."""
    args = [bin_path, "ping", "--connect", uri, "--json", "-n"]
    n = 20000 if model == "identity" else 2000
    extra = [] if model == "identity" else ["--model", model]
    t = time.monotonic()
    subprocess.run(args + [str(n), *extra], check=True, capture_output=True, timeout=300)
    per = (time.monotonic() - t) / n
    n = max(1000, int(seconds / per))
    out = subprocess.run(args + [str(n), *extra], check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/tensorwire")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sessions", type=int, default=1000)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tw-tenants-")
    token = "bench-token"
    tenants = os.path.join(tmp, "tenants.toml")
    with open(tenants, "w") as f:
        f.write(
            f'[[tenant]]\nname = "me"\nuids = [{os.getuid()}]\nmodels = ["*"]\n\n'
            f'[[tenant]]\nname = "token"\ntokens_sha256 = ["{hashlib.sha256(token.encode()).hexdigest()}"]\n'
            f'models = ["*"]\n'
        )
    agent, uris, metrics = start(a.bin, tmp, "t", ["--tenants", tenants])
    cases = [(t, m) for t in ("shm", "unix") for m in ("identity", "digits")]
    acc = {c: [] for c in cases}
    try:
        for rnd in range(a.rounds):
            k = rnd % len(cases)
            for t, m in cases[k:] + cases[:k]:
                p0, c0 = proc_cpu_s(agent.pid), tenant_cpu_s(metrics, "me")
                ping_for(a.bin, uris[t], a.seconds, m)
                # The last turn is charged when the session ends.
                time.sleep(0.3)
                p1, c1 = proc_cpu_s(agent.pid), tenant_cpu_s(metrics, "me")
                acc[(t, m)].append((c1 - c0, p1 - p0))
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=20)
    print(f"CPU accounting: {a.rounds} rounds of ~{a.seconds} s, one client; agent CPU from /proc/PID/stat")
    print("| transport | model | tenant CPU s (median) | agent process CPU s (median) | tenant / process (median [min–max]) |")
    print("|---|---|---|---|---|")
    for t, m in cases:
        r = [c / p for c, p in acc[(t, m)] if p > 0]
        print(
            f"| {t} | {m} | {statistics.median(c for c, _ in acc[(t, m)]):.3f} "
            f"| {statistics.median(p for _, p in acc[(t, m)]):.3f} "
            f"| {statistics.median(r):.3f} [{min(r):.3f}–{max(r):.3f}] |"
        )

    print()
    print(f"Memory: {a.sessions} idle sessions held over unix (Hello, one request, then idle)")
    print("| agent | RSS before KiB | RSS holding KiB | per session KiB (median [min–max]) |")
    print("|---|---|---|---|")
    per = {"tenants file, token": [], "no tenants file": []}
    rss = {k: [] for k in per}
    for rnd in range(max(1, a.rounds // 2)):
        for name in (list(per) if rnd % 2 == 0 else list(per)[::-1]):
            extra = ["--tenants", tenants] if name.startswith("tenants") else []
            p, u, _ = start(a.bin, tmp, f"m{rnd}", extra)
            try:
                time.sleep(0.5)
                before = rss_kib(p.pid)
                env = dict(os.environ, TENSORWIRE_TOKEN=token) if extra else os.environ
                h = subprocess.Popen(
                    [a.bin, "hold", "--connect", u["unix"], "--clients", str(a.sessions), "--seconds", "4"],
                    stdout=subprocess.PIPE, text=True, env=env,
                )
                line = h.stdout.readline()
                if not line.startswith(f"holding {a.sessions} "):
                    raise SystemExit(f"hold: {line}")
                time.sleep(1.0)
                holding = rss_kib(p.pid)
                h.wait(timeout=60)
            finally:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=20)
            per[name].append((holding - before) / a.sessions)
            rss[name].append((before, holding))
    for name, v in per.items():
        b = statistics.median(x for x, _ in rss[name])
        hld = statistics.median(y for _, y in rss[name])
        print(f"| {name} | {b:.0f} | {hld:.0f} | {statistics.median(v):.1f} [{min(v):.1f}–{max(v):.1f}] |")


if __name__ == "__main__":
    main()
