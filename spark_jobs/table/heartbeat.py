"""Writer heartbeats: how anyone tells a crashed writer's pending instant from a live one.

A writer records its owner (host, pid, start time) in its plan, then rewrites
``heartbeats/<instant>`` every :data:`INTERVAL_S` seconds, atomically (a reader sees the
previous beat or the new one, never a torn file). A pending instant is *abandoned* when

* its heartbeat is older than the timeout, or
* it has no heartbeat and its plan is older than the timeout (a writer between creating its
  plan and its first beat is starting, not dead), or
* its heartbeat or plan names a process on this host that no longer exists (so a crash on
  one machine is repaired at once instead of after the timeout).

The heartbeat is started only after the writer's plan file exists, so a writer that lost a
race for an instant time never touches the winner's heartbeat.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

from spark_jobs.io.filesystem import FileIO
from spark_jobs.table.layout import TableLayout

__all__ = ["Heartbeat", "is_alive", "owner_alive", "owner_info", "INTERVAL_S", "TIMEOUT_S", "default_timeout_s"]

INTERVAL_S = 5.0
#: default expiry; per call ``timeout_s``, or the environment variable below, overrides it
TIMEOUT_S = 60.0
TIMEOUT_ENV = "BUCKETINDEX_HEARTBEAT_TIMEOUT_S"


def default_timeout_s() -> float:
    return float(os.environ.get(TIMEOUT_ENV, TIMEOUT_S))


def owner_info() -> dict[str, Any]:
    """Who is writing: stored in the plan, so liveness is known before the first beat."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}


class Heartbeat:
    def __init__(self, io: FileIO, layout: TableLayout, instant: str, interval_s: float = INTERVAL_S) -> None:
        self.io, self.path = io, layout.heartbeat_file(instant)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        self.io.write_atomic(self.path, json.dumps(owner_info()).encode())

    def start(self) -> "Heartbeat":
        self.beat()
        self._thread = threading.Thread(target=self._run, name="bucketindex-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except OSError:  # a missed beat only makes us look older; the next one may succeed
                pass

    def stop(self, *, delete: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 1)
        if delete:
            self.io.delete(self.path)


def _process_gone(info: dict[str, Any]) -> bool:
    """Whether the writer named by ``info`` ran on this host and has exited.

    A killed process stays a zombie until its parent reaps it (in a container whose init
    does not reap, for ever); ``kill(pid, 0)`` still succeeds then, ``/proc`` says ``Z``.
    """
    if info.get("host") != socket.gethostname():
        return False
    try:
        pid = int(info["pid"])
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, ValueError, TypeError):
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):  # no /proc (macOS), or it just went away
        return False


def owner_alive(owner: dict[str, Any] | None, timeout_s: float | None = None) -> bool:
    """Whether the process named by ``owner`` (:func:`owner_info`, e.g. a plan's ``scheduled_by``)
    may still be at work: not known to have exited, and named less than ``timeout_s`` ago."""
    if not owner:
        return False
    timeout = default_timeout_s() if timeout_s is None else timeout_s
    return not _process_gone(owner) and time.time() - float(owner.get("at", 0)) < timeout


def is_alive(
    io: FileIO,
    layout: TableLayout,
    instant: str,
    timeout_s: float | None = None,
    *,
    owner: dict[str, Any] | None = None,
) -> bool:
    """Whether the writer of pending ``instant`` may still be working; ``owner`` is its plan's owner."""
    try:
        info = json.loads(io.read_bytes(layout.heartbeat_file(instant)))
    except FileNotFoundError:
        info = None
    except (OSError, ValueError):  # unreadable right now: never judge a writer dead on a read error
        return True
    if info is None:
        if not owner:  # no heartbeat and no owner: a pre-owner plan or a foreign tool
            return False
        info = owner
    return owner_alive(info, timeout_s)
