"""Parquet as the table writes and reads it: every page checksummed, every checksum verified.

Why: a flipped byte in a data page of a compressed, dictionary-encoded file often still
decodes -- into other values. Without a checksum ``read`` returned them with exit 0 and
``validate`` (which reads keys only) passed. Parquet has a field for it: the CRC-32 of each
page (data and dictionary pages) in its header. Every Parquet file this project writes
(data files, merge-on-read logs, ``read --output``) carries it (:func:`write_table`,
:func:`writer`), and every read of a table's file verifies it (:func:`open_file`,
:func:`read_table`, :func:`scan_options`); a page whose bytes no longer match is an error,
never a value. A file written before (no checksums) still reads: a page without a
checksum is not verified. The footer has no checksum: a damaged one fails to decode (or
its offsets point at bytes that fail their page's checksum), which is an error too.

An error from a damaged file is :func:`damaged_file_error` -- ``TableCorruptError`` naming
the file, exit 1 (:func:`table_file`) -- and never bad input or a retry: the command is
fine and running it again fails the same way.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.exceptions import BucketIndexError, TableCorruptError
from spark_jobs.io.filesystem import is_unreachable

__all__ = ["write_table", "writer", "open_file", "read_table", "scan_options", "verify", "is_damage",
           "damaged_file_error", "table_file"]


def write_table(rows: pa.Table, where: Any, **kwargs: Any) -> None:
    """``pq.write_table`` with a CRC-32 in every page header."""
    pq.write_table(rows, where, write_page_checksum=True, **kwargs)


def writer(where: Any, schema: pa.Schema, **kwargs: Any) -> pq.ParquetWriter:
    """``pq.ParquetWriter`` with a CRC-32 in every page header."""
    return pq.ParquetWriter(where, schema, write_page_checksum=True, **kwargs)


def open_file(source: Any, **kwargs: Any) -> pq.ParquetFile:
    """``pq.ParquetFile`` whose every page read verifies its checksum (where it has one)."""
    return pq.ParquetFile(source, page_checksum_verification=True, **kwargs)


def read_table(source: Any, *, columns: list[str] | None = None, use_threads: bool = True) -> pa.Table:
    """One Parquet file whole, ``columns`` only (top-level names; one the file lacks is left
    out, as a partial log's are), verifying every page's checksum (where it has one).

    The file's own reader, not ``pq.read_table``: that one builds a ``ParquetDataset`` even for
    one open file, importing ``pyarrow.dataset`` (15-40 ms of a cold CLI run, and the C++ side's
    pandas probe) for a read that needs none of it. With ``use_threads``, the column chunks are
    prefetched in coalesced ranges (``pre_buffer``) as the dataset reader did (fewer requests
    on S3); without, the file is read in this thread alone."""
    return open_file(source, pre_buffer=use_threads).read(columns=columns, use_threads=use_threads)


def scan_options() -> Any:
    """The fragment scan options of a dataset over the table's files: checksums verified."""
    import pyarrow.dataset as ds  # here: it loads pandas, and the core must stay cheap to import

    return ds.ParquetFragmentScanOptions(page_checksum_verification=True)


def verify(source: Any, *, statistics: bool = True) -> int:
    """Read every page of every column of a Parquet file (footer, dictionary and data pages,
    checksums verified), one row group at a time so memory is bounded by the largest, and
    check the footer against what was read (row counts, some statistics); the number of
    rows read. Raises what the read raises (:func:`table_file` names the file). Without
    ``statistics`` they are not compared (a file another writer wrote, which may truncate them)."""
    pf = open_file(source)
    md = pf.metadata
    n = 0
    for i in range(md.num_row_groups):
        rows = pf.read_row_group(i, use_threads=False)
        if rows.num_rows != md.row_group(i).num_rows:
            raise pa.ArrowInvalid(f"row group {i} read {rows.num_rows} rows, its footer says {md.row_group(i).num_rows}")
        if statistics:
            _check_statistics(md.row_group(i), rows, i)
        n += rows.num_rows
    return n


def _check_statistics(group: pq.RowGroupMetaData, rows: pa.Table, i: int) -> None:
    """The footer's statistics of a row group's plain top-level columns (integers, strings,
    booleans, dates) against the values read: the footer has no checksum, and a reader that
    filters (a dataset scan, DuckDB, Spark) skips a row group on them -- a damaged minimum
    would drop rows silently. Other types are left alone (NaN, zones and decimal scales make
    an exact comparison unsure, and a healthy file must never be called damaged)."""
    import pyarrow.compute as pc

    for c in range(group.num_columns):
        meta = group.column(c)
        name, stats = meta.path_in_schema, meta.statistics
        if stats is None or name not in rows.column_names:
            continue
        col = rows.column(name)
        if stats.has_null_count and stats.null_count != col.null_count:
            raise pa.ArrowInvalid(f"row group {i} column {name}: footer says {stats.null_count} nulls, read {col.null_count}")
        typ = col.type
        if not stats.has_min_max or col.null_count == len(col) or not (
                pa.types.is_integer(typ) or pa.types.is_string(typ) or pa.types.is_large_string(typ)
                or pa.types.is_boolean(typ) or pa.types.is_date32(typ)):
            continue
        mm = pc.min_max(col)
        try:
            stored = (stats.min, stats.max)
        except UnicodeDecodeError:  # this project's writers write a string's statistics whole
            stored = None
        if stored != (mm["min"].as_py(), mm["max"].as_py()):
            raise pa.ArrowInvalid(f"row group {i} column {name}: footer statistics do not match its values")


def is_damage(error: BaseException) -> bool:
    """Whether a reader's error says the file's bytes are wrong (checksum mismatch, a page
    that does not decompress or decode, a footer that does not parse, a truncated file) --
    as opposed to a missing file, a refusal, a store that did not answer, memory running out,
    or one of this project's own errors."""
    if isinstance(error, (BucketIndexError, FileNotFoundError, PermissionError, MemoryError)):
        return False
    if isinstance(error, OSError) and (error.errno is not None or is_unreachable(error)):
        return False  # the operating system's or the store's error (pyarrow's own have no errno)
    return isinstance(error, (pa.ArrowException, OSError))


def damaged_file_error(path: str, error: BaseException, *, what: str = "data file") -> TableCorruptError:
    """The one-line error for a table file whose bytes are wrong."""
    why = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    return TableCorruptError(
        f"{what} {path} is damaged ({why}): restore it from a backup of the table; `bucketindex validate` "
        f"lists every damaged file", path=path)


@contextmanager
def table_file(path: str, *, what: str = "data file") -> Iterator[None]:
    """Reads of one of the table's own files inside: an error saying its bytes are wrong
    (:func:`is_damage`) becomes :func:`damaged_file_error` naming ``path``; others pass."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - only damage is translated, the rest re-raised as is
        if is_damage(e):
            raise damaged_file_error(path, e, what=what) from e
        raise
