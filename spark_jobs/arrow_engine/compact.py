"""Compaction in-process: the plans of :mod:`spark_jobs.table.action.compact` executed on Arrow.

The action decides what is due, writes the plan, checks it still holds, and commits; this
engine only writes the plan's new bases, by the same task functions Spark's tasks run
(:func:`spark_jobs.kernels.tasks.compact_slices`, :func:`~spark_jobs.kernels.tasks.compact_index_buckets`),
one file group or index bucket per call, :data:`WORKERS` at a time. A task names its file with
the attempt's token (:meth:`Transaction.resume`) and the file group or bucket it folds -- the
Spark task attempt's part of the name is ``0-0-0`` in this process -- so two calls of one
attempt write the same path only for the same (directory, file id), which a plan never holds
twice (checked before anything is written).

:func:`needed_bytes` is what ``--engine auto`` sizes a plan by: the largest ``WORKERS`` file
slices it folds (base and logs) and the largest ``WORKERS`` index buckets (open base and
deltas), decoded (:data:`~spark_jobs.table.action.engine.IN_MEMORY_EXPANSION`).
"""

from __future__ import annotations

import logging
import posixpath
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from spark_jobs.exceptions import TableCorruptError
from spark_jobs.kernels import tasks
from spark_jobs.table.action import compact as action
from spark_jobs.table.action.compact import CompactionPolicy, plan_index_base_cap
from spark_jobs.table.action.engine import ARROW, IN_MEMORY_EXPANSION, EngineChoice
from spark_jobs.table.action.transaction import Transaction
from spark_jobs.table.layout import is_reference
from spark_jobs.table.table import Table

__all__ = ["run_compact", "run_rebuild_index", "write_plan", "needed_bytes", "WORKERS"]

log = logging.getLogger("bucketindex.compact")

#: file groups (then index buckets) folded at once: reads and Parquet writes release the GIL;
#: :func:`needed_bytes` plans for this many of the largest in memory together
WORKERS = 2
#: what a compaction run through the Python API records as its engine choice
API_CHOICE = EngineChoice(ARROW, "spark_jobs.arrow_engine.compact.run_compact")
#: what an upsert's automatic compaction records as its engine choice (it runs where the upsert ran)
AUTO_CHOICE = EngineChoice(ARROW, "an upsert's automatic compaction runs in the upsert's process")
#: an index rebuild scans the snapshot's keys in this process: the only engine that runs it
REBUILD_CHOICE = EngineChoice(ARROW, "an index rebuild runs in-process")

_GROUP_INPUT = pa.schema([("part", pa.string()), ("fid", pa.string()), ("base", pa.string()),
                          ("logs", pa.list_(pa.string()))])
_BUCKET_INPUT = pa.schema([("bucket", pa.int32()), ("files", pa.list_(pa.string())),
                           ("sealed", pa.list_(pa.string()))])


def run_compact(uri: str, *, policy: CompactionPolicy | None = None, schedule_only: bool = False,
                instant: str | None = None, heartbeat_timeout_s: float | None = None,
                choice: EngineChoice | None = None) -> dict[str, Any]:
    """Schedule a compaction (``schedule_only``), execute a scheduled one (``instant``), or both,
    in this process (:func:`spark_jobs.table.action.compact.run`; the same arguments as
    :func:`spark_jobs.jobs.compact.run_compact` without the session). ``choice``: the engine
    choice recorded in the commit (default: this API's)."""
    return action.run(uri, lambda table, plan: (write_plan, choice or API_CHOICE), policy=policy,
                      schedule_only=schedule_only, instant=instant, heartbeat_timeout_s=heartbeat_timeout_s)


def run_rebuild_index(uri: str, *, buckets: list[int] | None = None, index_base_cap: int | None = None,
                      heartbeat_timeout_s: float | None = None, choice: EngineChoice | None = None
                      ) -> dict[str, Any]:
    """Rebuild record-index buckets (default: all) from the table's data in this process, as one
    compaction commit (:func:`spark_jobs.table.action.compact.run_rebuild`): what
    ``bucketindex compact TABLE --rebuild-index [--bucket N ...]`` runs."""
    cap = action.DEFAULT_INDEX_BASE_CAP if index_base_cap is None else index_base_cap
    return action.run_rebuild(uri, write_plan, buckets=buckets, index_base_cap=cap,
                              heartbeat_timeout_s=heartbeat_timeout_s, choice=choice or REBUILD_CHOICE)


def needed_bytes(table: Table, plan: dict[str, Any]) -> int:
    """Bytes this engine holds at its peak for ``plan`` (see the module's docstring)."""

    def size(rel: str) -> int:
        try:
            return table.io.size(table.abs(rel))
        except (OSError, ValueError):
            return 0

    groups = sorted((_planned(g, "base_bytes", "log_bytes") or
                     sum(size(r) for r in [g["base"], *g.get("logs", [])]) for g in plan.get("file_groups", [])),
                    reverse=True)
    buckets = sorted((_planned(b, "base_bytes", "delta_bytes") or sum(size(r) for r in b.get("files", []))
                      for b in plan.get("index_buckets", [])), reverse=True)
    return (sum(groups[:WORKERS]) + sum(buckets[:WORKERS])) * IN_MEMORY_EXPANSION


def _planned(entry: dict[str, Any], *keys: str) -> int | None:
    """The sizes the plan recorded (plans scheduled before they were recorded have none)."""
    if not all(k in entry for k in keys):
        return None
    return sum(int(entry[k] or 0) for k in keys)


def write_plan(table: Table, txn: Transaction) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Write the resumed plan's new bases (:data:`spark_jobs.table.action.compact.Write`)."""
    plan, view = txn.plan, txn.view
    assert view is not None and view.schema is not None and table.config is not None and txn.attempt
    groups = plan.get("file_groups", [])
    buckets = plan.get("index_buckets", [])
    _check_distinct_targets(groups)
    written: list[dict[str, Any]] = []
    if groups:
        def fold(g: dict[str, Any]) -> Iterator[pa.RecordBatch]:
            rows = pa.RecordBatch.from_pylist([{"part": g["partition"], "fid": g["file_id"], "base": g["base"],
                                                "logs": g["logs"]}], schema=_GROUP_INPUT)
            return tasks.compact_slices([rows], table_uri=table.uri, instant=txn.ts, attempt=txn.attempt,
                                        schema=view.schema, precombine=table.config.precombine_field,
                                        snapshot_seq=view.seq)

        written = _parallel(fold, groups)
    index_written: list[dict[str, Any]] = []
    rebuilt = [b for b in buckets if b.get("rebuild")]
    buckets = [b for b in buckets if not b.get("rebuild")]
    if rebuilt:
        index_written += _rebuild_buckets(table, txn, [int(b["bucket"]) for b in rebuilt])
    if buckets:
        cap = plan_index_base_cap(plan)

        def fold_bucket(b: dict[str, Any]) -> Iterator[pa.RecordBatch]:
            rows = pa.RecordBatch.from_pylist([{"bucket": int(b["bucket"]), "files": b["files"],
                                                "sealed": b.get("sealed", [])}], schema=_BUCKET_INPUT)
            return tasks.compact_index_buckets([rows], table_uri=table.uri, instant=txn.ts, attempt=txn.attempt,
                                               snapshot_seq=view.seq, cap=cap)

        index_written += _parallel(fold_bucket, buckets)
    return written, index_written


def _rebuild_buckets(table: Table, txn: Transaction, buckets: list[int]) -> list[dict[str, Any]]:
    """New bases for an index rebuild's ``buckets`` (:func:`spark_jobs.table.action.compact.plan_index_rebuild`),
    from the rows of the snapshot ``txn`` runs on: every live key -- read as ``validate`` reads
    the truth (:func:`spark_jobs.arrow_engine.validate.keys_with_location`) -- hashing to one of
    them, with the (partition, file id) of the file group holding it. No index file is opened.

    A data file the snapshot reads that is missing stops it (the index would lose its keys);
    so does a key held by two file groups (which one is live cannot be told from the data:
    ``validate`` reports it as ``duplicate_keys``)."""
    from spark_jobs.arrow_engine.validate import keys_with_location
    from spark_jobs.index.hashing import buckets_of, fingerprints
    from spark_jobs.index.record_index import IndexEntries
    from spark_jobs.table.reader import missing_file_error

    view = txn.view
    assert view is not None and txn.attempt
    missing = table.missing_files(view)
    if missing:
        raise missing_file_error(missing[0])
    rows = keys_with_location(table, view)
    keys = rows.column(tasks.KEY).to_pylist()
    of_bucket = np.asarray(buckets_of(keys, table.num_buckets(view)), dtype=np.int64)
    hi, lo = fingerprints(keys)
    parts, fids = rows.column("part").to_pylist(), rows.column("fid").to_pylist()
    cap = plan_index_base_cap(txn.plan)
    out = []
    for b in buckets:
        at = np.nonzero(of_bucket == b)[0]
        _refuse_duplicates(hi[at], lo[at], [keys[i] for i in at.tolist()])
        entries = IndexEntries.from_fingerprints(hi[at], lo[at], [(parts[i], fids[i]) for i in at.tolist()])
        out.append(tasks.write_index_base(table, b, entries, instant=txn.ts, attempt=txn.attempt,
                                          snapshot_seq=view.seq, cap=cap))
        log.info("index rebuild %s: bucket %d rebuilt from the data (%d entries)", txn.ts, b, len(entries))
    return out


def _refuse_duplicates(hi: np.ndarray, lo: np.ndarray, keys: list[str]) -> None:
    """A key in two file groups has no single location to index: TableCorruptError naming it."""
    order = np.lexsort((lo, hi))
    same = (hi[order][1:] == hi[order][:-1]) & (lo[order][1:] == lo[order][:-1])
    if same.any():
        key = keys[int(order[int(np.nonzero(same)[0][0])])]
        raise TableCorruptError(f"key {key!r} is held by two file groups: the index cannot be rebuilt until the "
                                f"duplicate is removed (`bucketindex validate` lists duplicate_keys)")


def _check_distinct_targets(groups: list[dict[str, Any]]) -> None:
    """Two groups of one plan never fold into the same path: ``compact_slices`` names a new
    base by its directory (the old base's, or the partition's for a reference file) and file
    id, and every call in this process has the same task token."""
    seen: set[tuple[str, str]] = set()
    for g in groups:
        directory = g["partition"] if is_reference(g["base"]) else posixpath.dirname(g["base"])
        target = (directory, g["file_id"])
        if target in seen:
            raise RuntimeError(f"compaction plan folds two file groups into {directory}/{g['file_id']}")
        seen.add(target)


def _parallel(fn: Callable[[dict[str, Any]], Iterator[pa.RecordBatch]], items: list[dict[str, Any]]
              ) -> list[dict[str, Any]]:
    """Every row ``fn`` yields for each item, on :data:`WORKERS` threads; the first error wins, in item order."""
    def rows(item: dict[str, Any]) -> list[dict[str, Any]]:
        return [r for b in fn(item) for r in b.to_pylist()]

    if len(items) <= 1:
        return [r for item in items for r in rows(item)]
    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="bucketindex-compact") as pool:
        futures = [pool.submit(rows, item) for item in items]
        return [r for f in futures for r in f.result()]
