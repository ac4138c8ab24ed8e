"""Crash and pause injection for the fault and concurrency tests.

``BUCKETINDEX_FAULT=<point>`` in a writer's environment kills every process of its
*session* (driver, JVM, Python workers -- PySpark puts workers in process groups of their
own) with SIGKILL when execution reaches that point: the same as a node dying. Start the
writer in a session of its own (``start_new_session=True``), as the tests do.

``BUCKETINDEX_PAUSE=<point>=<seconds>[,<point>=<seconds>...]`` sleeps there instead, to
widen a race window (another writer commits, a rollback fires). With
``BUCKETINDEX_PAUSE_SIGNAL=<dir>`` the process first touches ``<dir>/<point>`` so a test
knows the writer has reached the point. Unset (the default), both are a dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time

from spark_jobs.processes import session_pids

__all__ = ["maybe_crash", "POINTS"]

ENV = "BUCKETINDEX_FAULT"
PAUSE_ENV = "BUCKETINDEX_PAUSE"
SIGNAL_ENV = "BUCKETINDEX_PAUSE_SIGNAL"
POINTS = (
    "after_requested",  # plan written, nothing else
    "after_data_file",  # an executor has written one data file (others may be pending)
    "after_index_file",  # all data files written, one index delta written
    "before_complete",  # everything written, conflict check not yet done
    "after_conflict_check",  # checked every concurrent commit, sequence slot not yet claimed
    "rollback_after_delete",  # a rollback decided and deleted some files
    "after_complete",  # committed, markers not yet cleaned
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


def _kill_session() -> None:
    me = os.getpid()
    for pid in session_pids(os.getsid(0)) or []:
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    os.killpg(os.getpgrp(), signal.SIGKILL)
