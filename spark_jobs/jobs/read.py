"""Reading a snapshot with Spark: the table, or the keys of every live row with its file group.

Partition directories hold URL-encoded values (``region=s%C3%A3o+paulo``), and Spark does
not hand paths back the way it was given them: ``input_file_name()`` and
``_metadata.file_path`` re-encode them as URIs (``%`` becomes ``%25``). So nothing here
ever matches a path Spark reports against a path from the table's metadata: the keys of a
file are read by a task that opened that very file (:func:`keys_with_location`), and paths
handed to Spark's reader are escaped so Hadoop takes them literally (:func:`file_uri`).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any
from urllib.parse import unquote, urlsplit

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.kernels import tasks
from spark_jobs.jobs.hadoop_fs import hadoop_reads
from spark_jobs.jobs.session import default_parallelism
from spark_jobs.table.config import EVOLVING_FORMAT_VERSION
from spark_jobs.table.layout import is_reference
from spark_jobs.table.reader import META_PREFIX
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSlice, FileSystemView

__all__ = ["read_table", "read_slices", "spark_uri", "file_uri", "keys_with_location", "write_one_parquet"]

KEY = tasks.KEY
#: file groups per read task is about len(files) / (this x the cores): a few waves, so one
#: large file does not leave the other cores idle, without a task per small file
READ_WAVES = 4
#: Hadoop's glob metacharacters (``GlobPattern``); Spark globs every path holding one
_GLOB_CHARS = re.compile(r"([\\{}\[\]*?])")


def spark_uri(uri: str) -> str:
    """The URI Spark (Hadoop) reads for a URI pyarrow reads.

    Bare paths become ``file://``, ``s3://`` becomes ``s3a://`` (Hadoop's S3 connector).
    pyarrow percent-decodes the path of a URI while Hadoop's ``Path`` takes it literally,
    so the path is decoded here: both then name the same directory. Globs are kept (a
    source may be one).
    """
    if "://" not in uri or uri.startswith("file:"):
        from spark_jobs.io.filesystem import resolve

        return "file://" + resolve(uri)[1]
    parts = urlsplit(uri)
    scheme = "s3a" if parts.scheme == "s3" else parts.scheme
    return f"{scheme}://{parts.netloc}{unquote(parts.path)}"


def file_uri(table: Table, rel: str) -> str:
    """The URI Spark reads for one of the table's files: exactly that file, never a glob.

    Partition values are URL-encoded, which leaves ``*`` as is, and Spark globs every path
    holding a glob character: ``region=a*b/f.parquet`` would also read ``region=aXb/f.parquet``.
    """
    return _GLOB_CHARS.sub(r"\\\1", spark_uri(table.uri).rstrip("/") + "/" + rel)


def keys_with_location(spark: SparkSession, table: Table, view: FileSystemView, *, part: str = "part",
                       fid: str = "fid") -> DataFrame | None:
    """``(_bi_key, part, fid)`` for every live row (None for an empty table): reads only the key column.

    One row per live file slice ``(path, part, fid)``, spread over tasks, each task opening
    its files with the table's FileIO: the file group of a key is the one whose file was
    opened, so no path is compared (and no shuffle moves the keys to find it).
    """
    slices = view.slices()
    if not slices:
        return None
    files = _file_list(spark, slices)
    read = tasks.bind_batches(tasks.read_file_keys, table_uri=table.uri, part=part, fid=fid)
    return files.mapInArrow(read, f"{KEY} string, {part} string, {fid} string")


def _read_tasks(spark: SparkSession, num_files: int) -> int:
    return max(1, min(num_files, READ_WAVES * default_parallelism(spark)))


def _file_list(spark: SparkSession, slices: list[FileSlice]) -> DataFrame:
    """One row per file slice (``FILE_LIST_SCHEMA``), spread over a few waves of tasks."""
    rows = [(s.path, s.partition, s.file_id, [lf.path for lf in s.logs]) for s in slices]
    return spark.createDataFrame(rows, tasks.FILE_LIST_SCHEMA).repartition(_read_tasks(spark, len(slices)))


def read_slices(spark: SparkSession, table: Table, view: FileSystemView, slices: list[FileSlice]) -> DataFrame:
    """Every live row of ``slices`` with the snapshot's schema (meta columns included).

    Where Spark's own reader can open the table's store (:func:`hadoop_reads`), every file
    goes through Spark's Parquet reader, the merges of merge-on-read slices applied
    by position (:func:`_merged_natively`); when rows cannot be named safely that way, each
    such slice is read and merged whole in one Python task (``tasks.read_slices``). Neither
    shuffles.
    """
    assert view.schema is not None and table.config is not None
    schema = from_arrow_schema(view.schema)
    args = {"table_uri": table.uri, "schema": view.schema, "precombine": table.config.precombine_field}
    if not hadoop_reads(spark, table.uri):
        # Spark's reader cannot open the store (no hadoop-aws for s3a://): every slice is read
        # and merged by pyarrow in the tasks, as merge-on-read slices are anyway
        if not slices:
            return spark.createDataFrame([], schema)
        return _file_list(spark, slices).mapInArrow(tasks.bind_batches(tasks.read_slices, **args), schema)
    # a bootstrapped user file lacks the key column (and its Hive path columns), which only
    # the Python reader adds (format.md §5.3): such slices are read there
    adopted = [s for s in slices if is_reference(s.path)]
    own = [s for s in slices if not is_reference(s.path)]
    merged = [s for s in own if s.logs]
    parts = []
    if adopted:
        parts.append(_file_list(spark, adopted).mapInArrow(tasks.bind_batches(tasks.read_slices, **args), schema))
    if merged and "_metadata" not in schema.names and _native_merge(own, merged):
        parts.append(_merged_natively(spark, table, own, merged, schema, args))
        merged = own = []
    plain = [file_uri(table, s.path) for s in own if not s.logs]
    if plain:
        parts.append(spark.read.schema(schema).parquet(*plain))
    if merged:
        parts.append(_file_list(spark, merged).mapInArrow(tasks.bind_batches(tasks.read_slices, **args), schema))
    if not parts:
        return spark.createDataFrame([], schema)
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


#: above this many log rows a read merges whole slices in Python instead: the rows a merge
#: drops are broadcast to every task (16 bytes each), which must stay small
NATIVE_MERGE_MAX_LOG_ROWS = 20_000_000
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def _files(slices: list[FileSlice]) -> list[str]:
    return [rel for s in slices for rel in (s.path, *(lf.path for lf in s.logs))]


def _native_merge(slices: list[FileSlice], merged: list[FileSlice]) -> bool:
    """Whether the files of ``slices`` can be scanned by Spark and ``merged``'s merges applied by position.

    Spark names a row's file by its URI-encoded name, so the names must need no encoding
    (every name this table writes is such), and their hashes must be distinct (they are,
    short of a 64-bit collision, which is checked rather than assumed).
    """
    from spark_jobs.index.hashing import bucket_hash

    if sum(lf.num_rows for s in merged for lf in s.logs) > NATIVE_MERGE_MAX_LOG_ROWS:
        return False
    names = [posixpath.basename(rel) for rel in _files(slices)]
    return all(_PLAIN_NAME.match(n) for n in names) and len({bucket_hash(n) for n in names}) == len(names)


def _merged_natively(spark: SparkSession, table: Table, slices: list[FileSlice], merged: list[FileSlice],
                     schema: Any, args: dict[str, Any]) -> DataFrame:
    """Every live row of ``slices``: one scan of their bases and logs by Spark's Parquet
    reader, minus the rows the merges of ``merged`` drop.

    A slice holding a partial log is dropped whole from the scan and read merged by
    ``tasks.read_partial_slices`` instead.

    Only keys (with precombine values and ops) cross into Python: ``tasks.slice_drops``
    plans each slice's merge in one task, and names the rows it drops -- base rows that were
    replaced, log rows that are not live -- by (file name hash, row index in the file). They
    are removed with a broadcast anti-join: no shuffle, and the rows themselves are read as
    a plain table's are. A log's ``_bi_op`` column is not in the snapshot schema, so the scan
    leaves it out.
    """
    scan = spark.read.schema(schema).parquet(*[file_uri(table, rel) for rel in _files(slices)]).select(
        "*", F.xxhash64(F.col("_metadata.file_name")).alias("_bi_f"), F.col("_metadata.row_index").alias("_bi_r"))
    listing = _file_list(spark, merged)
    drops = listing.mapInArrow(tasks.bind_batches(tasks.slice_drops, **args), tasks.DROPS_SCHEMA)
    rows = scan.join(F.broadcast(drops), ["_bi_f", "_bi_r"], "left_anti").drop("_bi_f", "_bi_r")
    assert table.config is not None
    if table.config.format_version < EVOLVING_FORMAT_VERSION:
        return rows  # no partial log: the first one upgrades the table before it is written (format.md §9)
    # a slice with a partial log (format.md §5.1) overlays columns, which no plan of whole rows
    # expresses: slice_drops drops all its rows and this reads it merged whole, in Arrow
    partial = listing.mapInArrow(tasks.bind_batches(tasks.read_partial_slices, **args), schema)
    return rows.unionByName(partial)


def read_table(spark: SparkSession, uri: str, as_of: str | None = None, *, with_meta: bool = False) -> DataFrame:
    """The table as of ``as_of`` (default latest). Only files of completed instants are read.

    Each file is named exactly (:func:`file_uri`): given files rather than directories,
    Spark infers no partition columns from the encoded directory names, so every value
    comes from the data as written.
    """
    table = Table.load(uri)
    view = table.view(as_of)
    if view.schema is None:
        return spark.createDataFrame([], "dummy string").drop("dummy")
    df = read_slices(spark, table, view, view.slices())
    if not with_meta:
        df = df.drop(*[c for c in df.columns if c.startswith(META_PREFIX)])
    return df


def write_one_parquet(spark: SparkSession, df: DataFrame, uri: str) -> int:
    """``df`` as one Parquet file at ``uri`` (``read --output`` on Spark): one task writes it
    into a directory beside ``uri``, then it is moved into place; the rows written.

    One task bounds memory to a row group, whatever the table's size (the in-process reader
    would hold the snapshot). Timestamps are written as Parquet's microsecond type, as
    pyarrow writes them, not Spark's default INT96.
    """
    import uuid

    import pyarrow.fs as pafs

    from spark_jobs.io import parquet
    from spark_jobs.io.filesystem import resolve
    from spark_jobs.jobs.session import job_conf

    io, path = resolve(uri)
    if not hadoop_reads(spark, uri):
        return _write_one_parquet_in_task(spark, df, uri)
    tmp_uri = f"{uri.rstrip('/')}.{uuid.uuid4().hex}.tmp"
    tmp = resolve(tmp_uri)[1]
    try:
        with job_conf(spark, **{"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}):
            df.coalesce(1).write.parquet(spark_uri(tmp_uri))
        parts = sorted(i.path for i in io.fs.get_file_info(pafs.FileSelector(tmp))
                       if i.type == pafs.FileType.File and i.base_name.endswith(".parquet"))
        if not parts:  # nothing written for an empty snapshot: an empty file with its schema
            from pyspark.sql.pandas.types import to_arrow_schema

            parquet.write_table(to_arrow_schema(df.schema).empty_table(), path, filesystem=io.fs)
        else:
            assert len(parts) == 1, parts
            io.fs.move(parts[0], path)
    finally:
        if io.exists(tmp):
            io.delete_dir(tmp)
    with io.open_input_file(path) as f:
        return parquet.open_file(f).metadata.num_rows


def _write_one_parquet_in_task(spark: SparkSession, df: DataFrame, uri: str) -> int:
    """``df`` as one Parquet file at ``uri``, written by pyarrow in one task: for a store
    Spark's own writer cannot open (no hadoop-aws for ``s3a://``). An object store makes the
    file visible only when its upload completes, so a failed task leaves nothing half
    written; an empty snapshot is an empty file with its schema, written here."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from spark_jobs.io import parquet
    from spark_jobs.io.filesystem import resolve

    schema = to_arrow_schema(df.schema, timezone="UTC")
    write = tasks.bind_batches(write_parquet_file, uri=uri, schema=schema)
    written = [int(r["rows"]) for r in df.coalesce(1).mapInArrow(write, "rows long").collect()]
    io, path = resolve(uri)
    if not written:  # no partition, no task: nothing was read
        with io.fs.open_output_stream(path) as f:
            parquet.write_table(schema.empty_table(), f)
    return sum(written)


def write_parquet_file(batches: Any, *, uri: str, schema: Any) -> Any:
    """mapInArrow in the one task of :func:`_write_one_parquet_in_task`: its rows, one file
    (row groups as they come, timestamps in microseconds as Spark's writer is told to)."""
    import pyarrow as pa

    from spark_jobs.io import parquet
    from spark_jobs.io.filesystem import resolve

    io, path = resolve(uri)
    n = 0
    with io.fs.open_output_stream(path) as f, parquet.writer(f, schema, coerce_timestamps="us") as w:
        for b in batches:
            w.write_batch(b.cast(schema) if not b.schema.equals(schema) else b)
            n += b.num_rows
    yield pa.RecordBatch.from_pylist([{"rows": n}], schema=pa.schema([("rows", pa.int64())]))
