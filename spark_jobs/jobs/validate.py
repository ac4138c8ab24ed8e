"""``validate``: a full index <-> data check.

For the record index: every live row's key is in the index pointing at the file group that
holds it, the index holds no other live key, and every entry sits in the bucket its key
hashes to. For the bucket index: every row sits in the file group of its bucket. For every
index: no key appears twice (per partition for the bucket index).

Every check is only as good as the rows it read, so the rows read per file group are first
reconciled with the row counts the commit metadata records: a file group that reads short
(a replaced or truncated file, or a reader that silently skipped it) is a problem itself,
instead of vanishing from every other check and letting the table pass.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.kernels import tasks
from spark_jobs.jobs.keys import bucket_expr
from spark_jobs.jobs.read import keys_with_location
from spark_jobs.jobs.session import default_parallelism, job_conf
from spark_jobs.resources import shuffle_partitions
from spark_jobs.table import validation
from spark_jobs.table.config import INDEX_BUCKET, INDEX_RECORD
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView

__all__ = ["run_validate", "count_and_sample", "ENTRY_SCHEMA"]

log = logging.getLogger("bucketindex.validate")
SAMPLES = validation.SAMPLES

ENTRY_SCHEMA = "bucket int, fp_hi long, fp_lo long, part string, fid string"


def run_validate(spark: SparkSession, uri: str) -> dict[str, Any]:
    table = Table.load(uri)
    view = table.view()
    # shuffles sized to the table (keys only: a fraction of its bytes), whatever the session says
    parts = shuffle_partitions(sum(s.size for s in view.slices()) // 4, default_parallelism(spark))
    with job_conf(spark, **{"spark.sql.shuffle.partitions": parts}):
        return _validate(spark, table, view)


def _validate(spark: SparkSession, table: Table, view: FileSystemView) -> dict[str, Any]:
    cfg = table.config
    assert cfg is not None
    rows = keys_with_location(spark, table, view)
    nb = table.num_buckets(view)
    report, problems = validation.new_report(table, view)
    damaged = validation.check_index_files(table, view, problems)  # left out of the record-index checks
    if validation.check_files(table, view, problems):  # reading them would fail or read other rows
        return validation.finish(report)
    if validation.add_damaged(problems, _damaged(spark, table, view, unreadable=damaged)):  # the same: their rows cannot be trusted
        return validation.finish(report)
    if rows is None and not any(view.index_files.values()):
        return validation.finish(report)
    if rows is not None:
        rows = rows.cache()
        report["rows"] = rows.count()
        read = {(r["part"], r["fid"]): r["count"] for r in rows.groupBy("part", "fid").count().collect()}
        mismatches = validation.row_count_mismatches(view, read)
        validation.add_problem(problems, "row_count_mismatch", len(mismatches), mismatches)
        dups = rows.groupBy(*validation.duplicate_identity(cfg.index_type)).count().filter("count > 1")
        _collect(problems, "duplicate_keys", dups.select(tasks.KEY))
    if cfg.index_type == INDEX_BUCKET and rows is not None:
        wrong = rows.filter(F.lpad(bucket_expr(F.col(tasks.KEY), nb).cast("string"), 8, "0") != F.col("fid"))
        _collect(problems, "rows_in_wrong_bucket", wrong.select(tasks.KEY))
    if cfg.index_type == INDEX_RECORD:
        files = {b: list(f) for b, f in view.index_files.items() if f and b not in damaged}
        entries = (
            spark.createDataFrame([(b,) for b in files], "bucket int").groupBy("bucket")
            .applyInArrow(tasks.bind(tasks.read_bucket_entries, table_uri=table.uri, files=files), ENTRY_SCHEMA)
        ) if files else spark.createDataFrame([], ENTRY_SCHEMA)
        entries = entries.cache()
        report["index_entries"] = entries.count()
        if rows is None:
            data = spark.createDataFrame([], f"{tasks.KEY} string, part string, fid string, fp_hi long, fp_lo long")
        else:
            data = rows.mapInArrow(
                tasks.fingerprint_keys, f"{tasks.KEY} string, part string, fid string, fp_hi long, fp_lo long"
            )
        data = data.withColumn("data_bucket", bucket_expr(F.col(tasks.KEY), nb))
        if damaged:  # a damaged bucket's keys: no entries to compare them with
            data = data.filter(~F.col("data_bucket").isin(sorted(damaged)))
        j = data.alias("d").join(entries.alias("i"), ["fp_hi", "fp_lo"], "full_outer")
        d_key = F.col("d." + tasks.KEY)
        checks = {  # the rules: spark_jobs.table.validation
            "keys_missing_from_index": (F.col("i.fid").isNull(), d_key),
            "index_entries_without_row": (F.col("d.fid").isNull(), F.concat_ws(":", "fp_hi", "fp_lo")),
            "index_points_to_wrong_file": (
                F.col("d.fid").isNotNull() & F.col("i.fid").isNotNull()
                & ((F.col("d.fid") != F.col("i.fid")) | (F.col("d.part") != F.col("i.part"))), d_key),
            "index_entries_in_wrong_bucket": (
                F.col("i.bucket").isNotNull() & F.col("d.data_bucket").isNotNull()
                & (F.col("i.bucket") != F.col("d.data_bucket")), d_key),
        }
        assert tuple(checks) == validation.RECORD_INDEX_CHECKS
        count_and_sample(problems, j, checks, ordered=True)
        entries.unpersist()
    if rows is not None:
        rows.unpersist()
    return validation.finish(report)


def _damaged(spark: SparkSession, table: Table, view: FileSystemView, *,
             unreadable: set[int]) -> list[tuple[str, str]]:
    """``(path, why)`` of every damaged file of the snapshot (but the index files of the
    ``unreadable`` buckets, reported already): ``tasks.verify_files`` in tasks, each reading
    its files whole (a file a partition, so big files spread over executors)."""
    files = validation.files_to_verify(view, unreadable=unreadable)
    if not files:
        return []
    listing = spark.createDataFrame([(f,) for f in files], "path string").repartition(
        min(len(files), max(1, default_parallelism(spark) * 2)))
    found = listing.mapInArrow(tasks.bind_batches(tasks.verify_files, table_uri=table.uri),
                               "path string, problem string").collect()
    return [(r["path"], r["problem"]) for r in found]


def count_and_sample(problems: dict[str, Any], df: DataFrame, checks: dict[str, tuple[Column, Column]], *,
                     samples: int = SAMPLES, ordered: bool = False) -> None:
    """Count every check's rows in one query over ``df`` (a join is computed once, not once
    per check); sample only the checks that found something (also used by shadow-compare).
    ``ordered``: the smallest sample values (``validation.add_problem``), else any."""
    counts = df.agg(*[F.sum(F.coalesce(cond, F.lit(False)).cast("long")).alias(f"c{i}")
                      for i, (cond, _) in enumerate(checks.values())]).first()
    for i, (name, (cond, sample)) in enumerate(checks.items()):
        n = counts[f"c{i}"] or 0
        if n:
            found = df.filter(cond).select(sample.alias("sample"))
            if ordered:
                found = found.orderBy("sample")
            problems[name] = {"count": n, "samples": [r[0] for r in found.limit(samples).collect()]}


def _collect(problems: dict[str, Any], name: str, df: DataFrame) -> None:
    """``df``'s rows (one column) as a problem: its count and its smallest values."""
    n = df.count()
    if n:
        col = df.columns[0]
        validation.add_problem(problems, name, n, [r[0] for r in df.orderBy(col).limit(SAMPLES).collect()])
