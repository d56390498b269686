"""Summarises scripts/bench-core.sh's results.jsonl as Markdown tables.

Per configuration: the median over repeats of p50 and p99 (µs), the spread of
p50 over repeats [min–max], and — for configurations with a baseline — the
ratio to the baseline measured in the same repeat (raw floor of the same
transport and placement; the engine called directly for models), as the
median of the per-repeat ratios with their spread.
"""
import json
import statistics
import sys
from collections import OrderedDict

BASELINE = {
    "tensorwire unix": "raw unix",
    "tensorwire tcp": "raw tcp",
    "tensorwire tcp?nodelay=0": "raw tcp",
    "digits inproc": "digits local (engine, no transport)",
    "digits unix": "digits local (engine, no transport)",
    "digits tcp": "digits local (engine, no transport)",
}
TITLES = {
    "unpinned": "Empty request (64 B each way) through `identity`, processes unpinned",
    "same-core": "Empty request, agent and client pinned to the same core",
    "cross-core": "Empty request, agent (and raw echo peer) on CPU 0, client on CPU 1",
    "nagle": "Nagle: a message written in two parts vs tensorwire's one vectored write (32 B tensor)",
    "model": "digits MLP (ONNX Runtime, batch 1): engine called directly vs through each transport",
    "vision": "Vision models (ONNX Runtime, batch 1, 2 intra-op threads): engine called directly vs through each transport",
}


def baseline_of(group: str, label: str) -> str:
    """The label of the baseline a row is compared with (same repeat)."""
    if group == "vision" and not label.endswith(" local"):
        return label.split(" ")[0] + " local"
    return BASELINE.get(label, "")


def classify_table(path: str) -> None:
    """The vAccel classifier table over repeats: medians and spreads."""
    rows: "OrderedDict[str, list[dict]]" = OrderedDict()
    for line in open(path):
        r = json.loads(line)
        rows.setdefault(r["config"], []).append(r)
    print("\n### Tweet classifier (MiniLM-L6 zero-shot, 100 lines, batch 1, 2 intra-op threads)\n")
    print("| configuration | repeats | first ms (median) | avg ms after 4th (median, spread) | tax ms (mean-based) | tax % | median-line ms | tax ms (median-based, spread) | identical |")
    print("|---|---|---|---|---|---|---|---|---|")
    med = statistics.median
    for config, rs in rows.items():
        avg = [r["avg_ms"] for r in rs]
        mtax = [r["median_tax_ms"] for r in rs]
        print(f"| {config} | {len(rs)} | {med(r['first_ms'] for r in rs):.2f} | "
              f"{med(avg):.3f} ({min(avg):.3f}–{max(avg):.3f}) | {med(r['tax_ms'] for r in rs):+.3f} | "
              f"{med(r['tax_pct'] for r in rs):+.1f}% | {med(r['median_ms'] for r in rs):.3f} | "
              f"{med(mtax):+.3f} ({min(mtax):+.3f}–{max(mtax):+.3f}) | "
              f"{'yes' if all(r['identical'] for r in rs) else 'NO'} |")


def main() -> None:
    if "--classify" in sys.argv:
        classify_table(sys.argv[sys.argv.index("--classify") + 1])
    runs: "OrderedDict[tuple[str, str], dict[int, dict]]" = OrderedDict()
    for line in open(sys.argv[1]):
        r = json.loads(line)
        runs.setdefault((r["group"], r["label"]), {})[r["repeat"]] = r
    for group, title in TITLES.items():
        rows = [(label, reps) for (g, label), reps in runs.items() if g == group]
        if not rows:
            continue
        print(f"\n### {title}\n")
        print("| configuration | n × repeats | p50 µs | p50 spread | p99 µs | vs baseline, same repeat (p50 ratio, spread) | tax µs (p50) |")
        print("|---|---|---|---|---|---|---|")
        for label, reps in rows:
            p50s = [r["p50_us"] for r in reps.values()]
            p99 = statistics.median(r["p99_us"] for r in reps.values())
            cmp = tax = ""
            base_label = baseline_of(group, label)
            base = runs.get((group, base_label))
            if base:
                pairs = [(reps[k]["p50_us"], base[k]["p50_us"]) for k in reps if k in base]
                ratios = [a / b for a, b in pairs]
                cmp = (f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) "
                       f"{base_label.split(' (')[0]}")
                tax = f"{statistics.median(a - b for a, b in pairs):+.1f}"
            n = next(iter(reps.values()))["count"]
            print(f"| {label} | {n} × {len(reps)} | {statistics.median(p50s):.2f} | "
                  f"{min(p50s):.2f}–{max(p50s):.2f} | {p99:.2f} | {cmp} | {tax} |")


if __name__ == "__main__":
    main()
