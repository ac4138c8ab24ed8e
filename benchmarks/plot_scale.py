"""Plot ``benchmarks/scale.py``: cold batch time against table size per contender, log-log.

    python benchmarks/plot_scale.py W/results.json [W2/results.json ...] \\
        [--medians benchmarks/data/scale_medians.csv] [-o docs/img/scale.png]

One panel per batch size (1k, 100k, 1M rows); in each, one line per contender (bucketindex by
table type, delta-rs, pypaimon): the median cold wall time of that contender's batches of that
size at each table size. A table whose batches cost what the batch costs draws a flat line; a
merge that rewrites the table climbs with slope 1 (the dotted guide). A contender that failed
(out of memory or time) at a size is an ``x`` at the top of the panel.

Figures come from ``scale.py``'s result files (the JSON object it prints last, or
``--json-out``; its ``results.jsonl`` lines work too) and, for runs whose files were not kept,
from a CSV of medians (``benchmarks/data/scale_medians.csv``: the medians docs/benchmarks.md
prints, with each run named). A result file wins over a CSV row for the same point. The runs
were made at different loads on a shared machine (each row says which): the plot shows growth
with table size, not one contender's absolute speed. Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "img" / "scale.png"
DEFAULT_MEDIANS = Path(__file__).resolve().parent / "data" / "scale_medians.csv"
BATCHES = {"1k": 1_000, "100k": 100_000, "1M": 1_000_000}
STYLE = {  # contender -> (label, colour, marker)
    "bucketindex_merge_on_read": ("bucketindex merge-on-read (default)", "#08519c", "o"),
    "bucketindex_copy_on_write": ("bucketindex copy-on-write", "#6baed6", "s"),
    "delta_rs": ("delta-rs merge", "#e6550d", "^"),
    "pypaimon": ("pypaimon (16 buckets)", "#31a354", "D"),
}

#: (contender, batch rows, table rows) -> median seconds, or None for a failed contender
Points = dict[tuple[str, int, int], "float | None"]


def contender_of(tag: str) -> str:
    """``bucketindex_merge_on_read_record_uuid_flat`` -> ``bucketindex_merge_on_read``; peers as named."""
    for name in STYLE:
        if tag == name or tag.startswith(name + "_"):
            return name
    return tag


def steps_of(path: Path) -> list[dict]:
    """The steps of a ``scale.py`` result: its final JSON object's ``steps``, or a ``results.jsonl``'s lines."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip().startswith("{")]
    last = json.loads(lines[-1]) if lines else {}
    if "steps" in last:
        return last["steps"]
    return [json.loads(ln) for ln in lines if "step" in json.loads(ln)]


def points_from_results(paths: list[Path]) -> Points:
    runs: dict[tuple[str, int, int], list[float]] = {}
    failed: set[tuple[str, int, int]] = set()
    for path in paths:
        for st in steps_of(path):
            m = re.fullmatch(r"batch_\d+_(\w+)", st.get("step", ""))
            if st.get("step") == "build" and st.get("rc", 0) != 0:
                for rows in BATCHES.values():
                    failed.add((contender_of(st["contender"]), rows, st["size"]))
            if not m or m.group(1) not in BATCHES:
                continue
            key = (contender_of(st["contender"]), BATCHES[m.group(1)], st["size"])
            if st.get("rc", 0) == 0 and st.get("oracle_ok", True) is not False:
                runs.setdefault(key, []).append(st["time_s"])
            else:
                failed.add(key)
    out: Points = {k: statistics.median(v) for k, v in runs.items()}
    out.update({k: None for k in failed if k not in out})
    return out


def points_from_medians(path: Path) -> Points:
    rows = csv.DictReader(ln for ln in path.read_text().splitlines() if not ln.startswith("#"))
    out: Points = {}
    for r in rows:
        key = (r["contender"], int(r["batch"]), int(r["size"]))
        out[key] = float(r["median_s"]) if r["median_s"] else None
        if not r["median_s"]:  # a failed build: no batch of any size
            out.update({(r["contender"], b, int(r["size"])): None for b in BATCHES.values()})
    return out


def rows_label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def plot(points: Points, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({s for _, _, s in points})
    fig, axes = plt.subplots(1, len(BATCHES), figsize=(5 * len(BATCHES), 4.6), sharey=True)
    top = max((v for v in points.values() if v is not None), default=10) * 3
    for ax, (name, rows) in zip(axes, BATCHES.items()):
        for contender, (label, colour, marker) in STYLE.items():
            got = sorted((s, v) for (c, b, s), v in points.items() if c == contender and b == rows)
            ok = [(s, v) for s, v in got if v is not None]
            if ok:
                ax.plot([s for s, _ in ok], [v for _, v in ok], marker=marker, color=colour, label=label)
                for s, v in ok:
                    ax.annotate(f"{v:,.0f}" if v >= 100 else f"{v:.3g}", (s, v), textcoords="offset points", xytext=(4, 4), fontsize=7,
                                color=colour)
            bad = [s for s, v in got if v is None]
            if bad:
                ax.scatter(bad, [top] * len(bad), marker="x", color=colour, s=60,
                           label=f"x: {label} failed (out of time or memory)")
        if sizes:  # slope 1 from the smallest size: what a merge that rewrites the table pays
            first = min((v for (c, b, s), v in points.items() if b == rows and s == sizes[0] and v), default=None)
            if first:
                ax.plot(sizes, [first * s / sizes[0] for s in sizes], ":", color="grey", lw=1,
                        label="grows with the table (slope 1)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sizes, [rows_label(s) for s in sizes])
        ax.set_title(f"batch of {name} rows")
        ax.set_xlabel("table rows")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("median cold wall time per batch, s")
    axes[0].set_ylim(top=top * 1.5)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("Cold CDC batch time against table size (scale.py; loads differ per run, see docs/benchmarks.md)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, nargs="*", help="scale.py result files (results.json / --json-out / results.jsonl)")
    p.add_argument("--medians", type=Path, default=DEFAULT_MEDIANS, help="CSV of medians for runs without a result file")
    p.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args()
    points = points_from_medians(args.medians) if args.medians and args.medians.exists() else {}
    points.update(points_from_results(args.results))
    if not points:
        raise SystemExit("no figures: give scale.py result files or --medians")
    plot(points, args.out)


if __name__ == "__main__":
    main()
