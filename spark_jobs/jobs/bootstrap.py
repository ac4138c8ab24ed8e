"""The bootstrap on Spark (``bucketindex bootstrap --engine spark``).

The rules -- which file becomes which file group, the duplicate choice, the index entries,
the commit -- are :mod:`spark_jobs.table.action.bootstrap`'s; this module supplies its
primitives as Spark jobs:

* **reference** -- one scan of the key columns of every file (a task per few files, Arrow
  reads, no rows moved) shuffled once by index bucket; the checks per bucket; the files
  holding a losing duplicate rewritten; one index delta per index bucket.
* **rewrite** -- the dataset's rows (read by pyarrow in the tasks) as a DataFrame, through
  the Spark upsert into the empty table, recorded as a ``bootstrap`` instant.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.kernels import tasks
from spark_jobs.jobs.keys import bucket_expr, key_expr, partition_expr
from spark_jobs.jobs.session import default_parallelism, job_conf, session_start_ms
from spark_jobs.table.action import bootstrap as action
from spark_jobs.table.action.bootstrap import (
    KEY,
    BootstrapOptions,
    Prepared,
    SourceDataset,
    check_bucket,
    read_files,
    rewrite_files,
    scan_keys,
    scan_schema,
)
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.layout import partition_path
from spark_jobs.table.shadow import SAMPLES
from spark_jobs.table.schema import stored_schema
from spark_jobs.table.table import Table

__all__ = ["BootstrapOptions", "SparkBootstrapEngine", "run_bootstrap"]

log = logging.getLogger("bucketindex.bootstrap")

CHECK_OUTPUT = "kind string, fno int, n long, bad long, problem string, key string, row long"


def run_bootstrap(spark: SparkSession | Callable[[], SparkSession], opts: BootstrapOptions, *,
                  choice: Any = None, prepared: Prepared | None = None) -> dict[str, Any]:
    """Bootstrap ``opts.table`` from ``opts.source`` on Spark (:func:`spark_jobs.table.action.bootstrap.run`).

    ``spark`` may be a function that starts a session: it is called after the checks that need
    no Spark (a bad option or a rerun of a completed bootstrap costs no JVM).
    """
    def engine_for(_: Prepared) -> tuple[SparkBootstrapEngine, int | None]:
        if callable(spark):
            import time

            t = time.perf_counter()
            session = spark()
            return SparkBootstrapEngine(session, choice=choice), int((time.perf_counter() - t) * 1000)
        return SparkBootstrapEngine(spark, choice=choice), session_start_ms()

    return action.run(engine_for, opts, choice=choice, prepared=prepared)


class SparkBootstrapEngine:
    """The bootstrap's primitives as Spark jobs over one session."""

    name = "spark"

    def __init__(self, spark: SparkSession, *, choice: Any = None) -> None:
        self.spark = spark
        self.choice = choice
        self._cached: list[DataFrame] = []
        self._keys: DataFrame | None = None
        self._tasks_n = 1

    def _file_list(self, source: SourceDataset) -> DataFrame:
        """One row per dataset file (its ordinal), spread over a few waves of tasks."""
        rows = [(i, f.path) for i, f in enumerate(source.files)]
        tasks_n = max(1, min(len(rows), 4 * default_parallelism(self.spark)))
        return self.spark.createDataFrame(rows, "fno int, path string").repartition(tasks_n)

    def partition_dirs(self, source: SourceDataset, field: str | None) -> dict[Any, str]:
        """By the expression every Spark write uses -- or its Python twin for the string and
        integer values Hive directories infer (a query costs a cold JVM seconds)."""
        if not field:
            return {None: ""}
        values = sorted({f.values.get(field) for f in source.files}, key=lambda v: (v is None, str(v)))
        if all(v is None or (isinstance(v, (str, int)) and not isinstance(v, bool)) for v in values):
            return {v: partition_path(field, v) for v in values}
        schema = from_arrow_schema(pa.schema([source.schema.field(field)]))
        df = self.spark.createDataFrame([(v,) for v in values], schema)
        return {r[0]: r[1] for r in df.select(F.col(field), partition_expr([field]).alias("p")).collect()}

    def scan(self, source: SourceDataset, opts: BootstrapOptions, *, num_buckets: int) -> list[dict[str, Any]]:
        # one shuffle for the whole job: the keys by index bucket. The checks group by bucket
        # and the index tasks too, so neither shuffles again
        pre = opts.precombine_field
        scan = tasks.bind_batches(scan_keys, source_uri=opts.source, paths=[f.path for f in source.files],
                                  values=[f.values for f in source.files], schema=source.schema,
                                  path_columns=source.path_columns, record_key=opts.record_key, precombine=pre,
                                  batch_rows=tasks.READ_BATCH_ROWS)
        self._tasks_n = max(default_parallelism(self.spark), min(num_buckets, 200))
        keys = self._file_list(source).mapInArrow(scan, from_arrow_schema(scan_schema(source, pre)))
        keys = keys.withColumn("bucket", bucket_expr(F.col(KEY), num_buckets)).repartition(self._tasks_n, "bucket")
        keys = keys.persist(StorageLevel.MEMORY_AND_DISK)
        self._cached.append(keys)
        self._keys = keys
        with job_conf(self.spark, **{"spark.sql.shuffle.partitions": self._tasks_n}):
            found = keys.groupBy("bucket").applyInArrow(tasks.bind(check_bucket, precombine=pre),
                                                        CHECK_OUTPUT).collect()
        return [r.asDict() for r in found]

    def rewrite_files(self, table: Table, todo: list[tuple[int, str, str, str, list[int]]], *, instant: str,
                      snapshot_seq: int, schema: pa.Schema) -> list[dict[str, Any]]:
        df = self.spark.createDataFrame(todo, "fno int, rel string, part string, fid string, drop array<long>")
        df = df.repartition(max(1, min(len(todo), 4 * default_parallelism(self.spark))))
        out = df.mapInArrow(tasks.bind_batches(rewrite_files, table_uri=table.uri, instant=instant,
                                               snapshot_seq=snapshot_seq, schema=schema, token=tasks.task_token,
                                               write=tasks.write_marked_parquet),
                            "fno int, path string, num_rows long, size long").collect()
        return [r.asDict() for r in out]

    def write_index(self, table: Table, *, losers: dict[int, list[int]], locations: list[tuple[str, str]],
                    instant: str, snapshot_seq: int) -> list[dict[str, Any]]:
        assert self._keys is not None
        keys = self._keys
        locs = self.spark.createDataFrame([(i, p, f) for i, (p, f) in enumerate(locations)],
                                          "fno int, part string, fid string")
        # broadcast joins keep the keys' partitioning by bucket: the index tasks do not shuffle
        live = keys
        if losers:
            lost = self.spark.createDataFrame([(f, r) for f, rows in losers.items() for r in rows], "fno int, row long")
            live = keys.join(F.broadcast(lost), ["fno", "row"], "left_anti")
        entries = live.join(F.broadcast(locs), "fno").select(
            F.col(KEY).alias("key"), "part", "fid", F.lit(False).alias("tomb"), "bucket")
        with job_conf(self.spark, **{"spark.sql.shuffle.partitions": self._tasks_n}):
            written = entries.groupBy("bucket").applyInArrow(
                tasks.bind(tasks.write_index_delta, table_uri=table.uri, instant=instant, snapshot_seq=snapshot_seq),
                tasks.DELTA_OUTPUT).collect()
        return [r.asDict() for r in written]

    def read_dataset(self, source: SourceDataset) -> DataFrame:
        read = tasks.bind_batches(read_files, source_uri=source.uri, paths=[f.path for f in source.files],
                                  values=[f.values for f in source.files], schema=source.schema,
                                  path_columns=source.path_columns, batch_rows=tasks.READ_BATCH_ROWS)
        df = self._file_list(source).mapInArrow(read, from_arrow_schema(stored_schema(source.schema)))
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        self._cached.append(df)
        return df

    def count_identities(self, frame: DataFrame, *, record_key: list[str], identity_field: str | None
                         ) -> tuple[int, int, int, list[str]]:
        extra = [identity_field] if identity_field else []
        keyed = frame.select(key_expr(record_key).alias(KEY), *extra)
        groups = keyed.groupBy(KEY, *extra).agg(F.count(F.lit(1)).alias("n"))
        agg = groups.agg(F.sum("n").alias("total"), F.sum(F.when(F.col("n") > 1, 1)).alias("keys"),
                         F.sum(F.when(F.col("n") > 1, F.col("n"))).alias("rows")).first()
        total, n_dup, dup_rows = int(agg["total"] or 0), int(agg["keys"] or 0), int(agg["rows"] or 0)
        samples = [r[0] for r in groups.filter("n > 1").orderBy(KEY).limit(SAMPLES).collect()] if n_dup else []
        return total, n_dup, dup_rows, samples

    def upsert(self, opts: UpsertOptions) -> dict[str, Any]:
        from spark_jobs.jobs.upsert import run_upsert

        return run_upsert(self.spark, opts, choice=self.choice)

    def release(self) -> None:
        for df in self._cached:
            df.unpersist()
        self._cached.clear()
