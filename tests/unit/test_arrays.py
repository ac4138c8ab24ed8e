"""``spark_jobs.io.arrays``: NumPy arrays handed to Arrow as ``pa.array`` / ``np.unique`` would,
without loading ``numpy.ma`` (issue 38: 14-25 ms of a cold upsert). Each case compares with
the library call it replaces, so a difference in type, values or length fails here."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from spark_jobs.io.arrays import from_numpy, unique

_RNG = np.random.default_rng(38)

CASES = {
    "bool": _RNG.random(37) < 0.5,
    "bool-all-true-9": np.ones(9, dtype=bool),  # a partial last byte
    "bool-strided": (_RNG.random(40) < 0.3)[::3],
    "int32": _RNG.integers(-2**31, 2**31 - 1, size=50, dtype=np.int32),
    "int64-view": np.arange(100, dtype=np.int64)[10:70],
    "int64-strided": np.arange(100, dtype=np.int64)[::7],
    "uint64-high": np.array([0, 2**63, 2**64 - 1], dtype=np.uint64),
    "uint8": np.arange(256, dtype=np.uint8),
    "float64-nan-inf": np.array([1.5, np.nan, -np.inf, np.inf, -0.0]),
    "float32": np.linspace(-1, 1, 11, dtype=np.float32),
    "empty-int64": np.array([], dtype=np.int64),
    "empty-bool": np.array([], dtype=bool),
    "strings": np.array(["a b", "é/%+", ""], dtype=object),  # objects: goes to pa.array
}


@pytest.mark.parametrize("values", list(CASES.values()), ids=list(CASES))
def test_from_numpy_equals_pa_array(values: np.ndarray) -> None:
    expected = pa.array(values)
    got = from_numpy(values)
    assert got.type == expected.type
    assert got.null_count == 0 and len(got) == len(values)
    got.validate(full=True)
    if values.dtype == object:
        assert got.equals(expected)
    else:  # the same values, NaN where NaN (``equals`` calls NaN unequal to itself)
        np.testing.assert_array_equal(got.to_numpy(zero_copy_only=False), expected.to_numpy(zero_copy_only=False))


def test_a_byte_swapped_array_is_refused_as_pa_array_refuses_it() -> None:
    with pytest.raises(pa.ArrowNotImplementedError):
        pa.array(np.arange(5, dtype=">i8"))
    with pytest.raises(pa.ArrowNotImplementedError):
        from_numpy(np.arange(5, dtype=">i8"))


def test_from_numpy_keeps_the_array_it_was_given_alive() -> None:
    """The Arrow array shares the NumPy buffer (zero copy): it must hold it, not dangle."""
    arr = from_numpy(np.arange(1000, dtype=np.int64) * 3)  # the temporary is dropped here
    assert arr.to_pylist()[-3:] == [2991, 2994, 2997]


@pytest.mark.parametrize("values", [np.array([5, 3, 5, -1, 3, 0], dtype=np.int64), np.array([], dtype=np.int32),
                                    np.array([True, False, True]), np.array([2**64 - 1, 0, 2**64 - 1], dtype=np.uint64),
                                    np.array([1.0, np.nan, np.nan, 1.0])],
                         ids=["int64", "empty", "bool", "uint64", "float-nan"])
def test_unique_equals_np_unique(values: np.ndarray) -> None:
    got, expected = unique(values), np.unique(values)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_neither_loads_numpy_ma() -> None:
    """What the helpers exist for, in a fresh interpreter: ``pa.array`` of the same array does."""
    code = ("import sys, numpy as np, pyarrow as pa\n"
            "from spark_jobs.io.arrays import from_numpy, unique\n"
            "from_numpy(np.ones(5, dtype=bool)); from_numpy(np.arange(5)); unique(np.array([3, 1, 3]))\n"
            "assert 'numpy.ma' not in sys.modules, 'helpers loaded numpy.ma'\n"
            "pa.array(np.arange(5))\n"
            "assert 'numpy.ma' in sys.modules, 'pa.array no longer loads numpy.ma: the helpers may go'\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
