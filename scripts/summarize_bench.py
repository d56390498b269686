"""Summarises scripts/bench-core.sh's results.jsonl as Markdown tables.

For each configuration: the median over repeats of p50 and p99 (µs), the
spread of p50 over repeats [min–max], and ratios against the baseline of its
group measured in the same run (raw floor of the same transport; the engine
called directly for models).
"""
import json
import statistics
import sys
from collections import OrderedDict


def main() -> None:
    rows: "OrderedDict[tuple[str, str], list[dict]]" = OrderedDict()
    for line in open(sys.argv[1]):
        r = json.loads(line)
        rows.setdefault((r["group"], r["label"]), []).append(r)

    def med(group: str, label: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[(group, label)])

    baseline = {
        "tensorwire unix": ("empty", "raw unix"),
        "tensorwire tcp": ("empty", "raw tcp"),
        "tensorwire tcp?nodelay=0": ("empty", "raw tcp"),
        "tensorwire inproc": None,
        "digits inproc": ("model", "digits local (engine, no transport)"),
        "digits unix": ("model", "digits local (engine, no transport)"),
        "digits tcp": ("model", "digits local (engine, no transport)"),
    }
    groups = {
        "empty": "Empty request (64 B header each way) through `identity`",
        "nagle": "Nagle: a message written in two parts vs one vectored write",
        "model": "digits MLP (ONNX Runtime, batch 1): engine called directly vs through each transport",
    }
    for g, title in groups.items():
        print(f"\n### {title}\n")
        print("| configuration | n × repeats | p50 µs (median) | p50 spread | p99 µs (median) | mean µs | vs baseline (p50) | tax µs (p50) |")
        print("|---|---|---|---|---|---|---|---|")
        for (group, label), rs in rows.items():
            if group != g:
                continue
            p50s = [r["p50_us"] for r in rs]
            base = baseline.get(label)
            ratio = tax = ""
            if base and base in rows:
                b = med(*base, "p50_us")
                ratio = f"{statistics.median(p50s) / b:.2f}× {base[1].split(' (')[0]}"
                tax = f"{statistics.median(p50s) - b:+.1f}"
            print(
                f"| {label} | {rs[0]['count']} × {len(rs)} | {statistics.median(p50s):.2f} | "
                f"{min(p50s):.2f}–{max(p50s):.2f} | {med(group, label, 'p99_us'):.2f} | "
                f"{med(group, label, 'mean_us'):.2f} | {ratio} | {tax} |"
            )


if __name__ == "__main__":
    main()
