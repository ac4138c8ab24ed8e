"""Key hashing shared by the JVM (Spark SQL) and Python sides.

Two hashes, two jobs:

* **Bucket hash** -- ``xxhash64(utf8(key), seed=42)`` read as a signed 64-bit integer,
  taken non-negative modulo the bucket count. Spark's built-in ``xxhash64(col)`` computes
  exactly this for a string column, so Spark routes records with a native expression
  (``pmod(xxhash64(key), n)``) and Python agrees without a UDF.
* **Fingerprint** -- the 128-bit XXH3 hash of ``utf8(key)``, stored in the record index
  instead of the key itself. Fixed width makes index files small (16 bytes instead of ~36
  for a UUID) and lets lookups binary-search with numpy. Two distinct keys collide with
  probability 2^-128; among ``n`` keys the chance of any collision is about
  ``n^2 / 2^129`` (1e-19 for ten billion keys), far below the rate of undetected disk
  errors. ``fp_hi`` is the high 64 bits, ``fp_lo`` the low 64 bits, both unsigned.

Composite keys are encoded canonically before either hash: :func:`canonical_key` is the one
definition, which the engines apply to Arrow arrays and Spark columns.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence, TypeVar

import numpy as np
import xxhash

__all__ = [
    "BUCKET_HASH_SEED",
    "DEFAULT_HASH",
    "KEY_ESCAPES",
    "KEY_SEPARATOR",
    "bucket_of",
    "canonical_key",
    "buckets_of",
    "composite_key",
    "fingerprints",
    "fingerprint",
]

BUCKET_HASH_SEED = 42
DEFAULT_HASH = "xxhash64"

_I64 = 1 << 63
_U64 = 1 << 64


def _signed(v: int) -> int:
    return v - _U64 if v >= _I64 else v


def bucket_hash(key: str) -> int:
    """Spark's ``xxhash64(key)`` for a string: XXH64 of the UTF-8 bytes, seed 42, signed."""
    return _signed(xxhash.xxh64_intdigest(key.encode("utf-8"), BUCKET_HASH_SEED))


def bucket_of(key: str, num_buckets: int) -> int:
    """The bucket of ``key``: ``pmod(xxhash64(key), num_buckets)`` as Spark computes it."""
    return bucket_hash(key) % num_buckets  # Python's % is already non-negative for n > 0


def buckets_of(keys: Iterable[str], num_buckets: int) -> np.ndarray:
    h = xxhash.xxh64_intdigest
    return np.fromiter(
        (_signed(h(k.encode("utf-8"), BUCKET_HASH_SEED)) % num_buckets for k in keys), dtype=np.int64
    )


def fingerprints(keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(fp_hi, fp_lo) uint64 arrays of the XXH3-128 of each key's UTF-8 bytes."""
    # map() over a C-level digest is ~20% faster than a comprehension; this loop is the
    # dominant cost of a lookup (see docs/benchmarks.md). Digests are canonical big-endian.
    raw = np.frombuffer(b"".join(map(xxhash.xxh3_128_digest, map(str.encode, keys))), dtype=">u8")
    if raw.size == 0:
        empty = np.empty(0, dtype=np.uint64)
        return empty, empty.copy()
    pairs = raw.reshape(-1, 2).astype(np.uint64)
    return np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1])


def fingerprint(key: str) -> tuple[int, int]:
    v = xxhash.xxh3_128_intdigest(key.encode("utf-8"))
    return v >> 64, v & (_U64 - 1)


#: the canonical key of several fields: each field's text escaped by these replacements, in this
#: order (``\\`` first, so an escape is never escaped again), then joined by KEY_SEPARATOR
KEY_ESCAPES: tuple[tuple[str, str], ...] = (("\\", "\\\\"), (",", "\\,"))
KEY_SEPARATOR = ","

T = TypeVar("T")


def canonical_key(texts: Sequence[T], *, replace: Callable[[T, str, str], T], join: Callable[[list[T], str], T]) -> T:
    """The one definition of the canonical record key, applied with the string primitives of its
    caller: a single field is its text; several are each escaped (:data:`KEY_ESCAPES`) and joined
    by :data:`KEY_SEPARATOR`, so distinct tuples never encode alike.

    ``texts`` are the fields' texts as Python strings (:func:`composite_key`), Arrow arrays
    (``arrow_engine.keys.record_keys``) or Spark columns (``jobs.keys.key_expr``); ``replace(t,
    old, new)`` replaces every literal ``old`` and ``join(ts, sep)`` joins, both null-propagating
    where values can be null (a null field makes the key null, which the batch checks refuse).
    One function and three sets of primitives: the engines cannot drift from the rule."""
    if len(texts) == 1:
        return texts[0]
    escaped = []
    for t in texts:
        for old, new in KEY_ESCAPES:
            t = replace(t, old, new)
        escaped.append(t)
    return join(escaped, KEY_SEPARATOR)


def composite_key(values: Sequence[object]) -> str:
    """One canonical string for a (possibly composite) record key (:func:`canonical_key` over the
    values' ``str``)."""
    return canonical_key([str(v) for v in values], replace=str.replace, join=lambda ts, sep: sep.join(ts))
