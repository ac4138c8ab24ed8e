"""``rehash`` on Spark: the Spark engine's primitives (:class:`SparkRehash`). The rules --
validation, task lists, one file per target, the split's check, metadata and the commit --
live in :mod:`spark_jobs.table.action.rehash`; the in-process engine is
:mod:`spark_jobs.arrow_engine.rehash`, over the same kernels (:mod:`spark_jobs.kernels.rehash_tasks`).

* ``bucket`` index: one task per old file group (a split) or per new one (a merge) reads
  whole file slices and writes the rows to the file groups of ``hash(key) mod M``. The job
  is ``spark.range(n, numPartitions=n).mapInArrow(...)``: the plan has no exchange, rows
  never cross tasks.
* ``record`` index, merge: one task per new index bucket concatenates the old buckets that
  fold into it -- keys are not needed, nothing is shuffled.
* ``record`` index, split: an index entry holds a fingerprint, not the key, so the new bucket
  of an entry is learnt from the data: the key column is read (never rewritten) and each key's
  fingerprint and new bucket go to the task of its old bucket -- a shuffle of ~40 bytes a
  key, not of the rows. That task splits the old bucket's entries into its children, after
  checking index and data agree.

Data files of a record-index table are never touched, and no data file is rewritten in
place: the old layout's files stay for readers as of earlier instants until a clean.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.kernels import rehash_tasks, tasks
from spark_jobs.jobs.keys import bucket_expr
from spark_jobs.jobs.read import READ_WAVES, keys_with_location
from spark_jobs.jobs.session import default_parallelism, job_conf, session_start_ms
from spark_jobs.table.action import rehash as action
from spark_jobs.table.action.engine import SPARK, EngineChoice
from spark_jobs.table.action.rehash import RehashPlan
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView
from spark_jobs.text import plural

__all__ = ["run_rehash", "SparkRehash"]

log = logging.getLogger("bucketindex.rehash")

#: what a rehash run through :func:`run_rehash` records as its engine choice
API_CHOICE = EngineChoice(SPARK, "spark_jobs.jobs.rehash.run_rehash")


def run_rehash(spark: SparkSession | Callable[[], SparkSession], uri: str, num_buckets: int, *,
               heartbeat_timeout_s: float | None = None, choice: EngineChoice | None = None) -> dict[str, Any]:
    """Rehash the table at ``uri`` to ``num_buckets`` on Spark (:func:`spark_jobs.table.action.rehash.run`).

    ``spark`` may be a function that starts a session, called only when there is work for Spark.
    ``choice``: the engine choice recorded in the commit (default: this API's).
    """
    engine = SparkRehash(spark)
    out = action.run(uri, num_buckets, lambda table, plan, view: (engine.started(), choice or API_CHOICE),
                     heartbeat_timeout_s=heartbeat_timeout_s)
    if not out["noop"]:
        out["session_start_ms"] = session_start_ms()
    return out


class SparkRehash:
    """The Spark engine's primitives (:class:`spark_jobs.table.action.rehash.RehashEngine`)."""

    def __init__(self, spark: SparkSession | Callable[[], SparkSession]) -> None:
        self._spark = spark

    def started(self) -> "SparkRehash":
        """Start the session now (before the rehash reserves its instant), if it is a function."""
        if callable(self._spark):
            self._spark = self._spark()
        return self

    @property
    def session(self) -> SparkSession:
        return self.started()._spark  # type: ignore[return-value]

    def write_file_groups(self, table: Table, instant: str, plan: RehashPlan, view: FileSystemView,
                          tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _rehash_data(self.session, table, instant, plan, view, tasks)

    def merge_index_buckets(self, table: Table, instant: str, plan: RehashPlan, view: FileSystemView,
                            tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _merge_index(self.session, table, instant, plan, view, tasks)

    def split_index_buckets(self, table: Table, instant: str, plan: RehashPlan, view: FileSystemView,
                            files: dict[int, list[str]]) -> list[dict[str, Any]]:
        return _split_index(self.session, table, instant, plan, view, files)


def task_range(spark: SparkSession, n: int) -> DataFrame:
    """``n`` tasks numbered 0..n-1, one per Spark partition, with no exchange in the plan
    (``createDataFrame(...).repartition`` would add one; this also works over Spark Connect)."""
    return spark.range(0, n, 1, n)


def spread(spark: SparkSession, units: list[dict[str, Any]], weight: str) -> list[list[int]]:
    """The units of work (old file groups, new index buckets) dealt to at most a few waves of
    Spark tasks, biggest first onto the least loaded task: a partitioned table has hundreds
    of small file groups, and a Spark task per group would cost more in scheduling and Python
    worker round trips than the group's rows."""
    n = max(1, min(len(units), READ_WAVES * default_parallelism(spark)))
    slots: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(units)), key=lambda i: -int(units[i].get(weight) or 0)):
        j = load.index(min(load))
        slots[j].append(i)
        load[j] += int(units[i].get(weight) or 0) or 1
    return slots


def _rehash_data(spark: SparkSession, table: Table, instant: str, plan: RehashPlan, view: FileSystemView,
                 todo: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert view.schema is not None and table.config is not None
    slots = spread(spark, todo, "rows")
    fn = tasks.bind_batches(rehash_tasks.rehash_file_groups, table_uri=table.uri, instant=instant, tasks=todo,
                            slots=slots, num_buckets=plan.new, schema=view.schema,
                            precombine=table.config.precombine_field, snapshot_seq=view.seq)
    written = [r.asDict() for r in task_range(spark, len(slots)).mapInArrow(fn, rehash_tasks.GROUPS_OUTPUT).collect()]
    log.info("rehash %s: %s read %s", instant, plural(len(slots), "Spark task"),
             plural(len(view.file_groups), "file group"))
    return written


def _merge_index(spark: SparkSession, table: Table, instant: str, plan: RehashPlan, view: FileSystemView,
                 todo: list[dict[str, Any]]) -> list[dict[str, Any]]:
    slots = spread(spark, todo, "files")
    fn = tasks.bind_batches(rehash_tasks.merge_index_buckets, table_uri=table.uri, instant=instant, tasks=todo,
                            slots=slots, snapshot_seq=view.seq)
    return [r.asDict() for r in task_range(spark, len(slots)).mapInArrow(fn, rehash_tasks.INDEX_OUTPUT).collect()]


def _split_index(spark: SparkSession, table: Table, instant: str, plan: RehashPlan, view: FileSystemView,
                 files: dict[int, list[str]]) -> list[dict[str, Any]]:
    keys = keys_with_location(spark, table, view)
    if keys is None and not files:
        return []
    cols = "old_bucket int, new_bucket int, fp_hi long, fp_lo long, part string, fid string"
    if keys is None:
        data = spark.createDataFrame([], cols)
    else:
        data = (keys.mapInArrow(tasks.fingerprint_keys, f"{tasks.KEY} string, part string, fid string, "
                                                        f"fp_hi long, fp_lo long")
                .select(bucket_expr(F.col(tasks.KEY), plan.old).alias("old_bucket"),
                        bucket_expr(F.col(tasks.KEY), plan.new).alias("new_bucket"), "fp_hi", "fp_lo", "part", "fid"))
    # every old bucket with index files gets a task, even one whose keys are all gone from the data
    present = spark.createDataFrame([(b, None, None, None, None, None) for b in sorted(files)], cols)
    fn = tasks.bind(rehash_tasks.split_index_bucket, table_uri=table.uri, instant=instant, files=files,
                    snapshot_seq=view.seq)
    grouped = data.unionByName(present).groupBy("old_bucket").applyInArrow(fn, rehash_tasks.INDEX_OUTPUT)
    # one task per old bucket, at most a few per core (the session's default may be 200)
    with job_conf(spark, **{"spark.sql.shuffle.partitions": max(1, min(plan.old, 4 * default_parallelism(spark)))}):
        return [r.asDict() for r in grouped.collect()]
