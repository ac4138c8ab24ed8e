"""Whether Spark's own reader and writer can reach a store, and what to say when they cannot.

Spark reads and writes through Hadoop filesystems: ``s3a://`` needs Hadoop's S3 connector
(``hadoop-aws`` and its AWS SDK) on the JVM's classpath, which a pip-installed PySpark does
not have. Every job reads the table's files with pyarrow inside tasks anyway (``mapInArrow``
over a file list, the storage options carried to the tasks: :mod:`spark_jobs.kernels.tasks`),
so Spark's native reader is an optimisation used only where :func:`hadoop_reads` says the
connector is there; nothing depends on it.
"""

from __future__ import annotations

import re
from typing import Any

from spark_jobs.exceptions import MissingDependencyError

__all__ = ["hadoop_reads", "hadoop_scheme", "missing_connector", "is_missing_filesystem", "CONNECTOR"]

#: what to install for ``s3a://`` (named in every error about it)
CONNECTOR = "Hadoop's S3 connector (hadoop-aws)"

#: the attribute of a session caching its answers, per Hadoop scheme
_CACHE_ATTR = "_bucketindex_hadoop_fs"

#: a JVM error for a Hadoop filesystem class that is not on the classpath (or no filesystem for a scheme)
_MISSING_FS = re.compile(
    r"ClassNotFoundException:?\s*(?:Class\s+)?(org\.apache\.hadoop\.fs\.\S*FileSystem\S*)"
    r"|UnsupportedFileSystemException:?\s*No FileSystem for scheme \W?(\w+)"
)


def hadoop_scheme(uri: str) -> str:
    """The scheme Spark's reader would be handed for ``uri`` (``s3://`` is read as ``s3a://``;
    a bare path is ``file``)."""
    if "://" not in uri:
        return "file"
    scheme = uri.split("://", 1)[0].lower()
    return "s3a" if scheme == "s3" else scheme


def hadoop_reads(spark: Any, uri: str) -> bool:
    """Whether Spark's own reader can open ``uri``: its Hadoop filesystem class loads.

    Local paths always can. A classic session asks its JVM once per scheme
    (``FileSystem.getFileSystemClass``, cached on the session); a Spark Connect session
    cannot be asked, so it is trusted only when its configuration names the filesystem
    (``spark.hadoop.fs.<scheme>.impl``).
    """
    scheme = hadoop_scheme(uri)
    if scheme in ("file", "local"):
        return True
    cache: dict[str, bool] | None = getattr(spark, _CACHE_ATTR, None)
    if cache is None:
        cache = {}
        try:
            setattr(spark, _CACHE_ATTR, cache)
        except AttributeError:  # a session type that takes no attributes: ask every time
            pass
    if scheme not in cache:
        cache[scheme] = _loads(spark, scheme)
    return cache[scheme]


def _loads(spark: Any, scheme: str) -> bool:
    from spark_jobs.jobs.connect import is_remote

    if is_remote(spark):
        try:
            return bool(spark.conf.get(f"spark.hadoop.fs.{scheme}.impl", None))
        except Exception:  # noqa: BLE001 - a server that cannot answer: take the path that needs nothing of it
            return False
    try:
        jvm = spark.sparkContext._jvm
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, conf)
        return True
    except Exception:  # noqa: BLE001 - Py4J wraps ClassNotFoundException / UnsupportedFileSystemException
        return False


def is_missing_filesystem(error: BaseException | str) -> bool:
    """Whether a JVM error says a Hadoop filesystem is not installed (``S3AFileSystem`` not found)."""
    return _MISSING_FS.search(str(error)) is not None


def missing_connector(what: str) -> MissingDependencyError:
    """The one line for work only Spark's own reader could do on ``s3a://`` without the connector."""
    return MissingDependencyError(f"{what} needs {CONNECTOR} on Spark's classpath (e.g. --packages "
                                  f"org.apache.hadoop:hadoop-aws:<Spark's Hadoop version>)")
