"""Crash injection for the fault tests.

Set ``BUCKETINDEX_FAULT=<point>`` in a writer's environment and every process of its
*session* (driver, JVM, Python workers -- PySpark puts workers in process groups of their
own) is killed with SIGKILL when execution reaches that point: the same as a node dying.
Start the writer in a session of its own (``start_new_session=True``), as the tests do. The
points are named where the protocol is most fragile; the tests kill at each and prove
readers see the old snapshot and the next run repairs. Unset (the default), this is a
dictionary lookup and nothing else.
"""

from __future__ import annotations

import os
import signal

from spark_jobs.processes import session_pids

__all__ = ["maybe_crash", "POINTS"]

ENV = "BUCKETINDEX_FAULT"
POINTS = (
    "after_requested",  # plan written, nothing else
    "after_data_file",  # an executor has written one data file (others may be pending)
    "after_index_file",  # all data files written, one index delta written
    "before_complete",  # everything written, completed instant not yet created
    "rollback_after_delete",  # a rollback deleted some files but has not completed
    "after_complete",  # committed, markers not yet cleaned
)


def maybe_crash(point: str) -> None:
    if os.environ.get(ENV) == point:
        _kill_session()


def _kill_session() -> None:
    me = os.getpid()
    for pid in session_pids(os.getsid(0)) or []:
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    os.killpg(os.getpgrp(), signal.SIGKILL)
