"""Reading a snapshot as a Spark DataFrame."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.table.reader import META_PREFIX
from spark_jobs.table.table import Table

__all__ = ["read_table", "snapshot_paths"]


def snapshot_paths(table: Table, as_of: str | None = None) -> list[str]:
    base = table.uri if "://" in table.uri else "file://" + table.root
    return [base.rstrip("/") + "/" + s.path for s in table.view(as_of).slices()]


def read_table(spark: SparkSession, uri: str, as_of: str | None = None, *, with_meta: bool = False) -> DataFrame:
    """The table as of ``as_of`` (default latest). Only files of completed instants are read."""
    table = Table.load(uri)
    view = table.view(as_of)
    paths = snapshot_paths(table, as_of)
    if view.schema is None:
        return spark.createDataFrame([], "dummy string").drop("dummy")
    schema = from_arrow_schema(view.schema)
    df = spark.read.schema(schema).parquet(*paths) if paths else spark.createDataFrame([], schema)
    if not with_meta:
        df = df.drop(*[c for c in df.columns if c.startswith(META_PREFIX)])
    return df
