"""The processes of a session: a writer is a whole session (driver, JVM, PySpark workers).

PySpark starts its Python workers in process groups of their own, so neither a process
group nor a parent-child walk reaches all of a job; the session (``setsid``) does. Used to
stop a job (the Airflow hook's ``on_kill``) and to simulate a node dying (fault injection).
"""

from __future__ import annotations

import os

__all__ = ["session_pids"]


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
