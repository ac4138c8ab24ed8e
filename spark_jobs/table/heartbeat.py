"""Writer heartbeats: how a new writer tells a crashed writer's pending instant from a live one.

A writer touches ``heartbeats/<instant>`` every :data:`INTERVAL_S` seconds. A pending
instant is *abandoned* when its heartbeat is missing, older than the timeout, or was
written by a process on this host that no longer exists (so a crash on one machine is
repaired at once instead of after the timeout).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

from spark_jobs.io.filesystem import FileIO
from spark_jobs.table.layout import TableLayout

__all__ = ["Heartbeat", "is_alive", "INTERVAL_S", "TIMEOUT_S"]

INTERVAL_S = 5.0
TIMEOUT_S = float(os.environ.get("BUCKETINDEX_HEARTBEAT_TIMEOUT_S", "60"))


class Heartbeat:
    def __init__(self, io: FileIO, layout: TableLayout, instant: str) -> None:
        self.io, self.path = io, layout.heartbeat_file(instant)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        payload = {"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}
        self.io.write_bytes(self.path, json.dumps(payload).encode())

    def start(self) -> "Heartbeat":
        self.beat()
        self._thread = threading.Thread(target=self._run, name="bucketindex-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            try:
                self.beat()
            except OSError:  # a missed beat only makes us look older; the next one may succeed
                pass

    def stop(self, *, delete: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=INTERVAL_S)
        if delete:
            self.io.delete(self.path)


def is_alive(io: FileIO, layout: TableLayout, instant: str, timeout_s: float = TIMEOUT_S) -> bool:
    path = layout.heartbeat_file(instant)
    try:
        info = json.loads(io.read_bytes(path))
    except (FileNotFoundError, OSError, ValueError):
        return False
    if info.get("host") == socket.gethostname():
        try:
            os.kill(int(info["pid"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
    return time.time() - float(info.get("at", 0)) < timeout_s
