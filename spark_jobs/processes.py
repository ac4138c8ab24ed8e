"""The processes of a session: a writer is a whole session (driver, JVM, PySpark workers).

PySpark starts its Python workers in process groups of their own, so neither a process
group nor a parent-child walk reaches all of a job; the session (``setsid``) does. Used to
stop a job (the Airflow hook's ``on_kill``) and to simulate a node dying (fault injection).
A helper server (Spark Connect, a standalone master, the S3 test server) is started with
:func:`stop_with_parent`, so it does not outlive the process that owns it when that one is
killed outright.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Callable

__all__ = ["is_running", "session_pids", "stop_with_parent"]

_PR_SET_PDEATHSIG = 1


def session_pids(sid: int) -> list[int] | None:
    """Pids of every process in session ``sid``; None where ``/proc`` is not available."""
    if not os.path.isdir("/proc"):
        return None
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # field 6 of stat: the session id
                pids.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def is_running(pid: int) -> bool:
    """Whether ``pid`` is a live process: not gone and not a zombie (a killed child stays one
    until its parent reaps it, and ``kill(pid, 0)`` still succeeds then). Needs ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def stop_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets ``sig`` when this process
    dies, however it dies (Linux ``PR_SET_PDEATHSIG``; None elsewhere: nothing to pass).

    Why: a server started in a session of its own (``start_new_session``) gets no signal when
    its owner is killed with SIGKILL or a SIGTERM that skips cleanup (a CI timeout, an
    OOM kill), and would hold its port and memory until the machine restarts. The setting
    survives ``exec`` -- ``spark-submit`` and ``spark-class`` exec the JVM in place -- but not
    a fork: a child that daemonizes is not covered. It fires when the *thread* that started
    the child ends, so start long-lived children from the main thread."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the forked child
    parent = os.getpid()

    def _preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the owner died before the setting took effect
            os.kill(os.getpid(), sig)

    return _preexec
