"""Where bucketindex keeps files of its own -- never a table's: Spark's logs and the demo's work folders.

One documented place instead of ``/tmp/bucketindex-*`` litter::

    $BUCKETINDEX_HOME                 default ${XDG_CACHE_HOME:-~/.cache}/bucketindex
        logs/spark-<time>-<pid>.log   a CLI run's Spark (JVM) output: deleted when the run
                                      succeeds, kept when it fails; the newest KEEP_LOGS kept
        demo/run-<time>-<pid>/        ``bucketindex demo``'s work folder: removed when the demo
                                      succeeds (``--keep`` keeps it), kept when it fails

``$BUCKETINDEX_SPARK_LOG`` names one file instead of ``logs/``: the user's file, appended to,
never deleted nor pruned. Nothing here imports pyspark or airflow.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time

__all__ = ["KEEP_LOGS", "home", "logs_dir", "demo_dir", "open_spark_log", "finish_spark_log", "prune"]

log = logging.getLogger("bucketindex")

#: Spark logs kept in ``logs/`` (failed runs' logs; the oldest beyond this are deleted)
KEEP_LOGS = 20
_SPARK_PREFIX = "spark-"


def home() -> str:
    """``$BUCKETINDEX_HOME``, else ``${XDG_CACHE_HOME:-~/.cache}/bucketindex`` (XDG: files that
    may be deleted at any time without losing anything -- logs and scratch folders)."""
    explicit = os.environ.get("BUCKETINDEX_HOME")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(cache), "bucketindex")


def logs_dir() -> str:
    return os.path.join(home(), "logs")


def demo_dir() -> str:
    return os.path.join(home(), "demo")


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime())


def prune(directory: str, *, prefix: str, keep: int) -> list[str]:
    """Delete the oldest files named ``prefix*`` in ``directory`` beyond the newest ``keep``;
    returns what was deleted. Errors are ignored: pruning is housekeeping, never a failure."""
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(prefix) and e.is_file()]
    except OSError:
        return []
    entries.sort(key=lambda e: (e.stat().st_mtime, e.name), reverse=True)
    gone = []
    for e in entries[keep:]:
        try:
            os.unlink(e.path)
            gone.append(e.path)
        except OSError:
            pass
    return gone


def open_spark_log() -> tuple[int, str, bool]:
    """A file descriptor for a run's Spark output, its path, and whether it is ours to delete
    (False for ``$BUCKETINDEX_SPARK_LOG``). Falls back to a fresh temporary file when the
    chosen place cannot be written (a ``$BUCKETINDEX_SPARK_LOG`` owned by another user, a
    read-only home): the log is ours, never a reason for the run to fail."""
    chosen = os.environ.get("BUCKETINDEX_SPARK_LOG")
    owned = not chosen
    if chosen:
        path = chosen
    else:
        directory = logs_dir()
        path = os.path.join(directory, f"{_SPARK_PREFIX}{_stamp()}-{os.getpid()}.log")
    try:
        if owned:
            os.makedirs(directory, exist_ok=True)
            prune(directory, prefix=_SPARK_PREFIX, keep=KEEP_LOGS - 1)  # room for this one
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as e:
        fd, fresh = tempfile.mkstemp(prefix="bucketindex-spark-", suffix=".log")
        log.warning("cannot write Spark's log to %s (%s); writing it to %s", path, e.strerror, fresh)
        return fd, fresh, True
    return fd, path, owned


def finish_spark_log(path: str, *, ok: bool, owned: bool) -> bool:
    """After the run: delete the log of a run that succeeded (its chatter helps no one) if it is
    ours; keep a failed run's for diagnosis. Returns whether the file is still there."""
    if ok and owned:
        try:
            os.unlink(path)
            return False
        except FileNotFoundError:
            return False
        except OSError:
            pass
    return os.path.exists(path)
