"""The Spark session the CLI and jobs use."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

__all__ = ["get_spark"]

DEFAULT_MASTER = "local[*]"


def get_spark(master: str | None = None, app_name: str = "bucketindex") -> SparkSession:
    """Get (or create) the session. Under spark-submit the master comes from spark-submit."""
    # Executors must run this interpreter (it has pyarrow), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    b = SparkSession.builder.appName(app_name)
    if master:
        b = b.master(master)
    elif "SPARK_HOME" not in os.environ and not os.environ.get("SPARK_SUBMIT_OPTS") and not _under_submit():
        b = b.master(DEFAULT_MASTER)
    spark = (
        b.config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel(os.environ.get("BUCKETINDEX_SPARK_LOG_LEVEL", "WARN"))
    return spark


def _under_submit() -> bool:
    return "spark.master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "") or bool(os.environ.get("SPARK_ENV_LOADED"))
