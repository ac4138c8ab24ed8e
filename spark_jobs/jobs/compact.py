"""``compact``: the Spark side of compaction (planning and committing live in
:mod:`spark_jobs.table.action.compact` and :mod:`spark_jobs.table.action.service`).

One Spark task per planned file group reads the group's base and the planned logs, merges
them (``spark_jobs.table.merge``) and writes the new base; one per planned index bucket
merges its base and deltas newest-wins into a new base without tombstones. Nothing is
shuffled.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from pyspark.sql import SparkSession

from spark_jobs.exceptions import BadInputError
from spark_jobs.jobs import tasks
from spark_jobs.jobs.session import session_start_ms
from spark_jobs.table.action.compact import (
    DEFAULT_INDEX_BASE_CAP,
    CompactionPolicy,
    compaction_metadata,
    schedule_compaction,
)
from spark_jobs.table.action.service import execute, execute_waiting
from spark_jobs.table.action.transaction import Transaction
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action

__all__ = ["run_compact"]

log = logging.getLogger("bucketindex.compact")


def run_compact(spark: SparkSession | Callable[[], SparkSession] | None, uri: str, *,
                policy: CompactionPolicy | None = None,
                schedule_only: bool = False, instant: str | None = None,
                heartbeat_timeout_s: float | None = None) -> dict[str, Any]:
    """Schedule a compaction (``schedule_only``), execute a scheduled one (``instant``), or both.

    Both (neither ``schedule_only`` nor ``instant``) first executes, oldest first, the
    scheduled plans no live process is executing -- a plan whose scheduler died before it
    could report the instant, or one ``--schedule-only`` left -- since the buckets and file
    groups they hold are left out of every new plan until they run; then it schedules and
    executes what is still due. Executing a plan is idempotent (a completed one is a no-op),
    so a plan picked up here and by its own ``--execute`` is folded once.

    Returns ``{"instant": ts or None, "scheduled": bool, "executed": bool, "noop": bool,
    "resumed": [...], ...}``; ``instant`` None means nothing was due and nothing was written.
    ``spark`` may be a function that starts a session: it is called only when there is work
    for Spark.
    """
    table = Table.load(uri)
    started = time.perf_counter()
    out: dict[str, Any] = {"instant": instant, "scheduled": False, "executed": False, "noop": False}
    session = spark

    def work(txn: Transaction) -> dict[str, Any]:
        assert session is not None
        s = session() if callable(session) else session
        return _execute(s, table, txn)

    if instant is None and not schedule_only:
        out["resumed"] = [{"instant": d.instant, "noop": d.noop, "counts": d.metadata.get("counts", {})}
                          for d in execute_waiting(table, Action.COMPACTION, work,
                                                   heartbeat_timeout_s=heartbeat_timeout_s)]
    if instant is None:
        planned = schedule_compaction(table, policy or CompactionPolicy(), heartbeat_timeout_s=heartbeat_timeout_s)
        if planned is None:
            ran = [r for r in out.get("resumed", []) if not r["noop"]]
            if ran:  # nothing new was due, but waiting plans ran
                out.update(instant=ran[-1]["instant"], executed=True, counts=ran[-1]["counts"],
                           total_ms=int((time.perf_counter() - started) * 1000))
                return out
            out["noop"] = True
            return out
        instant = out["instant"] = planned["instant"]
        out.update(scheduled=True, file_groups=planned["file_groups"], index_buckets=planned["index_buckets"])
        if schedule_only:
            return out
    assert spark is not None

    done = execute(table, instant, Action.COMPACTION, work, heartbeat_timeout_s=heartbeat_timeout_s)
    out.update(executed=not done.noop, noop=done.noop, counts=done.metadata.get("counts", {}),
               total_ms=int((time.perf_counter() - started) * 1000), session_start_ms=session_start_ms())
    return out


def _execute(spark: SparkSession, table: Table, txn: Transaction) -> dict[str, Any]:
    t0 = time.perf_counter()
    plan, view = txn.plan, txn.view
    assert view is not None and view.schema is not None and table.config is not None and txn.attempt
    groups = plan.get("file_groups", [])
    buckets = plan.get("index_buckets", [])
    # a plan only folds what is still there (a rehash would have conflicted)
    for g in groups:
        s = view.file_groups.get((g["partition"], g["file_id"]))
        if s is None or s.path != g["base"]:
            raise BadInputError(f"compaction {txn.ts}: file group {g['partition']}/{g['file_id']} changed "
                               f"since it was planned; cancel it (`bucketindex rollback {txn.ts}`) and schedule again")
    for b in buckets:
        # its sealed bases, then exactly the files it folds (open base, oldest deltas)
        below = [*b.get("sealed", []), *b["files"]]
        if view.index_files.get(int(b["bucket"]), [])[: len(below)] != below:
            raise BadInputError(f"compaction {txn.ts}: index bucket {b['bucket']} changed since it was planned; "
                               f"cancel it (`bucketindex rollback {txn.ts}`) and schedule again")
    one: dict[tuple[str, str], dict[str, Any]] = {}
    if groups:
        rows = [(g["partition"], g["file_id"], g["base"], g["logs"]) for g in groups]
        todo = spark.createDataFrame(rows, tasks.COMPACT_INPUT).repartition(len(rows))
        fn = tasks.bind_batches(tasks.compact_slices, table_uri=table.uri, instant=txn.ts, attempt=txn.attempt,
                                schema=view.schema, precombine=table.config.precombine_field,
                                snapshot_seq=view.seq)
        written = [r.asDict() for r in todo.mapInArrow(fn, tasks.COMPACT_OUTPUT).collect()]
        # a retried Spark task may have written twice: keep one file per group (the marker
        # cleanup after the commit deletes the other)
        one = {(w["part"], w["fid"]): w for w in sorted(written, key=lambda w: w["path"])}
        log.info("compaction %s: %d file groups folded into new bases", txn.ts, len(one))
    index_one: dict[int, dict[str, Any]] = {}
    if buckets:
        rows = [(int(b["bucket"]), b["files"], b.get("sealed", [])) for b in buckets]
        todo = spark.createDataFrame(rows, tasks.COMPACT_INDEX_INPUT).repartition(len(rows))
        # a plan scheduled before the cap existed seals at the default
        cap = int(plan.get("index_base_cap") or DEFAULT_INDEX_BASE_CAP)
        fn = tasks.bind_batches(tasks.compact_index_buckets, table_uri=table.uri, instant=txn.ts,
                                attempt=txn.attempt, snapshot_seq=view.seq, cap=cap)
        written = [r.asDict() for r in todo.mapInArrow(fn, tasks.COMPACT_INDEX_OUTPUT).collect()]
        index_one = {int(w["bucket"]): w for w in sorted(written, key=lambda w: w["path"])}
        log.info("compaction %s: %d index buckets folded into new bases (%d deltas, %d sealed)", txn.ts,
                 len(index_one), sum(int(b["deltas"]) for b in buckets),
                 sum(1 for w in index_one.values() if w["sealed"]))
    meta = compaction_metadata(txn.ts, plan, list(one.values()), list(index_one.values()))
    meta["timings_ms"] = {"compact_ms": int((time.perf_counter() - t0) * 1000)}
    log.info("compaction %s done in %d ms", txn.ts, meta["timings_ms"]["compact_ms"])
    return meta
