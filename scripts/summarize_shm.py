"""Summarises scripts/bench-shm.sh's results.jsonl as Markdown tables.

Medians over repeats of p50/p99, spreads of p50 over repeats, and ratios
computed within one repeat (tensorwire vs the raw floor of its transport;
each size vs the same transport's 1 KiB figure).
"""
import json
import statistics
import sys
from collections import OrderedDict

med = statistics.median


def main() -> None:
    runs: "OrderedDict[tuple[str, str], dict[int, dict]]" = OrderedDict()
    extra = []
    for line in open(sys.argv[1]):
        r = json.loads(line)
        if "label" in r:
            runs.setdefault((r["group"], r["label"]), {})[r["repeat"]] = r
        else:
            extra.append(r)

    print("\n### Empty request: tensorwire over shm vs the raw floor (same run)\n")
    print("| configuration | n × repeats | p50 µs | p50 spread | p99 µs | ratio to raw floor (p50, per repeat) |")
    print("|---|---|---|---|---|---|")
    base = {"tensorwire shm": "raw shm", "tensorwire unix": "raw unix"}
    for (g, label), reps in runs.items():
        if g != "empty":
            continue
        p50 = [r["p50_us"] for r in reps.values()]
        ratio = ""
        if label in base and ("empty", base[label]) in runs:
            b = runs[("empty", base[label])]
            rs = [reps[k]["p50_us"] / b[k]["p50_us"] for k in reps if k in b]
            ratio = f"{med(rs):.1f}× ({min(rs):.1f}–{max(rs):.1f})"
        print(f"| {label} | {next(iter(reps.values()))['count']} × {len(reps)} | {med(p50):.3f} | "
              f"{min(p50):.3f}–{max(p50):.3f} | {med(r['p99_us'] for r in reps.values()):.3f} | {ratio} |")

    print("\n### Round trip vs tensor size through `identity` (p50 µs, median over repeats; × = vs 1 KiB, same transport)\n")
    sizes = sorted({int(l.split()[1]) for (g, l) in runs if g.startswith("size-")})
    names = {1024: "1 KiB", 1 << 20: "1 MiB", 16 << 20: "16 MiB", 64 << 20: "64 MiB"}
    print("| transport | " + " | ".join(names.get(s, str(s)) for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for t in ["shm", "unix", "tcp"]:
        cells = []
        first = runs.get((f"size-{t}", f"{t} {sizes[0]}")) if sizes else None
        for s in sizes:
            reps = runs.get((f"size-{t}", f"{t} {s}"))
            if not reps:
                cells.append("")
                continue
            p = med(r["p50_us"] for r in reps.values())
            rat = ""
            if first:
                rs = [reps[k]["p50_us"] / first[k]["p50_us"] for k in reps if k in first]
                rat = f" ({med(rs):.2f}×, p99 {med(r['p99_us'] for r in reps.values()):.1f})"
            cells.append(f"{p:.1f}{rat}")
        print(f"| {t} | " + " | ".join(cells) + " |")

    for r in extra:
        if r["group"] == "idle":
            print(f"\nAgent CPU over {r['seconds']} s with {r['clients']} idle connected shm clients: "
                  f"**{r['cpu_pct']} %** ({r['ticks']} clock ticks).")
        if r["group"] == "rss":
            print(f"\nAgent memory per additional connected shm client ({r['clients']} clients): "
                  f"private (RssAnon) **{r['anon_kib_per_client']} KiB**, shared arena pages touched "
                  f"(RssShmem) {r['shmem_kib_per_client']} KiB; RssAnon {r['anon_before_kib']} → {r['anon_with_kib']} KiB.")


if __name__ == "__main__":
    main()
