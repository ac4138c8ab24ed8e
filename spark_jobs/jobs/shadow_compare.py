"""``shadow-compare``: the index's answer for each key against the truth, as a JSON report.

What is compared for which index type and ``--against``, what ``--since`` and
``--sample-fraction`` select, and every report field are described in
:mod:`spark_jobs.table.shadow`. This job only reads: nothing is written to the table.

It is built from ``validate``'s pieces -- the key scan that labels each key with the file
group whose file was opened (:func:`keys_with_location`), the live entries of index buckets
(``tasks.read_bucket_entries``), fingerprints (``tasks.fingerprint_keys``) and Spark's twin of
the bucket hash (:func:`bucket_expr`) -- but asks a different question: validate lists every
broken invariant of the table, shadow-compare answers "would a lookup of this key have been
right?", per key, so its counts are keys and a ``--since`` or a sample can narrow them.
:mod:`spark_jobs.arrow_engine.shadow_compare` runs the same comparison in-process (``--engine``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.io.storage import redact_uri
from spark_jobs.kernels import tasks
from spark_jobs.jobs.keys import bucket_expr, file_id_for_bucket_expr
from spark_jobs.jobs.read import keys_with_location
from spark_jobs.jobs.session import default_parallelism, job_conf
from spark_jobs.jobs.validate import ENTRY_SCHEMA, count_and_sample
from spark_jobs.resources import shuffle_partitions
from spark_jobs.table import shadow
from spark_jobs.table.config import INDEX_RECORD
from spark_jobs.table.shadow import ShadowOptions, Touched
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView
from spark_jobs.text import plural

__all__ = ["run_shadow_compare"]

log = logging.getLogger("bucketindex.shadow_compare")

KEY = tasks.KEY
DATA_SCHEMA = f"{KEY} string, part string, fid string, fp_hi long, fp_lo long"
TOUCHED_SCHEMA = f"fp_hi long, fp_lo long, bucket int, {KEY} string"


def run_shadow_compare(spark: SparkSession, uri: str, opts: ShadowOptions | None = None) -> dict[str, Any]:
    """Compare and return the report (``ok`` False when mismatches exceed ``opts.max_mismatches``).

    Options are checked before anything is read (BadInputError: exit 2).
    """
    start = time.monotonic()
    opts = opts or ShadowOptions()
    table = Table.load(uri)
    assert table.config is not None
    shadow.check_options(table.config.index_type, opts)
    view = table.view()
    instant = table.timeline.max_instant() or None
    touched = shadow.touched_since(table, opts.since) if opts.since is not None else None
    parts = shuffle_partitions(sum(s.size for s in view.slices()) // 4, default_parallelism(spark))
    with job_conf(spark, **{"spark.sql.shuffle.partitions": parts}):
        keys_checked, found = _compare(spark, table, view, opts, touched)
    report = shadow.build_report(table=table, index_type=table.config.index_type, instant=instant, opts=opts,
                                 keys_checked=keys_checked, found=found, touched=touched,
                                 elapsed_ms=int((time.monotonic() - start) * 1000))
    log.info("shadow-compare %s against %s: %s, %s", redact_uri(uri), opts.against, plural(keys_checked, "key"),
             plural(report["mismatches"], "mismatch"))
    return report


def _compare(spark: SparkSession, table: Table, view: FileSystemView, opts: ShadowOptions,
             touched: Touched | None) -> tuple[int, dict[str, Any]]:
    cfg = table.config
    assert cfg is not None
    nb = table.num_buckets(view)
    rows = keys_with_location(spark, table, view)
    data = (rows.mapInArrow(tasks.fingerprint_keys, DATA_SCHEMA) if rows is not None
            else spark.createDataFrame([], DATA_SCHEMA))
    tkeys = None
    if touched is not None:
        tkeys = _touched_keys(spark, table, touched, nb).cache()
        data = data.join(tkeys.select("fp_hi", "fp_lo"), ["fp_hi", "fp_lo"], "left_semi")
    data = _sampled(data, opts.sample_fraction)
    found: dict[str, Any] = {}
    if cfg.index_type == INDEX_RECORD:
        n = _compare_record(spark, table, view, opts, data.withColumn("bucket", bucket_expr(F.col(KEY), nb)),
                            tkeys, found)
    else:
        n = _compare_hashed(cfg.index_type, opts, data, nb, found)
    if tkeys is not None:
        tkeys.unpersist()
    return n, found


def _sampled(df: DataFrame, fraction: float) -> DataFrame:
    """The keys of a ``--sample-fraction`` sample: the top 32 bits of the fingerprint below the cutoff."""
    if fraction >= 1:
        return df
    return df.filter(F.shiftrightunsigned(F.col("fp_hi"), 32) < F.lit(shadow.sample_cutoff(fraction)))


def _touched_keys(spark: SparkSession, table: Table, touched: Touched, nb: int) -> DataFrame:
    """``(fp_hi, fp_lo, bucket, key)`` once per fingerprint touched after ``--since``: keys read
    from the touched data files, fingerprints (no key) from the touched index files."""
    parts = []
    if touched.data_files:
        files = spark.createDataFrame([(rel, "", "", []) for rel in touched.data_files], tasks.FILE_LIST_SCHEMA)
        files = files.repartition(max(1, min(len(touched.data_files), default_parallelism(spark))))
        keys = files.mapInArrow(tasks.bind_batches(tasks.read_file_keys, table_uri=table.uri),
                                f"{KEY} string, part string, fid string")
        parts.append(keys.mapInArrow(tasks.fingerprint_keys, DATA_SCHEMA).select(
            "fp_hi", "fp_lo", bucket_expr(F.col(KEY), nb).alias("bucket"), KEY))
    if touched.index_files:
        idx = spark.createDataFrame(touched.index_files, "bucket int, path string")
        idx = idx.repartition(max(1, min(len(touched.index_files), default_parallelism(spark))))
        parts.append(idx.mapInArrow(tasks.bind_batches(shadow.index_file_fingerprints, table_uri=table.uri),
                                    "bucket int, fp_hi long, fp_lo long").select(
            "fp_hi", "fp_lo", "bucket", F.lit(None).cast("string").alias(KEY)))
    if not parts:
        return spark.createDataFrame([], TOUCHED_SCHEMA)
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    # a fingerprint's bucket is the same from both sides; min() keeps a key string when one was read
    return out.groupBy("fp_hi", "fp_lo").agg(F.min("bucket").alias("bucket"), F.min(KEY).alias(KEY))


def _compare_record(spark: SparkSession, table: Table, view: FileSystemView, opts: ShadowOptions,
                    data: DataFrame, tkeys: DataFrame | None, found: dict[str, Any]) -> int:
    """Record index: per fingerprint, the live rows (with the bucket the key hashes to) full-joined
    with the live entry of that bucket -- the entry a lookup of the key would find."""
    files = {b: list(f) for b, f in view.index_files.items() if f}
    if tkeys is not None:  # only the buckets the touched keys hash to
        wanted = {r[0] for r in tkeys.select("bucket").distinct().collect()}
        files = {b: f for b, f in files.items() if b in wanted}
    entries = (
        spark.createDataFrame([(b,) for b in files], "bucket int").groupBy("bucket")
        .applyInArrow(tasks.bind(tasks.read_bucket_entries, table_uri=table.uri, files=files), ENTRY_SCHEMA)
    ) if files else spark.createDataFrame([], ENTRY_SCHEMA)
    if tkeys is not None:
        entries = entries.join(tkeys.select("fp_hi", "fp_lo"), ["fp_hi", "fp_lo"], "left_semi")
    entries = _sampled(entries, opts.sample_fraction)
    partition_only = shadow.record_partition_only(opts)  # a record table's file groups are not hash buckets
    loc = F.col("part") if partition_only else F.struct("part", "fid")
    d = data.groupBy("fp_hi", "fp_lo", "bucket").agg(
        F.count(F.lit(1)).alias("n"), F.min(KEY).alias(KEY), F.collect_set(loc).alias("locs"))
    j = d.alias("d").join(entries.alias("i"), ["fp_hi", "fp_lo", "bucket"], "full_outer")
    if tkeys is not None:  # name an extra entry by the key a --since read, when it read one
        j = j.join(tkeys.select("fp_hi", "fp_lo", F.col(KEY).alias("_bi_tkey")), ["fp_hi", "fp_lo"], "left")
        label: Column = F.coalesce(F.col("_bi_tkey"), _fp_label())
    else:
        label = _fp_label()
    j = j.cache()
    answer = F.col("i.part") if partition_only else F.struct(F.col("i.part").alias("part"),
                                                              F.col("i.fid").alias("fid"))
    row, entry = F.col("d.n").isNotNull(), F.col("i.fid").isNotNull()
    d_key = F.col("d." + KEY)
    count_and_sample(found, j, {
        "missing": (row & ~entry, d_key),
        "wrong_location": (row & entry & ~F.array_contains(F.col("d.locs"), answer), d_key),
        "extra": (~row, label),
        "duplicated": (F.col("d.n") > 1, d_key),
    }, samples=shadow.SAMPLES, ordered=True)  # the smallest names: shadow.add_found's rule
    n = j.count()
    j.unpersist()
    return n


def _fp_label() -> Column:
    """``shadow.fingerprint_label`` in Spark: Java's ``%x`` prints a negative long as its unsigned value."""
    return F.format_string("fp:%016x%016x", F.col("fp_hi"), F.col("fp_lo"))


def _compare_hashed(index_type: str, opts: ShadowOptions, data: DataFrame, nb: int, found: dict[str, Any]) -> int:
    """Bucket index (answer: file group ``hash(key) mod N`` of the row's partition) and
    global_simple (answer: wherever the row is): only wrong locations and duplicates can occur."""
    identity = shadow.hashed_identity(index_type, opts)
    answer = (file_id_for_bucket_expr(bucket_expr(F.col(KEY), nb)) if shadow.hashed_answer_is_bucket(index_type)
              else F.col("fid"))
    d = data.groupBy(*identity).agg(
        F.count(F.lit(1)).alias("n"), F.max((F.col("fid") != answer).cast("int")).alias("wrong")).cache()
    count_and_sample(found, d, {
        "wrong_location": (F.col("wrong") == 1, F.col(KEY)),
        "duplicated": (F.col("n") > 1, F.col(KEY)),
    }, samples=shadow.SAMPLES, ordered=True)
    n = d.count()
    d.unpersist()
    return n
