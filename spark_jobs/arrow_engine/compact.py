"""Compaction in-process: the plans of :mod:`spark_jobs.table.action.compact` executed on Arrow.

The action decides what is due, writes the plan, checks it still holds, and commits; this
engine only writes the plan's new bases, by the same task functions Spark's tasks run
(:func:`spark_jobs.jobs.tasks.compact_slices`, :func:`~spark_jobs.jobs.tasks.compact_index_buckets`),
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

import pyarrow as pa

from spark_jobs.jobs import tasks
from spark_jobs.table.action import compact as action
from spark_jobs.table.action.compact import CompactionPolicy, plan_index_base_cap
from spark_jobs.table.action.engine import ARROW, IN_MEMORY_EXPANSION, EngineChoice
from spark_jobs.table.action.transaction import Transaction
from spark_jobs.table.layout import is_reference
from spark_jobs.table.table import Table

__all__ = ["run_compact", "write_plan", "needed_bytes", "WORKERS"]

log = logging.getLogger("bucketindex.compact")

#: file groups (then index buckets) folded at once: reads and Parquet writes release the GIL;
#: :func:`needed_bytes` plans for this many of the largest in memory together
WORKERS = 2
#: what a compaction run through the Python API records as its engine choice
API_CHOICE = EngineChoice(ARROW, "spark_jobs.arrow_engine.compact.run_compact")

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
    if buckets:
        cap = plan_index_base_cap(plan)

        def fold_bucket(b: dict[str, Any]) -> Iterator[pa.RecordBatch]:
            rows = pa.RecordBatch.from_pylist([{"bucket": int(b["bucket"]), "files": b["files"],
                                                "sealed": b.get("sealed", [])}], schema=_BUCKET_INPUT)
            return tasks.compact_index_buckets([rows], table_uri=table.uri, instant=txn.ts, attempt=txn.attempt,
                                               snapshot_seq=view.seq, cap=cap)

        index_written = _parallel(fold_bucket, buckets)
    return written, index_written


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
