"""``rehash``: the Spark side of a bucket-count change (validation, task lists and metadata live
in :mod:`spark_jobs.table.action.rehash`).

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
import time
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.exceptions import BadInputError
from spark_jobs.io.storage import redact_uri
from spark_jobs.jobs import rehash_tasks, tasks
from spark_jobs.jobs.keys import bucket_expr
from spark_jobs.jobs.read import READ_WAVES, keys_with_location
from spark_jobs.jobs.session import default_parallelism, job_conf, session_start_ms
from spark_jobs.table.action import Transaction
from spark_jobs.table.action.rehash import RehashPlan, bucket_tasks, check_rehash, commit_rehash, index_merge_tasks
from spark_jobs.table.action.transaction import repair_abandoned
from spark_jobs.table.config import INDEX_BUCKET
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView
from spark_jobs.text import plural

__all__ = ["run_rehash"]

log = logging.getLogger("bucketindex.rehash")


def run_rehash(spark: SparkSession | Callable[[], SparkSession], uri: str, num_buckets: int, *,
               heartbeat_timeout_s: float | None = None) -> dict[str, Any]:
    """Rehash the table at ``uri`` to ``num_buckets``; returns the instant, counts and timings.

    A count equal to the one in force is a no-op (``instant`` None): running a rehash twice,
    as an Airflow retry does, changes nothing the second time. BadInputError (nothing
    written) for what :func:`check_rehash` refuses; ConflictError when a write completed
    while it ran (a rehash rewrites what it read: run it again). ``spark`` may be a function
    that starts a session, called only when there is work for Spark.
    """
    started = time.perf_counter()
    table = Table.load(uri)
    view = table.view()
    plan = check_rehash(table, view, num_buckets, heartbeat_timeout_s=heartbeat_timeout_s)
    # abandoned instants (a killed rehash) are rolled back, and leftovers of one killed after
    # its commit point cleaned, as every writer does -- also when there is nothing else to do
    repaired = repair_abandoned(table, timeout_s=heartbeat_timeout_s)
    if plan is None:
        log.info("%s already has %s: nothing to do", redact_uri(uri), plural(num_buckets, "bucket"))
        return {"instant": None, "noop": True, "num_buckets": int(num_buckets),
                "previous_num_buckets": int(num_buckets)}
    if repaired:
        view = table.view()
        plan = check_rehash(table, view, num_buckets, heartbeat_timeout_s=heartbeat_timeout_s)
        assert plan is not None
    session = spark() if callable(spark) else spark

    def write(txn: Transaction, plan: RehashPlan, view: FileSystemView
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if plan.index_type == INDEX_BUCKET:
            return _rehash_data(session, table, txn.ts, plan, view), []
        if plan.split:
            return [], _split_index(session, table, txn.ts, plan, view)
        return [], _merge_index(session, table, txn.ts, plan, view)

    return {**commit_rehash(table, plan, view, write, started=started), "session_start_ms": session_start_ms()}


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


def _one_per(written: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> list[dict[str, Any]]:
    """One file per new file group or bucket: a retried Spark task may have written twice
    (the marker cleanup after the commit deletes the other)."""
    return list({key(w): w for w in sorted(written, key=lambda w: w["path"], reverse=True)}.values())


def _rehash_data(spark: SparkSession, table: Table, instant: str, plan: RehashPlan,
                 view: FileSystemView) -> list[dict[str, Any]]:
    todo = bucket_tasks(plan, view)
    if not todo:
        return []
    assert view.schema is not None and table.config is not None
    slots = spread(spark, todo, "rows")
    fn = tasks.bind_batches(rehash_tasks.rehash_file_groups, table_uri=table.uri, instant=instant, tasks=todo,
                            slots=slots, num_buckets=plan.new, schema=view.schema,
                            precombine=table.config.precombine_field, snapshot_seq=view.seq)
    written = [r.asDict() for r in task_range(spark, len(slots)).mapInArrow(fn, rehash_tasks.GROUPS_OUTPUT).collect()]
    out = _one_per(written, lambda w: (w["part"], w["fid"]))
    log.info("rehash %s: %s read %s and wrote %d", instant, plural(len(slots), "Spark task"),
             plural(len(view.file_groups), "file group"), len(out))
    return out


def _merge_index(spark: SparkSession, table: Table, instant: str, plan: RehashPlan,
                 view: FileSystemView) -> list[dict[str, Any]]:
    todo = index_merge_tasks(plan, view)
    if not todo:
        return []
    slots = spread(spark, todo, "files")
    fn = tasks.bind_batches(rehash_tasks.merge_index_buckets, table_uri=table.uri, instant=instant, tasks=todo,
                            slots=slots, snapshot_seq=view.seq)
    written = [r.asDict() for r in task_range(spark, len(slots)).mapInArrow(fn, rehash_tasks.INDEX_OUTPUT).collect()]
    out = _one_per(written, lambda w: int(w["bucket"]))
    log.info("rehash %s: %d old index buckets merged into %d", instant, plan.old, len(out))
    return out


def _split_index(spark: SparkSession, table: Table, instant: str, plan: RehashPlan,
                 view: FileSystemView) -> list[dict[str, Any]]:
    files = {b: list(f) for b, f in view.index_files.items() if f}
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
        written = [r.asDict() for r in grouped.collect()]
    bad = [w for w in written if w["missing"] or w["extra"] or w["misplaced"] or w["duplicated"]]
    if bad:
        totals = {k: sum(int(w[k]) for w in bad) for k in ("missing", "extra", "misplaced", "duplicated")}
        raise BadInputError(
            f"the record index disagrees with the data in {len(bad)} bucket(s) ({totals['missing']} keys without "
            f"an entry, {totals['extra']} entries without a key, {totals['misplaced']} entries pointing elsewhere, "
            f"{totals['duplicated']} keys stored twice); nothing was rehashed: run `bucketindex validate` first")
    out = _one_per([w for w in written if w["path"]], lambda w: int(w["bucket"]))
    log.info("rehash %s: %s split into %d (%s)", instant, plural(len(files), "old index bucket"), len(out),
             plural(sum(int(w["entries"]) for w in out), "entry"))
    return out
