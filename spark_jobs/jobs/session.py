"""The Spark session the CLI and jobs use."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

__all__ = ["get_spark"]


def get_spark(master: str | None = None, app_name: str = "bucketindex") -> SparkSession:
    """Get (or create) the session.

    ``master=None`` means the job runs under ``spark-submit``, whose ``--master`` and
    ``--name`` must win, so neither is set here.
    """
    # Executors must run this interpreter (it has pyarrow), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    b = SparkSession.builder
    if master:
        b = b.master(master).appName(app_name)
    spark = (
        b.config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel(os.environ.get("BUCKETINDEX_SPARK_LOG_LEVEL", "WARN"))
    return spark
