"""Reading and validating an incoming batch before anything is written."""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, Iterator

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.arrow_engine import source as arrow_source
from spark_jobs.exceptions import BadInputError, EngineUnsupportedError, StorageUnavailableError
from spark_jobs.io.filesystem import resolve
from spark_jobs.jobs.connect import is_connection_error
from spark_jobs.jobs.hadoop_fs import hadoop_reads, is_missing_filesystem, missing_connector
from spark_jobs.jobs.read import spark_uri

__all__ = ["read_source", "SOURCE_FORMATS", "castability_checks", "raise_uncastable", "source_bytes",
           "corrupt_file_message"]

SOURCE_FORMATS = ("parquet", "json", "csv")


def read_source(spark: SparkSession, uri: str, fmt: str, *, table_schema: Any = None) -> DataFrame:
    """The batch at ``uri`` as a DataFrame.

    Spark's own reader reads it where its Hadoop filesystem for the scheme is installed
    (:func:`spark_jobs.jobs.hadoop_fs.hadoop_reads`: local paths always, ``s3a://`` with
    ``hadoop-aws``); otherwise the Arrow engine's reader does (:func:`_read_with_arrow`),
    so a Spark without Hadoop's S3 connector reads an S3 source as the Arrow engine does.
    ``table_schema`` (the table's Arrow schema, None for a new table) gates JSON and CSV on
    that path as on the Arrow engine.

    Only what is the input's fault is bad input (exit 2): a missing source, a file that is
    not Parquet, malformed JSON. A store that does not answer is StorageUnavailableError, a
    missing Hadoop filesystem MissingDependencyError.
    """
    if fmt not in SOURCE_FORMATS:
        raise BadInputError(f"unknown source format {fmt!r}; expected one of {', '.join(SOURCE_FORMATS)}")
    if not hadoop_reads(spark, uri):
        return _read_with_arrow(spark, uri, fmt, table_schema=table_schema)
    with _store(uri):
        arrow_source.require_source(uri)  # a glob: at least one match (Spark's reader globs it)
    reader = spark.read
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    if fmt == "json":
        reader = reader.option("mode", "FAILFAST")
    try:
        df = getattr(reader, fmt)(spark_uri(uri))
        df.schema  # noqa: B018 - force schema inference now, so errors surface here
    except Exception as e:  # corrupt files surface as Py4J/Spark errors (AnalysisException among them)
        if is_connection_error(e):  # a Spark Connect server gone: not the source's fault
            raise
        _raise_if_not_input(e, uri)
        raise BadInputError(corrupt_file_message(e) or f"cannot read {fmt} source {uri}: {_first_line(e)}") from e
    if fmt == "json" and "_corrupt_record" in df.columns:
        raise BadInputError(f"source {uri} has malformed JSON records")
    return df


#: a JVM's words for a store that did not answer (Hadoop's S3A and its AWS SDK, plain sockets)
_JVM_UNREACHABLE = re.compile(r"ConnectException|Connection refused|UnknownHostException|SocketTimeoutException|"
                              r"ConnectTimeoutException|Unable to execute HTTP request|SdkClientException")


def _raise_if_not_input(e: BaseException, uri: str) -> None:
    """Raise what a failed read of the source means when it is not the input's fault."""
    if is_missing_filesystem(e):
        raise missing_connector(f"reading the source {uri} with Spark's own reader") from e
    text = str(e)
    if _JVM_UNREACHABLE.search(text) and not _FAILED_FILE.search(text):
        raise StorageUnavailableError(f"the store of source {uri} did not answer ({_first_line(e)}); nothing "
                                      f"was committed, safe to retry") from e


@contextmanager
def _store(uri: str) -> Iterator[None]:
    """pyarrow's error for a store that does not answer as StorageUnavailableError, not a failed read."""
    try:
        yield
    except OSError as e:
        arrow_source.raise_if_unreachable(e, uri)
        raise


def _read_with_arrow(spark: SparkSession, uri: str, fmt: str, *, table_schema: Any) -> DataFrame:
    """The source read by the Arrow engine's reader, for a Spark that cannot open its store.

    Parquet is listed on the driver (files, Hive ``k=v`` directories, globs:
    :func:`spark_jobs.arrow_engine.source.list_source`), every footer read there (so a file
    that is not Parquet is named before any task runs), and the rows are read in tasks
    (``mapInArrow``, a few files per task, the storage options carried): the schema is the
    one Spark's reader gives. JSON and CSV are inferred as the Arrow engine infers them, from
    every record at once, so they are read on the driver. Whatever that reader leaves to
    Spark's own (EngineUnsupportedError) needs the connector: MissingDependencyError.
    """
    from spark_jobs.kernels import tasks
    from spark_jobs.jobs.session import default_parallelism

    try:
        with _store(uri):
            if fmt != "parquet":
                table = arrow_source.read_source(uri, fmt, table_schema=table_schema)
                if not table.num_columns:  # no record at all: the batch's checks call it empty
                    return spark.createDataFrame([], "x int").drop("x")
                return spark.createDataFrame(table)
            listing = arrow_source.list_source(uri, fmt)
            schema = arrow_source.parquet_source_schema(listing)
    except EngineUnsupportedError as e:
        why = str(e).replace(": use the Spark engine", "").replace("; use the Spark engine", "")
        raise missing_connector(f"reading the source {uri} on Spark ({why})") from e
    read = tasks.bind_batches(arrow_source.read_source_files, uri=uri, paths=listing.paths, values=listing.values,
                              schema=schema)
    n = len(listing.paths)
    files = spark.createDataFrame([(i,) for i in range(n)], "fno int").repartition(
        max(1, min(n, 4 * default_parallelism(spark))))
    return files.mapInArrow(read, from_arrow_schema(schema))


_FAILED_FILE = re.compile(r"FAILED_READ_FILE[.\w]*\] Encountered error while reading file (\S+?)\.?(?:\s|$)")
_TASK_BAD_FILE = re.compile(r"BadInputError: ((?:source file \S+ is corrupt|cannot read parquet source )[^\n]*)")
_NOT_PARQUET = re.compile(r"is not a Parquet file|Could not read footer|CANNOT_READ_FILE_FOOTER")


def corrupt_file_message(error: BaseException) -> str | None:
    """One line naming the source file Spark could not read as Parquet (junk, truncated), or None.

    Spark names the file only deep in a JVM stack trace (``FAILED_READ_FILE``), and only when
    a scan reaches it: at schema inference for a single file, at the first query for a
    directory. Both places ask here, so the user learns which file to remove or replace.
    """
    text = str(error)
    in_task = _TASK_BAD_FILE.search(text)  # the Arrow engine's reader in a task (a Spark without the store's connector)
    if in_task:
        return in_task.group(1).strip()
    m = _FAILED_FILE.search(text)
    if not m or not _NOT_PARQUET.search(text):
        return None
    path = m.group(1).removeprefix("file://").removeprefix("file:")
    return f"source file {path} is corrupt or not Parquet (no valid Parquet footer): remove or replace it"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def castability_checks(df: DataFrame, target: T.StructType) -> list[tuple[str, Column]]:
    """``(column, aggregate)`` pairs counting the non-null source values of each column that
    cannot be cast to the table type; run them in the batch's one validation query."""
    checks = []
    for field in target.fields:
        if field.name not in df.columns:
            continue
        src = F.col(field.name)
        bad = src.isNotNull() & src.try_cast(field.dataType).isNull()
        checks.append((field.name, F.sum(bad.cast("long")).alias(f"_bi_uncastable_{len(checks)}")))
    return checks


def raise_uncastable(df: DataFrame, target: T.StructType, row: Row, names: list[str]) -> None:
    """Raise BadInputError for the first column whose check (see :func:`castability_checks`) counted values."""
    for i, name in enumerate(names):
        bad = row[f"_bi_uncastable_{i}"] or 0
        if bad > 0:
            src_type = df.schema[name].dataType.simpleString()
            raise BadInputError(
                f"column {name!r}: {bad} value(s) of type {src_type} cannot be cast "
                f"to the table's {target[name].dataType.simpleString()}"
            )


def source_bytes(uri: str) -> int:
    """Bytes of the source's files (0 when unknown, e.g. a glob): sizes the batch's shuffles."""
    io, path = resolve(uri)
    try:
        return io.total_size(path)
    except (OSError, ValueError):
        return 0
