"""Plot ``benchmarks/upsert_scaling.py``: tag time vs table size per index, and the phases of each run.

    python benchmarks/upsert_scaling.py | tee /tmp/upsert_scaling.log
    python benchmarks/plot_upsert_scaling.py /tmp/upsert_scaling.log [-o docs/img/upsert_scaling.png]

Reads the last line of the file that parses as a JSON object (the benchmark's result line).
Needs matplotlib, which is not a runtime dependency (``pip install matplotlib``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from results import load_result  # benchmarks/ is on sys.path when run as a script

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "upsert_scaling.png"
COLORS = {"record": "tab:blue", "bucket": "tab:green", "global_simple": "tab:red"}
MARKERS = {"record": "o", "bucket": "s", "global_simple": "^"}
PHASES = [("validate_ms", "validate", "#bbbbbb"), ("dedupe_ms", "dedupe", "#888888"), ("tag_ms", "tag", "tab:orange"),
          ("write_ms", "write (copy-on-write merge)", "tab:purple"), ("index_ms", "index deltas", "tab:cyan"),
          ("commit_ms", "commit", "black")]


def short(ix: str) -> str:
    return "global\nsimple" if ix == "global_simple" else ix


def rows_label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", type=Path, help="output of benchmarks/upsert_scaling.py (or just its JSON line)")
    ap.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401

    res = load_result(args.result)
    runs = res["runs"]
    indexes = [ix for ix in COLORS if any(r["index"] == ix for r in runs)]
    sizes = sorted({r["size"] for r in runs})
    by = {(r["index"], r["size"]): r for r in runs}

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.4), dpi=120, gridspec_kw={"width_ratios": [1, 1.35]})

    # left: tag time vs table size
    for ix in indexes:
        xs = [s for s in sizes if (ix, s) in by]
        ys = [by[(ix, s)]["tag_ms"] / 1000 for s in xs]
        growth = res.get(f"{ix}_tag_growth")
        label = f"{ix}" + (f"  (x{growth} from {rows_label(xs[0])} to {rows_label(xs[-1])})" if growth else "")
        ax1.plot(xs, ys, marker=MARKERS[ix], color=COLORS[ix], lw=2, ms=8, label=label)
        for x, y in zip(xs, ys):
            ax1.annotate(f"{y:.2f} s", (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8, color=COLORS[ix])
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax1.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax1.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax1.set_xticks(sizes)
    ax1.set_xticklabels([rows_label(s) for s in sizes])
    ax1.set_xlabel("table rows")
    ax1.set_ylabel("tag phase (s, log scale)")
    ax1.set_title(f"Tag time vs table size ({res['batch'] // 1000}k-record batch)")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8, loc="upper left")

    # right: phases per run, stacked
    labels, x = [], 0
    positions = []
    for s in sizes:
        for ix in indexes:
            if (ix, s) in by:
                positions.append((x, by[(ix, s)]))
                labels.append(f"{short(ix)}\n{rows_label(s)}")
                x += 1
        x += 0.6
    local = {(r["index"], r["size"]): r for r in res.get("local_runs", []) if r["size"] == sizes[-1]}
    for ix in indexes:
        if (ix, sizes[-1]) in local:
            positions.append((x, local[(ix, sizes[-1])]))
            labels.append(f"{short(ix)}\n{rows_label(sizes[-1])} local")
            x += 1
    for key, name, color in PHASES:
        bottoms = []
        for pos, r in positions:
            below = sum(r[k] for k, _, _ in PHASES[: [p[0] for p in PHASES].index(key)]) / 1000
            bottoms.append((pos, r[key] / 1000, below))
        ax2.bar([b[0] for b in bottoms], [b[1] for b in bottoms], bottom=[b[2] for b in bottoms], width=0.8,
                color=color, label=name)
    for pos, r in positions:
        ax2.text(pos, r["wall_ms"] / 1000 * 1.01, f"{r['wall_ms'] / 1000:.1f}", ha="center", va="bottom", fontsize=8)
    ax2.set_xticks([p for p, _ in positions])
    ax2.set_xticklabels(labels, fontsize=8)
    ax2.set_ylabel("seconds (wall time of run_upsert on top)")
    speed = res.get("record_speedup_vs_global_simple")
    ax2.set_title(f"Phases per upsert; record vs global_simple end to end at {rows_label(sizes[-1])}: x{speed}")
    ax2.grid(True, axis="y", alpha=0.3)
    top = max(r["wall_ms"] for _, r in positions) / 1000
    ax2.set_ylim(0, top * 1.35)
    ax2.legend(fontsize=8, loc="upper left", ncol=3)

    fig.suptitle(f"Upsert scaling: {res['env']['cores']} cores, {res['master']}, Spark {res['env']['pyspark']}, "
                 f"copy-on-write, {res['partitions']} partitions", fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
