"""NumPy arrays handed to Arrow without loading ``numpy.ma`` (issue 38).

Why: ``pa.array(ndarray)`` asks ``isinstance(values, np.ma.MaskedArray)`` (pyarrow 26's
``array.pxi``), and numpy 2 imports ``numpy.ma`` on that first attribute access: 14-25 ms of a
cold 200-row ``bucketindex upsert``, about fifteen call sites on its path alone, for arrays that
are never masked. :func:`from_numpy` builds the same Arrow array from the NumPy buffer (zero
copy for numbers, one bit-packing for booleans, as ``pa.array`` does) and hands anything else to
``pa.array``. ``np.unique`` without ``return_*`` asks ``np.ma.is_masked`` the same way:
:func:`unique` is its sorted distinct values without that question.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["from_numpy", "unique"]


def from_numpy(values: np.ndarray) -> pa.Array:
    """``pa.array(values)`` for a 1-D NumPy array: equal to it (type, values, no nulls), without
    loading ``numpy.ma`` for booleans and native-order integers and floats; any other array
    (objects, strings, dates, several dimensions, a masked array) goes to ``pa.array``."""
    a = values
    if type(a) is not np.ndarray or a.ndim != 1:
        return pa.array(a)
    if a.dtype == np.bool_:
        bits = np.packbits(a.view(np.uint8), bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(a), [None, pa.py_buffer(bits)])
    if a.dtype.kind in "iuf" and a.dtype.isnative:
        a = np.ascontiguousarray(a)
        return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a), [None, pa.py_buffer(a)])
    return pa.array(a)


def unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` (the sorted distinct values) of integers or booleans without its
    ``np.ma.is_masked`` question, which loads ``numpy.ma``; other arrays (floats, whose NaNs
    ``np.unique`` folds into one) go to ``np.unique``."""
    if type(values) is not np.ndarray or values.dtype.kind not in "iub":
        return np.unique(values)
    s = np.sort(values.ravel())
    if s.size == 0:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]
