"""Record-level index files (RFC-08): key fingerprint -> (partition, file id), per index bucket.

Each index bucket holds *base* files (written by compaction) and *delta* files (one per
commit that touched the bucket). A lookup merges them newest-first: the newest entry for a
key wins, a tombstone hides the key, and a key re-inserted after a delete comes back
because its new entry is newer than the tombstone. A base that compaction wrote past the
bucket's cap is *sealed* (RFC-08 option 1, format.md §6.1): never rewritten again, so a
bucket is a few sealed bases, at most one open base, and deltas -- lookups open them all.

File format (see docs/format.md): an uncompressed Arrow IPC file, sorted by
``(fp_hi, fp_lo)``, split into record batches ("blocks") of :data:`BLOCK_ROWS` entries::

    fp_hi  uint64   high 64 bits of the key's XXH3-128 fingerprint (sorted)
    fp_lo  uint64   low 64 bits
    loc    int8/16/32  index into the file's location table; -1 is a tombstone

The location table ``[[partition, file_id], ...]`` and the first ``fp_hi`` of every block live
in the file's schema metadata (layout 1, which Arrow IPC stores twice: at the start and in the
footer) or in the footer's metadata, once (layout 2). This release reads both and writes
layout 1 unless asked (``write_index_file(layout=2)``): releases before it refuse layout 2, so
it is written only once every reader of a deployment reads it (format.md §6, two-step rollout).

Why Arrow IPC and not Parquet: the file is memory-mapped, so opening costs a footer read and
a lookup touches only the pages binary search visits; and fixed-width fingerprints plus a
small location ordinal cost 17-20 bytes per entry, less than a zstd Parquet file of the raw UUID keys (~21 bytes). Measured in docs/benchmarks.md.

Two lookup strategies, as RFC-08 proposes:

* **seek** -- sort the batch's fingerprints, pick the blocks whose range can hold them
  (from the block index), binary-search each block (``numpy.searchsorted``);
* **scan** -- read every entry and hash-join it against the batch (``pyarrow.compute.index_in``).

``auto`` follows the measurements (``benchmarks/index_lookup.py``, docs/benchmarks.md): on
memory-mapped files seek won at every batch size -- hashing the batch dominates both
strategies, and binary search over a sorted fixed-width column beats building and probing a
hash table -- so ``auto`` always seeks there. Where the storage cannot memory-map (HDFS, S3),
seek issues range reads per touched block while scan reads the whole file in one request;
``auto`` scans there when the batch touches at least :data:`SCAN_BLOCK_FRACTION` of the
bucket's blocks (the bytes read are then about the same, the request count is not).

**File summaries are cached per process** (:func:`lookup` only). An upsert's tag phase calls
:func:`lookup` once per bucket, and a process that tags batch after batch (a Python API user,
a reused Spark worker, the Arrow engine's threads) would otherwise map every file and parse its
footer again each time: ~8 ms a bucket at RFC-08's size, where 1,000 buckets of 18 MB never fit
a cache of mapped files (docs/benchmarks.md). Index files are immutable once written, so a local
file's resident summary (:class:`_Resident`: block offsets and every :data:`SAMPLE_STEP`-th
``fp_hi``, ~0.3 MB a 1M-entry file) is kept, keyed by its path and :meth:`FileIO.identity`
(device, inode, size, mtime -- a file rewritten or replaced is summarised anew; one modified in
the last seconds is not cached, since its mtime could not yet tell a rewrite in the same clock
tick), and each lookup reads through it with ``pread`` only what its keys need: nothing stays
mapped, so the cache's bytes are what it holds in memory. Bounded: at most
:data:`CACHE_MAX_FILES` summaries and :data:`CACHE_MAX_BYTES` bytes of them (sample, offsets,
location table as counted by :func:`_location_bytes`), least recently used first out;
:func:`set_cache_limits` changes the bounds (0 turns caching off: every file is opened as an
:class:`IndexFile`), :func:`clear_cache` empties it. Files without a memory map (HDFS, object
stores) are not cached: there is no cheap identity to key them by.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import sys
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from spark_jobs.exceptions import IndexCorruptError
from spark_jobs.index.hashing import fingerprints
from spark_jobs.io.arrays import from_numpy
from spark_jobs.io.filesystem import FileIO

__all__ = [
    "BLOCK_ROWS",
    "SCAN_BLOCK_FRACTION",
    "TOMBSTONE",
    "IndexEntries",
    "choose_mode",
    "IndexFile",
    "LookupResult",
    "lookup",
    "merge_entries",
    "compact_entries",
    "write_index_file",
    "SEALED_SUFFIX",
    "is_sealed_base",
    "index_file_problem",
    "index_file_error",
    "INDEX_FILE_LAYOUT",
    "INDEX_FILE_LAYOUTS",
    "CACHE_MAX_FILES",
    "CACHE_MAX_BYTES",
    "SAMPLE_STEP",
    "WHOLE_FILE_BYTES_PER_KEY",
    "set_cache_limits",
    "clear_cache",
    "cache_info",
]

BLOCK_ROWS = 65_536
#: without a memory map, auto scans (one whole-file read) when the batch touches at least
#: this fraction of the bucket's blocks; memory-mapped files are always sought (measured)
SCAN_BLOCK_FRACTION = 0.5
TOMBSTONE = -1
LOOKUP_MODES = ("auto", "seek", "scan")

_META_LOCATIONS = b"bucketindex.locations"
_META_BLOCKS = b"bucketindex.block_first_hi"
_META_EXTRA = b"bucketindex.meta"
#: the index file layout this release writes by default (``"layout"`` in ``bucketindex.meta``;
#: absent: 1). 1: location table and block index in the schema metadata (stored twice by Arrow
#: IPC); 2: both in the file footer's metadata, once (format.md §6). Layout 1 because releases
#: before this one read only it and refuse a layout-2 file as damaged: a deployment mixing
#: versions (an upgraded writer, an older reader) must keep reading what is written. Layout 2
#: is written only when asked (``write_index_file(layout=2)``: tests, benchmarks), until a table
#: opts in once every reader reads it.
INDEX_FILE_LAYOUT = 1
#: the layouts this release reads (and can be asked to write)
INDEX_FILE_LAYOUTS = (1, 2)
_LAYOUTS_READ = INDEX_FILE_LAYOUTS
#: the schema metadata's ``bucketindex.locations`` in a layout-2 file: not JSON, so that a release
#: reading only layout 1 fails on it (the file is "damaged" to it) rather than reading an empty
#: location table -- its compaction would turn the entries into tombstones
_LAYOUT_2_STUB = b"in the file footer (index file layout 2)"
#: the end of a sealed base's name before its extension: ``base_<instant>_<attempt>_sealed.arrow``
SEALED_SUFFIX = "_sealed"


def is_sealed_base(rel: str) -> bool:
    """Whether an index file (path or name) is a sealed base (format.md §6.1).

    Told by the name, so the file-system view -- a list of paths per bucket, also as stored
    in timeline checkpoints -- knows it without opening the file or keeping the metadata of
    the compaction that wrote it; the file's ``bucketindex.meta`` says ``"sealed": true`` too.
    """
    name = rel.rsplit("/", 1)[-1]
    return name.startswith("base_") and name.split(".", 1)[0].endswith(SEALED_SUFFIX)


#: ``<table root>/.bucketindex/index/bucket=<n>/<file>`` (spark_jobs.table.layout.TableLayout)
_INDEX_PATH = re.compile(r"^(?P<root>.*)/\.bucketindex/index/bucket=(?P<bucket>\d+)/[^/]+$")


def index_file_error(io: FileIO, path: str, *, why: str) -> IndexCorruptError:
    """The one-line error for index file ``path`` (absolute, on ``io``) that is ``why`` (missing,
    truncated, not an index file): names the file and the command that rebuilds its bucket.

    The table and the bucket are read off the path, whose shape the layout fixes, so every
    caller -- a lookup in a Spark task, a compaction, a conflict check -- gets the same line
    without passing the table along."""
    m = _INDEX_PATH.match(path)
    root, bucket = (m.group("root"), int(m.group("bucket"))) if m else (path, -1)
    table = root if io.scheme in ("file", "generic") else f"{io.scheme}://{root}"
    return IndexCorruptError(path, table=table, bucket=bucket, why=why)


@contextmanager
def _readable(io: FileIO, path: str) -> Iterator[None]:
    """Turn a missing file, or bytes that are not an index file, into :class:`IndexCorruptError`
    naming it. Other I/O errors (a store that did not answer) pass through: they are not the
    file's fault and a retry may succeed."""
    try:
        yield
    except FileNotFoundError:
        raise index_file_error(io, path, why="missing (deleted outside bucketindex?)") from None
    except (pa.ArrowInvalid, ValueError, KeyError, TypeError, IndexError) as e:  # ArrowInvalid: not Arrow IPC
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise index_file_error(io, path, why=f"damaged ({why})") from None


@dataclass
class IndexEntries:
    """A set of index entries; ``loc[i]`` indexes ``locations`` or is TOMBSTONE."""

    fp_hi: np.ndarray
    fp_lo: np.ndarray
    loc: np.ndarray
    locations: list[tuple[str, str]]

    def __len__(self) -> int:
        return int(self.fp_hi.size)

    @classmethod
    def from_keys(
        cls, keys: Sequence[str], targets: Sequence[tuple[str, str] | None]
    ) -> "IndexEntries":
        """Entries for ``keys``; a ``None`` target is a tombstone."""
        hi, lo = fingerprints(keys)
        return cls.from_fingerprints(hi, lo, targets)

    @classmethod
    def from_fingerprints(
        cls, fp_hi: np.ndarray, fp_lo: np.ndarray, targets: Sequence[tuple[str, str] | None]
    ) -> "IndexEntries":
        ids: dict[tuple[str, str], int] = {}
        loc = np.fromiter(
            (TOMBSTONE if t is None else ids.setdefault((t[0], t[1]), len(ids)) for t in targets),
            dtype=np.int32,
            count=len(targets),
        )
        return cls(np.asarray(fp_hi, np.uint64), np.asarray(fp_lo, np.uint64), loc, list(ids))

    def live(self) -> "IndexEntries":
        keep = self.loc != TOMBSTONE
        return IndexEntries(self.fp_hi[keep], self.fp_lo[keep], self.loc[keep], self.locations)

    def targets(self) -> list[tuple[str, str] | None]:
        return [None if i == TOMBSTONE else self.locations[i] for i in self.loc.tolist()]


def _loc_type(n: int) -> tuple[pa.DataType, type]:
    if n < 2**7:
        return pa.int8(), np.int8
    if n < 2**15:
        return pa.int16(), np.int16
    return pa.int32(), np.int32


def write_index_file(
    io: FileIO,
    path: str,
    entries: IndexEntries,
    *,
    metadata: dict | None = None,
    block_rows: int = BLOCK_ROWS,
    layout: int = INDEX_FILE_LAYOUT,
) -> int:
    """Write ``entries`` (unique fingerprints) sorted as one index file; returns its size in bytes.

    ``layout``: the index file layout (format.md §6). 1, the default, is what every release
    reads; 2 stores the location table once (~0.07 bytes an entry less at RFC-08's size) but
    releases before this one refuse it, so no product path asks for it yet."""
    if layout not in INDEX_FILE_LAYOUTS:
        raise ValueError(f"index file layout {layout!r}: this release writes layouts "
                         f"{', '.join(map(str, INDEX_FILE_LAYOUTS))}")
    order = np.lexsort((entries.fp_lo, entries.fp_hi))
    hi, lo = entries.fp_hi[order], entries.fp_lo[order]
    if hi.size > 1:
        dup = (hi[1:] == hi[:-1]) & (lo[1:] == lo[:-1])
        if dup.any():
            raise ValueError("index entries must have unique keys; merge them before writing")
    # Only the locations the entries use, renumbered densely, so the ordinal stays narrow.
    used, loc_ids = np.unique(entries.loc[order], return_inverse=True)
    has_tomb = used.size > 0 and used[0] == TOMBSTONE
    locations = [entries.locations[i] for i in used.tolist() if i != TOMBSTONE]
    loc = loc_ids.astype(np.int64) - (1 if has_tomb else 0)  # tombstone stays -1
    pa_type, np_type = _loc_type(len(locations))
    loc = loc.astype(np_type)
    tables = {
        _META_LOCATIONS: json.dumps(locations, separators=(",", ":")).encode(),
        _META_BLOCKS: json.dumps([str(v) for v in hi[::block_rows].tolist()]).encode(),
    }
    extra = json.dumps({**(metadata or {}), "entries": int(hi.size), "layout": layout}).encode()
    if layout == 1:
        # The tables in the schema metadata (which Arrow IPC writes twice: stream header and
        # footer); releases before layout 2 ignore the "layout" member of bucketindex.meta.
        schema_md, footer = {**tables, _META_EXTRA: extra}, None
    else:
        # The location table (~65 bytes a location) and the block index in the footer, once;
        # the schema's bucketindex.locations is a non-JSON stub a layout-1 reader fails on.
        schema_md, footer = {_META_LOCATIONS: _LAYOUT_2_STUB, _META_EXTRA: extra}, tables
    schema = pa.schema([("fp_hi", pa.uint64()), ("fp_lo", pa.uint64()), ("loc", pa_type)], metadata=schema_md)
    with io.open_output_stream(path) as sink, ipc.new_file(sink, schema, metadata=footer) as writer:
        for start in range(0, max(hi.size, 1), block_rows):
            sl = slice(start, start + block_rows)
            writer.write_batch(
                pa.record_batch([from_numpy(hi[sl]), from_numpy(lo[sl]), from_numpy(loc[sl])], schema=schema)
            )
    return io.size(path)



def _read_tables(reader: ipc.RecordBatchFileReader) -> tuple[dict, bytes, np.ndarray]:
    """An index file's ``bucketindex.meta``, its location table (JSON, not decoded) and its block
    index, from whichever metadata its layout keeps them in (format.md §6). ValueError (KeyError,
    JSONDecodeError) when they are not an index file's: the caller names the file."""
    md = reader.schema.metadata or {}
    names = reader.schema.names
    if names != ["fp_hi", "fp_lo", "loc"]:
        raise ValueError(f"columns {names}, not fp_hi, fp_lo, loc")
    metadata: dict = json.loads(md.get(_META_EXTRA, b"{}"))
    layout = metadata.get("layout", 1)
    if layout not in _LAYOUTS_READ:
        raise ValueError(f"index file layout {layout!r}, this release reads layouts "
                         f"{', '.join(map(str, _LAYOUTS_READ))} (written by a newer release?)")
    tables = md if layout == 1 else (reader.metadata or {})
    blocks = np.array([int(x) for x in json.loads(tables.get(_META_BLOCKS, b"[]"))], dtype=np.uint64)
    return metadata, tables.get(_META_LOCATIONS, b"[]"), blocks


def _decode_locations(raw: bytes) -> list[tuple[str, str]]:
    """The location table from its JSON; its strings interned, so that the tables of many cached
    files of one table (every bucket names the same data files) share them."""
    rows = json.loads(raw)
    intern = sys.intern
    try:
        return [(intern(p), intern(f)) for p, f in rows]
    except (TypeError, ValueError):  # not [partition, file id] string pairs: kept as they are, for
        return [tuple(x) for x in rows]  # index_file_problem to name (or a lookup to fail on)


class IndexFile:
    """An open index file: memory-mapped where the filesystem allows, blocks read on demand.

    Memory-mapped, the whole file is held as one zero-copy buffer and the file itself (its
    descriptor) is closed at once: the mapping lives as long as the buffer or a view of it, so
    an open file kept in the cache holds no descriptor, and dropping it while another thread
    still searches its blocks is safe."""

    def __init__(self, io: FileIO, path: str, *, lazy_locations: bool = False) -> None:
        """Open ``path``: IndexCorruptError (naming it) when it is missing or not an index file.

        ``lazy_locations``: decode the location table on first use (a lookup that finds no key
        never needs it) instead of now; a damaged table then fails there, as IndexCorruptError."""
        self.path = path
        self._io = io
        with _readable(io, path):
            source = io.memory_map(path)
        self.memory_mapped = isinstance(source, pa.MemoryMappedFile)
        try:
            with _readable(io, path):
                if self.memory_mapped:
                    whole = source.read_buffer()
                    source.close()
                    self._source: pa.NativeFile = pa.BufferReader(whole)
                    self.nbytes = whole.size
                else:
                    self._source = source
                    self.nbytes = source.size()
                self._reader = ipc.open_file(self._source)
                self.metadata, self._locations_json, self.block_first_hi = _read_tables(self._reader)
                self._locations: list[tuple[str, str]] | None = None
                if not lazy_locations:
                    self._locations = self._decode_locations()
                self.num_blocks = self._reader.num_record_batches
                #: the decoded blocks of a memory-mapped file (zero-copy views), kept
                self._blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = [None] * self.num_blocks
        except BaseException:
            source.close()
            raise

    def _decode_locations(self) -> list[tuple[str, str]]:
        return _decode_locations(self._locations_json)

    @property
    def locations(self) -> list[tuple[str, str]]:
        """The location table: ``loc`` values index it."""
        if self._locations is None:  # two threads may both decode: the same list, either wins
            with _readable(self._io, self.path):
                self._locations = self._decode_locations()
        return self._locations

    def __enter__(self) -> "IndexFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._source.close()

    def block(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        got = self._blocks[i]
        if got is not None:
            return got
        with _readable(self._io, self.path):
            b = self._reader.get_batch(i)
        got = tuple(c.to_numpy(zero_copy_only=True) for c in b.columns)  # type: ignore[assignment]
        if self.memory_mapped:  # views of the mapping: free to keep (copies read from a store are not)
            self._blocks[i] = got
        return got  # type: ignore[return-value]

    def read_all(self) -> pa.Table:
        with _readable(self._io, self.path):
            if self.memory_mapped:
                return self._reader.read_all()
            # Without a memory map the IPC reader issues range reads per block; read the whole
            # file in one request instead (what scan is for on HDFS / object stores).
            return ipc.open_file(self._source.read_at(self._source.size(), 0)).read_all()

    def entries(self) -> IndexEntries:
        t = self.read_all()
        return IndexEntries(
            t.column("fp_hi").to_numpy(),
            t.column("fp_lo").to_numpy(),
            t.column("loc").to_numpy().astype(np.int32),
            list(self.locations),
        )

    @property
    def num_entries(self) -> int:
        return int(self.metadata["entries"])

    @property
    def sealed(self) -> bool:
        """A base compaction wrote past the bucket's cap: later compactions leave it as it is."""
        return bool(self.metadata.get("sealed", False))


#: entries between two samples of an index file's resident fingerprint sample (:class:`_Resident`):
#: a lookup reads one window of this many ``fp_hi`` values (512 bytes) per key, and the sample
#: costs 8 / SAMPLE_STEP bytes an entry in memory (125 KB for a 1M-entry file, 125 MB for RFC-08's
#: 1e9 keys). Measured against 32, 128 and 256 in docs/benchmarks.md ("Resident summaries").
SAMPLE_STEP = 64

#: default bounds of the cache of resident summaries (:func:`set_cache_limits`): 100,000 files and
#: 1 GiB of summaries -- at RFC-08's size (~0.33 MB a 1M-entry bucket, counted as below) about
#: 3,000 buckets, three times the 1B-key index
CACHE_MAX_FILES = 100_000
CACHE_MAX_BYTES = 1 << 30
#: what a summary is counted at beyond its arrays: the object and its small arrays, the cache entry
_SUMMARY_OVERHEAD = 2048
#: a location table is counted at its JSON's bytes plus this much per location (the JSON until a
#: lookup finds a key, then the decoded table -- a list of tuples of two interned strings: measured
#: 163 bytes a location for 1,000 realistic ones, JSON included; tests/unit/test_record_index.py
#: checks the bound)
_LOCATION_BYTES = 256


def _location_bytes(raw: bytes) -> int:
    """What a location table (its JSON ``raw``) is counted at, decoded or not: at least its cost.
    Locations are counted by their closing brackets (one in a partition value counts one more)."""
    return len(raw) + _LOCATION_BYTES * max(raw.count(b"]") - 1, 0)


class _Resident:
    """What a lookup keeps of an index file between calls -- where each block's columns lie in
    the file and every :data:`SAMPLE_STEP`-th ``fp_hi`` -- so that it reads only what it needs.

    With the summary, a key costs one ``pread`` of a 512-byte window of ``fp_hi`` (the sample
    says which), and two more of 8 and 1-4 bytes when its ``fp_hi`` is there (``fp_lo``, then
    ``loc``): no mapping, footer or block index per call, no per-block loop, and nothing of the
    file stays mapped. Before, every lookup mapped the file, parsed its footer and faulted in the
    pages binary search visited: ~8 ms a bucket at 1,000 buckets, and a cache of mapped files
    that held the whole 1B-key index at 18 GB of RSS (docs/benchmarks.md).

    Built once per file per process, from a memory map without read-ahead advice: a cold
    build reads the ``fp_hi`` pages (the sample touches each), not the whole file. Only files
    whose blocks are uniform (every block but the last of one size, the last no larger), whose
    columns have no nulls and whose buffers are aligned get one -- every file
    :func:`write_index_file` writes; any other is looked up through :class:`IndexFile`."""

    __slots__ = ("path", "n", "rows", "step", "hi_off", "lo_off", "loc_off", "loc_dtype", "sample",
                 "_locations_json", "_locations", "nbytes", "_io", "size")

    def __init__(self) -> None:
        self._locations: list[tuple[str, str]] | None = None

    @classmethod
    def build(cls, io: FileIO, path: str, fd: int) -> "_Resident | None":
        """The summary of the file open as ``fd`` (ValueError and the like when it is not an index
        file: the caller names it), or None when it has no uniform layout to summarise."""
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # ValueError on an empty file
        buf = pa.py_buffer(mm)
        reader = ipc.open_file(pa.BufferReader(buf))
        _, locations_json, _ = _read_tables(reader)
        schema = reader.schema
        loc_type = schema.field("loc").type
        if not (schema.field("fp_hi").type == pa.uint64() and schema.field("fp_lo").type == pa.uint64()
                and pa.types.is_signed_integer(loc_type)):
            return None
        rows: list[int] = []
        offs: list[list[int]] = [[], [], []]
        base = buf.address
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            rows.append(batch.num_rows)
            if batch.num_rows == 0:
                continue
            for col, dst in zip(batch.columns, offs):
                if col.null_count or col.offset:
                    return None
                data = col.buffers()[1]
                dst.append(data.address - base)
        r = cls()
        r.path, r._io, r.size = path, io, len(mm)
        r.n = int(sum(rows))
        r.loc_dtype = np.dtype(loc_type.to_pandas_dtype())
        r._locations_json = locations_json
        if r.n == 0:
            r.rows = r.step = 1
            r.hi_off = r.lo_off = r.loc_off = np.zeros(0, np.int64)
            r.sample = np.zeros(0, np.uint64)
        else:
            full = [x for x in rows if x]
            r.rows = full[0]
            if any(x != r.rows for x in full[:-1]) or full[-1] > r.rows or len(full) != len(rows):
                return None
            r.hi_off, r.lo_off, r.loc_off = (np.array(o, np.int64) for o in offs)
            if (r.hi_off % 8).any() or (r.lo_off % 8).any() or (r.loc_off % r.loc_dtype.itemsize).any():
                return None
            # the largest step <= SAMPLE_STEP dividing the block size: a window never spans two blocks
            r.step = max(d for d in range(1, min(r.rows, SAMPLE_STEP) + 1) if r.rows % d == 0)
            r.sample = np.concatenate([
                np.frombuffer(mm, np.uint64, count=k, offset=int(o))[::r.step]
                for k, o in zip(full, r.hi_off.tolist())])
        r.nbytes = (_SUMMARY_OVERHEAD + r.sample.nbytes + 3 * r.hi_off.nbytes
                    + _location_bytes(locations_json))
        return r  # the mapping goes with the last view of it (the reader, buf): nothing stays mapped

    @property
    def locations(self) -> list[tuple[str, str]]:
        """The location table, decoded on first use and kept (counted in :attr:`nbytes` from the start)."""
        if self._locations is None:  # two threads may both decode: the same list, either wins
            with _readable(self._io, self.path):
                self._locations = _decode_locations(self._locations_json)
            self._locations_json = b""
        return self._locations


def _pread(fd: int, offsets: list[int], size: int) -> bytes:
    """``size`` bytes at each of ``offsets``, concatenated: one ``pread`` each (a read cut short by
    the end of the file -- a window past the last block's ``fp_hi`` -- padded with zero bytes,
    which the caller does not look at)."""
    pr = os.pread
    raw = b"".join([pr(fd, size, o) for o in offsets])
    if len(raw) != size * len(offsets):
        raw = b"".join([pr(fd, size, o).ljust(size, b"\0") for o in offsets])
    return raw


#: a lookup reads a summarised file whole (one read into a per-thread buffer, then searched in
#: memory) when it has at least one key per this many bytes of file -- ~3,000 keys for a 1M-entry
#: file (18 MB): measured at 1,000 keys a file, the whole read cost what 3 reads a hit cost and
#: twice what 1 read a miss cost (docs/benchmarks.md, "Resident summaries"); files up to
#: WHOLE_FILE_MAX_BYTES are copied (each looking-up thread keeps a buffer of the largest it
#: read), larger ones mapped for the call
WHOLE_FILE_BYTES_PER_KEY = 6 << 10
WHOLE_FILE_MAX_BYTES = 64 << 20
_SCRATCH = threading.local()


def _file_bytes(fd: int, size: int) -> np.ndarray:
    """The file's ``size`` bytes in this thread's reusable buffer (a fresh one per call would page-
    fault its every page in: several times the copy). A short read is a damaged file."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < size:
        buf = _SCRATCH.buf = np.empty(max(size, 1 << 20), np.uint8)
    view = memoryview(buf)[:size]
    got = 0
    while got < size:
        k = os.preadv(fd, [view[got:]], got)
        if k <= 0:
            raise ValueError(f"read {got} of {size} bytes: truncated")
        got += k
    return buf[:size]


def _entry(r: _Resident, fd: int, i: int) -> tuple[int, int, int]:
    """Entry ``i`` of the file: (fp_hi, fp_lo, loc)."""
    b, k = divmod(i, r.rows)
    isz = r.loc_dtype.itemsize
    h = int(np.frombuffer(os.pread(fd, 8, int(r.hi_off[b]) + 8 * k), np.uint64)[0])
    lo = int(np.frombuffer(os.pread(fd, 8, int(r.lo_off[b]) + 8 * k), np.uint64)[0])
    loc = int(np.frombuffer(os.pread(fd, isz, int(r.loc_off[b]) + isz * k), r.loc_dtype)[0])
    return h, lo, loc


def _seek_resident(r: _Resident, fd: int, hi: np.ndarray, lo: np.ndarray, out: np.ndarray) -> None:
    """:func:`_seek` through a file's resident summary: set out[i] = file loc (>= -1) where the
    sorted needle ``hi``/``lo`` is found, reading only the windows, ``fp_lo`` and ``loc`` it needs.

    The sample ``s`` (``s[j]`` = fp_hi of entry j x step) puts the first entry whose fp_hi is >=
    the needle's (its lower bound) in entries ``((j-1) x step, j x step]`` for the first ``j`` with
    ``s[j] >= hi``; counting the window's values below ``hi`` finds it. Every step is one numpy
    operation over all of the bucket's keys."""
    n = r.n
    if n == 0 or hi.size == 0:
        return
    k, rows, isz = r.step, r.rows, r.loc_dtype.itemsize
    if hi.size * WHOLE_FILE_BYTES_PER_KEY >= r.size:
        # many keys for the file's size: one read of it all costs less than a read per key. A
        # file above WHOLE_FILE_MAX_BYTES (a bucket of ~3.5M+ entries: 16 buckets at 100M keys)
        # is mapped for this call instead of copied into the thread's buffer; the mapping goes
        # with the call (its pages count in RSS only meanwhile). Without it such a lookup read
        # 3 windows a key: 990k keys over 16 buckets of 6.3M entries took 8.3 s against 3.3 s
        # mapped (docs/benchmarks.md, "Results at 100M rows")
        raw = _file_bytes(fd, r.size) if r.size <= WHOLE_FILE_MAX_BYTES else \
            np.frombuffer(mmap.mmap(fd, r.size, access=mmap.ACCESS_READ), np.uint8)
        u64 = raw[:r.size // 8 * 8].view(np.uint64)
        locs = raw[:r.size // isz * isz].view(r.loc_dtype)
        span = np.arange(k)

        def windows(offs: np.ndarray) -> np.ndarray:  # past the file's end: clipped, and not looked at
            return u64[np.minimum((offs >> 3)[:, None] + span, u64.size - 1)]

        def words(offs: np.ndarray) -> np.ndarray:
            return u64[offs >> 3]

        def loc_at(offs: np.ndarray) -> np.ndarray:
            return locs[offs // isz]
    else:
        def windows(offs: np.ndarray) -> np.ndarray:
            return np.frombuffer(_pread(fd, offs.tolist(), 8 * k), np.uint64).reshape(-1, k)

        def words(offs: np.ndarray) -> np.ndarray:
            return np.frombuffer(_pread(fd, offs.tolist(), 8), np.uint64)

        def loc_at(offs: np.ndarray) -> np.ndarray:
            return np.frombuffer(_pread(fd, offs.tolist(), isz), r.loc_dtype)
    j = np.searchsorted(r.sample, hi, side="left")
    start = np.maximum(j - 1, 0) * k
    blk = start // rows
    win = windows(r.hi_off[blk] + (start - blk * rows) * 8)
    below = win < hi[:, None]
    short = n - start < k  # the file's last window: fewer entries than the step
    if short.any():
        below[short] &= np.arange(k) < (n - start[short])[:, None]
    c = below.sum(axis=1)
    p = start + c  # the lower bound
    cand = win[np.arange(hi.size), np.minimum(c, k - 1)]
    nxt = c == k  # past the window: the next window's first entry, which the sample holds
    if nxt.any():
        cand[nxt] = r.sample[np.minimum(j[nxt], r.sample.size - 1)]
    e = np.nonzero((p < n) & (cand == hi))[0]
    if e.size == 0:
        return
    pe = p[e]
    pb = pe // rows
    pr = pe - pb * rows
    exact = words(r.lo_off[pb] + pr * 8) == lo[e]
    if exact.any():
        out[e[exact]] = loc_at(r.loc_off[pb[exact]] + pr[exact] * isz)
    # fp_hi equal but fp_lo differs: several entries share fp_hi (2^-64 per pair); walk the run,
    # which starts at the lower bound and may run on into later blocks
    for i in e[~exact].tolist():
        h, want, q = int(hi[i]), int(lo[i]), int(p[i]) + 1
        while q < n:
            qh, ql, qloc = _entry(r, fd, q)
            if qh != h:
                break
            if ql == want:
                out[i] = qloc
                break
            q += 1


class _Summaries:
    """Resident summaries of index files kept between lookups: path -> (identity, summary),
    least recently used first, bounded by count and by the bytes the summaries are counted at.
    Thread-safe (the Arrow engine looks buckets up on threads); a summary holds no descriptor
    and no mapping, so one dropped while another thread uses it is simply freed after."""

    def __init__(self, max_files: int, max_bytes: int) -> None:
        self.max_files = max_files
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._files: OrderedDict[str, tuple[tuple, _Resident]] = OrderedDict()
        self._bytes = 0
        self.hits = self.misses = 0

    def open(self, io: FileIO, path: str) -> tuple[_Resident, int] | None:
        """``path``'s summary and a descriptor of the file it summarises (the caller closes it), or
        None: caching is off, the storage has no cheap identity (no local file), the file is too
        young to be vouched for or was replaced while opened, or it has no uniform layout -- then
        the caller opens it as an :class:`IndexFile`."""
        if self.max_files <= 0 or self.max_bytes <= 0:
            return None
        with _readable(io, path):
            ident = io.identity(path)
        if ident is None:
            return None
        with _readable(io, path):  # identity vouched for a local path: os.stat of it
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != ident:
                os.close(fd)  # replaced between the stat and the open: which one is this?
                return None
            with self._lock:
                got = self._files.get(path)
                if got is not None and got[0] == ident:
                    self._files.move_to_end(path)
                    self.hits += 1
                    return got[1], fd
            with _readable(io, path):
                r = _Resident.build(io, path, fd)
            if r is None:
                os.close(fd)
                return None
            with self._lock:
                self.misses += 1  # hits + misses: the files looked up through summaries
                if r.nbytes <= self.max_bytes:
                    old = self._files.pop(path, None)
                    if old is not None:
                        self._bytes -= old[1].nbytes
                    self._files[path] = (ident, r)
                    self._bytes += r.nbytes
                    while self._files and (len(self._files) > self.max_files or self._bytes > self.max_bytes):
                        _, (_, gone) = self._files.popitem(last=False)
                        self._bytes -= gone.nbytes
            return r, fd
        except BaseException:
            os.close(fd)
            raise

    def limit(self, max_files: int, max_bytes: int) -> None:
        with self._lock:
            self.max_files, self.max_bytes = max_files, max_bytes
            while self._files and (len(self._files) > max(max_files, 0) or self._bytes > max(max_bytes, 0)):
                _, (_, gone) = self._files.popitem(last=False)
                self._bytes -= gone.nbytes

    def clear(self) -> None:
        with self._lock:
            self._files.clear()
            self._bytes = 0
            self.hits = self.misses = 0

    def info(self) -> dict[str, int]:
        with self._lock:
            return {"files": len(self._files), "bytes": self._bytes, "hits": self.hits, "misses": self.misses,
                    "max_files": self.max_files, "max_bytes": self.max_bytes}


_SUMMARIES = _Summaries(CACHE_MAX_FILES, CACHE_MAX_BYTES)


def set_cache_limits(*, max_files: int = CACHE_MAX_FILES, max_bytes: int = CACHE_MAX_BYTES) -> None:
    """Bound the process's cache of resident index-file summaries (0 for either: no caching, every
    lookup opens its files as :class:`IndexFile`; a bound not given is its default again);
    summaries beyond the new bounds are dropped now."""
    _SUMMARIES.limit(max_files, max_bytes)


def clear_cache() -> None:
    """Drop every cached summary (and the hit counts): the next lookups build them anew."""
    _SUMMARIES.clear()


def cache_info() -> dict[str, int]:
    """The cache's files, the bytes its summaries are counted at, hits and misses since the last
    :func:`clear_cache`, and its bounds."""
    return _SUMMARIES.info()


def index_file_problem(io: FileIO, path: str) -> str | None:
    """Why the index file at ``path`` is damaged, or None: what ``validate`` checks of it.

    An index file is Arrow IPC without checksums (memory-mapped lookups read only the pages
    they touch, format.md §6), so a damaged one is found by its invariants instead: it decodes
    whole; its columns are ``fp_hi``, ``fp_lo`` (uint64) and a signed ``loc``; the fingerprints
    are strictly increasing; each block starts at the ``fp_hi`` its block index records; the
    entry count is the recorded one; every ``loc`` is a tombstone or names a location of its
    table, and every location is a ``[partition, file id]`` pair of strings. What these do not
    catch -- a fingerprint changed to another in sorted order, or a ``loc`` to another valid
    one -- ``validate``'s join of entries and rows does (an entry without its row and a row
    without its entry, or an entry pointing at the wrong file)."""
    try:
        with IndexFile(io, path) as f:
            batches = [f._reader.get_batch(i) for i in range(f.num_blocks)]
            if any(not (isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) for x in p))
                   for p in f.locations):
                return "its location table is not a list of [partition, file id] pairs"
            names = [fl.name for fl in f._reader.schema]
            if names != ["fp_hi", "fp_lo", "loc"] or not all(
                    f._reader.schema.field(n).type == pa.uint64() for n in ("fp_hi", "fp_lo")) or not \
                    pa.types.is_signed_integer(f._reader.schema.field("loc").type):
                return f"its columns are {f._reader.schema}, not fp_hi, fp_lo (uint64) and loc"
            for b in batches:
                b.validate(full=True)
            hi = np.concatenate([b.column(0).to_numpy() for b in batches]) if batches else np.empty(0, np.uint64)
            lo = np.concatenate([b.column(1).to_numpy() for b in batches]) if batches else np.empty(0, np.uint64)
            loc = np.concatenate([b.column(2).to_numpy() for b in batches]) if batches else np.empty(0, np.int64)
            if len(hi) != f.num_entries:
                return f"it holds {len(hi)} entries, its metadata says {f.num_entries}"
            firsts = [int(b.column(0)[0].as_py()) for b in batches if b.num_rows]
            if firsts != [int(x) for x in f.block_first_hi.tolist()]:
                return "its block index does not match its blocks"
            if len(hi) > 1 and not np.all((hi[1:] > hi[:-1]) | ((hi[1:] == hi[:-1]) & (lo[1:] > lo[:-1]))):
                return "its fingerprints are not strictly increasing"
            if len(loc) and (loc.min() < TOMBSTONE or loc.max() >= len(f.locations)):
                return "an entry names a location its table does not hold"
    except IndexCorruptError as e:  # it broke after check_index_files opened it: the same finding
        return e.why
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as e:
        if isinstance(e, (FileNotFoundError, PermissionError)) or (isinstance(e, OSError) and e.errno is not None):
            raise
        return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    return None


@dataclass
class LookupResult:
    """Per queried key: ``loc[i]`` indexes ``locations`` or is -1 (absent or deleted)."""

    loc: np.ndarray
    locations: list[tuple[str, str]]
    mode: str

    @property
    def found(self) -> np.ndarray:
        return self.loc >= 0

    def target(self, i: int) -> tuple[str, str] | None:
        v = int(self.loc[i])
        return None if v < 0 else self.locations[v]


def _seek(f: IndexFile, hi: np.ndarray, lo: np.ndarray, out: np.ndarray) -> None:
    """Search sorted needles ``hi``/``lo``; set out[i] = file loc (>= -1) where found.

    Per touched block only the binary search and the gathers of the candidates run (a batch of
    ~100 keys touches every block of a 1M-entry file, and at 1,000 buckets that per-block work
    is most of a lookup); the comparisons run once over all needles."""
    if f.num_blocks == 0 or hi.size == 0:
        return
    blk = np.searchsorted(f.block_first_hi, hi, side="right") - 1
    # needles below the first block's first key (blk -1) can only be absent: they stay -2
    bounds = np.searchsorted(blk, np.arange(f.num_blocks + 1), side="left")
    pos = np.zeros(hi.size, dtype=np.int64)  # insertion point in the needle's block
    size = np.zeros(hi.size, dtype=np.int64)  # that block's length (0: not searched)
    c_hi = np.zeros(hi.size, dtype=np.uint64)
    c_lo = np.zeros(hi.size, dtype=np.uint64)
    c_loc = np.full(hi.size, -2, dtype=np.int64)
    for b in np.nonzero(bounds[1:] > bounds[:-1])[0].tolist():
        s, e = int(bounds[b]), int(bounds[b + 1])
        bhi, blo, bloc = f.block(b)
        if bhi.size == 0:
            continue
        p = np.searchsorted(bhi, hi[s:e], side="left")
        pos[s:e] = p
        size[s:e] = bhi.size
        p = np.minimum(p, bhi.size - 1)
        c_hi[s:e], c_lo[s:e], c_loc[s:e] = bhi[p], blo[p], bloc[p]
    hit = (pos < size) & (c_hi == hi)
    exact = hit & (c_lo == lo)
    out[exact] = c_loc[exact]
    # fp_hi equal but fp_lo differs: several entries share fp_hi (2^-64 per pair); walk them
    for j in np.nonzero(hit & ~exact)[0].tolist():
        b = int(blk[j])
        bhi, blo, bloc = f.block(b)
        p = int(pos[j])
        while p < bhi.size and bhi[p] == hi[j]:
            if blo[p] == lo[j]:
                out[j] = bloc[p]
                break
            p += 1
        else:
            if pos[j] == 0:  # the run of equal fp_hi may start in earlier blocks
                out[j] = _walk_back(f, b, hi[j], lo[j])


def _walk_back(f: IndexFile, b: int, h: np.uint64, l: np.uint64) -> int:
    """Find (h, l) in the blocks before ``b``, where a run of entries with fp_hi == h that
    reaches into block ``b`` began; -2 if it is not there."""
    while b > 0:
        b -= 1
        bhi, blo, bloc = f.block(b)
        p = bhi.size - 1
        while p >= 0 and bhi[p] == h:
            if blo[p] == l:
                return int(bloc[p])
            p -= 1
        if p >= 0:  # the run began inside this block
            break
    return -2


def _scan(f: IndexFile, hi: np.ndarray, lo: np.ndarray, out: np.ndarray) -> None:
    """Hash-join every entry of the file against the needles."""
    if f.num_blocks == 0 or hi.size == 0:
        return
    t = f.read_all()
    # entry -> position of the needle with the same fp_hi (-1: no such needle)
    match = pc.fill_null(pc.index_in(t.column("fp_hi"), value_set=pa.array(hi)), -1).to_numpy()
    rows = np.nonzero(match >= 0)[0]
    if rows.size == 0:
        return
    needle_pos = match[rows].astype(np.int64)
    ok = t.column("fp_lo").to_numpy()[rows] == lo[needle_pos]
    out[needle_pos[ok]] = t.column("loc").to_numpy()[rows][ok]
    # Entries sharing fp_hi with a needle but not fp_lo, or needles sharing fp_hi with each
    # other (each about 2^-64 per pair): settle the needles still open by exact search.
    if not ok.all() or (hi.size > 1 and (hi[1:] == hi[:-1]).any()):
        open_ = np.nonzero(out == -2)[0]
        if open_.size:
            sub = np.full(open_.size, -2, dtype=np.int32)
            _seek(f, hi[open_], lo[open_], sub)
            out[open_] = sub


def choose_mode(mode: str = "auto", *, memory_mapped: bool = True, touched_fraction: float = 0.0) -> str:
    """The strategy for a lookup: ``mode`` itself unless it is ``auto``.

    ``auto``: seek on memory-mapped files (measured fastest at every batch size); otherwise
    scan when the batch touches at least :data:`SCAN_BLOCK_FRACTION` of the blocks.
    """
    if mode not in LOOKUP_MODES:
        raise ValueError(f"lookup mode must be one of {LOOKUP_MODES}, got {mode!r}")
    if mode != "auto":
        return mode
    if memory_mapped:
        return "seek"
    return "scan" if touched_fraction >= SCAN_BLOCK_FRACTION else "seek"


def _touched_blocks(f: IndexFile, sorted_hi: np.ndarray) -> int:
    """How many of ``f``'s blocks a seek for the sorted needles would read."""
    blk = np.searchsorted(f.block_first_hi, sorted_hi, side="right") - 1
    blk = blk[blk >= 0]
    return 0 if blk.size == 0 else 1 + int(np.count_nonzero(blk[1:] != blk[:-1]))


def lookup(
    io: FileIO,
    paths: Sequence[str],
    keys: Sequence[str] | None = None,
    *,
    fp: tuple[np.ndarray, np.ndarray] | None = None,
    mode: str = "auto",
) -> LookupResult:
    """Look up keys (or their fingerprints) in one bucket's index files, ``paths`` oldest first.

    Newest file wins per key; a tombstone makes the key absent. Local files are sought through
    their resident summaries (the module's cache, bounded; :class:`_Resident`), read with
    ``pread``: nothing stays mapped between calls. Files without one (object stores, HDFS, a
    file written in the last 2 s, caching off) are opened as :class:`IndexFile` for the call and
    sought or scanned as ``mode`` says. Only the locations of the entries found are resolved, so
    ``locations`` holds those, not the files' whole tables.
    """
    if mode not in LOOKUP_MODES:
        raise ValueError(f"lookup mode must be one of {LOOKUP_MODES}, got {mode!r}")
    hi, lo = fp if fp is not None else fingerprints(keys or [])
    n = hi.size
    order = np.argsort(hi)
    shi, slo = hi[order], lo[order]
    files: list[IndexFile | tuple[_Resident, int]] = []
    owned: list[IndexFile] = []  # opened for this call only: closed at the end
    fds: list[int] = []  # descriptors of the summarised files: closed at the end
    try:
        for p in paths:  # opened inside the try: a damaged file closes the ones opened before it
            got = _SUMMARIES.open(io, p) if mode != "scan" else None
            if got is not None:
                fds.append(got[1])
                files.append(got)
            else:
                f = IndexFile(io, p, lazy_locations=True)
                owned.append(f)
                files.append(f)
        mapped = all(f.memory_mapped for f in owned)
        touched = 0.0
        if mode == "auto" and not mapped:
            blocks = sum(f.block_first_hi.size for f in owned)
            touched = sum(_touched_blocks(f, shi) for f in owned) / blocks if blocks else 0.0
        chosen = choose_mode(mode, memory_mapped=mapped, touched_fraction=touched)
        # resolved[i]: global location id, -1 absent/deleted, -2 not yet seen in any file
        resolved = np.full(n, -2, dtype=np.int64)
        loc_ids: dict[tuple[str, str], int] = {}
        pending = np.arange(n)
        for f in reversed(files):  # newest first: the first file that knows a key decides
            if pending.size == 0:
                break
            out = np.full(pending.size, -2, dtype=np.int32)
            if isinstance(f, tuple):
                f, fd = f
                _seek_resident(f, fd, shi[pending], slo[pending], out)
            else:
                (_seek if chosen == "seek" else _scan)(f, shi[pending], slo[pending], out)
            seen = out != -2
            if not seen.any():
                continue
            file_locs = np.asarray(out[seen], dtype=np.int64)
            live = file_locs >= 0
            if live.any():  # the file's ordinals found -> this result's location ids
                used, inverse = np.unique(file_locs[live], return_inverse=True)
                with _readable(io, f.path):  # an ordinal past the table: a damaged file
                    table = f.locations
                    glob = np.array([loc_ids.setdefault(table[u], len(loc_ids)) for u in used.tolist()],
                                    dtype=np.int64)
                file_locs[live] = glob[inverse.reshape(-1)]
            resolved[pending[seen]] = file_locs
            pending = pending[~seen]
        locations = list(loc_ids)
    finally:
        for f in owned:
            f.close()
        for fd in fds:
            os.close(fd)
    result = np.empty(n, dtype=np.int64)
    result[order] = np.where(resolved < 0, -1, resolved)
    return LookupResult(result, locations, chosen)


def merge_entries(io: FileIO, paths: Sequence[str], *, keep_tombstones: bool = False) -> IndexEntries:
    """All entries of a bucket's files (oldest first) merged newest-wins; tombstones dropped."""
    his, los, locs, ages = [], [], [], []
    ids: dict[tuple[str, str], int] = {}
    for age, p in enumerate(paths):
        with IndexFile(io, p) as f:
            e = f.entries()
        remap = np.array([ids.setdefault(l, len(ids)) for l in e.locations] + [TOMBSTONE], dtype=np.int32)
        his.append(e.fp_hi)
        los.append(e.fp_lo)
        locs.append(remap[e.loc])  # TOMBSTONE (-1) maps to the appended -1
        ages.append(np.full(e.fp_hi.size, age, dtype=np.int32))
    locations = list(ids)
    if not his:
        z = np.empty(0, np.uint64)
        return IndexEntries(z, z.copy(), np.empty(0, np.int32), [])
    hi, lo, loc, age = (np.concatenate(x) for x in (his, los, locs, ages))
    order = np.lexsort((-age, lo, hi))  # per key, newest first
    hi, lo, loc = hi[order], lo[order], loc[order]
    first = np.ones(hi.size, dtype=bool)
    first[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    merged = IndexEntries(hi[first], lo[first], loc[first], locations)
    return merged if keep_tombstones else merged.live()



def compact_entries(io: FileIO, paths: Sequence[str], *, sealed: Sequence[str] = ()) -> IndexEntries:
    """The new base of an index compaction: ``paths`` (the open base and deltas it folds,
    oldest first) merged newest-wins, tombstones dropped unless they still hide something.

    ``sealed`` are the bucket's sealed bases, all older than ``paths`` and never rewritten:
    a tombstone whose key they still resolve to a location (newest sealed entry wins) stays,
    or dropping it would bring the deleted key back; every other tombstone goes, since no
    older file of the bucket remains for it to hide.
    """
    merged = merge_entries(io, paths, keep_tombstones=True)
    tomb = merged.loc == TOMBSTONE
    keep = ~tomb
    if sealed and tomb.any():
        at = np.nonzero(tomb)[0]
        hidden = lookup(io, sealed, fp=(merged.fp_hi[at], merged.fp_lo[at])).found
        keep[at[hidden]] = True
    return IndexEntries(merged.fp_hi[keep], merged.fp_lo[keep], merged.loc[keep], merged.locations)
