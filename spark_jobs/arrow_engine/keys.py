"""Record keys, partition directories, buckets and file-group slots computed on Arrow arrays.

The in-process twins of :mod:`spark_jobs.jobs.keys` and of the Spark upsert's file-group
slot (``pmod(xxhash64(key, "file-group"), n)``). Both engines must route every record to the
same partition, bucket and file group, byte for byte, or two writers of one table would store
one key twice; ``tests/spark/test_keys.py`` holds them to Spark on users' kinds of data.

Only column types whose ``cast(... as string)`` in Spark this module reproduces exactly are
accepted; any other raises :class:`EngineUnsupportedError`, so ``--engine auto`` hands the
batch to Spark instead of guessing a text form (a double's ``1.0E7``, a binary's decoding)
that could differ in one character.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from spark_jobs.exceptions import EngineUnsupportedError
from spark_jobs.index.hashing import BUCKET_HASH_SEED, canonical_key
from spark_jobs.io.arrays import from_numpy
from spark_jobs.table.action.upsert import FILE_GROUP_SALT
from spark_jobs.table.layout import partition_path

__all__ = ["bucket_ids", "by_bucket", "file_group_slots", "key_text", "partition_dirs", "record_keys"]

#: the second argument of the slot hash ``xxhash64(key, FILE_GROUP_SALT)`` (the action's rule)
_SALT = FILE_GROUP_SALT.encode("utf-8")

#: the dates whose ``YYYY-MM-DD`` text Arrow and Spark write alike (Spark signs other years)
_MIN_DAY = -719162  # 0001-01-01
_MAX_DAY = 2932896  # 9999-12-31
_US_PER_DAY = 86_400_000_000


def _column(table: pa.Table, name: str) -> pa.Array:
    if name not in table.column_names:
        raise KeyError(f"column {name!r} is not in the batch (columns: {', '.join(table.column_names)})")
    col = table.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _decimal_text(arr: pa.Array) -> pa.Array:
    # Spark prints a decimal as BigDecimal.toPlainString with the type's scale ("0.0000000100",
    # "0.0000"); Arrow's cast prints scientific notation ("1.00E-8"), so Python formats it
    return pa.array([None if v is None else format(v, "f") for v in arr.to_pylist()], type=pa.string())


def _timestamp_text(arr: pa.Array, *, name: str) -> pa.Array:
    # Spark (session time zone UTC): "yyyy-MM-dd HH:mm:ss" of the UTC wall clock (a naive
    # timestamp_ntz: its own wall clock), then the microseconds with trailing zeros cut
    # (".5", ".000001"), nothing when they are zero; the second is floored (checked for 1969)
    if arr.type.unit == "ns":  # Spark holds microseconds: a table never stores nanoseconds
        raise EngineUnsupportedError(f"column {name!r} holds nanosecond timestamps: use the Spark engine")
    us = pc.cast(arr.cast(pa.timestamp("us", tz=arr.type.tz)), pa.int64())
    lo, hi = pc.min_max(us).values()
    if lo.is_valid and (lo.as_py() < _MIN_DAY * _US_PER_DAY or hi.as_py() >= (_MAX_DAY + 1) * _US_PER_DAY):
        raise EngineUnsupportedError(f"column {name!r} holds timestamps outside years 1..9999, whose text only "
                                     f"Spark defines: use the Spark engine")
    naive = us.cast(pa.timestamp("us"))
    whole = pc.strftime(naive, format="%Y-%m-%d %H:%M:%S")  # %S of a us timestamp prints the fraction too
    whole = pc.utf8_slice_codeunits(whole, 0, 19)
    frac = np.mod(us.fill_null(0).to_numpy(), 1_000_000)
    tails = pa.array([f".{f:06d}".rstrip("0") if f else "" for f in frac.tolist()], type=pa.string())
    return pc.binary_join_element_wise(whole, tails, "", null_handling="emit_null")


def key_text(arr: pa.Array, *, name: str) -> pa.Array:
    """``arr`` as Spark's ``cast(col as string)`` gives it (session time zone UTC), as ``pa.string()``.

    Supported: strings, int8..int64 (Java's decimal text), booleans (``true``/``false``),
    dates of years 1..9999 (``YYYY-MM-DD``) and decimal128 (plain text with the type's
    scale), timestamps of years 1..9999 (zone-aware ones as the UTC wall clock, Spark's
    session zone; the fraction's trailing zeros cut). Refused with
    :class:`EngineUnsupportedError`: floats (Java prints ``1.0E7``), binary (Spark decodes
    bytes as UTF-8, replacing invalid ones), unsigned ints (a table never holds them),
    dates and timestamps outside years 1..9999, nested and other types.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pc.cast(arr, pa.string())
    if pa.types.is_integer(t) and pa.types.is_signed_integer(t):
        return pc.cast(arr, pa.string())
    if pa.types.is_boolean(t):
        return pc.cast(arr, pa.string())
    if pa.types.is_date32(t):
        days = pc.cast(arr, pa.int32())
        lo, hi = pc.min_max(days).values()
        if lo.is_valid and (lo.as_py() < _MIN_DAY or hi.as_py() > _MAX_DAY):
            raise EngineUnsupportedError(f"column {name!r} holds dates outside years 1..9999, whose text only "
                                         f"Spark defines: use the Spark engine")
        return pc.cast(arr, pa.string())
    if pa.types.is_decimal128(t):
        return _decimal_text(arr)
    if pa.types.is_timestamp(t):
        return _timestamp_text(arr, name=name)
    raise EngineUnsupportedError(f"column {name!r} of type {t} has a text form only Spark defines "
                                 f"(keys and partition values): use the Spark engine")


def record_keys(table: pa.Table, fields: list[str]) -> pa.Array:
    """The record key of each row: :func:`spark_jobs.index.hashing.canonical_key` applied to the
    fields' Spark texts (:func:`key_text`) with Arrow's kernels, so equal to Spark's
    ``key_expr(fields)``; null when any field is null (the caller rejects null keys)."""
    if not fields:
        raise ValueError("a record key needs at least one field")
    # the core's one definition (hashing.canonical_key) with Arrow's string kernels
    return canonical_key([key_text(_column(table, f), name=f) for f in fields],
                         replace=lambda t, old, new: pc.replace_substring(t, old, new),
                         join=lambda ts, sep: pc.binary_join_element_wise(*ts, sep, null_handling="emit_null"))


def partition_dirs(table: pa.Table, fields: list[str]) -> pa.Array:
    """The partition directory of each row, equal to Spark's ``partition_expr(fields)``: ``""``
    unpartitioned, else ``field=<encoded>`` for the first field.

    The encoding is :func:`spark_jobs.table.layout.partition_path` applied to the value's Spark
    text (:func:`key_text`), once per distinct value: one rule for both engines, and a batch
    pays for its distinct partitions, not its rows.
    """
    n = table.num_rows
    if not fields:
        return pa.array([""] * n, type=pa.string())
    field = fields[0]
    text = key_text(_column(table, field), name=field)
    encoded = text.dictionary_encode(null_encoding="mask")
    dirs = pa.array([partition_path(field, v) for v in encoded.dictionary.to_pylist()], type=pa.string())
    out = pc.take(dirs, encoded.indices)
    if out.null_count:
        out = pc.fill_null(out, partition_path(field, None))
    return out


def _hashes(keys: pa.Array, per_key: Callable[[object], int]) -> np.ndarray:
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
        raise TypeError(f"keys must be strings, got {keys.type}")
    out = np.fromiter(map(per_key, keys.to_pylist()), dtype=np.uint64, count=len(keys))
    return out.view(np.int64)


def _key_hash(k: str | None) -> int:
    # Spark's xxhash64 skips a null input: the hash is then the seed itself
    return BUCKET_HASH_SEED if k is None else xxhash.xxh64_intdigest(k.encode("utf-8"), BUCKET_HASH_SEED)


def _slot_hash(k: str | None) -> int:
    # Spark's multi-argument xxhash64 chains: each value is hashed with the previous hash (as
    # an unsigned 64-bit seed) instead of 42, so xxhash64(key, "file-group") is
    # XXH64("file-group", seed=XXH64(key, 42))
    return xxhash.xxh64_intdigest(_SALT, _key_hash(k))


def bucket_ids(keys: pa.Array, num_buckets: int) -> np.ndarray:
    """``pmod(xxhash64(key), num_buckets)`` per key (Spark's ``bucket_expr``), as int64."""
    if num_buckets <= 0:
        raise ValueError(f"num_buckets must be positive, got {num_buckets}")
    return np.mod(_hashes(keys, _key_hash), np.int64(num_buckets))


def by_bucket(keys: pa.Array, buckets: np.ndarray) -> list[tuple[int, pa.Array]]:
    """``keys`` grouped by their bucket (``buckets[i]`` is key i's): (bucket, its keys) in
    ascending bucket order, each bucket's keys in batch order.

    One stable sort and one ``take``, then zero-copy slices: a ``filter`` of the whole batch per
    bucket is keys x buckets work (2.7 s for 1M keys over 524 buckets, against 0.5 s sorted;
    docs/benchmarks.md, "Index at RFC-08's size")."""
    buckets = np.asarray(buckets)
    if buckets.shape != (len(keys),):
        raise ValueError(f"buckets must hold one bucket per key: {buckets.shape} for {len(keys)} keys")
    if buckets.size == 0:
        return []
    order = np.argsort(buckets, kind="stable")  # stable: a bucket's keys keep their batch order
    ordered = buckets[order]
    uniq, starts = np.unique(ordered, return_index=True)
    ends = np.append(starts[1:], ordered.size)
    grouped = keys.take(from_numpy(order))
    return [(u, grouped.slice(s, e - s)) for u, s, e in zip(uniq.tolist(), starts.tolist(), ends.tolist())]


def file_group_slots(keys: pa.Array, sizes: np.ndarray) -> np.ndarray:
    """``pmod(xxhash64(key, "file-group"), sizes[i])`` per key: which of its partition's
    ``sizes[i]`` new file groups an insert goes to, as the Spark upsert assigns it."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.shape != (len(keys),):
        raise ValueError(f"sizes must hold one count per key: {sizes.shape} for {len(keys)} keys")
    if sizes.size and sizes.min() <= 0:
        raise ValueError("every file-group count must be positive")
    return np.mod(_hashes(keys, _slot_hash), sizes)
