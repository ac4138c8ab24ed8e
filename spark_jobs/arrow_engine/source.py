"""Reading and casting an incoming batch with pyarrow, as the Spark path would.

The twin of :mod:`spark_jobs.jobs.source` and of the Spark upsert's validation
(``_validated_batch``: a ``try_cast`` of every source column to the table's type, ANSI mode,
session time zone UTC). A batch read here must hold the very values Spark would have read and
cast, or the two engines would write different snapshots from one batch. So every rule below
was checked against Spark 4.2 (``tests/spark/test_arrow_source.py``), and whatever Spark
decides in a way this module does not reproduce exactly -- a lenient parser, an inference
rule, a rounding -- raises :class:`EngineUnsupportedError` instead of guessing: ``--engine
auto`` then runs the batch on Spark, which decides (and words any error) itself.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import io as _io
import json
import posixpath
import re
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from spark_jobs.exceptions import BadInputError, EngineUnsupportedError
from spark_jobs.io import parquet
from spark_jobs.io.filesystem import FileIO, is_glob, is_unreachable, resolve
from spark_jobs.table.schema import STORED_TZ, check_timestamp_units, spark_type, spark_type_name

if TYPE_CHECKING:
    import pyarrow.json as pajson

__all__ = ["SOURCE_FORMATS", "cast_to_table", "read_source", "spark_schema", "spark_type", "spark_type_name",
           "SourceListing", "list_source", "require_source", "partition_schema", "parquet_source_schema", "read_source_files",
           "raise_if_unreachable"]

#: as :data:`spark_jobs.jobs.source.SOURCE_FORMATS` (not imported: that module imports pyspark)
SOURCE_FORMATS = ("parquet", "json", "csv")

_USE_SPARK = "use the Spark engine"


# -- Spark's view of Arrow types -----------------------------------------------------------
# spark_type and spark_type_name live in the core (spark_jobs.table.schema, whose rules word their
# errors with them); imported above and re-exported here under the same names.

def spark_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as Spark reads it (see :func:`spark_type`): what a new table's data schema
    becomes on the Spark path. Every top-level column is nullable (Spark's file reader makes
    them so); no metadata. Nanosecond timestamps are refused as the Spark path refuses them
    (:func:`spark_jobs.table.schema.check_timestamp_units`, BadInputError)."""
    check_timestamp_units(schema, source="the source")
    return pa.schema([pa.field(f.name, spark_type(f.type, name=f.name), True) for f in schema])


# -- reading ---------------------------------------------------------------------------------

def _spark_path(uri: str, fs_path: str) -> str:
    """The path Spark names in its errors for the file pyarrow knows as ``fs_path``."""
    if "://" not in uri or uri.startswith("file:"):
        return fs_path
    scheme = uri.split("://", 1)[0]
    return f"{'s3a' if scheme == 's3' else scheme}://{fs_path}"


def _corrupt(uri: str, fs_path: str) -> BadInputError:
    return BadInputError(f"source file {_spark_path(uri, fs_path)} is corrupt or not Parquet "
                         f"(no valid Parquet footer): remove or replace it")


def _hidden(name: str) -> bool:
    # Spark's InMemoryFileIndex skips these (_SUCCESS, .crc files, _temporary, ._COPYING_ uploads)
    return (name.startswith("_") and "=" not in name) or name.startswith(".") or name.endswith("._COPYING_")


def _source_files(io: FileIO, path: str, uri: str, fmt: str) -> list[pafs.FileInfo]:
    """The data files Spark reads for ``path``: the file itself, or a flat directory's
    visible files, by name. Subdirectories (a Hive-partitioned layout adds columns from
    their names; other ones Spark reads its own way) are left to Spark."""
    info = io.fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [info]
    entries = io.fs.get_file_info(pafs.FileSelector(path, recursive=False))
    visible = [e for e in entries if not _hidden(posixpath.basename(e.path))]
    subdirs = [posixpath.basename(e.path) for e in visible if e.type == pafs.FileType.Directory]
    if subdirs:
        raise EngineUnsupportedError(f"source {uri} has subdirectories ({', '.join(sorted(subdirs)[:3])}): "
                                     f"a partitioned layout the Arrow engine does not read; {_USE_SPARK}")
    files = sorted((e for e in visible if e.type == pafs.FileType.File), key=lambda e: e.path)
    if not files:
        if fmt == "parquet":
            raise BadInputError(f"cannot read parquet source {uri}: [UNABLE_TO_INFER_SCHEMA] Unable to infer "
                                f"schema for Parquet. It must be specified manually. SQLSTATE: 42KD9")
        raise EngineUnsupportedError(f"source {uri} holds no {fmt} file: {_USE_SPARK}")
    return files


#: Arrow's bytes per uncompressed Parquet byte (the footers' ``total_byte_size``), planned for:
#: measured 1.33 on the benchmarks' 9-column rows (97 MiB decoded for 73 MiB uncompressed, 1M
#: rows; strings carry offsets, Parquet's dictionary pages are decoded); a column whose values
#: repeat (dictionary pages) decodes to more -- the engine checks the exact size once it has read
#: the batch (:meth:`spark_jobs.arrow_engine.upsert.ArrowUpsertEngine.prepare`)
ARROW_PER_PARQUET_BYTE = 1.5
#: footers read to size a source at most: a directory of more files is sized from these, by bytes
SIZED_FILES = 64


#: bytes of JSON or CSV text per row, assumed when sizing such a source before reading it
TEXT_ROW_BYTES = 32


def batch_size(uri: str, fmt: str) -> tuple[int, int] | None:
    """About how many rows the batch at ``uri`` holds and how many bytes it takes once read
    into Arrow, before reading it: for Parquet, the footers' row counts and uncompressed sizes
    (:data:`ARROW_PER_PARQUET_BYTE`; at most :data:`SIZED_FILES` footers, the rest scaled by file
    bytes); JSON and CSV, their text's bytes (a row per :data:`TEXT_ROW_BYTES`). None for what
    cannot be sized so (a glob, a Hive layout, an unreadable footer): the caller's own rule
    applies, and the engine refuses or fails on those itself."""
    try:
        io, path = resolve(uri)
        if is_glob(path):
            return None
        files = _source_files(io, path, uri, fmt)
        if fmt != "parquet":
            total = sum(f.size or 0 for f in files)
            return total // TEXT_ROW_BYTES, total
        return parquet_size(io, [(f.path, f.size or 0) for f in files])
    except (OSError, ValueError, pa.ArrowException, BadInputError):
        return None


def parquet_size(io: FileIO, files: list[tuple[str, int]]) -> tuple[int, int]:
    """About how many rows the Parquet ``files`` (path on ``io``, size in bytes) hold and how
    many bytes they take once read into Arrow, from their footers: at most :data:`SIZED_FILES`
    footers read, the rest scaled by file bytes. :func:`batch_size`'s rule, for callers that
    listed the files already (a bootstrap's dataset, a Hive layout included)."""
    total = sum(size for _, size in files)
    sample = files[:SIZED_FILES]
    rows = sized = 0
    for path, _ in sample:
        with io.fs.open_input_file(path) as fh:
            md = pq.ParquetFile(fh).metadata
            rows += md.num_rows
            sized += sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    sample_bytes = sum(size for _, size in sample)
    scale = total / sample_bytes if sample_bytes else 1.0
    return int(rows * scale), int(sized * scale * ARROW_PER_PARQUET_BYTE)


def read_source(uri: str, fmt: str, *, table_schema: pa.Schema | None) -> pa.Table:
    """The batch at ``uri`` as Spark's :func:`spark_jobs.jobs.source.read_source` reads it,
    in Spark's types (:func:`spark_type`): Parquet (a file, or a flat directory of them),
    JSON lines, or CSV with a header row.

    Errors Spark words the same way are raised with its words (a missing source, an unknown
    format, a file that is not Parquet, malformed JSON). JSON and CSV are read only for an
    existing table (``table_schema``): their columns' types are Spark's inference, which
    this module reproduces only for the plain cases (see :func:`_read_json`,
    :func:`_read_csv`); a new table's schema would be that inference's alone.
    """
    if fmt not in SOURCE_FORMATS:
        raise BadInputError(f"unknown source format {fmt!r}; expected one of {', '.join(SOURCE_FORMATS)}")
    io, path = resolve(uri)
    if is_glob(path):  # before the existence check: a glob is no path
        raise EngineUnsupportedError(f"source {uri} is a glob pattern for Spark: {_USE_SPARK}")
    if not io.exists(path):
        raise BadInputError(f"source {uri} does not exist")
    files = _source_files(io, path, uri, fmt)
    if fmt == "parquet":
        return _read_parquet(io, files, uri)
    if table_schema is None:
        raise EngineUnsupportedError(f"a new table's schema from a {fmt} source is Spark's type inference: "
                                     f"{_USE_SPARK} for the first batch")
    data = [io.read_bytes(f.path) for f in files]
    return _read_json(data, uri) if fmt == "json" else _read_csv(data, uri)


def _read_parquet(io: FileIO, files: list[pafs.FileInfo], uri: str) -> pa.Table:
    tables: list[pa.Table] = []
    schema: pa.Schema | None = None
    for f in files:
        try:
            with io.fs.open_input_file(f.path) as fh:
                pf = parquet.open_file(fh)  # pages with a checksum verified
                if any(pf.schema.column(i).physical_type == "INT96" for i in range(len(pf.schema))):
                    raise EngineUnsupportedError(f"source file {f.path} holds INT96 timestamps: {_USE_SPARK}")
                try:
                    t = pf.read()
                except (pa.ArrowException, OSError) as e:
                    if is_out_of_memory(e):  # the machine's limit, not the batch's fault: exit 1
                        raise
                    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                    raise BadInputError(f"cannot read parquet source {uri}: {first}") from e
        except (pa.ArrowInvalid, OSError) as e:  # no footer: junk, empty or truncated
            if is_out_of_memory(e):
                raise
            raise _corrupt(uri, f.path) from e
        # zone-aware timestamps as UTC instants: Spark's view of them (Parquet records only that
        # they are instants; the zone is Arrow's metadata), and what the table stores anyway, so
        # files of one batch written in different zones are one schema
        s = _instants_in_utc(t.schema.remove_metadata())
        if schema is None:
            schema = s
        elif not s.equals(schema):  # Spark takes one file's schema and reads the others with it
            raise EngineUnsupportedError(f"the files of source {uri} have different schemas: {_USE_SPARK}")
        tables.append(t if t.schema.remove_metadata().equals(s) else t.cast(s))
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if len({n.lower() for n in table.column_names}) != table.num_columns:  # Spark resolves names ignoring case
        raise EngineUnsupportedError(f"source {uri} has columns whose names differ only in case: {_USE_SPARK}")
    target = spark_schema(table.schema)
    return pa.table([_to_spark(table.column(i), target.field(i).type) for i in range(table.num_columns)],
                    schema=target)


def _utc(t: pa.DataType) -> pa.DataType:
    """``t`` with every zone-aware timestamp in it (nested ones too) in zone UTC: the same
    instants, as a cast keeps them (Arrow stores a zone-aware timestamp as UTC already)."""
    if pa.types.is_timestamp(t):
        return pa.timestamp(t.unit, tz=STORED_TZ) if t.tz is not None else t
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        field = t.value_field.with_type(_utc(t.value_type))
        return pa.list_(field) if pa.types.is_list(t) else pa.large_list(field)
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_utc(t.field(i).type)) for i in range(t.num_fields)])
    return t


def _instants_in_utc(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_type(_utc(f.type)) for f in schema])


def _to_spark(col: pa.ChunkedArray | pa.Array, t: pa.DataType) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), t)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return arr if arr.type.equals(t) else pc.cast(arr, t)


# -- a source read in Spark tasks (Spark without Hadoop's connector for the store) -----------

#: Spark's name for a null partition value (``__HIVE_DEFAULT_PARTITION__``)
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[dDfF]?)")
_ISO_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_ISO_TS = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{1,2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]*)?)?")


class SourceListing:
    """A source's data files as Spark lists them: the roots a path (or a glob) names, every
    visible file beneath them, and each file's Hive path values (``k=v`` directories, decoded)
    typed as Spark infers partition columns (:func:`partition_schema`)."""

    def __init__(self, uri: str, io: FileIO, paths: list[str], values: list[dict[str, str | None]],
                 partition: pa.Schema) -> None:
        self.uri, self.io, self.paths, self.values, self.partition = uri, io, paths, values, partition


def list_source(uri: str, fmt: str) -> SourceListing:
    """The files Spark's reader reads for ``uri``: a file, a directory (Hive ``k=v``
    subdirectories become columns, as Spark's partition discovery makes them), or a Hadoop
    glob (``*``, ``?``, ``[ab]``, ``{a,b}`` within one path component; each match a root).

    BadInputError for what Spark refuses too (nothing matches, directory levels that
    disagree); EngineUnsupportedError for layouts only Spark's own listing decides
    (subdirectories that are not ``k=v``)."""
    if fmt not in SOURCE_FORMATS:
        raise BadInputError(f"unknown source format {fmt!r}; expected one of {', '.join(SOURCE_FORMATS)}")
    io, path = resolve(uri)
    roots = _glob(io, path) if is_glob(path) else [path]
    if not roots or (len(roots) == 1 and not io.exists(roots[0])):
        raise BadInputError(f"source {uri} does not exist")
    paths: list[str] = []
    values: list[dict[str, str | None]] = []
    for root in roots:
        info = io.fs.get_file_info(root)
        if info.type == pafs.FileType.File:
            paths.append(root)
            values.append({})
            continue
        for f, v in _hive_files(io, root, uri):
            paths.append(f)
            values.append(v)
    if not paths:
        if fmt == "parquet":
            raise BadInputError(f"cannot read parquet source {uri}: [UNABLE_TO_INFER_SCHEMA] Unable to infer "
                                f"schema for Parquet. It must be specified manually. SQLSTATE: 42KD9")
        raise EngineUnsupportedError(f"source {uri} holds no {fmt} file: {_USE_SPARK}")
    names = {tuple(v) for v in values}
    if len(names) > 1:
        raise BadInputError(f"source {uri} has conflicting directory structures (partition columns "
                            f"{' vs '.join(sorted('/'.join(n) or '(none)' for n in names))})")
    return SourceListing(uri, io, paths, values, partition_schema(values, uri=uri))


def require_source(uri: str) -> None:
    """BadInputError unless ``uri`` names something to read: the path itself or, for a Hadoop
    glob (Spark globs any path holding ``*?[{``), at least one match. A glob never exists as a
    path, so a plain existence check refuses every glob the CLI accepts."""
    io, path = resolve(uri)
    if not is_glob(path):
        if not io.exists(path):
            raise BadInputError(f"source {uri} does not exist")
    elif not _glob(io, path):
        raise BadInputError(f"source {uri} matches no file")


def _glob(io: FileIO, path: str) -> list[str]:
    """The paths a Hadoop glob names, sorted (one listing under its first literal directory)."""
    parts = path.split("/")
    first = next(i for i, p in enumerate(parts) if is_glob(p))
    base = "/".join(parts[:first])
    pattern = [re.compile(_glob_regex(p)) for p in parts[first:]]
    found = io.fs.get_file_info(pafs.FileSelector(base, recursive=len(pattern) > 1, allow_not_found=True))
    out = []
    for e in found:
        rel = e.path[len(base):].lstrip("/").split("/")
        if len(rel) == len(pattern) and all(p.fullmatch(c) for p, c in zip(pattern, rel)) \
                and not any(_hidden(c) for c in rel):
            out.append(e.path)
    return sorted(out)


def _glob_regex(component: str) -> str:
    """One path component of a Hadoop glob as a regular expression."""
    out, i, depth = [], 0, 0
    while i < len(component):
        c = component[i]
        if c == "\\" and i + 1 < len(component):
            out.append(re.escape(component[i + 1]))
            i += 2
            continue
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = component.find("]", i + 1)
            if j < 0:
                raise BadInputError(f"unclosed character class in the glob {component!r}")
            body = component[i + 1:j]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = j
        elif c == "{":
            depth += 1
            out.append("(?:")
        elif c == "}" and depth:
            depth -= 1
            out.append(")")
        elif c == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(c))
        i += 1
    if depth:
        raise BadInputError(f"unclosed group in the glob {component!r}")
    return "".join(out)


def _hive_files(io: FileIO, root: str, uri: str) -> list[tuple[str, dict[str, str | None]]]:
    """Every visible file under ``root`` with its ``k=v`` directories' values (decoded), by path."""
    out = []
    for e in io.fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if e.type != pafs.FileType.File:
            continue
        rel = e.path[len(root):].lstrip("/").split("/")
        if any(_hidden(c) for c in rel):
            continue
        values: dict[str, str | None] = {}
        for d in rel[:-1]:
            if "=" not in d:
                raise EngineUnsupportedError(f"source {uri} has a subdirectory {d!r} that is not a Hive partition "
                                             f"(name=value): {_USE_SPARK}")
            k, v = d.split("=", 1)
            values[_unescape(k)] = None if v == HIVE_NULL else _unescape(v)
        out.append((e.path, values))
    return sorted(out, key=lambda fv: fv[0])


def _unescape(text: str) -> str:
    """Hive's (and Spark's) ``unescapePathName``: ``%XX`` decoded, everything else (``+``) kept."""
    raw = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "%" and re.fullmatch(r"[0-9A-Fa-f]{2}", text[i + 1:i + 3]):
            raw.append(int(text[i + 1:i + 3], 16))
            i += 3
        else:
            raw.extend(text[i].encode("utf-8"))
            i += 1
    return raw.decode("utf-8", errors="replace")


def partition_schema(values: list[dict[str, str | None]], *, uri: str) -> pa.Schema:
    """The partition columns' types as Spark infers them from directory names: int, then
    bigint, then double, then date (``yyyy-MM-dd``), else string; the widest over all values
    (numbers with text: string); no value but nulls: string. Timestamps and integers beyond a
    long are refused (EngineUnsupportedError): Spark types them its own way."""
    if not values or not values[0]:
        return pa.schema([])
    fields = []
    for name in values[0]:
        kinds = {_value_kind(v[name], name=name, uri=uri) for v in values if v.get(name) is not None}
        if not kinds:
            t = pa.string()
        elif kinds <= {"int", "bigint", "double"}:
            t = pa.float64() if "double" in kinds else pa.int64() if "bigint" in kinds else pa.int32()
        elif kinds == {"date"}:
            t = pa.date32()
        else:
            t = pa.string()
        fields.append(pa.field(name, t))
    return pa.schema(fields)


def _value_kind(raw: str, *, name: str, uri: str) -> str:
    if _INT.fullmatch(raw):
        v = _java_long(raw)
        if v is not None and -2**31 <= v < 2**31:
            return "int"
        if v is not None:
            return "bigint"
        raise EngineUnsupportedError(f"source {uri}: partition column {name!r} holds integers beyond a long, "
                                     f"which Spark types as decimals: {_USE_SPARK}")
    if _DOUBLE.fullmatch(raw.strip(_TRIM)):
        return "double"
    if _ISO_TS.fullmatch(raw):
        raise EngineUnsupportedError(f"source {uri}: partition column {name!r} holds timestamps: {_USE_SPARK}")
    m = _ISO_DATE.fullmatch(raw)
    if m:
        try:
            dt.date(int(m[1]), int(m[2]), int(m[3]))
            return "date"
        except ValueError:
            return "string"
    return "string"


def _partition_array(raw: str | None, t: pa.DataType, n: int) -> pa.Array:
    if raw is None:
        return pa.nulls(n, t)
    if pa.types.is_integer(t):
        value: object = _java_long(raw)  # a kind _value_kind gave: within a long
    elif pa.types.is_floating(t):
        value = float(raw.strip(_TRIM).rstrip("dDfF"))
    elif pa.types.is_date(t):
        value = dt.date.fromisoformat(raw)
    else:
        value = raw
    return pa.array([value] * n, t)


def parquet_source_schema(listing: SourceListing) -> pa.Schema:
    """The schema Spark reads ``listing``'s Parquet files with: the files' columns in Spark's
    types (:func:`spark_schema`), then the partition columns. Every file's footer is read (a
    few at a time), so a file that is not Parquet is named here, before any task runs (bad
    input); files of different schemas, INT96 timestamps or a partition column the files hold
    too are left to Spark (EngineUnsupportedError), as :func:`read_source` leaves them."""
    from concurrent.futures import ThreadPoolExecutor

    io, uri = listing.io, listing.uri

    def footer(path: str) -> pa.Schema:
        with _opened(io, path, uri) as pf:
            if any(pf.schema.column(i).physical_type == "INT96" for i in range(len(pf.schema))):
                raise EngineUnsupportedError(f"source file {path} holds INT96 timestamps: {_USE_SPARK}")
            return pf.schema_arrow.remove_metadata()

    with ThreadPoolExecutor(8) as pool:
        schemas = list(pool.map(footer, listing.paths))
    first = schemas[0]
    if any(not s.equals(first) for s in schemas[1:]):
        raise EngineUnsupportedError(f"the files of source {uri} have different schemas: {_USE_SPARK}")
    if len({n.lower() for n in first.names + listing.partition.names}) != len(first.names) + len(listing.partition):
        raise EngineUnsupportedError(f"source {uri} has columns whose names differ only in case (or a partition "
                                     f"column its files hold too): {_USE_SPARK}")
    data = spark_schema(first)
    return pa.schema(list(data) + list(listing.partition))


def raise_if_unreachable(e: BaseException, uri: str) -> None:
    """StorageUnavailableError when pyarrow's error says the store did not answer (not the file's fault)."""
    from spark_jobs.exceptions import StorageUnavailableError

    if is_unreachable(e):
        text = str(e)
        first = (text.strip().splitlines() or [type(e).__name__])[0][:300]
        raise StorageUnavailableError(f"the store of source {uri} did not answer ({first}); nothing was "
                                      f"committed, safe to retry") from e


def read_source_files(files: Iterable[pa.RecordBatch], *, uri: str, paths: list[str],
                      values: list[dict[str, str | None]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """mapInArrow over ``fno int`` rows: every row of each listed Parquet file in ``schema``
    (:func:`parquet_source_schema`), its partition columns added. Runs in a Spark task: the
    errors it raises name the file (a file damaged after the driver read its footer is bad
    input; a store that stops answering is StorageUnavailableError)."""
    from spark_jobs.kernels.tasks import READ_BATCH_ROWS

    io, _ = resolve(uri)
    parts = [f for f in schema if f.name in (values[0] if values else {})]
    data = pa.schema([f for f in schema if f.name not in {p.name for p in parts}])
    for b in files:
        for fno in b.column("fno").to_pylist():
            path = paths[fno]
            with _opened(io, path, uri) as pf:
                try:
                    for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS):
                        n = batch.num_rows
                        cols = [_to_spark(batch.column(batch.schema.get_field_index(f.name)), f.type) for f in data]
                        cols += [_partition_array(values[fno].get(p.name), p.type, n) for p in parts]
                        yield pa.RecordBatch.from_arrays(cols, schema=schema)
                except (pa.ArrowException, OSError) as e:
                    raise_if_unreachable(e, uri)
                    if is_out_of_memory(e):
                        raise
                    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                    raise BadInputError(f"cannot read parquet source {uri}: {first}") from e


def is_out_of_memory(error: BaseException) -> bool:
    """:func:`spark_jobs.resources.is_out_of_memory`, imported when a read fails: that module
    (Spark's sizing rules and their patterns) is not needed by a read that succeeds, so a cold
    upsert does not load it (issue 38)."""
    from spark_jobs.resources import is_out_of_memory as out_of_memory

    return out_of_memory(error)


@contextlib.contextmanager
def _opened(io: FileIO, path: str, uri: str) -> Iterator[pq.ParquetFile]:
    """A source file opened as Parquet: its footer read, or the one line naming it."""
    try:
        fh = io.fs.open_input_file(path)
        pf = parquet.open_file(fh)  # pages with a checksum verified
    except (pa.ArrowInvalid, OSError) as e:
        raise_if_unreachable(e, uri)
        if is_out_of_memory(e):
            raise
        raise _corrupt(uri, path) from e
    with fh:
        yield pf


#: a JSON integer Spark reads as a decimal (beyond a long); pyarrow as a double
_BIG_INT = re.compile(rb"(?<![\w.\"])-?\d{19,}(?![\w.])")


def _read_json(data: list[bytes], uri: str) -> pa.Table:
    """JSON lines as Spark infers them (FAILFAST): integers bigint, other numbers double,
    booleans, strings (Spark infers no timestamps from JSON; pyarrow would), an all-null
    column string, columns sorted by name. Nested values, integers beyond a long, a column
    mixing kinds, and records pyarrow cannot parse but Spark's Jackson might (single quotes,
    ``INF``, an array of records on a line) are left to Spark."""
    import pyarrow.json as pajson  # here: a Parquet batch (the usual one) needs neither reader

    body = b"\n".join(d.rstrip(b"\n") for d in data if d.strip())
    if not body.strip():
        return pa.table({})
    if _BIG_INT.search(body):
        raise EngineUnsupportedError(f"source {uri} holds integers beyond a long: {_USE_SPARK}")
    try:
        table = pajson.read_json(_io.BytesIO(body), read_options=_json_block(body))
    except pa.ArrowInvalid as e:
        _raise_malformed(body, uri)
        raise EngineUnsupportedError(f"source {uri}: the Arrow engine cannot read these JSON records "
                                     f"({str(e).splitlines()[0][:200]}): {_USE_SPARK}") from e
    as_text = [f.name for f in table.schema if pa.types.is_timestamp(f.type) or pa.types.is_date(f.type)]
    if as_text:  # pyarrow inferred a timestamp from text: Spark keeps the text
        explicit = pa.schema([pa.field(f.name, pa.string()) if f.name in as_text else f for f in table.schema])
        table = pajson.read_json(_io.BytesIO(body), read_options=_json_block(body),
                                 parse_options=pajson.ParseOptions(explicit_schema=explicit))
    cols: dict[str, pa.Array] = {}
    for f in table.schema:
        t = f.type
        if pa.types.is_null(t):
            t = pa.string()
        elif not (t in (pa.int64(), pa.float64(), pa.bool_()) or pa.types.is_string(t)):
            raise EngineUnsupportedError(f"source {uri}: JSON column {f.name!r} holds {t} values, which Spark "
                                         f"infers its own way: {_USE_SPARK}")
        cols[f.name] = _to_spark(table.column(f.name), t)
    if len({n.lower() for n in cols}) != len(cols):
        raise EngineUnsupportedError(f"source {uri} has JSON fields differing only in case: {_USE_SPARK}")
    return pa.table({n: cols[n] for n in sorted(cols)})


def _json_block(body: bytes) -> "pajson.ReadOptions":
    import pyarrow.json as pajson

    # one block for the batch: a record longer than pyarrow's 1 MiB default block would fail
    return pajson.ReadOptions(block_size=max(1 << 20, min(len(body) + 1, 1 << 30)))


def _raise_malformed(body: bytes, uri: str) -> None:
    """BadInputError when a line is not JSON for Spark either: Python's parser rejects it and
    it uses none of the extensions Spark's Jackson allows (single quotes, INF)."""
    for line in body.split(b"\n"):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError:
            if b"'" in line or b"INF" in line.upper():
                return
            raise BadInputError(f"source {uri} has malformed JSON records") from None


#: a value that Spark's CSV inference can only type as string: its first character (after the
#: characters Java's trim drops) starts no number, date, timestamp, boolean, NaN or infinity
_CSV_NUMERIC_START = set("+-.")
_CSV_WORDS = ("nan", "inf", "true", "false")
_TRIM = "".join(chr(i) for i in range(33))
_INT = re.compile(r"[+-]?[0-9]+")


def _surely_string(v: str) -> bool:
    s = v.strip(_TRIM).strip()
    if not s:
        return bool(v)  # blanks: no parser takes them (an empty field is null)
    c = s[0]
    if c.isdigit() or c.isdecimal() or c in _CSV_NUMERIC_START:
        return False
    return not s.lower().startswith(_CSV_WORDS)


def _read_csv(data: list[bytes], uri: str) -> pa.Table:
    """CSV with a header as Spark infers it (``inferSchema``): one file; a column is string
    when some value can only be text, int or bigint when every value is a plain integer,
    boolean when every value is ``true``/``false``; an empty field (quoted or not) is null.
    Other columns (doubles, dates, timestamps, decimals, mixtures), quoted line breaks,
    backslash escapes and repeated or empty header names are left to Spark."""
    import csv

    import pyarrow.csv as pacsv  # here: a Parquet batch (the usual one) needs neither reader

    if len(data) != 1:
        raise EngineUnsupportedError(f"source {uri} holds several CSV files: {_USE_SPARK}")
    body = data[0]
    if body.startswith(b"\xef\xbb\xbf") or b"\\" in body or re.search(rb'[^,\r\n]""|""[^,\r\n]', body) \
            or any(line.count(b'"') % 2 for line in body.splitlines()):
        raise EngineUnsupportedError(f"source {uri} uses CSV quoting the Arrow engine does not read like "
                                     f"Spark: {_USE_SPARK}")
    lines = body.splitlines()
    header = next((ln for ln in lines if ln.strip()), b"")
    names = next(iter(csv.reader([header.decode("utf-8")])), [])
    if not names or any(not n for n in names) or len(set(names)) != len(names):
        raise EngineUnsupportedError(f"source {uri} has empty or repeated CSV header names: {_USE_SPARK}")
    try:
        table = pacsv.read_csv(
            _io.BytesIO(body),
            read_options=pacsv.ReadOptions(block_size=max(1 << 20, min(len(body) + 1, 1 << 30))),
            convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names}, null_values=[""],
                                                 strings_can_be_null=True, quoted_strings_can_be_null=True),
        )
    except pa.ArrowInvalid as e:
        raise EngineUnsupportedError(f"source {uri}: the Arrow engine cannot read this CSV like Spark "
                                     f"({str(e).splitlines()[0][:200]}): {_USE_SPARK}") from e
    cols: dict[str, pa.Array] = {}
    for name in names:
        arr = table.column(name).combine_chunks()
        values = [v for v in arr.to_pylist() if v is not None]
        if not values or any(_surely_string(v) for v in values):
            cols[name] = arr
        elif all(_INT.fullmatch(v) for v in values):  # Java's parseInt: "+7", "007", "-0"
            ints = [None if v is None else _java_long(v) for v in arr.to_pylist()]
            live = [i for i in ints if i is not None]
            if len(live) < len(values):  # some value beyond a long
                raise EngineUnsupportedError(f"source {uri}: CSV column {name!r} holds integers beyond a long: "
                                             f"{_USE_SPARK}")
            if all(-2**31 <= i < 2**31 for i in live):
                cols[name] = pa.array(ints, pa.int32())
            elif all(-2**63 <= i < 2**63 for i in live):
                cols[name] = pa.array(ints, pa.int64())
            else:
                raise EngineUnsupportedError(f"source {uri}: CSV column {name!r} holds integers beyond a long: "
                                             f"{_USE_SPARK}")
        elif all(v.lower() in ("true", "false") for v in values):
            cols[name] = pc.equal(pc.utf8_lower(arr), "true")
        else:
            raise EngineUnsupportedError(f"source {uri}: CSV column {name!r} holds values whose type Spark "
                                         f"infers its own way (numbers, dates, times): {_USE_SPARK}")
    return pa.table(cols)


# -- try_cast ----------------------------------------------------------------------------------

_INT_BOUNDS = {8: (-2**7, 2**7 - 1), 16: (-2**15, 2**15 - 1), 32: (-2**31, 2**31 - 1), 64: (-2**63, 2**63 - 1)}
_EPOCH = dt.date(1970, 1, 1)
_US_PER_DAY = 86_400_000_000
#: the plain ISO forms, ASCII digits only (Python's \d would take other scripts' digits);
#: Spark's parsers take more (one-digit months, "T03:04", zone names): those are left to it
_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})(?:[T ].*)?", re.DOTALL)
_TS = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})(?:[T ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
                 r"(Z|[+-][0-9]{2}:[0-9]{2})?)?")
_TRUE = {"t", "true", "y", "yes", "1"}
_FALSE = {"f", "false", "n", "no", "0"}


class _Unsupported(Exception):
    """A value whose cast only Spark decides (converted to EngineUnsupportedError with the column)."""


#: marks a value whose try_cast is null (a failed cast, counted)
_BAD = object()


def _from_values(values: list, t: pa.DataType) -> tuple[pa.Array, int]:
    """(array of ``values`` with null for each :data:`_BAD`, the number of them)."""
    bad = sum(1 for v in values if v is _BAD)
    return pa.array([None if v is _BAD else v for v in values], type=t), bad


def _per_value(arr: pa.Array, t: pa.DataType, fn: Callable[[object], object]) -> tuple[pa.Array, int]:
    return _from_values([None if v is None else fn(v) for v in arr.to_pylist()], t)


def _java_trim(s: str) -> str:
    # Spark trims characters up to U+0020 around a number or boolean it parses (checked:
    # \x00, \x0b, \r, \t, \n, space), and not U+00A0; U+007F..U+009F are not checked
    t = s.strip(_TRIM)
    if t and (t[0] in _C1 or t[-1] in _C1):
        raise _Unsupported("a control character around the value")
    return t


_C1 = {chr(i) for i in range(0x7F, 0xA0)}


def _int_range(arr: pa.Array, lo: int, hi: int, t: pa.DataType) -> tuple[pa.Array, int]:
    ok = pc.and_(pc.greater_equal(arr, lo), pc.less_equal(arr, hi))
    bad = int(pc.sum(pc.invert(ok)).as_py() or 0)
    if not bad:
        return pc.cast(arr, t), 0
    kept = pc.if_else(ok, arr, pa.scalar(None, arr.type))
    return pc.cast(kept, t, safe=False), bad


def _float_to_int(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, int]:
    # Spark (ANSI try_cast): truncate toward zero when floor(x) <= MAX and ceil(x) >= MIN,
    # else null; for a long the bounds compare as doubles, so 2^63 saturates to Long.MAX
    x = pc.cast(arr, pa.float64())
    lo, hi = _INT_BOUNDS[t.bit_width]
    if t.bit_width == 64:
        ok = pc.and_(pc.greater_equal(x, float(lo)), pc.less_equal(x, float(2**63)))
    else:
        ok = pc.and_(pc.greater(x, float(lo - 1)), pc.less(x, float(hi + 1)))
    ok = pc.fill_null(pc.and_(ok, pc.invert(pc.is_nan(x))), True)
    bad = int(pc.sum(pc.and_(pc.invert(ok), pc.is_valid(x))).as_py() or 0)
    kept = pc.if_else(ok, pc.trunc(x), pa.scalar(None, pa.float64()))
    if t.bit_width == 64:
        top = pc.fill_null(pc.greater_equal(kept, float(2**63)), False)
        ints = pc.cast(pc.if_else(top, 0.0, kept), pa.int64(), safe=False)
        return pc.if_else(top, pa.scalar(hi, pa.int64()), ints), bad
    return pc.cast(kept, t, safe=False), bad


def _java_long(text: str) -> int | None:
    """The value of a plain integer text (``_INT``) as Java's and Spark's parsers read it, digit
    by digit -- leading zeros count for nothing, so ``"0" * 5000 + "1"`` is 1 -- or None when it
    is beyond a long (then beyond every Spark integer type).

    Never builds a Python int from more than 19 digits: CPython refuses a text of more than
    4,300 digits (``sys.set_int_max_str_digits``), and a value that long overflows anyway."""
    sign = text[0] if text[0] in "+-" else ""
    digits = text[len(sign):].lstrip("0") or "0"
    if len(digits) > 19:
        return None
    v = int(sign + digits)
    return v if -2**63 <= v < 2**63 else None


def _str_to_int(s: str, lo: int, hi: int) -> object:
    t = _java_trim(s)
    if not _INT.fullmatch(t):
        return _BAD  # ANSI try_cast: no fraction, exponent, hex or non-ASCII digits (checked)
    v = _java_long(t)
    return v if v is not None and lo <= v <= hi else _BAD  # beyond the type: try_cast's null


def _str_to_bool(s: str) -> object:
    t = _java_trim(s).lower()
    return True if t in _TRUE else False if t in _FALSE else _BAD


def _str_to_date(s: str) -> object:
    m = _DATE.fullmatch(s.strip(_TRIM))
    if not m:
        raise _Unsupported("a date Spark's lenient parser decides")
    try:
        return dt.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        raise _Unsupported("an invalid date") from None


def _str_to_micros(s: str, *, zoned: bool) -> object:
    m = _TS.fullmatch(s.strip(_TRIM))
    if not m:
        raise _Unsupported("a timestamp Spark's lenient parser decides")
    try:
        day = dt.date(int(m[1]), int(m[2]), int(m[3]))
        hh, mm, ss = (int(m[i]) if m[i] else 0 for i in (4, 5, 6))
        dt.time(hh, mm, ss)
    except ValueError:
        raise _Unsupported("an invalid date or time") from None
    frac = int((m[7] or "").ljust(6, "0")[:6] or 0)  # Spark truncates past microseconds
    us = (day - _EPOCH).days * _US_PER_DAY + ((hh * 60 + mm) * 60 + ss) * 1_000_000 + frac
    zone = m[8]
    if zone and zone != "Z":
        oh, om = int(zone[1:3]), int(zone[4:6])
        if oh > 18 or om > 59:
            raise _Unsupported("an offset Spark decides")
        if zoned:  # the wall clock at that offset; a naive target ignores the zone (checked)
            us -= (1 if zone[0] == "+" else -1) * (oh * 60 + om) * 60_000_000
    return us


def _dec_round(d: decimal.Decimal, p: int, s: int) -> object:
    q = d.quantize(decimal.Decimal(1).scaleb(-s), rounding=decimal.ROUND_HALF_UP,
                   context=decimal.Context(prec=80))
    return q if abs(q) < decimal.Decimal(10) ** (p - s) else _BAD  # else it overflows decimal(p,s)


def _try_cast(arr: pa.Array, dst: pa.DataType) -> tuple[pa.Array, int]:
    """Spark's ``try_cast(arr as dst)`` under ANSI mode and time zone UTC: the values and the
    number of non-null values that became null. Both types are Spark's (:func:`spark_type`).
    Raises :class:`_Unsupported` for a pair (or a value) whose cast this does not reproduce."""
    src = arr.type
    n = len(arr)
    if src.equals(dst):
        return arr, 0
    if arr.null_count == n:
        return pa.nulls(n, dst), 0
    if _relaxed(src).equals(_relaxed(dst)):  # nested types differing in nullability or list field names
        if _narrows(src, dst):  # Spark's analyzer refuses to cast nullable elements to non-null ones
            raise _Unsupported("nullable nested values into non-null ones")
        return arr.cast(dst), 0
    if pa.types.is_integer(src):
        if pa.types.is_integer(dst):
            lo, hi = _INT_BOUNDS[dst.bit_width]
            return _int_range(arr, lo, hi, dst)
        if pa.types.is_floating(dst):
            return pc.cast(arr, dst, safe=False), 0  # Java's (double)/(float): round to nearest
        if pa.types.is_decimal(dst):  # null when the integer part has more than p - s digits
            limit = 10 ** (dst.precision - dst.scale)
            return _per_value(arr, dst, lambda v: decimal.Decimal(v) if abs(v) < limit else _BAD)
        if pa.types.is_string(dst):
            return pc.cast(arr, dst), 0
        if pa.types.is_boolean(dst):
            return pc.not_equal(arr, 0), 0
    if pa.types.is_boolean(src) and (pa.types.is_integer(dst) or pa.types.is_floating(dst)
                                     or pa.types.is_string(dst)):
        return pc.cast(arr, dst), 0
    if pa.types.is_floating(src):
        if pa.types.is_integer(dst):
            return _float_to_int(arr, dst)
        if pa.types.is_floating(dst):
            return pc.cast(arr, dst, safe=False), 0  # widening exact; narrowing rounds, overflows to inf
    if pa.types.is_decimal(src):
        if pa.types.is_decimal(dst):
            return _per_value(arr, dst, lambda d: _dec_round(d, dst.precision, dst.scale))
        if pa.types.is_integer(dst):
            lo, hi = _INT_BOUNDS[dst.bit_width]
            return _per_value(arr, dst, lambda d: int(d) if lo <= int(d) <= hi else _BAD)
    if pa.types.is_string(src):
        if pa.types.is_integer(dst):
            lo, hi = _INT_BOUNDS[dst.bit_width]
            return _per_value(arr, dst, lambda s: _str_to_int(s, lo, hi))
        if pa.types.is_boolean(dst):
            return _per_value(arr, dst, _str_to_bool)
        if pa.types.is_date32(dst):
            return _per_value(arr, dst, _str_to_date)
        if pa.types.is_timestamp(dst):
            zoned = dst.tz is not None
            vals, bad = _per_value(arr, pa.int64(), lambda s: _str_to_micros(s, zoned=zoned))
            return vals.cast(dst), bad
    if pa.types.is_date32(src):
        if pa.types.is_timestamp(dst):  # midnight in the session zone, UTC
            us = pc.multiply(pc.cast(pc.cast(arr, pa.int32()), pa.int64()), _US_PER_DAY)
            return us.cast(dst), 0
        if pa.types.is_string(dst):
            return _spark_text(arr), 0
    if (pa.types.is_timestamp(src) or pa.types.is_decimal(src)) and pa.types.is_string(dst):
        return _spark_text(arr), 0
    if pa.types.is_timestamp(src):
        us = pc.cast(arr, pa.int64())
        if pa.types.is_timestamp(dst):  # zone-aware <-> naive: the same wall clock in UTC
            return us.cast(dst), 0
        if pa.types.is_date32(dst):  # the UTC day, floored (1969-12-31 23:59:59.5 is 1969-12-31)
            days = np.floor_divide(us.fill_null(0).to_numpy(), _US_PER_DAY).astype(np.int32)
            return pa.array(days, type=pa.int32(), mask=us.is_null().to_numpy(zero_copy_only=False)).cast(
                pa.date32()), 0
    raise _Unsupported(f"{spark_type_name(src)} to {spark_type_name(dst)}")


def _relaxed(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable and list fields named alike: what Spark's cast
    ignores (names of struct fields are kept: Spark casts structs by position)."""
    if pa.types.is_list(t):
        return pa.list_(pa.field("element", _relaxed(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(t.field(i).name, _relaxed(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(_relaxed(t.key_type), _relaxed(t.item_type))
    return t


def _narrows(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether a nested field of ``dst`` is non-null where ``src``'s is nullable (same shapes)."""
    pairs: list[tuple[pa.Field, pa.Field]] = []
    if pa.types.is_list(src):
        pairs = [(src.value_field, dst.value_field)]
    elif pa.types.is_struct(src):
        pairs = [(src.field(i), dst.field(i)) for i in range(src.num_fields)]
    elif pa.types.is_map(src):
        pairs = [(src.item_field, dst.item_field)]
    return any((a.nullable and not b.nullable) or _narrows(a.type, b.type) for a, b in pairs)


def _spark_text(arr: pa.Array) -> pa.Array:
    """Spark's ``cast(... as string)``: the one rule keys use too (:func:`keys.key_text`)."""
    from spark_jobs.arrow_engine.keys import key_text

    try:
        return key_text(arr, name="?")
    except EngineUnsupportedError as e:
        raise _Unsupported(str(e).split(": use the Spark engine")[0].replace("column '?' ", "")) from None


def cast_to_table(batch: pa.Table, schema: pa.Schema) -> pa.Table:
    """The batch's columns cast to the table's ``schema`` as the Spark path's ``try_cast``
    does, in ``schema``'s column order; a column the batch lacks is all null (only a batch
    of deletes gets here: the caller checks). Columns ``schema`` lacks (the delete field) are
    left out: the caller appends them.

    Raises BadInputError with the Spark path's words (``raise_uncastable``) for the first
    column, in table order, holding values that cannot be cast, and EngineUnsupportedError
    for a type pair (or a value) whose cast only Spark decides -- e.g. a double to a decimal
    (Spark rounds Java's ``Double.toString``), text to a double, lenient date formats.
    """
    cols: list[pa.Array] = []
    for field in schema:
        if field.name not in batch.column_names:
            cols.append(pa.nulls(batch.num_rows, field.type))
            continue
        col = batch.column(field.name)
        src_type = spark_type(col.type, name=field.name)
        dst_type = spark_type(field.type, name=field.name)
        if col.type.equals(field.type) and src_type.equals(col.type) and dst_type.equals(src_type):
            cols.append(col)  # nothing to cast: the column as read, not a copy (the batch is held once)
            continue
        arr = _to_spark(col, src_type)
        try:
            out, bad = _try_cast(arr, dst_type)
        except _Unsupported as e:
            raise EngineUnsupportedError(f"column {field.name!r}: the cast of {spark_type_name(src_type)} to the "
                                         f"table's {spark_type_name(dst_type)} ({e}) is decided by Spark alone: "
                                         f"{_USE_SPARK}") from None
        if bad:  # Spark names the first such column in table order, whatever the later ones hold
            raise BadInputError(f"column {field.name!r}: {bad} value(s) of type {spark_type_name(src_type)} "
                                f"cannot be cast to the table's {spark_type_name(dst_type)}")
        cols.append(out if out.type.equals(field.type) else pc.cast(out, field.type))
    return pa.table(cols, schema=pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema]))
