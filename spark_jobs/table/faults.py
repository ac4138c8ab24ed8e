"""Crash and pause injection for the fault and concurrency tests.

``BUCKETINDEX_FAULT=<point>`` in a writer's environment kills every process of its
*session* (driver, JVM, Python workers -- PySpark puts workers in process groups of their
own) with SIGKILL when execution reaches that point: the same as a node dying. Start the
writer in a session of its own (``start_new_session=True``), as the tests do.

``BUCKETINDEX_PAUSE=<point>=<seconds>[,<point>=<seconds>...]`` sleeps there instead, to
widen a race window (another writer commits, a rollback fires). With
``BUCKETINDEX_PAUSE_SIGNAL=<dir>`` the process first touches ``<dir>/<point>`` so a test
knows the writer has reached the point. Unset (the default), both are a dictionary lookup.

Points inside Spark tasks (``after_data_file``, ``after_index_file``) run in Python
workers. Under ``local[*]`` or spark-submit those inherit the driver's environment; on a
Spark Connect server they do not (the server was started by someone else). So the jobs
wrap every task function with :func:`carried` settings (``spark_jobs.kernels.tasks.bind``)
and the task re-applies them (:func:`adopt`), together with the driver's host and
session id: a crash in a task kills the *driver's* session -- the writer -- and then only
the task's own process where that is not the writer's session (a Connect server's
workers serve other clients too and must survive; the failed task fails the server's job).
"""

from __future__ import annotations

import os
import signal
import socket
import time

from spark_jobs.processes import session_pids

__all__ = ["maybe_crash", "POINTS", "carried", "adopt"]

ENV = "BUCKETINDEX_FAULT"
PAUSE_ENV = "BUCKETINDEX_PAUSE"
SIGNAL_ENV = "BUCKETINDEX_PAUSE_SIGNAL"
#: ``<host> <session id>`` of the driver whose settings a task adopted
DRIVER_ENV = "BUCKETINDEX_FAULT_DRIVER"
_CARRIED = (ENV, PAUSE_ENV, SIGNAL_ENV)
POINTS = (
    "after_requested",  # plan written, nothing else
    "after_data_file",  # an executor has written one data file (others may be pending)
    "after_index_file",  # all data files written, one index delta written
    "before_complete",  # everything written, conflict check not yet done
    "after_conflict_check",  # checked every concurrent commit, sequence slot not yet claimed
    "rollback_after_delete",  # a rollback decided and deleted some files
    "after_complete",  # committed, markers not yet cleaned
    "after_commit_before_mirror",  # committed (and cleaned up), the projections (Delta, Iceberg) not yet written
    "after_rollback_before_mirror",  # a rollback decided and cleaned up, its Delta log version not yet written
    "schedule_after_plan",  # a table service planned, its requested instant not yet written
    "schedule_after_requested",  # the plan written as a requested instant, its instant not yet reported
    "auto_compact_before_commit",  # an upsert's automatic compaction wrote its new bases, not committed
    "clean_after_plan",  # a clean's plan is on the timeline, nothing deleted
    "clean_after_delete",  # a clean deleted half of its files, not completed
    "checkpoint_before_write",  # a checkpoint's batch list written, the checkpoint not
    "archive_after_copy",  # entries copied into an archive file, none deleted from sequence/
    "archive_after_plans",  # archived instants' plan files deleted, their sequence entries not
)


def maybe_crash(point: str) -> None:
    """Crash or pause at ``point`` if the environment asks for it."""
    if os.environ.get(ENV) == point:
        _kill_session()
    pauses = os.environ.get(PAUSE_ENV)
    if pauses:
        for item in pauses.split(","):
            name, _, seconds = item.partition("=")
            if name == point:
                signal_dir = os.environ.get(SIGNAL_ENV)
                if signal_dir:
                    os.makedirs(signal_dir, exist_ok=True)
                    with open(os.path.join(signal_dir, point), "a"):
                        pass
                time.sleep(float(seconds or 1))


def carried() -> dict[str, str] | None:
    """This (driver) process's fault settings, for the tasks it starts; None when it has none."""
    values = {k: os.environ[k] for k in _CARRIED if k in os.environ}
    if not values:
        return None
    values[DRIVER_ENV] = f"{socket.gethostname()} {os.getsid(0)}"
    return values


def adopt(values: dict[str, str] | None) -> None:
    """In a task: take exactly the driver's settings (a reused worker keeps none of an earlier task's)."""
    for k in (*_CARRIED, DRIVER_ENV):
        if values and k in values:
            os.environ[k] = values[k]
        elif k in os.environ:
            del os.environ[k]


def _driver_session() -> int | None:
    """The session id of the driver whose settings this process adopted, if it runs on this host."""
    host, _, sid = os.environ.get(DRIVER_ENV, "").partition(" ")
    if host == socket.gethostname() and sid.isdigit():
        return int(sid)
    return None


def _kill_session() -> None:
    me = os.getpid()
    own = os.getsid(0)
    driver = _driver_session()
    for pid in session_pids(driver if driver is not None else own) or []:
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if driver is None or driver == own:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # the writer's own worker: its process group goes with it
    # a worker outside the writer's session (a Spark Connect server's): only this task dies
    os.kill(me, signal.SIGKILL)
