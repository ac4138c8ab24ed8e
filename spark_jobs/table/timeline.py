"""The timeline: every action on a table as an instant moving requested -> inflight -> completed.

An instant is a file under ``.bucketindex/timeline/``::

    <instant>.<action>.requested    the plan (JSON), written first
    <instant>.<action>.inflight     work has started; files may exist under markers/<instant>/
    <instant>.<action>              completed: the commit metadata (JSON)

Each state file is created atomically and only if absent (:meth:`FileIO.create_exclusive`),
so the completed file either holds the whole metadata or does not exist, and when writers
race to complete the same instant exactly one wins. Readers trust completed instants only.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Iterable

import pendulum

from spark_jobs.io.filesystem import FileIO, InstantExistsError

__all__ = ["Action", "State", "Instant", "Timeline", "InstantConflictError"]


class Action:
    COMMIT = "commit"
    COMPACTION = "compaction"
    REHASH = "rehash"
    ROLLBACK = "rollback"
    CLEAN = "clean"
    BOOTSTRAP = "bootstrap"
    ALL = (COMMIT, COMPACTION, REHASH, ROLLBACK, CLEAN, BOOTSTRAP)
    #: actions whose completed metadata changes the data files or the index
    WRITES = (COMMIT, COMPACTION, REHASH, BOOTSTRAP)


class State(IntEnum):
    REQUESTED = 0
    INFLIGHT = 1
    COMPLETED = 2


class InstantConflictError(RuntimeError):
    """Another writer already moved this instant to the state we tried to create."""


_NAME = re.compile(r"^(\d{17,})\.([a-z_]+)(?:\.(requested|inflight))?$")
_SUFFIX = {State.REQUESTED: ".requested", State.INFLIGHT: ".inflight", State.COMPLETED: ""}


@dataclass(frozen=True, order=True)
class Instant:
    timestamp: str
    action: str
    state: State

    def file_name(self, state: State | None = None) -> str:
        return f"{self.timestamp}.{self.action}{_SUFFIX[self.state if state is None else state]}"

    @property
    def is_completed(self) -> bool:
        return self.state == State.COMPLETED

    def __str__(self) -> str:
        return f"{self.timestamp}.{self.action}[{self.state.name.lower()}]"


def _parse(name: str) -> tuple[str, str, State] | None:
    m = _NAME.match(name)
    if not m or m.group(2) not in Action.ALL:
        return None
    state = {None: State.COMPLETED, "requested": State.REQUESTED, "inflight": State.INFLIGHT}[m.group(3)]
    return m.group(1), m.group(2), state


class Timeline:
    """A snapshot of the timeline as listed at construction; :meth:`reload` lists again."""

    def __init__(self, io: FileIO, timeline_dir: str) -> None:
        self.io = io
        self.dir = timeline_dir
        self.instants: list[Instant] = []
        self.reload()

    def reload(self) -> "Timeline":
        latest: dict[tuple[str, str], State] = {}
        for name in self.io.list_names(self.dir):
            parsed = _parse(name)  # temp files start with "." and never parse
            if parsed is None:
                continue
            ts, action, state = parsed
            key = (ts, action)
            latest[key] = max(state, latest.get(key, State.REQUESTED))
        self.instants = sorted(Instant(ts, a, s) for (ts, a), s in latest.items())
        return self

    # -- queries ---------------------------------------------------------------------
    def completed(self, actions: Iterable[str] | None = None, as_of: str | None = None) -> list[Instant]:
        acts = set(actions) if actions is not None else None
        return [
            i
            for i in self.instants
            if i.is_completed and (acts is None or i.action in acts) and (as_of is None or i.timestamp <= as_of)
        ]

    def pending(self, actions: Iterable[str] | None = None) -> list[Instant]:
        acts = set(actions) if actions is not None else None
        return [i for i in self.instants if not i.is_completed and (acts is None or i.action in acts)]

    def last_completed(self, actions: Iterable[str] | None = None) -> Instant | None:
        done = self.completed(actions)
        return done[-1] if done else None

    def find(self, timestamp: str) -> Instant | None:
        for i in self.instants:
            if i.timestamp == timestamp:
                return i
        return None

    def _path(self, instant: Instant, state: State | None = None) -> str:
        return posixpath.join(self.dir, instant.file_name(state))

    def read_plan(self, instant: Instant) -> dict[str, Any]:
        return json.loads(self.io.read_bytes(self._path(instant, State.REQUESTED)))

    def read_metadata(self, instant: Instant) -> dict[str, Any]:
        if not instant.is_completed:
            raise ValueError(f"{instant} is not completed; only completed instants have metadata")
        return json.loads(self.io.read_bytes(self._path(instant, State.COMPLETED)))

    # -- transitions -----------------------------------------------------------------
    def new_instant_time(self) -> str:
        """A 17-digit UTC timestamp (yyyyMMddHHmmssSSS) strictly after every instant seen."""
        now = pendulum.now("UTC").format("YYYYMMDDHHmmssSSS")
        self.reload()
        last = self.instants[-1].timestamp if self.instants else ""
        if now <= last:  # clock did not advance (or went back): stay monotonic
            now = str(int(last) + 1)
        return now

    def _create(self, instant: Instant, state: State, payload: dict[str, Any] | None) -> Instant:
        data = json.dumps(payload or {}, indent=1, sort_keys=True, default=str).encode()
        try:
            self.io.create_exclusive(self._path(instant, state), data)
        except InstantExistsError as e:
            raise InstantConflictError(
                f"instant {instant.timestamp}.{instant.action} is already {state.name.lower()} "
                f"(another writer got there first)"
            ) from e
        new = Instant(instant.timestamp, instant.action, state)
        self.reload()
        return new

    def create_requested(self, action: str, plan: dict[str, Any], timestamp: str | None = None) -> Instant:
        ts = timestamp or self.new_instant_time()
        return self._create(Instant(ts, action, State.REQUESTED), State.REQUESTED, plan)

    def transition_to_inflight(self, instant: Instant, info: dict[str, Any] | None = None) -> Instant:
        return self._create(instant, State.INFLIGHT, info)

    def complete(self, instant: Instant, metadata: dict[str, Any]) -> Instant:
        """Publish the instant. Exactly one caller wins; the others get InstantConflictError."""
        return self._create(instant, State.COMPLETED, metadata)

    def delete_pending(self, instant: Instant) -> None:
        """Remove a pending instant's files: inflight first, so a crash leaves it still pending."""
        if self.io.exists(self._path(instant, State.COMPLETED)):
            raise InstantConflictError(f"{instant.timestamp}.{instant.action} is completed; it cannot be removed")
        self.io.delete(self._path(instant, State.INFLIGHT))
        self.io.delete(self._path(instant, State.REQUESTED))
        self.reload()
