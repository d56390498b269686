#!/usr/bin/env python3
"""What TLS costs a native request (docs/BENCHMARKS.md, "TLS"): one agent
listening on tcp://127.0.0.1 and tls://127.0.0.1 at once (same process,
same model, same session code: only the listener differs), and
`tensorwire ping` against each, for an empty request and a 1 MiB one
through `identity` (the tensor crosses both ways).

Each round runs every (size, transport) in an order rotated by the
round's number, so machine drift spreads over all of them. Prints per
size and transport the p50 (median over rounds [min-max]) and the median
p99, and for tls the per-round ratio and difference of p50s against tcp
in the same round. Certificates (a CA and the agent's, ECDSA P-256) are
made with the `openssl` command in a temporary directory.

  python3 scripts/bench-tls.py --bin target/release/tensorwire --rounds 10 -n 5000 \\
      --out docs/bench/tls
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile

SIZES = [("empty", 0), ("1 MiB", 1 << 20)]


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(tmp):
    """A CA and a certificate for localhost signed by it; returns (ca, cert, key)."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=tensorwire bench CA", cwd=tmp)
    openssl("req", *ec, "-keyout", "agent.key", "-out", "agent.csr", "-subj", "/CN=localhost",
            cwd=tmp)
    with open(os.path.join(tmp, "ext.cnf"), "w") as f:
        f.write("subjectAltName=DNS:localhost\nbasicConstraints=critical,CA:FALSE\n")
    openssl("x509", "-req", "-in", "agent.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "agent.pem", "-days", "2", "-extfile", "ext.cnf", cwd=tmp)
    return tuple(os.path.join(tmp, n) for n in ("ca.pem", "agent.pem", "agent.key"))


def start(bin_path, cert, key):
    args = [bin_path, "serve", "--grace", "1", "--listen", "tcp://127.0.0.1:0",
            "--listen", "tls://127.0.0.1:0", "--tls-cert", cert, "--tls-key", key]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    uris = []
    while len(uris) < 2:
        line = p.stdout.readline()
        if not line:
            raise SystemExit(f"{args} exited")
        if line.startswith("listening on "):
            uris.append(line.split()[-1])
    return p, {u.split("://")[0]: u for u in uris}


def ping(bin_path, uri, size, n):
    out = subprocess.run(
        [bin_path, "ping", "--connect", uri, "-n", str(n), "--warmup", str(max(n // 10, 100)),
         "--size", str(size), "--json"],
        check=True, capture_output=True, text=True, timeout=600,
    ).stdout
    s = json.loads(out)
    return s["p50_us"], s["p99_us"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/tensorwire")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("-n", type=int, default=5000, help="round trips per measurement (1 MiB: n/10)")
    ap.add_argument("--out", help="directory for results.json")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tw-bench-tls-")
    ca, cert, key = make_pki(tmp)
    agent, uris = start(a.bin, cert, key)
    targets = {"tcp": uris["tcp"], "tls": f"{uris['tls']}?ca={ca}&name=localhost"}
    rows = [(label, size, t) for label, size in SIZES for t in targets]
    res = {r: [] for r in rows}
    try:
        for rnd in range(a.rounds):
            k = rnd % len(rows)
            for label, size, t in rows[k:] + rows[:k]:
                n = a.n if size == 0 else max(a.n // 10, 100)
                res[(label, size, t)].append(ping(a.bin, targets[t], size, n))
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=20)
    print(f"{a.rounds} rounds; one client, nothing pinned; identity, the tensor both ways; µs")
    print("| request | transport | p50: median [min–max] over rounds | p99: median "
          "| p50 tls / tcp, per round: median [min–max] | p50 tls − tcp, µs: median [min–max] |")
    print("|---|---|---|---|---|---|")
    summary = []
    for label, size in SIZES:
        for t in targets:
            p50 = [x[0] for x in res[(label, size, t)]]
            p99 = [x[1] for x in res[(label, size, t)]]
            ratio = diff = ""
            row = {"request": label, "bytes": size, "transport": t, "p50_us": p50, "p99_us": p99}
            if t == "tls":
                pairs = list(zip(res[(label, size, "tls")], res[(label, size, "tcp")]))
                r = [x / y for (x, _), (y, _) in pairs]
                d = [x - y for (x, _), (y, _) in pairs]
                ratio = f"{statistics.median(r):.2f}× [{min(r):.2f}–{max(r):.2f}]"
                diff = f"{statistics.median(d):.1f} [{min(d):.1f}–{max(d):.1f}]"
                row["ratio_per_round"] = r
            summary.append(row)
            print(f"| {label} | {t} | {statistics.median(p50):.2f} [{min(p50):.2f}–{max(p50):.2f}] "
                  f"| {statistics.median(p99):.2f} | {ratio} | {diff} |")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump({"rounds": a.rounds, "n": a.n, "rows": summary}, f, indent=1)


if __name__ == "__main__":
    main()
