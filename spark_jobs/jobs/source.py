"""Reading and validating an incoming batch before anything is written."""

from __future__ import annotations

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.io.filesystem import resolve
from spark_jobs.jobs.read import spark_uri
from spark_jobs.table.config import BadInputError

__all__ = ["read_source", "SOURCE_FORMATS"]

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
        raise BadInputError(f"cannot read {fmt} source {uri}: {_first_line(e)}") from e
    except Exception as e:  # corrupt files surface as Py4J/Spark errors
        raise BadInputError(f"cannot read {fmt} source {uri}: {_first_line(e)}") from e
    if fmt == "json" and "_corrupt_record" in df.columns:
        raise BadInputError(f"source {uri} has malformed JSON records")
    return df


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def check_castable(df: DataFrame, target: T.StructType) -> None:
    """Fail with BadInputError when a non-null source value cannot be cast to the table type."""
    aggs = []
    for field in target.fields:
        if field.name not in df.columns:
            continue
        src = F.col(field.name)
        bad = src.isNotNull() & src.try_cast(field.dataType).isNull()
        aggs.append(F.sum(bad.cast("long")).alias(field.name))
    if not aggs:
        return
    row = df.agg(*aggs).first()
    for field in target.fields:
        if field.name in df.columns and (row[field.name] or 0) > 0:
            src_type = df.schema[field.name].dataType.simpleString()
            raise BadInputError(
                f"column {field.name!r}: {row[field.name]} value(s) of type {src_type} cannot be cast "
                f"to the table's {field.dataType.simpleString()}"
            )
