"""Reading a snapshot with Spark: the table, or the keys of every live row with its file group."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.table.reader import META_PREFIX
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView

__all__ = ["read_table", "spark_uri", "file_uri", "keys_with_location"]

KEY = "_bi_key"


def spark_uri(uri: str) -> str:
    """The URI Spark (Hadoop) reads for a URI pyarrow reads: bare paths become ``file://``,
    ``s3://`` becomes ``s3a://`` (Hadoop's S3 connector)."""
    if "://" not in uri:
        from spark_jobs.io.filesystem import resolve

        return "file://" + resolve(uri)[1]
    if uri.startswith("s3://"):
        return "s3a://" + uri[len("s3://"):]
    return uri


def file_uri(table: Table, rel: str) -> str:
    return spark_uri(table.uri).rstrip("/") + "/" + rel


def keys_with_location(spark: SparkSession, table: Table, view: FileSystemView, *, part: str = "part",
                       fid: str = "fid") -> DataFrame | None:
    """``(_bi_key, part, fid)`` for every live row (None for an empty table): reads only the key column."""
    slices = view.slices()
    if not slices:
        return None
    paths = [file_uri(table, s.path) for s in slices]
    locs = spark.createDataFrame([(p, s.partition, s.file_id) for p, s in zip(paths, slices)],
                                 f"_bi_path string, {part} string, {fid} string")
    return (
        spark.read.parquet(*paths).select(KEY)
        .withColumn("_bi_path", F.input_file_name())
        .join(F.broadcast(locs), "_bi_path").drop("_bi_path")
    )


def read_table(spark: SparkSession, uri: str, as_of: str | None = None, *, with_meta: bool = False) -> DataFrame:
    """The table as of ``as_of`` (default latest). Only files of completed instants are read."""
    table = Table.load(uri)
    view = table.view(as_of)
    if view.schema is None:
        return spark.createDataFrame([], "dummy string").drop("dummy")
    schema = from_arrow_schema(view.schema)
    paths = [file_uri(table, s.path) for s in view.slices()]
    df = spark.read.schema(schema).parquet(*paths) if paths else spark.createDataFrame([], schema)
    if not with_meta:
        df = df.drop(*[c for c in df.columns if c.startswith(META_PREFIX)])
    return df
