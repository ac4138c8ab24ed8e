"""What the Spark tasks of a rehash do, as plain functions over Arrow (no ``pyspark`` here).

Every task writes its files under the rehash's markers with a name carrying the task
attempt's token, so a retried or speculative attempt never overwrites a sibling's file;
the driver keeps one file per new bucket and the commit's marker cleanup deletes the rest.
"""

from __future__ import annotations

import posixpath
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa

from spark_jobs.index.hashing import buckets_of
from spark_jobs.index.record_index import TOMBSTONE, IndexEntries, merge_entries, write_index_file
from spark_jobs.kernels.tasks import KEY, task_token, write_marked_parquet
from spark_jobs.table.action.rehash import bucket_file_id
from spark_jobs.table.layout import data_file_name
from spark_jobs.table.reader import read_slice
from spark_jobs.table.table import Table
from spark_jobs.table.faults import maybe_crash

__all__ = [
    "GROUPS_OUTPUT",
    "INDEX_OUTPUT",
    "SPLIT_INPUT",
    "rehash_file_groups",
    "split_index_bucket",
    "merge_index_buckets",
]

#: one row per new file group a task wrote (bucket index)
GROUPS_OUTPUT = "part string, fid string, path string, num_rows long, size long"
#: one row per new index base a task wrote (record index); a split also reports what it found
#: wrong (index and data disagree: nothing is written for that old bucket)
INDEX_OUTPUT = ("bucket int, path string, entries long, size long, old_bucket int, "
                "missing long, extra long, misplaced long, duplicated long")
#: the record-index split's input: every live key's fingerprint, location and new bucket,
#: grouped by old bucket (a row with a null fingerprint stands for an old bucket without keys)
SPLIT_INPUT = "old_bucket int, new_bucket int, fp_hi long, fp_lo long, part string, fid string"

_GROUP_SCHEMA = pa.schema([("part", pa.string()), ("fid", pa.string()), ("path", pa.string()),
                           ("num_rows", pa.int64()), ("size", pa.int64())])
_INDEX_SCHEMA = pa.schema([("bucket", pa.int32()), ("path", pa.string()), ("entries", pa.int64()),
                           ("size", pa.int64()), ("old_bucket", pa.int32()), ("missing", pa.int64()),
                           ("extra", pa.int64()), ("misplaced", pa.int64()), ("duplicated", pa.int64())])


def _units(batches: Iterable[pa.RecordBatch], slots: list[list[int]]) -> Iterator[int]:
    """The units of work of this Spark task: its number in ``spark.range(n, numPartitions=n)``
    picks its slot of ``slots``."""
    for b in batches:
        for i in b.column(0).to_pylist():
            yield from slots[i]


def rehash_file_groups(ids: Iterable[pa.RecordBatch], *, table_uri: str, instant: str, tasks: list[dict[str, Any]],
                       slots: list[list[int]], num_buckets: int, schema: pa.Schema, precombine: str | None,
                       snapshot_seq: int) -> Iterator[pa.RecordBatch]:
    """mapInArrow over task numbers (``slots``: which ``tasks`` each runs): read each task's old slices (a merge-on-read slice merged
    with its logs) and write every row to the file group of ``hash(key) mod num_buckets``.

    A split task reads one old file group and writes its children; a merge task reads the old
    groups that fold into one new group. The rows never leave the task: no shuffle.
    """
    t: Table | None = None
    token = task_token()
    for i in _units(ids, slots):
        task = tasks[i]
        if t is None:
            t = Table.open(table_uri)
        parts = [read_slice(t, base, logs or [], precombine=precombine, schema=schema).select(schema.names).cast(schema)
                 for _, base, logs in task["sources"]]
        rows = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        directory = posixpath.dirname(task["sources"][0][1])
        buckets = buckets_of(rows.column(KEY).to_pylist(), num_buckets)
        order = np.argsort(buckets, kind="stable")
        bounds = np.flatnonzero(np.diff(buckets[order])) + 1
        for idx in np.split(order, bounds) if len(order) else []:
            b = int(buckets[idx[0]])
            fid = bucket_file_id(b)
            rel = posixpath.join(directory, data_file_name(fid, token, instant))
            part_rows = rows.take(pa.array(np.sort(idx)))  # the rows keep their order in the file
            size = write_marked_parquet(t, instant, rel, part_rows, snapshot_seq=snapshot_seq)
            yield pa.RecordBatch.from_pylist([{"part": task["part"], "fid": fid, "path": rel,
                                               "num_rows": part_rows.num_rows, "size": size}], schema=_GROUP_SCHEMA)


def _as_s16(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """128-bit fingerprints as 16-byte big-endian strings: ordered like (hi, lo)."""
    pair = np.empty((len(hi), 2), dtype=">u8")
    pair[:, 0], pair[:, 1] = hi, lo
    return pair.view("S16").ravel()


def _write_base(t: Table, instant: str, bucket: int, entries: IndexEntries, *, token: str,
                snapshot_seq: int) -> dict[str, Any]:
    path = t.layout.index_file(bucket, "base", f"{instant}_{token}")
    rel = t.layout.rel(path)

    def write() -> int:
        size = write_index_file(t.io, path, entries, metadata={"instant": instant, "bucket": bucket, "sealed": False})
        maybe_crash("after_index_file")
        return size

    size = t.write_marked(instant, rel, write, snapshot_seq=snapshot_seq)
    return {"bucket": bucket, "path": rel, "entries": len(entries), "size": size}


def _index_row(old_bucket: int, written: dict[str, Any] | None = None, **problems: int) -> pa.RecordBatch:
    row = {"bucket": None, "path": None, "entries": 0, "size": 0, **(written or {}), "old_bucket": old_bucket,
           "missing": 0, "extra": 0, "misplaced": 0, "duplicated": 0, **problems}
    return pa.RecordBatch.from_pylist([row], schema=_INDEX_SCHEMA)


def split_index_bucket(key: tuple, rows: pa.Table, *, table_uri: str, instant: str, files: dict[int, list[str]],
                       snapshot_seq: int) -> pa.Table:
    """applyInArrow per old index bucket: split its live entries into its children.

    An index entry holds the key's fingerprint, not the key, so its new bucket cannot be
    computed from the entry: the job reads the key column of the data (never rewriting it)
    and sends each key's fingerprint and new bucket to the task of its old bucket. The task
    merges the old bucket's files, and writes each child the old entries whose keys hash
    there -- after checking that index and data agree exactly (every live entry has its key
    in the data at the same file group, every key has its entry, no key twice). If they do
    not, it writes nothing and reports the counts: a rehash must not bake a broken index
    into a new layout (``bucketindex validate`` says which keys).
    """
    old = int(key[0].as_py())
    t = Table.open(table_uri)
    token = task_token()
    entries = merge_entries(t.io, [t.abs(f) for f in files.get(old, [])])  # live, sorted by (hi, lo)
    real = rows.filter(rows.column("fp_hi").is_valid())
    d_hi = real.column("fp_hi").to_numpy().view(np.uint64)
    d_lo = real.column("fp_lo").to_numpy().view(np.uint64)
    d_new = real.column("new_bucket").to_numpy()
    d_key = _as_s16(d_hi, d_lo)
    e_key = _as_s16(entries.fp_hi, entries.fp_lo)
    duplicated = len(d_key) - len(np.unique(d_key))
    pos = np.searchsorted(e_key, d_key)
    found = pos < len(e_key)
    found[found] = e_key[pos[found]] == d_key[found]
    missing = int(np.count_nonzero(~found))
    extra = len(e_key) - len(np.unique(pos[found]))
    misplaced = 0
    if found.any():
        locs = entries.locations
        d_part = real.column("part").to_pylist()
        d_fid = real.column("fid").to_pylist()
        for i in np.flatnonzero(found).tolist():
            li = int(entries.loc[pos[i]])
            if li == TOMBSTONE or locs[li] != (d_part[i], d_fid[i]):
                misplaced += 1
    if missing or extra or misplaced or duplicated:
        return pa.Table.from_batches([_index_row(old, missing=missing, extra=extra, misplaced=misplaced,
                                                 duplicated=duplicated)])
    child = np.empty(len(e_key), dtype=np.int64)
    child[pos] = d_new
    out = []
    for c in np.unique(child).tolist():
        keep = child == c
        sub = IndexEntries(entries.fp_hi[keep], entries.fp_lo[keep], entries.loc[keep], entries.locations)
        out.append(_index_row(old, _write_base(t, instant, int(c), sub, token=token, snapshot_seq=snapshot_seq)))
    if not out:
        out.append(_index_row(old))  # an old bucket without keys: nothing to write, nothing wrong
    return pa.Table.from_batches(out, schema=_INDEX_SCHEMA)


def merge_index_buckets(ids: Iterable[pa.RecordBatch], *, table_uri: str, instant: str,
                        tasks: list[dict[str, Any]], slots: list[list[int]],
                        snapshot_seq: int) -> Iterator[pa.RecordBatch]:
    """mapInArrow over task numbers: each new index bucket is the union of the old buckets that
    fold into it. Old buckets hold disjoint keys, so each is merged on its own (newest entry
    wins, tombstones dropped) and the results are concatenated: no key is needed."""
    t: Table | None = None
    token = task_token()
    for i in _units(ids, slots):
        task = tasks[i]
        if t is None:
            t = Table.open(table_uri)
        his: list[np.ndarray] = []
        los: list[np.ndarray] = []
        locs: list[np.ndarray] = []
        ids_: dict[tuple[str, str], int] = {}
        for files in task["sources"]:
            e = merge_entries(t.io, [t.abs(f) for f in files])
            remap = np.array([ids_.setdefault(l, len(ids_)) for l in e.locations] + [TOMBSTONE], dtype=np.int32)
            his.append(e.fp_hi)
            los.append(e.fp_lo)
            locs.append(remap[e.loc])
        merged = IndexEntries(np.concatenate(his), np.concatenate(los), np.concatenate(locs), list(ids_))
        written = _write_base(t, instant, int(task["bucket"]), merged, token=token, snapshot_seq=snapshot_seq)
        yield _index_row(-1, written)
