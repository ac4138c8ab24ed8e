"""Spark SQL expressions for keys, buckets and partition paths.

The core's one definition of each rule -- the canonical key (``hashing.canonical_key``), the
partition directory (``layout.partition_dir``) -- applied with Spark SQL functions as its
primitives, so routing a record costs no Python and cannot drift from the rule;
``tests/spark/test_keys.py`` holds the primitives to Python's on users' kinds of values.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_jobs.index.hashing import canonical_key
from spark_jobs.table.layout import partition_dir

__all__ = ["key_expr", "bucket_expr", "partition_expr", "aliased_partition_expr", "file_id_for_bucket_expr"]


def key_expr(fields: list[str]) -> Column:
    """The canonical record key: :func:`spark_jobs.index.hashing.canonical_key` applied to the
    fields' ``cast(... as string)`` with Spark's literal ``replace`` and ``concat`` (not
    ``concat_ws``: a null field makes the whole key null, and the batch checks reject it)."""
    def join(cols: list[Column], sep: str) -> Column:
        return F.concat(*[c for i, col in enumerate(cols) for c in ([F.lit(sep)] if i else []) + [col]])

    return canonical_key([F.col(f).cast("string") for f in fields],
                         replace=lambda c, old, new: F.replace(c, F.lit(old), F.lit(new)), join=join)


def bucket_expr(key: Column, num_buckets: int) -> Column:
    """``pmod(xxhash64(key), n)``: Spark's xxhash64 uses seed 42, like ``hashing.bucket_of``."""
    return F.pmod(F.xxhash64(key), F.lit(num_buckets)).cast("int")


class _SparkDirOps:
    """The layout's :class:`~spark_jobs.table.layout.DirOps` as Spark SQL functions."""

    def lit(self, s: str) -> Column:
        return F.lit(s)

    def url_encode(self, text: Column) -> Column:
        return F.url_encode(text)  # java.net.URLEncoder, UTF-8

    def sub(self, v: Column, pattern: str, repl: str) -> Column:
        return F.regexp_replace(v, pattern, repl)

    def head(self, v: Column, n: int) -> Column:
        return F.substring(v, 1, n)

    def sha256_hex(self, text: Column) -> Column:
        return F.sha2(text, 256)

    def longer(self, v: Column, n: int, then: Callable[[], Column], otherwise: Column) -> Column:
        return F.when(F.length(v) > n, then()).otherwise(otherwise)

    def concat(self, *vs: Column) -> Column:
        return F.concat(*vs)

    def if_null(self, v: Column, default: str) -> Column:
        return F.coalesce(v, F.lit(default))


def partition_expr(fields: list[str]) -> Column:
    """Hive-style partition directory, ``""`` when unpartitioned: the layout's one definition
    (:func:`spark_jobs.table.layout.partition_dir`, format.md §1) applied to the first field's
    ``cast(... as string)`` with Spark's string functions. Field names are checked
    (``config.check_field_names``) before any query: no ``.`` or backtick reaches ``F.col``."""
    if not fields:
        return F.lit("")
    return partition_dir(fields[0], F.col(fields[0]).cast("string"), _SparkDirOps())


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
