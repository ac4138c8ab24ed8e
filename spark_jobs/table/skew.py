"""Bucket sizes and a suggested bucket count: what ``bucketindex show`` reports so a user
can see when to rehash (issue 12, "skew report").

Bucket counts are chosen at creation and tables grow; a bucket that is too big makes
every merge into it (``bucket`` index: its file group is rewritten or logged into) or every
lookup in it (``record`` index: its index files are read) slow, and one that is too small
pays a file per bucket for nothing. The numbers come from the snapshot's metadata alone --
the view's live row counts per file group, the index files' footers -- so ``show`` stays
cheap and needs no Spark.

The suggestion follows RFC-29 (grow by multiples, so bucket ``i`` splits into
``i, i+N, ...`` without a shuffle; a rehash also merges back by divisors) and RFC-08
(over-provision by 30%): among the counts ``N * 2**j`` and ``N / 2**j`` (dividing ``N``,
at least 1, at most :data:`MAX_BUCKETS`), the smallest whose expected size per bucket,
with 30% headroom, stays under the target. It shrinks only when even half the buckets
would stay under a quarter of the target, and then only as far as that quarter, so the
advice does not flap between growing and shrinking as a table hovers near a boundary.
"""

from __future__ import annotations

import shlex
from fractions import Fraction
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_plus

import numpy as np

from spark_jobs.exceptions import BadInputError
from spark_jobs.table.action.compact import DEFAULT_INDEX_BASE_CAP
from spark_jobs.table.config import INDEX_BUCKET, INDEX_RECORD, MAX_NUM_BUCKETS
from spark_jobs.text import plural

if TYPE_CHECKING:
    from spark_jobs.table.table import Table
    from spark_jobs.table.view import FileSystemView

__all__ = [
    "MAX_BUCKETS",
    "HEADROOM",
    "SHRINK_BELOW",
    "SKEW_RATIO",
    "RECORD_BUCKET_TARGET",
    "bucket_sizes",
    "size_stats",
    "candidate_counts",
    "suggest_num_buckets",
    "key_skew_note",
    "format_bucket_sizes",
    "plot_bucket_sizes",
]

#: the largest bucket count a rehash accepts (issue 12)
MAX_BUCKETS = MAX_NUM_BUCKETS
#: RFC-08: over-provision by 30%, so a table grows for a while before it needs the next rehash
HEADROOM = Fraction(13, 10)
#: shrink only when even half the buckets would stay under target / SHRINK_BELOW, and then to
#: the smallest count under it: the table may grow about 4x again before growing is advised
SHRINK_BELOW = 4
#: p99 / median at or above this, while the average fits the target, is skew in the keys
SKEW_RATIO = 2
#: entries per record-index bucket: the sealed-base cap. Past it index compaction seals the
#: base and starts another, so a lookup in the bucket opens one more base per cap's worth
RECORD_BUCKET_TARGET = DEFAULT_INDEX_BASE_CAP

#: a plot colours each partition apart up to this many partitions, else one distribution
_PLOT_PARTITIONS = 8


# -- sizes -------------------------------------------------------------------------------

def bucket_sizes(table: "Table", view: "FileSystemView") -> dict[str, Any]:
    """Per bucket sizes of the snapshot ``view``, their stats and the suggested count.

    ``bucket`` index: live rows per file group (the file id is the bucket number), per
    ``(partition, bucket)`` -- what a file's size is, the busiest partition decides -- and
    per bucket summed over partitions. ``record`` index: entries per index bucket from the
    index files' footers; before compaction deltas' updates, moves and tombstones count
    too, so that is an upper bound of the live keys. Buckets without rows or entries count
    as 0. ``global_simple``: ``{"bucketed": False}``, there is nothing to rehash.
    """
    cfg = table.config
    assert cfg is not None
    if cfg.index_type not in (INDEX_BUCKET, INDEX_RECORD):
        return {"bucketed": False, "index_type": cfg.index_type,
                "reason": f"a {cfg.index_type} index has no buckets: nothing to rehash"}
    n = table.num_buckets(view)
    if cfg.index_type == INDEX_BUCKET:
        return _bucket_index_sizes(table, view, n)
    return _record_index_sizes(table, view, n)


def _bucket_index_sizes(table: "Table", view: "FileSystemView", n: int) -> dict[str, Any]:
    assert table.config is not None
    per_partition: dict[str, list[int]] = {}
    for (partition, file_id), fs in view.file_groups.items():
        sizes = per_partition.setdefault(partition, [0] * n)
        b = int(file_id)
        if b >= len(sizes):  # never in a consistent snapshot; counted, not hidden
            sizes.extend([0] * (b + 1 - len(sizes)))
        sizes[b] += fs.num_rows
    width = max((len(s) for s in per_partition.values()), default=n)
    per_bucket = np.zeros(width, dtype=np.int64)
    for s in per_partition.values():
        per_bucket[: len(s)] += s
    groups = [v for s in per_partition.values() for v in s]
    target = table.config.target_file_rows
    busiest = max(per_partition, key=lambda p: (sum(per_partition[p]), p), default=None)
    load = sum(per_partition[busiest]) if busiest is not None else 0
    group_stats = size_stats(groups)
    suggestion = suggest_num_buckets(n, load, target, unit="rows", per="file group",
                                     where=f"the busiest partition {busiest}" if busiest else "the table")
    return {
        "bucketed": True,
        "index_type": INDEX_BUCKET,
        "num_buckets": n,
        "unit": "rows",
        "per_file_group": {"stats": group_stats, "partitions": per_partition},
        "per_bucket": {"stats": size_stats(per_bucket), "sizes": per_bucket.tolist()},
        "busiest_partition": None if busiest is None else {
            "partition": busiest, "rows": load, "max_per_file_group": max(per_partition[busiest])},
        "target": target,
        "target_of": "target_file_rows per file group",
        "suggestion": suggestion,
        "skew": key_skew_note(group_stats, load, n, target, unit="rows", per="file group"),
    }


def _record_index_sizes(table: "Table", view: "FileSystemView", n: int) -> dict[str, Any]:
    from spark_jobs.index.record_index import IndexFile

    width = max([n, *(b + 1 for b in view.index_files)])
    sizes = np.zeros(width, dtype=np.int64)
    for b, files in view.index_files.items():
        for rel in files:
            with IndexFile(table.io, table.abs(rel), lazy_locations=True) as f:  # the footer only
                sizes[b] += f.num_entries
    stats = size_stats(sizes)
    load = int(sizes.sum())
    return {
        "bucketed": True,
        "index_type": INDEX_RECORD,
        "num_buckets": n,
        "unit": "entries",
        "per_bucket": {"stats": stats, "sizes": sizes.tolist()},
        "note": "entries in the index files: before compaction the deltas' updates, moves and tombstones "
                "count too, an upper bound of the live keys",
        "target": RECORD_BUCKET_TARGET,
        "target_of": "entries per index bucket (the sealed-base cap)",
        "suggestion": suggest_num_buckets(n, load, RECORD_BUCKET_TARGET, unit="entries", per="index bucket",
                                          where="the index"),
        "skew": key_skew_note(stats, load, n, RECORD_BUCKET_TARGET, unit="entries", per="index bucket"),
    }


def size_stats(sizes: Any) -> dict[str, Any]:
    """min, median, p99, max, mean and total of ``sizes`` (zeros included: an empty bucket is a bucket)."""
    a = np.asarray(sizes, dtype=np.int64)
    if a.size == 0:
        return {"count": 0, "min": 0, "median": 0.0, "p99": 0.0, "max": 0, "mean": 0.0, "total": 0}
    return {"count": int(a.size), "min": int(a.min()), "median": round(float(np.median(a)), 1),
            "p99": round(float(np.percentile(a, 99)), 1), "max": int(a.max()),
            "mean": round(float(a.mean()), 1), "total": int(a.sum())}


# -- the suggestion ----------------------------------------------------------------------

def candidate_counts(n: int) -> list[int]:
    """The counts a rehash of ``n`` buckets can reach: ``n * 2**j`` up to :data:`MAX_BUCKETS`
    and ``n / 2**j`` while it divides ``n``, ascending, ``n`` itself included."""
    out = {n}
    m = n
    while m % 2 == 0:
        m //= 2
        out.add(m)
    m = n
    while m * 2 <= MAX_BUCKETS:
        m *= 2
        out.add(m)
    return sorted(out)


def _with_headroom(load: int, m: int) -> Fraction:
    return Fraction(load, m) * HEADROOM


def suggest_num_buckets(n: int, load: int, target: int, *, unit: str = "rows", per: str = "bucket",
                        where: str = "the table") -> dict[str, Any]:
    """The bucket count to rehash ``n`` buckets to, for ``load`` rows/entries spread over them.

    Grow to the smallest candidate count (:func:`candidate_counts`) whose expected size per
    bucket ``load / m * 1.3`` is at most ``target`` (capped at :data:`MAX_BUCKETS`); shrink
    only when ``n / 2`` would keep it under ``target / 4``, to the smallest candidate that
    does; otherwise keep ``n``. Returns ``{"num_buckets", "action", "reason"}`` with
    ``action`` one of ``grow``, ``shrink``, ``keep``.
    """
    def fmt(x: Fraction | int) -> str:
        return f"{round(float(x)):,}"

    now = _with_headroom(load, n)
    head = (f"{where} holds {load:,} {unit}: {fmt(Fraction(load, n))} per {per} at {_buckets(n)}, "
            f"{fmt(now)} with 30% headroom")
    if load == 0:
        return {"num_buckets": n, "action": "keep", "reason": f"{where} is empty: nothing to size the buckets by"}
    counts = candidate_counts(n)
    if now > target:
        fits = [m for m in counts if m > n and _with_headroom(load, m) <= target]
        if fits:
            m = fits[0]
            return {"num_buckets": m, "action": "grow",
                    "reason": f"{head}, over the target {target:,}; at {_buckets(m)}: "
                              f"{fmt(_with_headroom(load, m))}"}
        m = counts[-1]
        if m == n:
            return {"num_buckets": n, "action": "keep",
                    "reason": f"{head}, over the target {target:,}, but {n} is the most buckets a rehash makes"}
        return {"num_buckets": m, "action": "grow",
                "reason": f"{head}, over the target {target:,}; capped at the maximum, {_buckets(m)}: "
                          f"{fmt(_with_headroom(load, m))}"}
    low = Fraction(target, SHRINK_BELOW)
    if n % 2 == 0 and _with_headroom(load, n // 2) <= low:
        m = next(m for m in counts if m < n and _with_headroom(load, m) <= low)
        return {"num_buckets": m, "action": "shrink",
                "reason": f"{head}, far under the target {target:,}; at {_buckets(m)}: "
                          f"{fmt(_with_headroom(load, m))}, still under a quarter of it"}
    return {"num_buckets": n, "action": "keep", "reason": f"{head}, under the target {target:,}"}


def key_skew_note(stats: dict[str, Any], load: int, n: int, target: int, *, unit: str, per: str) -> str | None:
    """A note when the skew is in the keys, not the bucket count: p99 at least
    :data:`SKEW_RATIO` x the median and over the target while the average (with headroom)
    fits it. A hash spreads distinct keys evenly, so more buckets do not split a hot key
    (or one key's pile of deltas); compaction or the data itself is the fix."""
    if load == 0 or stats["p99"] <= target or _with_headroom(load, n) > target:
        return None
    if stats["median"] and stats["p99"] < SKEW_RATIO * stats["median"]:
        return None
    ratio = f"{stats['p99'] / stats['median']:.1f}x the median" if stats["median"] else "over a median of 0"
    return (f"p99 {stats['p99']:,.0f} {unit} per {per} is {ratio} and over the target {target:,} while the "
            f"average fits it: the skew is in the keys, more buckets will not help a hot key")


# -- output ------------------------------------------------------------------------------

def _buckets(m: int) -> str:
    return f"{m:,} bucket{'s' * (m != 1)}"


def _stats_text(s: dict[str, Any]) -> str:
    return (f"min {s['min']:,}, median {s['median']:,.1f}, p99 {s['p99']:,.1f}, max {s['max']:,}, "
            f"mean {s['mean']:,.1f}")


def format_bucket_sizes(report: dict[str, Any], uri: str) -> list[str]:
    """The ``buckets`` block of ``bucketindex show`` (lines without a trailing newline)."""
    if not report.get("bucketed"):
        return [f"buckets    not bucketed: {report['reason']}"]
    n = report["num_buckets"]
    lines = []
    if report["index_type"] == INDEX_BUCKET:
        fg = report["per_file_group"]
        parts = len(fg["partitions"])
        lines.append(f"buckets    rows per file group ({plural(n, 'bucket')} x {plural(parts, 'partition')}): "
                     f"{_stats_text(fg['stats'])}")
        if parts > 1:
            lines.append(f"  per bucket over all partitions: {_stats_text(report['per_bucket']['stats'])}")
        b = report["busiest_partition"]
        if b is not None:
            lines.append(f"  busiest partition {b['partition'] or '(unpartitioned)'}: {b['rows']:,} "
                         f"row{'s' * (b['rows'] != 1)}, "
                         f"at most {b['max_per_file_group']:,} in a file group")
    else:
        lines.append(f"buckets    entries per index bucket ({plural(n, 'bucket')}): "
                     f"{_stats_text(report['per_bucket']['stats'])}")
        lines.append(f"  {report['note']}")
    s = report["suggestion"]
    lines.append(f"  suggested {_buckets(s['num_buckets'])} ({s['action']}): {s['reason']}")
    if s["num_buckets"] != n:
        lines.append(f"  to apply: bucketindex rehash {shlex.quote(uri)} --num-buckets {s['num_buckets']}")
    if report.get("skew"):
        lines.append(f"  skew: {report['skew']}")
    return lines


def plot_bucket_sizes(report: dict[str, Any], path: str, *, title: str = "") -> None:
    """Draw the histogram of bucket sizes of ``report`` (from :func:`bucket_sizes`) as a PNG.

    ``bucket`` index: rows per file group, one colour per partition when there are few;
    ``record`` index: entries per index bucket. The target is drawn when it is on the
    chart's scale. matplotlib is an optional dependency (the ``plot`` extra), imported here
    only; without it: :class:`BadInputError` saying how to install it.
    """
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise BadInputError("--plot needs matplotlib: pip install 'airflow-provider-bucketindex[plot]' "
                            "(or pip install 'matplotlib>=3.8')") from None
    if not report.get("bucketed"):
        raise BadInputError(f"--plot: {report['reason']}")
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    n = report["num_buckets"]
    if report["index_type"] == INDEX_BUCKET:
        parts = report["per_file_group"]["partitions"]
        what = "rows per file group"
        values = [v for s in parts.values() for v in s]
        if 1 < len(parts) <= _PLOT_PARTITIONS:
            labels = [unquote_plus(p) for p in parts]
            ax.hist(list(parts.values()), bins=30, stacked=True, label=labels)
        else:
            ax.hist(values, bins=30)
        ax.set_ylabel("file groups")
    else:
        what = "entries per index bucket"
        values = report["per_bucket"]["sizes"]
        ax.hist(values, bins=30)
        ax.set_ylabel("index buckets")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    target = report["target"]
    if values and target <= 2 * max(values):
        ax.axvline(target, color="red", linestyle="--", label=f"target {target:,}")
        ax.set_xlabel(what)
    else:  # a line far right would squash the histogram into its first bin
        ax.set_xlabel(f"{what} (target {target:,}, off the chart)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    s = report["suggestion"]
    ax.set_title((f"{title}\n" if title else "")
                 + f"{report['index_type']} index, {n} buckets: {what}; suggested {s['num_buckets']} ({s['action']})",
                 fontsize="medium")
    try:
        fig.savefig(path, format="png")
    except OSError as e:
        raise BadInputError(f"--plot: cannot write {path}: {e.strerror or e}") from None
