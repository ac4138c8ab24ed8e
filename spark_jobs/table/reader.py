"""Reading a snapshot with Arrow alone (no Spark): for small tables, tests, tools, and the
per-file-group reads of Spark tasks (a merge-on-read slice is merged here, in one place)."""

from __future__ import annotations

from typing import Sequence
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.exceptions import BadInputError, BucketIndexError, RetryableError, TableCorruptError
from spark_jobs.io import parquet
from spark_jobs.io.parquet import table_file
from spark_jobs.table.layout import is_reference
from spark_jobs.table.schema import conform
from spark_jobs.table.merge import LOG_OP, SlicePlan, merge_slice, plan_slice
from spark_jobs.table.ordering import older
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView

__all__ = ["read_arrow", "read_slice", "read_slice_plan", "read_data_file", "slice_value_bound", "canonical_keys", "hive_values",
           "META_PREFIX", "HIVE_NULL", "missing_file_error", "missing_during_read",
           "read_view"]

META_PREFIX = "_bi_"
#: the record key column of every data file (``spark_jobs.kernels.tasks.KEY``)
KEY_COLUMN = "_bi_key"
#: pyarrow's (and Hive's) directory value for a null partition value
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def read_slice(table: Table, base: str, logs: Sequence[str] = (), *, columns: Sequence[str] | None = None,
               precombine: str | None = None, schema: pa.Schema | None = None, threads: bool = True) -> pa.Table:
    """The live rows of one file slice (relative paths): the base, merged with its logs.

    ``columns`` (default: all of the base's) are the columns returned. Only the columns the
    merge needs are read from the logs (those plus the key, the precombine field and the op).
    ``schema`` casts every file to the snapshot's schema first (older files may lack a
    column added since, or hold a narrower type). ``threads=False`` reads each file in the
    calling thread alone: for a caller that runs on one of pyarrow's own pool threads (a
    dataset fragment opened by a scan), where a read waiting on that pool could deadlock it.
    """
    cols = list(columns) if columns is not None else None
    if not logs:
        return _cast(_read(table, base, cols, threads), schema,
                     cols if cols is not None or schema is None else schema.names)
    need = None if cols is None else list(dict.fromkeys([*cols, KEY_COLUMN] + ([precombine] if precombine else [])))
    b = _cast(_read(table, base, need, threads), schema, need if need is not None or schema is None else schema.names)
    ls = [_cast(_read(table, rel, None if need is None else [*need, LOG_OP], threads), schema,
                None if need is None else [*need, LOG_OP]) for rel in logs]
    return merge_slice(b, ls, key=KEY_COLUMN, precombine=precombine, columns=cols or b.column_names)


def read_slice_plan(table: Table, base: str, logs: Sequence[str], *, precombine: str | None,
                    schema: pa.Schema | None = None) -> tuple[SlicePlan, list[pa.Table]]:
    """The merge plan of one slice (``merge.plan_slice``) and its logs' merge columns.

    Only the columns the merge rules look at are read (key, precombine, and a log's op): a
    reader that applies the plan by position reads the rows themselves some other way.
    """
    merge_cols = [KEY_COLUMN] + ([precombine] if precombine else [])
    b = _cast(_read(table, base, merge_cols), schema, merge_cols)
    ls = [_cast(_read(table, rel, [*merge_cols, LOG_OP]), schema, [*merge_cols, LOG_OP]) for rel in logs]
    return plan_slice(b, ls, key=KEY_COLUMN, precombine=precombine), ls


def _read(table: Table, rel: str, cols: list[str] | None, threads: bool = True) -> pa.Table:
    return read_data_file(table, rel, cols, threads=threads)


def read_data_file(table: Table, rel: str, columns: Sequence[str] | None = None, *,
                   schema: pa.Schema | None = None, threads: bool = True) -> pa.Table:
    """One data file (relative path) as stored, ``columns`` only (default all): every reader
    of data files goes through here, so a *reference* file (format.md §5.3) reads as a file
    the table wrote -- its Hive path columns and the key column ``_bi_key`` added.

    With ``schema`` (the snapshot's), the file is read in it (:func:`~spark_jobs.table.schema.conform`):
    a file written before a column was added or widened gets the column as null, or widened.
    A requested column the file lacks is left out of what is read (Parquet refuses to project
    it: the read is retried with the file's own columns) and ``schema`` fills it in."""
    if schema is not None:
        return _cast(read_data_file(table, rel, columns, threads=threads), schema, columns)
    cols = list(columns) if columns is not None else None
    try:
        f = table.io.open_input_file(table.abs(rel))
    except FileNotFoundError as e:
        raise missing_file_error(table.abs(rel)) from e
    with f, table_file(table.abs(rel)):  # a damaged file is named (exit 1), never read as other values
        if not is_reference(rel):
            # a column the file lacks is skipped: a partial log (format.md §5.1) holds only some
            return parquet.read_table(f, columns=cols, use_threads=threads)
        pf = parquet.open_file(f)
        stored = pf.schema_arrow.names
        assert table.config is not None and table.config.reference is not None, f"{rel}: not a reference table"
        keys = list(table.config.record_key_fields)
        want = cols if cols is not None else list(dict.fromkeys(
            [*stored, *table.config.reference["path_columns"], KEY_COLUMN]))
        need = [c for c in dict.fromkeys([*want, *(keys if KEY_COLUMN in want else [])]) if c in stored]
        data = pf.read(columns=need, use_threads=threads)
    return _adopt(table, rel, data, want)


def _bound_is_exact(typ: pa.DataType) -> bool:
    """Whether Parquet's footer statistics of a column of this type order as format.md §8 does.

    Signed integers, dates and timestamps of s/ms/us (stored as INT32/INT64, compared as the
    numbers they are) do. Floats do not (a footer's max leaves NaN out, and §8 ranks NaN above
    every number), nor strings (a writer may shorten a long max, and orders differ for older
    files), nor decimals (some writers ordered their bytes unsigned), nor nanosecond timestamps
    (their statistics come back as pandas values)."""
    if pa.types.is_signed_integer(typ) or pa.types.is_date32(typ):
        return True
    return pa.types.is_timestamp(typ) and typ.unit != "ns"


def slice_value_bound(table: Table, base: str, logs: Sequence[str] = (), *, column: str,
                      schema: pa.Schema) -> pa.Array | None:
    """The greatest value of ``column`` over every row stored in one file slice -- the base and
    all its logs, live or not -- read from the files' footers alone (no column data), as a
    one-element array of the snapshot's type (null when every stored value is null); ``None``
    when the footers cannot tell: a file without statistics for the column (or without the
    column), a reference file (format.md §5.3), or a type whose statistics do not order as §8.

    Why: a merge-on-read delete is logged only when it is not older than the stored row
    (format.md §5.1). A delete not older than *every* value the slice holds is not older than
    its key's row either, so the writer can log it without reading the slice's key and
    precombine columns (at 100M rows that read was 2.4 GB for a 1M-row batch with 1% deletes:
    docs/benchmarks.md). The bound is conservative: rows that are stale or superseded count."""
    typ = schema.field(column).type
    if not _bound_is_exact(typ):
        return None
    best: pa.Array | None = None
    any_value = False
    for rel in [base, *logs]:
        if is_reference(rel):
            return None
        try:
            f = table.io.open_input_file(table.abs(rel))
        except FileNotFoundError as e:
            raise missing_file_error(table.abs(rel)) from e
        with f, table_file(table.abs(rel)):
            meta = parquet.open_file(f).metadata
            at = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == column), None)
            if at is None:
                return None
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                chunk = rg.column(at)
                st = chunk.statistics if chunk.is_stats_set else None
                if st is None:
                    return None
                if not st.has_min_max:
                    if st.has_null_count and st.null_count == rg.num_rows:
                        continue  # nulls only: §8 ranks null lowest, it never raises the bound
                    return None
                value = pa.array([st.max], type=typ)
                if best is None or bool(older(best, value)[0].as_py()):
                    best = value
                any_value = True
    return best if any_value else pa.nulls(1, typ)


def missing_file_error(path: str) -> TableCorruptError:
    """The one-line error for a data file a committed snapshot reads and storage lacks."""
    return TableCorruptError(
        f"data file {path} of the committed snapshot is missing (deleted outside bucketindex?): restore it "
        f"from a backup; `bucketindex validate` lists every missing file", path=path)


def missing_during_read(table: Table, view: FileSystemView, path: str) -> BucketIndexError:
    """The error for file ``path`` of ``view`` found missing while the view was being read.

    The timeline is read again first: when a ``clean`` (completed, or pending: its deletions
    may have begun) now retains only snapshots after ``view``'s, the file was removed by that
    clean while the snapshot was being read -- not lost -- and the error says so, naming the
    snapshot and the clean. Which exit (README's exit-status table):

    * the latest snapshot (no ``as_of``): :class:`RetryableError`, exit 3. The reader did
      nothing wrong and the table is fine; the same call now reads the newer latest snapshot,
      so a scheduler's retry succeeds;
    * an ``as_of`` snapshot: :class:`BadInputError`, exit 2, in the words of ``--as-of``
      older than the retained window (``Table.view``): running again gives that very answer,
      so retrying is useless, and the fix is the caller's (a retained instant, or a wider
      ``clean --retain-commits/--retain-hours``).

    Otherwise the file was deleted outside bucketindex: :func:`missing_file_error` (exit 1).
    """
    try:
        table.timeline.reload()
        kept = table.retained_from()
    except Exception:  # noqa: BLE001 - a diagnosis must not replace the error it explains
        kept = None
    if kept is None or view.seq >= kept["earliest_retained_seq"]:
        return missing_file_error(path)
    left = (f"left the retained window while it was being read: clean {kept['instant']} removed its files "
            f"({path}) and kept the snapshots from instant {kept['earliest_retained_instant']} on")
    if view.as_of is None:
        return RetryableError(f"the latest snapshot when the read began (sequence entry {view.seq}) {left}; "
                              f"read again for the current one")
    return BadInputError(f"--as-of {view.as_of} {left} (see `bucketindex show`; `clean --retain-commits/"
                         f"--retain-hours` sets the window)")


def _adopt(table: Table, rel: str, data: pa.Table, want: list[str]) -> pa.Table:
    """A reference file's rows with the columns a table file holds and it does not."""
    assert table.config is not None and table.config.reference is not None
    path_types = table.config.reference["path_columns"]
    values = hive_values(rel)
    out, names = [], []
    for name in want:
        if name == KEY_COLUMN:
            out.append(canonical_keys([_column(table, rel, data, values, k) for k in table.config.record_key_fields]))
        elif name in data.column_names:
            out.append(data.column(name))
        elif name in path_types:
            out.append(_column(table, rel, data, values, name))
        else:
            continue  # a column added to the table since (schema evolution): the reader fills it
        names.append(name)
    return pa.table(out, names=names)


def _column(table: Table, rel: str, data: pa.Table, values: dict[str, str | None], name: str) -> pa.Array:
    if name in data.column_names:
        return data.column(name)
    assert table.config is not None and table.config.reference is not None
    if name not in values:
        raise KeyError(f"column {name!r} is neither in reference file {rel} nor in its path")
    typ = pa.type_for_alias(table.config.reference["path_columns"][name])
    return pa.array([values[name]] * data.num_rows, pa.string()).cast(typ)


def hive_values(rel: str) -> dict[str, str | None]:
    """The ``name=value`` directories of a path, decoded as pyarrow writes them (``uri``
    segment encoding; ``__HIVE_DEFAULT_PARTITION__`` for null). The nearest one wins."""
    out: dict[str, str | None] = {}
    for seg in rel.split("/")[:-1]:
        name, eq, value = seg.partition("=")
        if eq and name:
            out[name] = None if value == HIVE_NULL else unquote(value)
    return out


def canonical_keys(columns: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Array:
    """The canonical record key (format.md §7) of each row, vectorised: a value cast to
    string, or several joined with ``,`` after escaping ``\\`` and ``,`` (``hashing.composite_key``)."""
    strs = [pc.cast(c, pa.string()) for c in columns]
    if len(strs) == 1:
        out = strs[0]
    else:
        esc = [pc.replace_substring(pc.replace_substring(c, "\\", "\\\\"), ",", "\\,") for c in strs]
        out = pc.binary_join_element_wise(*esc, ",")
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def _cast(t: pa.Table, schema: pa.Schema | None, columns: Sequence[str] | None = None) -> pa.Table:
    """``t`` (a file's rows) in the snapshot's ``schema``: columns added since filled with null,
    widened ones cast (``schema.conform``, which keeps a partial log's metadata: merge.log_columns);
    ``columns`` the ones asked for (default: the schema's, then the file's others, e.g. ``_bi_op``)."""
    if schema is None:
        return t
    return conform(t, schema, columns)


def read_arrow(uri: str, as_of: str | None = None, *, with_meta: bool = False, limit: int | None = None) -> pa.Table:
    """The table as of ``as_of`` -- an instant or an ISO-8601 time, no zone meaning UTC
    (:func:`~spark_jobs.table.timeline.resolve_as_of`); default: latest -- as one Arrow table; with ``limit``, its
    first ``limit`` rows, reading file slices (in the view's order) only until they hold them."""
    table = Table.load(uri)
    return read_view(table, table.view(as_of), with_meta=with_meta, limit=limit)


def read_view(table: Table, view: FileSystemView, *, with_meta: bool = False, limit: int | None = None) -> pa.Table:
    """:func:`read_arrow`'s rows of a view already built: the files are read only now, so a
    file removed since (a ``clean`` in between) is explained by :func:`missing_during_read`."""
    assert table.config is not None
    precombine = table.config.precombine_field
    # cast to the snapshot's schema: a reference file keeps its source's time zone (format.md §5)
    parts, got = [], 0
    for s in view.slices():
        if limit is not None and got >= limit:
            break
        try:
            parts.append(read_slice(table, s.path, [lf.path for lf in s.logs], precombine=precombine,
                                    schema=view.schema))
        except TableCorruptError as e:
            if e.path is None or table.io.exists(e.path):
                raise
            raise missing_during_read(table, view, e.path) from e
        got += parts[-1].num_rows
    if parts and limit is not None and view.schema is not None:
        parts.append(view.schema.empty_table())  # every column, though the slices read lack one added later
    if parts:
        out = pa.concat_tables(parts, promote_options="default")
    elif view.schema is not None:
        out = view.schema.empty_table()
    else:
        out = pa.table({})
    if not with_meta:
        out = out.select([n for n in out.column_names if not n.startswith(META_PREFIX)])
    return out if limit is None else out.slice(0, limit)
