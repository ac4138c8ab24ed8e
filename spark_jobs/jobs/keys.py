"""Spark SQL expressions for keys, buckets and partition paths.

These are the JVM twins of :mod:`spark_jobs.index.hashing`: native expressions, so routing
a record costs no Python. ``tests/spark/test_keys.py`` proves both sides agree.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_jobs.table.layout import (
    CUT_ESCAPE,
    DUNDER_ESCAPE,
    LONG_VALUE_HASH_CHARS,
    LONG_VALUE_SEP,
    NULL_PARTITION,
    long_value_budget,
)

__all__ = ["key_expr", "bucket_expr", "partition_expr", "aliased_partition_expr", "file_id_for_bucket_expr"]


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
    """Hive-style partition directory, ``""`` when unpartitioned: the twin of
    ``layout.partition_path`` (format.md §1) -- the value URL-encoded, a leading ``__``
    escaped as ``%5F_``, ``__NULL__`` for null, a long value cut to a prefix plus ``~`` plus
    the first 32 hex digits of the SHA-256 of its UTF-8 text. Field names are checked
    (``config.check_field_names``) before any query: no ``.`` or backtick reaches ``F.col``."""
    if not fields:
        return F.lit("")
    f = fields[0]
    text = F.col(f).cast("string")
    encoded = F.regexp_replace(F.url_encode(text), DUNDER_ESCAPE[0], DUNDER_ESCAPE[1])
    whole, prefix = long_value_budget(field=f)
    shortened = F.concat(F.regexp_replace(F.substring(encoded, 1, prefix), CUT_ESCAPE, ""), F.lit(LONG_VALUE_SEP),
                         F.substring(F.sha2(text, 256), 1, LONG_VALUE_HASH_CHARS))
    value = F.when(F.length(encoded) > whole, shortened).otherwise(encoded)
    return F.concat(F.lit(f"{f}="), F.coalesce(value, F.lit(NULL_PARTITION)))


def aliased_partition_expr(part: Column, aliases: dict[str, str]) -> Column:
    """``part`` with each directory name in ``aliases`` replaced by the old name a table
    written before has for the same value (``layout.legacy_partition_aliases``)."""
    if not aliases:
        return part
    lookup = F.create_map(*[F.lit(x) for kv in sorted(aliases.items()) for x in kv])
    return F.coalesce(lookup[part], part)


def file_id_for_bucket_expr(bucket: Column) -> Column:
    """Bucket-index file ids are the zero-padded bucket number: routing needs no lookup."""
    return F.lpad(bucket.cast("string"), 8, "0")
