"""A snapshot as a ``pyarrow.dataset.Dataset``: how DuckDB, Polars, pandas and plain pyarrow
read a bucketindex table without this project's reader in the loop (and without copying it).

Pointing ``pyarrow.dataset.dataset()`` at the table directory gives wrong answers: every file
version ever written is there, merge-on-read logs are not merged, and partition directories
hold form-encoded names. :func:`dataset` builds the dataset from the snapshot's file-system view
instead (format.md §4.1), so only the snapshot's files are read:

* a file slice **without logs** (every slice of a copy-on-write table; a merge-on-read slice
  after compaction) is a Parquet fragment of a ``FileSystemDataset`` read lazily by pyarrow
  itself, so projections and filters go down to Parquet (columns, row-group statistics) and
  a fragment whose partition value contradicts a filter is never opened;
* a slice **with logs** must be merged (format.md §5.1) before any row of it is right: it is
  a fragment of a second ``FileSystemDataset`` whose "files" are merged slices, produced on
  open by :func:`spark_jobs.table.reader.read_slice` (see :class:`MergedSliceFiles` for why
  this and not a ``RecordBatchReader``).

Both kinds are read in the snapshot's published schema: ``_bi_*`` columns left out, a file
written before an ``alter`` read with the current columns (absent ones null, narrower ones
widened: pyarrow's scanner casts a fragment to the dataset schema as ``schema.conform`` does),
a reference-bootstrapped file (format.md §5.3) with its Hive path columns supplied by its
fragment's partition expression, which pyarrow materialises for columns the file lacks.
"""

from __future__ import annotations

import datetime as _dt
import posixpath
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Mapping, Sequence
from urllib.parse import unquote_plus

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc

from spark_jobs.exceptions import TableCorruptError, TableNotFoundError
from spark_jobs.io import parquet
from spark_jobs.io.filesystem import refuse_uncommittable, refuse_uncommittable_uri, resolve
from spark_jobs.io.storage import normalise_options
from spark_jobs.table.config import TableConfig
from spark_jobs.table.layout import NULL_PARTITION, TableLayout, is_reference, partition_path
from spark_jobs.table.reader import META_PREFIX, hive_values, missing_during_read, read_slice
from spark_jobs.table.schema import conform
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSlice, FileSystemView

if TYPE_CHECKING:
    import pyarrow.dataset as ds

__all__ = ["dataset", "snapshot_dataset", "open_table", "public_schema", "partition_candidates",
           "MergedSliceFiles"]

#: merged slices kept after a fragment is opened: pyarrow opens each IPC fragment twice per
#: scan (its footer, then its batches), so the second open must not merge the slice again
MERGED_CACHE_SLICES = 2


def dataset(uri: str, *, as_of: str | None = None,
            storage_options: Mapping[str, str] | None = None) -> ds.Dataset:
    """The table at ``uri`` as of ``as_of`` (an instant or an ISO-8601 time, as ``read --as-of``;
    default: latest) as a ``pyarrow.dataset.Dataset`` in the table's published schema.

    The snapshot is fixed when this returns: later commits are not seen, and every scan of the
    dataset (it can be scanned any number of times) reads the same files. ``storage_options``
    are the settings of ``--storage-option`` (``endpoint_url``, ``region``, credentials, ...),
    over the environment's, for a table on object storage.

    Copy-on-write: a ``FileSystemDataset`` of the snapshot's base files (Parquet, read lazily
    by pyarrow). Merge-on-read: slices without logs the same way, slices with logs merged one
    at a time on open (:class:`MergedSliceFiles`), the two joined by a ``UnionDataset``. Row
    order is not :func:`~spark_jobs.table.reader.read_arrow`'s.
    """
    table = open_table(uri, storage_options=storage_options)
    return snapshot_dataset(table, table.view(as_of))


def open_table(uri: str, *, storage_options: Mapping[str, str] | None = None) -> Table:
    """``Table.load`` with this caller's storage options instead of the process's run options:
    a library call (or a Spark task) must not change what other tables of the process use."""
    if not storage_options:
        return Table.load(uri)
    refuse_uncommittable_uri(uri)
    io, root = resolve(uri, options=normalise_options(storage_options))
    refuse_uncommittable(io, uri)
    table = Table(uri, io, root, TableConfig.load(io, TableLayout(root).config_file))
    if table.config is None:
        raise TableNotFoundError(f"no bucketindex table at {uri} (no .bucketindex/table.json)")
    return table


def public_schema(schema: pa.Schema | None) -> pa.Schema:
    """The snapshot's schema as users see it: without the reserved ``_bi_*`` columns."""
    if schema is None:
        return pa.schema([])
    return pa.schema([f for f in schema if not f.name.startswith(META_PREFIX)])


def snapshot_dataset(table: Table, view: FileSystemView) -> ds.Dataset:
    """The dataset of one view of ``table`` (:func:`dataset` says what it is made of)."""
    import pyarrow.dataset as ds  # here, not at the top: it loads pandas, and `spark_jobs.table` must stay cheap

    assert table.config is not None
    schema = public_schema(view.schema)
    plain = [s for s in view.slices() if not s.logs]
    merged = [s for s in view.slices() if s.logs]
    parts: list[ds.Dataset] = []
    if plain or not merged:
        parts.append(ds.FileSystemDataset.from_paths(
            [table.abs(s.path) for s in plain], schema=schema, filesystem=table.io.fs,
            # every page's checksum verified: a damaged page is an error, never other values
            format=ds.ParquetFileFormat(default_fragment_scan_options=parquet.scan_options()),
            partitions=[_guarantee(table, s, schema) for s in plain]))
    if merged:
        files = MergedSliceFiles(table=table, view=view, slices=merged, schema=schema)
        parts.append(ds.FileSystemDataset.from_paths(
            files.paths, schema=schema, format=ds.IpcFileFormat(), filesystem=pafs.PyFileSystem(files),
            partitions=[_partition_guarantee(table, s, schema) for s in merged]))
    return parts[0] if len(parts) == 1 else ds.UnionDataset(schema, parts)


# -- partition values --------------------------------------------------------------------

def partition_candidates(table: Table, s: FileSlice, schema: pa.Schema) -> list[Any] | None:
    """The partition field values the rows of slice ``s`` may hold, or None when its directory
    name does not say (no partition field, a shortened long value, a name from before format.md
    §1's current rule, a type whose text form is not one-to-one here).

    Directory names are never *read* as values (format.md §1): a name only narrows down which
    values a file can hold, and only when encoding the decoded value gives the very same name.
    ``__NULL__`` may also hold the string ``"__NULL__"`` on a bucket-index table written
    before the rule, so it stands for both."""
    assert table.config is not None
    fields = list(table.config.partition_fields or [])
    if len(fields) != 1 or fields[0] not in schema.names:
        return None
    field = fields[0]
    typ = schema.field(field).type
    head = f"{field}="
    if not s.partition.startswith(head):
        return None
    encoded = s.partition[len(head):]
    if encoded == NULL_PARTITION:
        return [None, NULL_PARTITION] if pa.types.is_string(typ) or pa.types.is_large_string(typ) else [None]
    text = unquote_plus(encoded)
    if partition_path(field, text) != s.partition:
        return None
    value = _typed(text, typ)
    return None if value is None else [value]


def _typed(text: str, typ: pa.DataType) -> Any:
    """``text`` (a partition value's string form, as Spark's cast to string writes it) as a
    value of ``typ``, or None when that form is not known to be one-to-one."""
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return text
    if pa.types.is_integer(typ):
        try:
            n = int(text)
        except ValueError:
            return None
        return n if str(n) == text else None
    if pa.types.is_date32(typ):
        try:
            d = _dt.date.fromisoformat(text)
        except ValueError:
            return None
        return d if d.isoformat() == text else None
    return None


def _partition_guarantee(table: Table, s: FileSlice, schema: pa.Schema) -> ds.Expression:
    """``field == value`` when the slice's directory proves its one value, else true.

    pyarrow takes a fragment's partition expression as the truth -- it prunes the fragment
    against filters with it and *replaces* the column's values with it -- so it is given only
    for a value the name proves (:func:`partition_candidates`), never for null (see there)."""
    import pyarrow.dataset as ds

    cands = partition_candidates(table, s, schema)
    if cands is None or len(cands) != 1 or cands[0] is None:
        return ds.scalar(True)
    field = table.config.partition_fields[0]  # type: ignore[union-attr]
    return ds.field(field) == pa.scalar(cands[0], schema.field(field).type)


def _guarantee(table: Table, s: FileSlice, schema: pa.Schema) -> ds.Expression:
    """A plain fragment's partition expression: a reference file's Hive path columns -- the
    values its directories give them (format.md §5.3), which pyarrow materialises since the
    file lacks those columns -- or the table's own partition value (:func:`_partition_guarantee`)."""
    import pyarrow.dataset as ds

    if not is_reference(s.path):
        return _partition_guarantee(table, s, schema)
    assert table.config is not None and table.config.reference is not None
    values = hive_values(s.path)
    expr = ds.scalar(True)
    for name, alias in table.config.reference["path_columns"].items():
        if name not in schema.names:
            continue
        if name not in values:
            # the file carries the column itself (a table bootstrapped before discovery stopped
            # listing a flat dataset's own columns as path columns): pyarrow reads it from the file
            continue
        value = values[name]
        if value is None:
            term = ds.field(name).is_null()
        else:  # as the reader: the text cast to the listed type, then to the snapshot's
            term = ds.field(name) == pa.scalar(value, pa.string()).cast(pa.type_for_alias(alias)).cast(
                schema.field(name).type)
        expr = expr & term
    return expr


# -- merged slices -----------------------------------------------------------------------

class MergedSliceFiles(pafs.FileSystemHandler):
    """A read-only filesystem (``pyarrow.fs.PyFileSystem``) whose files are the merged slices
    of a merge-on-read snapshot, each an Arrow IPC file made on open by ``read_slice``.

    Why a filesystem and not a ``RecordBatchReader``: a dataset over a reader
    (``InMemoryDataset``) can be scanned once -- a second ``to_table()``, or DuckDB running the
    query's scan twice, fails -- and its filters prune nothing. Files of a
    ``FileSystemDataset`` are opened afresh by every scan, and each fragment carries its
    partition expression, so a filter on the partition field skips a slice before it is
    merged. Memory is bounded by slices, not the table: merges run one at a time (a lock),
    and only the last :data:`MERGED_CACHE_SLICES` merged slices are kept (besides the few
    fragments pyarrow's scanner reads ahead, ``fragment_readahead``). Projection is applied
    after the merge: a slice's rows need all their columns to be merged (partial logs fill
    columns from other rows), so every column of a merged slice is read.
    """

    def __init__(self, *, table: Table, view: FileSystemView, slices: Sequence[FileSlice], schema: pa.Schema) -> None:
        assert table.config is not None
        self.table = table
        self.view = view
        self.view_schema = view.schema
        self.schema = schema
        self.precombine = table.config.precombine_field
        #: one name per slice; a counter, not the slice's path: names must need no escaping
        self.slices = {f"slice-{i:08d}.arrow": s for i, s in enumerate(slices)}
        self._cache: OrderedDict[str, pa.Buffer] = OrderedDict()
        self._lock = threading.Lock()
        self.merges = 0  # slices merged so far (tests check the cache works)

    @property
    def paths(self) -> list[str]:
        return list(self.slices)

    def _merged(self, path: str) -> pa.Buffer:
        with self._lock:
            buf = self._cache.get(path)
            if buf is not None:
                self._cache.move_to_end(path)
                return buf
            s = self.slices.get(path)
            if s is None:
                raise FileNotFoundError(path)
            # on a pyarrow pool thread (the scan opening a fragment): a read that waited on the
            # pools would wait on the very threads blocked here, so it reads in this thread alone
            try:
                rows = read_slice(self.table, s.path, [lf.path for lf in s.logs], precombine=self.precombine,
                                  schema=self.view_schema, threads=False)
            except TableCorruptError as e:  # a clean since the dataset was made, or a file lost
                if e.path is None or self.table.io.exists(e.path):
                    raise
                raise missing_during_read(self.table, self.view, e.path) from e
            rows = conform(rows, self.schema, self.schema.names)
            sink = pa.BufferOutputStream()
            with ipc.new_file(sink, self.schema) as w:
                w.write_table(rows.replace_schema_metadata(None).cast(self.schema))
            buf = sink.getvalue()
            self.merges += 1
            self._cache[path] = buf
            while len(self._cache) > MERGED_CACHE_SLICES:
                self._cache.popitem(last=False)
            return buf

    # -- pyarrow.fs.FileSystemHandler ------------------------------------------------------
    def get_type_name(self) -> str:
        return "bucketindex-merged-slices"

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: Sequence[str]) -> list[pafs.FileInfo]:
        return [pafs.FileInfo(p, pafs.FileType.File if p in self.slices else pafs.FileType.NotFound) for p in paths]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return [pafs.FileInfo(p, pafs.FileType.File) for p in self.slices
                if posixpath.dirname(p) == selector.base_dir.strip("/")]

    def open_input_file(self, path: str) -> pa.NativeFile:
        return pa.BufferReader(self._merged(path))

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.open_input_file(path)

    def _read_only(self, *args: Any) -> None:
        raise OSError("the merged slices of a bucketindex snapshot are read-only")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _read_only
    move = copy_file = open_output_stream = open_append_stream = _read_only
