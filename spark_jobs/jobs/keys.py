"""Spark SQL expressions for keys, buckets and partition paths.

These are the JVM twins of :mod:`spark_jobs.index.hashing`: native expressions, so routing
a record costs no Python. ``tests/spark/test_keys.py`` proves both sides agree.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_jobs.table.layout import NULL_PARTITION

__all__ = ["key_expr", "bucket_expr", "partition_expr", "file_id_for_bucket_expr"]


def key_expr(fields: list[str]) -> Column:
    """The canonical record key (see ``hashing.composite_key``)."""
    if len(fields) == 1:
        return F.col(fields[0]).cast("string")
    escaped = [
        F.regexp_replace(F.regexp_replace(F.col(f).cast("string"), r"\\", r"\\\\"), ",", r"\\,") for f in fields
    ]
    # concat (not concat_ws) so a null field makes the whole key null and is rejected
    parts: list[Column] = []
    for i, e in enumerate(escaped):
        if i:
            parts.append(F.lit(","))
        parts.append(e)
    return F.concat(*parts)


def bucket_expr(key: Column, num_buckets: int) -> Column:
    """``pmod(xxhash64(key), n)``: Spark's xxhash64 uses seed 42, like ``hashing.bucket_of``."""
    return F.pmod(F.xxhash64(key), F.lit(num_buckets)).cast("int")


def partition_expr(fields: list[str]) -> Column:
    """Hive-style partition directory, values URL-encoded; ``""`` when unpartitioned."""
    if not fields:
        return F.lit("")
    f = fields[0]
    return F.concat(F.lit(f"{f}="), F.coalesce(F.url_encode(F.col(f).cast("string")), F.lit(NULL_PARTITION)))


def file_id_for_bucket_expr(bucket: Column) -> Column:
    """Bucket-index file ids are the zero-padded bucket number: routing needs no lookup."""
    return F.lpad(bucket.cast("string"), 8, "0")
