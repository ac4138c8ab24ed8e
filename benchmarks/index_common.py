"""Helpers shared by the record-index benchmarks (``index_lookup.py``, ``index_scale.py``,
``index_base_cap.py``): realistic locations, a complete result check, a read-counting FileIO
and the process's memory figures."""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from spark_jobs.io.filesystem import FileIO

__all__ = ["Checker", "CountingFileIO", "log", "make_locations", "status_kb"]


def log(msg: str) -> None:
    print(msg, flush=True)


def make_locations(tag: str, partitions: int, files: int) -> list[tuple[str, str]]:
    """``partitions`` x ``files`` (partition, file id) pairs with realistic names: a date
    partition and a bucket-prefixed file id (so the index's location table is as long as a
    real one)."""
    return [
        (f"dt=2024-03-{p + 1:02d}", f"{p * files + f:05d}-{uuid.UUID(int=(p * files + f) * 7919 + len(tag), version=4)}-{tag}")
        for p in range(partitions)
        for f in range(files)
    ]


class Checker:
    """Expected location per key (by key position) to verify a LookupResult completely."""

    def __init__(self, locations: list[tuple[str, str]]) -> None:
        self.locations = locations
        self.index = {loc: i for i, loc in enumerate(locations)}

    def global_ids(self, res) -> np.ndarray:
        """Per query of ``res``: the global location index it resolved to, -1 when absent."""
        remap = np.array([self.index[loc] for loc in res.locations] + [-1], dtype=np.int64)
        return remap[np.where(res.loc >= 0, res.loc, len(res.locations))]

    def check(self, res, expected: np.ndarray, what: str) -> None:
        """``expected[i]``: global location index of query i, or -1 for absent/deleted."""
        want_found = expected >= 0
        if not np.array_equal(res.found, want_found):
            bad = int(np.count_nonzero(res.found != want_found))
            raise AssertionError(f"{what}: {bad} keys found/absent wrongly")
        got = self.global_ids(res)
        if not np.array_equal(got, expected):
            raise AssertionError(f"{what}: {int(np.count_nonzero(got != expected))} targets differ")


class _CountingFile:
    """A Python file object that counts read requests (wrapped by pyarrow.PythonFile)."""

    def __init__(self, path: str, counter: dict) -> None:
        self._f = open(path, "rb")  # noqa: SIM115
        self._c = counter
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        b = self._f.read(n)
        self._c["reads"] += 1
        self._c["bytes"] += len(b)
        return b

    def seek(self, off: int, whence: int = 0) -> int:
        return self._f.seek(off, whence)

    def tell(self) -> int:
        return self._f.tell()

    def close(self) -> None:
        self._f.close()
        self.closed = True

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False


class CountingFileIO(FileIO):
    """The generic (not memory-mapped) FileIO, counting the read requests lookups issue."""

    def __init__(self) -> None:
        super().__init__(pafs.LocalFileSystem())
        self.counter = {"reads": 0, "bytes": 0}

    def memory_map(self, path: str) -> pa.NativeFile:
        return pa.PythonFile(_CountingFile(path, self.counter), mode="r")


def status_kb(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process, in KiB. Not ``ru_maxrss``: Linux
    carries that across exec, so a child would report its parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0
