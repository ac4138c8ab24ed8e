"""Plot ``benchmarks/index_lookup.py``'s sweep: lookup time per mode vs batch size (log-log).

    python benchmarks/index_lookup.py | tee /tmp/index_lookup.txt
    python benchmarks/plot_index_lookup.py /tmp/index_lookup.txt [-o docs/img/index_lookup.png]

Reads the last line of the file that parses as a JSON object (the benchmark's result line).
Needs matplotlib, which is not a runtime dependency (``pip install matplotlib``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from results import load_result  # benchmarks/ is on sys.path when run as a script

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "index_lookup.png"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", type=Path, help="output of benchmarks/index_lookup.py (or just its JSON line)")
    ap.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = load_result(args.result)
    sweep = sorted(res["sweep"], key=lambda r: r["keys"])
    keys = [r["keys"] for r in sweep]

    fig, ax = plt.subplots(figsize=(8, 5.2), dpi=120)
    ax.plot(keys, [r["seek_ms"] for r in sweep], "o-", color="tab:blue", lw=2, label="seek (binary search per block)")
    ax.plot(keys, [r["scan_ms"] for r in sweep], "s-", color="tab:red", lw=2, label="scan (read all, hash join)")
    ax.plot(keys, [r["auto_ms"] for r in sweep], "x--", color="black", ms=9, lw=1.2, label="auto (as chosen)")
    if all("hash_ms" in r for r in sweep):
        ax.plot(keys, [r["hash_ms"] for r in sweep], ":", color="tab:gray", lw=1.5,
                label="hashing the batch alone (XXH3-128)")
    # the goals and RFC-08's HFile figure at 100k keys
    ax.axhline(60, color="tab:green", lw=0.8, ls="-.")
    ax.annotate("goal: 100k keys <= 60 ms", (keys[0], 60), textcoords="offset points", xytext=(2, 4),
                color="tab:green", fontsize=8)
    if 100_000 in keys:
        ax.plot([100_000], [600], "D", color="tab:orange", label="RFC-08 HFile, 100k keys (~600 ms)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("keys looked up in one batch")
    ax.set_ylabel("lookup time, median (ms)")
    ax.set_title(
        f"Record-index lookup, one bucket of {res['entries']:,} UUID keys "
        f"({res['bytes_per_entry']:.1f} B/entry)\n"
        f"{res['cpu_count']} cpus {res.get('cpu_model', '')}, python {res['python']}, "
        f"pyarrow {res['pyarrow']}, numpy {res['numpy']}",
        fontsize=9.5,
    )
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.15)
    for r in sweep:  # scan/seek ratio above each point
        ax.annotate(f"{r['scan_ms'] / r['seek_ms']:.1f}x", (r["keys"], r["scan_ms"]), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize=7.5, color="tab:red")
    ax.legend(loc="lower right", fontsize=8.5)
    fig.text(0.99, 0.01, "red labels: scan time / seek time", ha="right", fontsize=7.5, color="tab:red")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
