"""``shadow-compare``: the pure-Python half -- options, the keys a ``--since`` touches, the report.

The engines -- Spark (:mod:`spark_jobs.jobs.shadow_compare`) and in-process Arrow
(:mod:`spark_jobs.arrow_engine.shadow_compare`, the same report) -- ask *the index* for every
key's answer -- a location ``(partition, file group)`` or "absent" -- and compare it with the
truth. This module holds what needs no Spark and decides the rules both follow (the sample,
the identities compared, the samples a report shows), so the CLI can refuse bad input before a
JVM starts and an executor can read index files without importing pyspark.

What is compared (``--against``), per index type of the table:

* record index, ``scan`` (default): the truth is a key scan of the live data, as ``validate``
  reads it; the index's answer for a key is the entry a lookup finds, i.e. the entry in the
  index bucket the key hashes to (an entry in another bucket is invisible to lookups: the key
  is *missing*, the entry *extra*).
* record index, ``global_simple``: a global_simple index *is* a key scan of the data, so the
  truth is the same scan; the name is accepted so a comparison reads like the switch it checks.
* record index, ``bucket``: a bucket index computed on the fly answers a partition and a file
  group ``hash(key) mod N`` -- a record table's file groups are not hash buckets, so only the
  partition of the answer (and presence) is compared.
* bucket index, ``scan``: the index's answer for a row is the file group ``hash(key) mod N`` of
  the row's partition (format.md §5): a row elsewhere is at the *wrong location*, a key twice in
  one partition *duplicated*. A hash index answers every key, so nothing is missing or extra.
* bucket index, ``global_simple``: as ``scan``, but a global index allows a key once in the whole
  table, so a key in two partitions is *duplicated* (what a switch to global_simple would reject).
* global_simple (no index), ``scan``: only duplicates can disagree with a key scan.
* Refused (exit 2): a bucket table ``--against bucket`` and a global_simple table ``--against
  global_simple`` (the index compared with itself), a global_simple table ``--against bucket``
  (its file groups are not hash buckets).

The same words describe the *tee* (``upsert --shadow-index``, :mod:`spark_jobs.jobs.upsert`),
which compares the table's index with a second one for the keys of each batch as it commits;
shadow-compare checks a whole table (or the commits since an instant) after the fact.

``--since INSTANT`` compares only the keys touched by write actions whose instant is after
INSTANT (RFC-08's background comparison of delta commits): the keys of the files they wrote
(bases and logs), of the file versions they replaced (so a key a commit deleted is checked
too), and the fingerprints of the index files they added (tombstones included). The truth is
still a key scan of every live file group (a touched key may sit anywhere), but only the index
buckets the touched keys hash to are read. Pass the ``instant`` of the previous report to
compare everything committed since it. ``--sample-fraction F`` keeps a key when the top 32
bits of its 128-bit fingerprint fall below ``F * 2**32``: deterministic, so reruns (and
the index and data sides) agree on the sample.

The report (JSON, printed and written to ``--report``):

``table``, ``index_type``, ``instant`` (the latest completed instant compared at),
``against``, ``since``, ``sample_fraction``, ``commits_since`` (write actions after
``since``, or null), ``since_files_gone`` (data files those actions wrote or replaced that a
``clean`` already deleted -- replaced versions, logs a data compaction folded -- so their keys,
e.g. of deletes, were not read; null without ``--since``), ``since_index_files_gone`` (index
deltas those actions added that an index compaction folded into a base and a ``clean``
deleted, so their fingerprints were not read; null without ``--since``),
``history_unavailable`` (the sum: what history can no longer answer. The keys the remaining
files name are still looked up in the *current* index, so a compaction and clean after
``since`` narrow the comparison, never break it; a key only a deleted file named -- a delete
folded away -- is not compared), ``keys_checked`` (distinct keys the comparison looked at, from either
side), ``missing`` (live keys the index does not find), ``wrong_location`` (keys the index
places in another partition or file group than the data), ``extra`` (index entries without a
live row: a deleted key still indexed), ``duplicated`` (keys held by more than one live row),
``mismatches`` (their sum), ``max_mismatches``, ``ok`` (mismatches <= max_mismatches),
``samples`` (kind -> the ``SAMPLES`` smallest keys in string order, so both engines and every
run show the same ones; an extra entry has no key string in the index,
so it is named by :func:`fingerprint_label` unless a ``--since`` read the key), ``elapsed_ms``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa

from spark_jobs.exceptions import BadInputError
from spark_jobs.table.commit import parse as parse_commit
from spark_jobs.table.config import INDEX_BUCKET, INDEX_GLOBAL_SIMPLE, INDEX_RECORD
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action, Instant, State
from spark_jobs.table.view import FileSystemView

__all__ = [
    "AGAINST",
    "KINDS",
    "SAMPLES",
    "ShadowOptions",
    "Touched",
    "check_options",
    "sample_cutoff",
    "in_sample",
    "fingerprint_label",
    "fingerprint_labels",
    "sample_mask",
    "record_partition_only",
    "hashed_identity",
    "hashed_answer_is_bucket",
    "add_found",
    "touched_since",
    "index_file_fingerprints",
    "build_report",
    "write_report",
]

AGAINST = ("scan", INDEX_GLOBAL_SIMPLE, INDEX_BUCKET)
#: the kinds of mismatch, in report order
KINDS = ("missing", "wrong_location", "extra", "duplicated")
#: sample keys kept per kind
SAMPLES = 10
_INSTANT = re.compile(r"^[0-9]{1,17}$")
#: fingerprints of index files read per executor batch
_FP_SCHEMA = pa.schema([("bucket", pa.int32()), ("fp_hi", pa.int64()), ("fp_lo", pa.int64())])


@dataclass(frozen=True)
class ShadowOptions:
    against: str = "scan"
    since: str | None = None
    sample_fraction: float = 1.0
    max_mismatches: int = 0


def check_options(index_type: str, opts: ShadowOptions) -> None:
    """BadInputError (one line, exit 2) for options that are invalid or make no sense for the table."""
    if opts.against not in AGAINST:
        raise BadInputError(f"--against must be one of {', '.join(AGAINST)}, got {opts.against!r}")
    if not 0 < opts.sample_fraction <= 1:
        raise BadInputError(f"--sample-fraction must be in (0, 1], got {opts.sample_fraction}")
    if opts.max_mismatches < 0:
        raise BadInputError(f"--max-mismatches must be 0 or more, got {opts.max_mismatches}")
    if opts.since is not None and not _INSTANT.match(opts.since):
        from spark_jobs.table.timeline import parse_as_of

        parse_as_of(opts.since, option="--since", instant_prefix=True)  # a time, or one line naming the forms
    if (index_type, opts.against) in ((INDEX_BUCKET, INDEX_BUCKET), (INDEX_GLOBAL_SIMPLE, INDEX_GLOBAL_SIMPLE)):
        raise BadInputError(f"--against {opts.against} on a {index_type}-index table compares the index with itself; "
                            f"use --against scan")
    if (index_type, opts.against) == (INDEX_GLOBAL_SIMPLE, INDEX_BUCKET):
        raise BadInputError("--against bucket needs hash-bucketed file groups; a global_simple table has none "
                            "(use --against scan)")
    if index_type not in (INDEX_RECORD, INDEX_BUCKET, INDEX_GLOBAL_SIMPLE):  # pragma: no cover - config checks it
        raise BadInputError(f"unknown index type {index_type!r}")


def sample_cutoff(fraction: float) -> int:
    """Keys whose fingerprint's top 32 bits are below this are in the sample (``2**32``: all)."""
    return int(round(fraction * 2**32))


def in_sample(key: str, fraction: float) -> bool:
    """Whether ``key`` is in a ``--sample-fraction`` sample (what the Spark job decides, in Python)."""
    from spark_jobs.index.hashing import fingerprint

    return (fingerprint(key)[0] >> 32) < sample_cutoff(fraction)


def fingerprint_label(key: str) -> str:
    """How a report names a key it only knows by fingerprint (an index entry without a row)."""
    from spark_jobs.index.hashing import fingerprint

    hi, lo = fingerprint(key)
    return fingerprint_labels([hi], [lo])[0]


def fingerprint_labels(fp_hi: Iterable[int], fp_lo: Iterable[int]) -> list[str]:
    """:func:`fingerprint_label` of fingerprints (signed int64 views or unsigned): each half as
    16 hex digits of its unsigned value (what Java's ``%016x`` prints for a long)."""
    m = (1 << 64) - 1
    return [f"fp:{int(h) & m:016x}{int(l) & m:016x}" for h, l in zip(fp_hi, fp_lo)]


def sample_mask(fp_hi: np.ndarray, fraction: float) -> np.ndarray | None:
    """Which fingerprints (``fp_hi``, int64 views) are in a ``--sample-fraction`` sample: the top
    32 bits of ``fp_hi`` below :func:`sample_cutoff` (the Spark job's filter); None: all are."""
    if fraction >= 1:
        return None
    return (np.asarray(fp_hi).view(np.uint64) >> np.uint64(32)) < np.uint64(sample_cutoff(fraction))


def record_partition_only(opts: ShadowOptions) -> bool:
    """Record index ``--against bucket``: only the partition of the index's answer is compared
    (a record table's file groups are not hash buckets)."""
    return opts.against == INDEX_BUCKET


def hashed_identity(index_type: str, opts: ShadowOptions) -> list[str]:
    """Bucket and global_simple tables: the columns that make one key of the comparison -- the
    key alone where a key may live once in the whole table (a global_simple table, or
    ``--against global_simple``), else the key and its partition."""
    from spark_jobs.table.validation import KEY

    return [KEY] if INDEX_GLOBAL_SIMPLE in (index_type, opts.against) else [KEY, "part"]


def hashed_answer_is_bucket(index_type: str) -> bool:
    """Whether the index's answer for a row is the file group ``hash(key) mod N`` (bucket
    index), rather than wherever the row is (global_simple: only duplicates can disagree)."""
    return index_type == INDEX_BUCKET


def add_found(found: dict[str, Any], kind: str, count: int, samples: Iterable[str]) -> None:
    """Record ``count`` mismatches of ``kind`` (when positive) with its samples: the ``SAMPLES``
    smallest names in string order, so every run and every engine reports the same ones
    (``samples``: all the names, or at least the smallest ``SAMPLES`` of them)."""
    if count:
        found[kind] = {"count": int(count), "samples": sorted(samples)[:SAMPLES]}


@dataclass
class Touched:
    """What the write actions after ``since`` touched: files to read keys from, index files to
    read fingerprints from (``(bucket, rel)``), and how many actions that was."""

    since: str
    data_files: list[str] = field(default_factory=list)
    index_files: list[tuple[int, str]] = field(default_factory=list)
    actions: int = 0
    #: data files of those actions no longer on storage -- versions they replaced, or logs a
    #: data compaction folded -- that a clean deleted: their keys are not read
    gone: int = 0
    #: index files those actions added that an index compaction folded into a base and a clean
    #: deleted: their fingerprints (a delete's tombstone among them) are not read
    index_gone: int = 0
    #: rows their commits recorded for the ``data_files`` read (an estimate of the keys a
    #: comparison holds, for ``--engine auto``; a replaced version counts its live rows)
    rows: int = 0


def touched_since(table: Table, since: str) -> Touched:
    """The files whose keys the write actions after ``since`` touched (see the module doc).

    Replays the sequence from just before the first such action, so the file versions each
    one replaced are known: a copy-on-write delete leaves its key only in the version it
    replaced (and in an index tombstone, which a faulty index may lack).
    """
    tl = table.timeline.reload()
    tl.load_history()
    if _INSTANT.match(since):
        hits = [i.seq for i in tl.completed(Action.WRITES) if i.timestamp > since]
    else:  # a time: the write actions not in the snapshot a reader at that time saw
        from spark_jobs.table.timeline import resolve_as_of

        after = resolve_as_of(tl, since, option="--since", allow_empty=True).seq
        hits = [i.seq for i in tl.completed(Action.WRITES) if i.seq > after]
    out = Touched(since=since)
    if not hits:
        return out
    hit = set(hits)
    view = FileSystemView.at_seq(tl, hits[0] - 1)
    data: dict[str, int] = {}  # every data file the actions wrote or replaced, in order (-> its rows)
    for seq in range(hits[0], tl.last_seq + 1):
        e = tl.entry(seq)
        if e["action"] not in Action.WRITES:
            continue
        meta = parse_commit(e["metadata"])
        if seq in hit:
            out.actions += 1
            for fg in meta.groups:
                old = view.file_groups.get(fg.key)
                if fg.log is not None:
                    data.setdefault(fg.log.path, int(fg.log.num_rows or 0))
                    continue
                if not fg.removed:
                    data.setdefault(fg.path, int(fg.num_rows or 0))  # type: ignore[arg-type]
                if old is not None and old.path != fg.path:
                    data.setdefault(old.path, old.num_rows)
                    for lf in old.logs:
                        data.setdefault(lf.path, lf.num_rows)
            for f in meta.added:
                out.index_files.append((int(f.bucket), f.path))
        view.apply(Instant(e["instant"], e["action"], State.COMPLETED, seq), meta)
    # ``view`` is now the current snapshot, whose files clean keeps; any other file the actions
    # wrote or replaced -- a replaced version, a log or an index delta a compaction folded --
    # may be gone. What is gone is counted, not read: the touched keys that other files still
    # name are compared against the current index all the same
    live = view.all_files()

    def there(rel: str) -> bool:
        return rel in live or table.io.exists(table.abs(rel))

    for rel, rows in data.items():
        if there(rel):
            out.data_files.append(rel)
            out.rows += rows
        else:
            out.gone += 1
    index_files, out.index_files = out.index_files, []
    for bucket, rel in index_files:
        if there(rel):
            out.index_files.append((bucket, rel))
        else:
            out.index_gone += 1
    return out


def index_file_fingerprints(batches: Iterable[pa.RecordBatch], *, table_uri: str) -> Iterator[pa.RecordBatch]:
    """mapInArrow over ``(bucket int, path string)``: every entry's fingerprint (int64 views),
    tombstones included -- a tombstone touches its key as much as an entry does."""
    from spark_jobs.index.record_index import IndexFile

    t: Table | None = None
    for b in batches:
        for bucket, rel in zip(b.column("bucket").to_pylist(), b.column("path").to_pylist()):
            if t is None:
                t = Table.open(table_uri)
            with IndexFile(t.io, t.abs(rel)) as f:
                e = f.entries()
            yield pa.RecordBatch.from_arrays(
                [pa.array(np.full(len(e), bucket, np.int32)), pa.array(e.fp_hi.view(np.int64)),
                 pa.array(e.fp_lo.view(np.int64))], schema=_FP_SCHEMA)


def build_report(*, table: Table, index_type: str, instant: str | None, opts: ShadowOptions, keys_checked: int,
                 found: dict[str, dict[str, Any]], touched: Touched | None, elapsed_ms: int) -> dict[str, Any]:
    """The JSON report (fields in the module doc); ``found`` is kind -> {count, samples}."""
    counts = {k: int(found.get(k, {}).get("count", 0)) for k in KINDS}
    total = sum(counts.values())
    return {
        "table": table.display_uri, "index_type": index_type, "instant": instant, "against": opts.against,
        "since": opts.since, "sample_fraction": opts.sample_fraction,
        "commits_since": touched.actions if touched is not None else None,
        "since_files_gone": touched.gone if touched is not None else None,
        "since_index_files_gone": touched.index_gone if touched is not None else None,
        "history_unavailable": touched.gone + touched.index_gone if touched is not None else None,
        "keys_checked": int(keys_checked), **counts, "mismatches": total,
        "max_mismatches": opts.max_mismatches, "ok": total <= opts.max_mismatches,
        "samples": {k: sorted(found.get(k, {}).get("samples", []))[:SAMPLES] for k in KINDS},
        "elapsed_ms": int(elapsed_ms),
    }


def write_report(report: dict[str, Any], dest: str) -> None:
    """Write the report to a local path or a URI (through pyarrow's filesystems)."""
    from spark_jobs.io.filesystem import resolve

    io, path = resolve(dest)
    io.write_bytes(path, (json.dumps(report, indent=2, sort_keys=True) + "\n").encode())
