"""Reading a snapshot with Spark: the table, or the keys of every live row with its file group.

Partition directories hold URL-encoded values (``region=s%C3%A3o+paulo``), and Spark does
not hand paths back the way it was given them: ``input_file_name()`` and
``_metadata.file_path`` re-encode them as URIs (``%`` becomes ``%25``). So nothing here
ever matches a path Spark reports against a path from the table's metadata: the keys of a
file are read by a task that opened that very file (:func:`keys_with_location`), and paths
handed to Spark's reader are escaped so Hadoop takes them literally (:func:`file_uri`).
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.jobs import tasks
from spark_jobs.jobs.session import default_parallelism
from spark_jobs.table.reader import META_PREFIX
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSlice, FileSystemView

__all__ = ["read_table", "read_slices", "spark_uri", "file_uri", "keys_with_location"]

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

    Slices without logs go through Spark's Parquet reader; merge-on-read slices with logs are
    merged per file group inside the task that reads them (``tasks.read_slices``): no shuffle.
    """
    assert view.schema is not None and table.config is not None
    schema = from_arrow_schema(view.schema)
    plain = [file_uri(table, s.path) for s in slices if not s.logs]
    merged = [s for s in slices if s.logs]
    parts = []
    if plain:
        parts.append(spark.read.schema(schema).parquet(*plain))
    if merged:
        fn = tasks.bind_batches(tasks.read_slices, table_uri=table.uri, schema=view.schema,
                                precombine=table.config.precombine_field)
        parts.append(_file_list(spark, merged).mapInArrow(fn, schema))
    if not parts:
        return spark.createDataFrame([], schema)
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


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
