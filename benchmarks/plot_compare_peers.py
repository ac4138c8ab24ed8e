"""Plot ``benchmarks/compare_peers.py``: upsert time per contender, per case, cold and warm.

    python benchmarks/compare_peers.py --json-out /tmp/cp.json
    python benchmarks/plot_compare_peers.py /tmp/cp.json [/tmp/cp10m.json ...] [-o docs/img/compare_peers.png]

One panel per (table size, case); bars per contender, cold (whole process) and warm (in a
running session, or in-process for the Arrow engine; over Spark Connect for the ``connect``
contender). Several result files (e.g. one run per table size) are drawn together. Log scale:
the contenders span three orders of magnitude. Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from results import load_result  # benchmarks/ is on sys.path when run as a script

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "compare_peers.png"
ORDER = ["delta_rs", "pyiceberg", "plain_spark", "bucketindex_record", "bucketindex_bucket",
         "bucketindex_record_mor", "bucketindex_bucket_mor", "bucketindex_record_connect",
         "bucketindex_record_arrow", "bucketindex_record_mor_arrow", "bucketindex_bucket_arrow",
         "bucketindex_record_mor_auto"]
LABEL = {"delta_rs": "delta-rs", "pyiceberg": "pyiceberg", "plain_spark": "plain Spark",
         "bucketindex_record": "bi record", "bucketindex_bucket": "bi bucket", "bucketindex_record_mor": "bi record MOR",
         "bucketindex_bucket_mor": "bi bucket MOR", "bucketindex_record_connect": "bi record\nConnect",
         "bucketindex_record_arrow": "bi record\narrow", "bucketindex_record_mor_arrow": "bi record MOR\narrow",
         "bucketindex_bucket_arrow": "bi bucket\narrow", "bucketindex_record_mor_auto": "bi record MOR\nauto"}
MODE_COLOR = {"cold": "#9ecae1", "warm": "#08519c", "connect": "#fd8d3c"}


def rows_label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("result", type=Path, nargs="+", help="compare_peers output(s) (or --json-out files)")
    p.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    results = [load_result(r) for r in args.result]
    res = results[0]
    figs = [f for r in results for f in r["figures"] if f.get("time_s")]
    panels = sorted({(f["size"], f["case"]) for f in figs}, key=lambda x: (x[0], x[1]))
    contenders = [c for c in ORDER if any(f["contender"] == c for f in figs)]
    ncol = 3
    nrow = (len(panels) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.6 * nrow), squeeze=False)
    for ax, (size, case) in zip(axes.flat, panels):
        for i, c in enumerate(contenders):
            for j, mode in enumerate(("cold", "warm", "connect")):
                f = next((f for f in figs if (f["size"], f["case"], f["contender"], f["mode"]) == (size, case, c, mode)),
                         None)
                if f is None:
                    continue
                x = i + (j - 0.5) * 0.4 if mode != "connect" else i
                ax.bar(x, f["time_s"], width=0.38, color=MODE_COLOR[mode], label=mode)
                if f.get("engine") and f["contender"].endswith("_auto"):  # which engine auto chose
                    ax.annotate(f["engine"], (x, f["time_s"]), ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_xticks(range(len(contenders)))
        ax.set_xticklabels([LABEL[c] for c in contenders], rotation=45, ha="right", fontsize=8)
        ax.set_title(f"{rows_label(size)} rows, {case.replace('_', ' ')}", fontsize=10)
        ax.set_ylabel("upsert time, s (log)")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    fig.legend(uniq.values(), [{"cold": "cold (new process)", "warm": "warm (in a session)",
                                "connect": "cold CLI over Spark Connect"}[k] for k in uniq], loc="upper center",
               bbox_to_anchor=(0.5, 0.985), ncol=3, frameon=False)
    env = res.get("env", {})
    loads = [x for r in results for x in (r.get("env", {}).get("load_avg_1m_at_start"),
                                          r.get("env", {}).get("load_avg_1m_at_end")) if x is not None]
    fig.suptitle(f"compare_peers.py at commit {env.get('commit', '?')} ({env.get('cores', '?')} cores"
                 + (f", load {min(loads):g}-{max(loads):g}" if loads else "") + ")", y=1.03, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(args.out, dpi=110, bbox_inches="tight")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
