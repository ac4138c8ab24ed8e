"""Reading and validating an incoming batch before anything is written."""

from __future__ import annotations

import re

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.exceptions import BadInputError
from spark_jobs.io.filesystem import resolve
from spark_jobs.jobs.connect import is_connection_error
from spark_jobs.jobs.read import spark_uri

__all__ = ["read_source", "SOURCE_FORMATS", "castability_checks", "raise_uncastable", "source_bytes",
           "corrupt_file_message"]

SOURCE_FORMATS = ("parquet", "json", "csv")


def read_source(spark: SparkSession, uri: str, fmt: str) -> DataFrame:
    if fmt not in SOURCE_FORMATS:
        raise BadInputError(f"unknown source format {fmt!r}; expected one of {', '.join(SOURCE_FORMATS)}")
    io, path = resolve(uri)
    if not io.exists(path):
        raise BadInputError(f"source {uri} does not exist")
    reader = spark.read
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    if fmt == "json":
        reader = reader.option("mode", "FAILFAST")
    try:
        df = getattr(reader, fmt)(spark_uri(uri))
        df.schema  # noqa: B018 - force schema inference now, so errors surface here
    except AnalysisException as e:
        raise BadInputError(corrupt_file_message(e) or f"cannot read {fmt} source {uri}: {_first_line(e)}") from e
    except Exception as e:  # corrupt files surface as Py4J/Spark errors
        if is_connection_error(e):  # a Spark Connect server gone: not the source's fault
            raise
        raise BadInputError(corrupt_file_message(e) or f"cannot read {fmt} source {uri}: {_first_line(e)}") from e
    if fmt == "json" and "_corrupt_record" in df.columns:
        raise BadInputError(f"source {uri} has malformed JSON records")
    return df


_FAILED_FILE = re.compile(r"FAILED_READ_FILE[.\w]*\] Encountered error while reading file (\S+?)\.?(?:\s|$)")
_NOT_PARQUET = re.compile(r"is not a Parquet file|Could not read footer|CANNOT_READ_FILE_FOOTER")


def corrupt_file_message(error: BaseException) -> str | None:
    """One line naming the source file Spark could not read as Parquet (junk, truncated), or None.

    Spark names the file only deep in a JVM stack trace (``FAILED_READ_FILE``), and only when
    a scan reaches it: at schema inference for a single file, at the first query for a
    directory. Both places ask here, so the user learns which file to remove or replace.
    """
    text = str(error)
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
