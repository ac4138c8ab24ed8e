"""The Spark settings of a session this package starts: pyspark-free, so that both the classic
session (:mod:`spark_jobs.jobs.session`, which imports ``pyspark``) and the Spark Connect
launcher (:mod:`spark_jobs.jobs.connect`, which must not load ``pyspark`` to start a server)
read them from one place, without importing each other (``tests/unit/test_layering.py``).
"""

from __future__ import annotations

__all__ = ["SESSION_CONF", "VERIFY_CHECKSUMS"]

#: Spark's own Parquet scans (plain slices, sources) verify the pages' CRC-32 as pyarrow's
#: reads do (:mod:`spark_jobs.io.parquet`): a damaged page is an error, never other values.
#: A static (Hadoop) setting: a Connect server gets it at its start (``connect.server_command``)
VERIFY_CHECKSUMS = {"spark.hadoop.parquet.page.verify-checksum.enabled": "true"}

#: settings for a session this package starts itself (CLI, spark-submit entry point)
SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # adaptive execution sizes shuffles to the data and skips empty partitions
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    # Python workers are reused across the job's stages: one interpreter start per core
    "spark.python.worker.reuse": "true",
    **VERIFY_CHECKSUMS,
}
