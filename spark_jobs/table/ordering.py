"""The one ordering of precombine values (and of the rows a tie compares), as Spark orders SQL values.

format.md §8: the highest precombine value wins, nulls lowest, NaN above every number (and
equal to itself), -0.0 equal to 0.0. Spark's comparisons (``>``, ``max_by``, struct ordering)
order doubles and floats this way; Arrow's ``greater`` and Python's ``>`` do not (every
comparison with NaN is false), so a path comparing with those decides differently from one
that ranks. Every path that compares precombine values in Python -- the write-time staleness
check of both table types and both engines, a mover's check, the in-batch dedupe, the
read-time merge of a merge-on-read slice (hence compaction), bootstrap's duplicates -- goes
through this module, so they cannot disagree.
"""

from __future__ import annotations

import math
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.io.arrays import from_numpy

__all__ = ["older", "ranks", "sort_key"]


def _flat(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


def ranks(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each value's dense rank under format.md §8's order: null 0, then 1.. ascending, equal
    values equal ranks. Arrow's sort already puts NaN after every number (NaNs tie) and ties
    -0.0 with 0.0 (tests/unit/test_precombine_order.py holds it to that); only nulls, which
    Arrow sorts last, are moved to the bottom. Integers, so callers group with numpy sorts."""
    values = _flat(values)
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64)
    rank = pc.rank(values, sort_keys="ascending", tiebreaker="dense").to_numpy().astype(np.int64)
    if values.null_count:
        rank = np.where(pc.is_null(values).to_numpy(zero_copy_only=False), 0, rank)
    return rank


def older(incoming: pa.Array | pa.ChunkedArray, stored: pa.Array | pa.ChunkedArray) -> pa.BooleanArray:
    """Per row, whether ``incoming`` orders strictly below ``stored`` (the row is stale): a null
    below any value, a number below NaN; equal values (NaN and NaN, -0.0 and 0.0) are not older,
    so the incoming row wins a tie (format.md §8, "not lower"). A null ``stored`` (no stored
    row) is never greater. Both sides are ranked together; ``stored`` is cast to the incoming
    type first (the schema the commit writes, which only widens the stored one)."""
    inc, sto = _flat(incoming), _flat(stored)
    if not sto.type.equals(inc.type):
        sto = sto.cast(inc.type)
    both = ranks(pa.concat_arrays([inc, sto]))
    n = len(inc)
    return from_numpy(both[:n] < both[n:])  # booleans: pa.array(..., pa.bool_()) without numpy.ma


def sort_key(v: Any) -> tuple:
    """A sort key ordering Python values as Spark orders SQL values: null lowest, NaN above every
    number and equal to itself, -0.0 equal to 0.0, strings by UTF-8 bytes (= code points),
    arrays element by element then by length, structs field by field. For the rows a tie on
    the precombine value compares (format.md §8), where a vectorised rank cannot reach."""
    if v is None:
        return (0,)
    if isinstance(v, bool):
        return (1, int(v))
    if isinstance(v, float):
        return (1, (1, 0.0) if math.isnan(v) else (0, v + 0.0))
    if isinstance(v, (int, Decimal, str, bytes, date, datetime)):
        return (1, v)
    if isinstance(v, dict):
        return (1, tuple(sort_key(x) for x in v.values()))
    if isinstance(v, (list, tuple)):
        return (1, tuple(sort_key(x) for x in v))
    return (1, v)
