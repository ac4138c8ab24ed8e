"""The Spark session the CLI and jobs use, and the per-job settings every job applies.

Session-wide settings are few on purpose: a user's own session (Python API) or a
spark-submit keeps its configuration, so everything a job depends on for speed is set
around that job's actions by :func:`job_conf` and restored afterwards.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from pyspark.sql import SparkSession

from spark_jobs.jobs.datasource import register as register_datasource
from spark_jobs.jobs.settings import SESSION_CONF, VERIFY_CHECKSUMS
from spark_jobs.resources import is_local_master, local_driver_memory

__all__ = ["get_spark", "job_conf", "default_parallelism", "session_start_ms", "SESSION_CONF", "VERIFY_CHECKSUMS"]

log = logging.getLogger("bucketindex.session")

#: time the last :func:`get_spark` of this process took to start the JVM and session
_START_MS: int | None = None


def get_spark(master: str | None = None, app_name: str = "bucketindex", *, driver_memory: str | None = None,
              ui: bool = True, remote: str | None = None, datasource: bool = True) -> SparkSession:
    """Get (or create) the session.

    ``master=None`` means the job runs under ``spark-submit``, whose ``--master``, ``--name``
    and ``--driver-memory`` must win, so none is set here. A local master gets a heap sized
    to the machine (:func:`spark_jobs.resources.local_driver_memory`), since executors run
    inside the driver JVM there. ``ui=False`` skips starting the web UI (a CLI run is over
    before anybody opens it). ``remote="sc://host:port"`` opens a Spark Connect session
    instead (no JVM here; the server has its own memory and UI; see
    :mod:`spark_jobs.jobs.connect`).

    ``datasource`` registers ``format("bucketindex")`` (:func:`spark_jobs.jobs.datasource.register`)
    for the caller's queries. The verbs' own sessions pass ``False``: no job reads through it, and
    the first Python data source a JVM registers makes Spark start a Python process that imports
    every top-level module named ``pyspark_*`` on the path (``pyspark.sql.worker.lookup_data_sources``),
    3-5 s of every cold ``spark-submit`` on a 2-core machine.
    """
    global _START_MS
    if remote:
        from spark_jobs.jobs.connect import remote_session

        t0 = time.perf_counter()
        spark = remote_session(remote, app_name=app_name)
        _START_MS = int((time.perf_counter() - t0) * 1000)
        log.info("Spark Connect session opened in %d ms", _START_MS)
        return spark
    # Executors must run this interpreter (it has pyarrow), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    t0 = time.perf_counter()
    b = SparkSession.builder
    if master:
        b = b.master(master).appName(app_name)
        if is_local_master(master):
            b = b.config("spark.driver.memory", local_driver_memory(driver_memory))
    if not ui:
        b = b.config("spark.ui.enabled", "false")
    for k, v in SESSION_CONF.items():
        b = b.config(k, v)
    # PySpark turns any builder into a Connect client when SPARK_REMOTE is set: classic means classic
    remote_env = os.environ.pop("SPARK_REMOTE", None)
    spark = b.getOrCreate()
    if remote_env is not None:
        os.environ["SPARK_REMOTE"] = remote_env
    spark.sparkContext.setLogLevel(os.environ.get("BUCKETINDEX_SPARK_LOG_LEVEL", "WARN"))
    if datasource:  # spark.read.format("bucketindex") and `USING bucketindex` for the caller's queries
        register_datasource(spark)
    _START_MS = int((time.perf_counter() - t0) * 1000)
    log.info("Spark session started in %d ms (master %s, driver memory %s)", _START_MS,
             spark.conf.get("spark.master", master or "?"), spark.conf.get("spark.driver.memory", "default"))
    return spark


def session_start_ms() -> int | None:
    """How long this process took to start its Spark session (None if it did not start one)."""
    return _START_MS


def default_parallelism(spark: SparkSession) -> int:
    """Cores the session can run tasks on (the server's, for a Spark Connect session, which has no SparkContext)."""
    from spark_jobs.jobs.connect import default_parallelism as remote_parallelism, is_remote

    if is_remote(spark):
        return remote_parallelism(spark)
    return int(spark.sparkContext.defaultParallelism)


@contextmanager
def job_conf(spark: SparkSession, **conf: object) -> Iterator[None]:
    """Run the enclosed Spark actions with ``conf`` (full keys: ``**{"spark.sql.x": v}``), then
    restore the caller's values: a job sizes its own shuffles without changing the user's session."""
    before: dict[str, str | None] = {}
    for key, value in conf.items():
        before[key] = spark.conf.get(key, None)
        spark.conf.set(key, str(value))
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
