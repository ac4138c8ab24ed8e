"""``compact``: the Spark side of compaction (what is due, the plan, the checks, the order of
a run and what it commits live in :mod:`spark_jobs.table.action.compact` and
:mod:`spark_jobs.table.action.service`; :mod:`spark_jobs.arrow_engine.compact` executes the
same plans in-process).

One Spark task per planned file group reads the group's base and the planned logs, merges
them (``spark_jobs.table.merge``) and writes the new base; one per planned index bucket
merges its base and deltas newest-wins into a new base without tombstones. Nothing is
shuffled: each kind of work is one Spark job (:func:`_task_per_row`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from spark_jobs.kernels import tasks
from spark_jobs.jobs.session import session_start_ms
from spark_jobs.table.action import compact as action
from spark_jobs.table.action.compact import CompactionPolicy, plan_index_base_cap
from spark_jobs.table.action.engine import SPARK, EngineChoice
from spark_jobs.table.action.transaction import Transaction
from spark_jobs.table.table import Table

__all__ = ["run_compact"]

log = logging.getLogger("bucketindex.compact")

#: what a compaction run through the Python API records as its engine choice
API_CHOICE = EngineChoice(SPARK, "spark_jobs.jobs.compact.run_compact")
#: what an upsert's automatic compaction records as its engine choice (it runs where the upsert ran)
AUTO_CHOICE = EngineChoice(SPARK, "an upsert's automatic compaction runs in the upsert's Spark session")


def auto_pick(spark: SparkSession) -> action.Pick:
    """The :data:`~spark_jobs.table.action.compact.Pick` of a Spark upsert's automatic compaction
    (:func:`spark_jobs.table.action.compact.auto_compact`): the upsert's own session writes the
    due groups' new bases, as ``bucketindex compact --engine spark`` does, so a table compacts
    the same way whichever engine ``auto`` chose for its upserts."""
    return lambda table, plan: ((lambda t, txn: _execute(spark, t, txn)), AUTO_CHOICE)


def run_compact(spark: SparkSession | Callable[[], SparkSession] | None, uri: str, *,
                policy: CompactionPolicy | None = None,
                schedule_only: bool = False, instant: str | None = None,
                heartbeat_timeout_s: float | None = None, choice: EngineChoice | None = None) -> dict[str, Any]:
    """Schedule a compaction (``schedule_only``), execute a scheduled one (``instant``), or both,
    on Spark (:func:`spark_jobs.table.action.compact.run`).

    ``spark`` may be a function that starts a session: it is called only when there is work
    for Spark. ``choice``: the engine choice recorded in the commit (default: this API's).
    """
    session: list[SparkSession] = []

    def pick(table: Table, plan: dict[str, Any]) -> tuple[action.Write, EngineChoice | None]:
        assert spark is not None, "a compaction plan runs on Spark: pass a session"
        if not session:
            session.append(spark() if callable(spark) else spark)
        return (lambda t, txn: _execute(session[0], t, txn)), choice or API_CHOICE

    out = action.run(uri, pick, policy=policy, schedule_only=schedule_only, instant=instant,
                     heartbeat_timeout_s=heartbeat_timeout_s)
    if session:  # JVM and session start, apart from the compaction's own time
        out["session_start_ms"] = session_start_ms()
    return out


def _execute(spark: SparkSession, table: Table, txn: Transaction
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Write the plan's new bases (:data:`spark_jobs.table.action.compact.Write`) in Spark tasks."""
    plan, view = txn.plan, txn.view
    assert view is not None and view.schema is not None and table.config is not None and txn.attempt
    groups = plan.get("file_groups", [])
    buckets = plan.get("index_buckets", [])
    written: list[dict[str, Any]] = []
    if groups:
        rows = [(g["partition"], g["file_id"], g["base"], g["logs"]) for g in groups]
        fn = tasks.bind_batches(tasks.compact_slices, table_uri=table.uri, instant=txn.ts, attempt=txn.attempt,
                                schema=view.schema, precombine=table.config.precombine_field,
                                snapshot_seq=view.seq)
        written = [r.asDict() for r in _task_per_row(spark, rows, tasks.COMPACT_INPUT_ARROW, fn,
                                                      tasks.COMPACT_OUTPUT).collect()]
    index_written: list[dict[str, Any]] = []
    if buckets:
        rows = [(int(b["bucket"]), b["files"], b.get("sealed", [])) for b in buckets]
        fn = tasks.bind_batches(tasks.compact_index_buckets, table_uri=table.uri, instant=txn.ts,
                                attempt=txn.attempt, snapshot_seq=view.seq, cap=plan_index_base_cap(plan))
        index_written = [r.asDict() for r in _task_per_row(spark, rows, tasks.COMPACT_INDEX_INPUT_ARROW, fn,
                                                            tasks.COMPACT_INDEX_OUTPUT).collect()]
    return written, index_written


def _task_per_row(spark: SparkSession, rows: list[tuple[Any, ...]], schema: pa.Schema,
                  fn: Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]], output: str) -> DataFrame:
    """``fn`` over ``rows`` (of ``schema``) in one task per row, as one Spark job.

    The plan's rows travel with the function (a few file names each) and each task takes its
    own by number from ``spark.range``, whose partitions are the tasks: a DataFrame made from
    the rows and repartitioned would shuffle them first, a job of its own (1.7 s of a 1M-row
    upsert's automatic index compaction, docs/benchmarks.md "Session 51")."""
    plan = pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows], schema=schema)

    def mapped(numbers: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        def own() -> Iterator[pa.RecordBatch]:
            for b in numbers:
                yield from plan.take(b.column(0)).to_batches()

        return fn(own())

    return spark.range(0, len(rows), 1, len(rows)).mapInArrow(mapped, output)

