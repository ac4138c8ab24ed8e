"""The timeline: every action on a table as an instant, and the commit sequence that orders them.

An instant starts as files under ``.bucketindex/timeline/``::

    <instant>.<action>.requested    the plan (JSON), written first; reserves the instant time
    <instant>.<action>.inflight     work has started; files may exist under markers/<instant>/

and is *completed* by exactly one entry of the **commit sequence**::

    .bucketindex/sequence/<n>.json  {"seq": n, "instant", "action", "metadata"}, n = 1, 2, ...

Why a sequence and not a completed file per instant: with several writers, completing must
be atomic *with the check that nothing conflicting completed since the writer's snapshot*.
Entry ``n + 1`` is created with the create-if-absent primitive (:meth:`FileIO.create_exclusive`),
so of all writers that checked entries ``1..n`` exactly one wins the slot; the others list
again, check the new entries, and try ``n + 2``. That is Delta's log protocol: no lock, no
lease to expire, and it works on any store with a conditional put. Readers replay entries in
sequence order (commit order), which is why a writer that started first may complete later.

A ``rollback`` entry *aborts* its target: an aborted instant can never complete (its writer
checks for that before claiming a slot, and a rollback checks the target did not complete
before claiming its own), so a writer and a rollback can never both win.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Iterable

import pendulum

from spark_jobs.io.filesystem import FileIO, InstantExistsError
from spark_jobs.table.layout import TableLayout

__all__ = [
    "Action",
    "State",
    "Instant",
    "Timeline",
    "InstantConflictError",
    "InstantAbortedError",
    "SequenceTakenError",
]


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
    #: table services: scheduled as a plan, executed (and resumed after a crash) later
    SERVICES = (COMPACTION,)


class State(IntEnum):
    REQUESTED = 0
    INFLIGHT = 1
    COMPLETED = 2


class InstantConflictError(RuntimeError):
    """Another writer already moved this instant to the state we tried to create."""


class InstantAbortedError(InstantConflictError):
    """The instant was rolled back; it can never complete."""


class SequenceTakenError(RuntimeError):
    """Another action claimed the sequence slot first: list again, check, try the next one."""


_NAME = re.compile(r"^(\d{17,})\.([a-z_]+)\.(requested|inflight)$")
_SEQ_NAME = re.compile(r"^(\d{20})\.json$")
_SUFFIX = {State.REQUESTED: ".requested", State.INFLIGHT: ".inflight", State.COMPLETED: ""}


@dataclass(frozen=True, order=True)
class Instant:
    timestamp: str
    action: str
    state: State
    #: position in the commit sequence (completed instants only)
    seq: int | None = field(default=None, compare=False)

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
    return m.group(1), m.group(2), State.REQUESTED if m.group(3) == "requested" else State.INFLIGHT


class Timeline:
    """The timeline as listed at construction; :meth:`reload` lists again.

    Sequence entries never change once written, so they are read once and cached: a
    reload lists two directories and reads only the entries added since the last one.
    """

    def __init__(self, io: FileIO, layout: TableLayout) -> None:
        self.io = io
        self.layout = layout
        self.dir = layout.timeline
        self.entries: list[dict[str, Any]] = []  # entries[i] has seq i + 1
        self.instants: list[Instant] = []
        self._completed: dict[str, dict[str, Any]] = {}
        self.aborted: set[str] = set()
        self._files: dict[tuple[str, str], State] = {}
        self.reload()

    def reload(self) -> "Timeline":
        self._read_new_entries()
        latest: dict[tuple[str, str], State] = {}
        for name in self.io.list_names(self.dir):
            parsed = _parse(name)  # temp files start with "." and never parse
            if parsed is None:
                continue
            ts, action, state = parsed
            latest[(ts, action)] = max(state, latest.get((ts, action), State.REQUESTED))
        self._files = latest
        self._rebuild()
        return self

    def _rebuild(self) -> None:
        """The instant list from what is known, without listing storage again."""
        instants = [
            Instant(e["instant"], e["action"], State.COMPLETED, e["seq"]) for e in self.entries
        ]
        instants += [
            Instant(ts, a, s)
            for (ts, a), s in self._files.items()
            if ts not in self._completed and ts not in self.aborted
        ]
        self.instants = sorted(instants)

    def _read_new_entries(self) -> None:
        names = [n for n in self.io.list_names(self.layout.sequence) if _SEQ_NAME.match(n)]
        for name in names[len(self.entries):]:  # names sort by seq (zero-padded)
            entry = json.loads(self.io.read_bytes(posixpath.join(self.layout.sequence, name)))
            if entry["seq"] != len(self.entries) + 1:  # pragma: no cover - a hand-edited table
                raise RuntimeError(f"commit sequence of {self.layout.root} has a gap before {name}")
            self._index(entry)

    def _index(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)
        self._completed[entry["instant"]] = entry
        if entry["action"] == Action.ROLLBACK and entry["metadata"].get("rolled_back"):
            self.aborted.add(entry["metadata"]["rolled_back"])

    # -- queries ---------------------------------------------------------------------
    @property
    def last_seq(self) -> int:
        return len(self.entries)

    def completed(self, actions: Iterable[str] | None = None, as_of: str | None = None) -> list[Instant]:
        """Completed instants in commit order.

        ``as_of``: the prefix of the sequence up to the last entry whose instant is at or
        before it -- the snapshot right after that commit (time travel by commit order).
        """
        acts = set(actions) if actions is not None else None
        entries = self.entries
        if as_of is not None:
            last = max((i for i, e in enumerate(entries) if e["instant"] <= as_of), default=-1)
            entries = entries[: last + 1]
        return [
            Instant(e["instant"], e["action"], State.COMPLETED, e["seq"])
            for e in entries
            if acts is None or e["action"] in acts
        ]

    def entries_after(self, seq: int) -> list[dict[str, Any]]:
        return self.entries[seq:]

    def pending(self, actions: Iterable[str] | None = None) -> list[Instant]:
        """Instants with a plan that neither completed nor were rolled back."""
        acts = set(actions) if actions is not None else None
        return [i for i in self.instants if not i.is_completed and (acts is None or i.action in acts)]

    def aborted_leftovers(self) -> list[Instant]:
        """Rolled-back instants whose plan files are still there (a rollback cut short)."""
        return sorted(Instant(ts, a, s) for (ts, a), s in self._files.items() if ts in self.aborted)

    def last_completed(self, actions: Iterable[str] | None = None) -> Instant | None:
        done = self.completed(actions)
        return done[-1] if done else None

    def find(self, timestamp: str) -> Instant | None:
        for i in self.instants:
            if i.timestamp == timestamp:
                return i
        return None

    def is_completed(self, timestamp: str) -> bool:
        return timestamp in self._completed

    @staticmethod
    def rolled_back_since(io: FileIO, layout: TableLayout, timestamp: str, after_seq: int) -> bool:
        """Whether a rollback decided against ``timestamp``, reading only the entries after ``after_seq``.

        For a writer's tasks, which must not leave files behind an instant rolled back under
        them (a Spark Connect server keeps running a killed client's tasks). A rollback can
        only decide after the instant's plan exists, so its entry follows the snapshot the
        writer planned on: one listing and the few entries since, not the whole history.
        """
        names = sorted(n for n in io.list_names(layout.sequence) if _SEQ_NAME.match(n))
        for name in names[after_seq:]:
            try:
                entry = json.loads(io.read_bytes(posixpath.join(layout.sequence, name)))
            except FileNotFoundError:  # pragma: no cover - sequence entries are never deleted
                continue
            if entry["action"] == Action.ROLLBACK and entry["metadata"].get("rolled_back") == timestamp:
                return True
        return False

    def _path(self, instant: Instant, state: State) -> str:
        return posixpath.join(self.dir, instant.file_name(state))

    def read_plan(self, instant: Instant) -> dict[str, Any]:
        return json.loads(self.io.read_bytes(self._path(instant, State.REQUESTED)))

    def read_metadata(self, instant: Instant) -> dict[str, Any]:
        entry = self._completed.get(instant.timestamp)
        if entry is None:
            raise ValueError(f"{instant} is not completed; only completed instants have metadata")
        return entry["metadata"]

    # -- transitions -----------------------------------------------------------------
    def new_instant_time(self) -> str:
        """A 17-digit UTC timestamp (yyyyMMddHHmmssSSS) strictly after every instant seen.

        Two processes can still pick the same time; creating the requested file decides
        (:meth:`create_requested` raises for the loser, who picks again).
        """
        now = pendulum.now("UTC").format("YYYYMMDDHHmmssSSS")
        self.reload()
        last = max([i.timestamp for i in self.instants] + [ts for ts, _ in self._files], default="")
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
        self._files[(instant.timestamp, instant.action)] = state
        self._rebuild()
        return Instant(instant.timestamp, instant.action, state)

    def create_requested(self, action: str, plan: dict[str, Any], timestamp: str | None = None) -> Instant:
        ts = timestamp or self.new_instant_time()
        return self._create(Instant(ts, action, State.REQUESTED), State.REQUESTED, plan)

    def transition_to_inflight(self, instant: Instant, info: dict[str, Any] | None = None) -> Instant:
        return self._create(instant, State.INFLIGHT, info)

    def append(self, instant: Instant, metadata: dict[str, Any], *, seq: int) -> Instant:
        """Claim sequence slot ``seq`` for ``instant``: the commit point. SequenceTakenError if taken.

        The caller has checked entries ``< seq``; a taken slot means it must check again.
        """
        entry = {"seq": seq, "instant": instant.timestamp, "action": instant.action, "metadata": metadata}
        data = json.dumps(entry, indent=1, sort_keys=True, default=str).encode()
        try:
            self.io.create_exclusive(self.layout.sequence_file(seq), data)
        except InstantExistsError as e:
            raise SequenceTakenError(f"sequence slot {seq} is taken") from e
        self._read_new_entries()  # entries before ours, if this handle had not seen them
        if len(self.entries) < seq:
            self._index(entry)
        self._rebuild()
        return Instant(instant.timestamp, instant.action, State.COMPLETED, seq)

    def complete(self, instant: Instant, metadata: dict[str, Any]) -> Instant:
        """Complete ``instant`` without a conflict check (rollbacks, single-writer tools, tests).

        Raises InstantConflictError when it is already completed, InstantAbortedError when
        it was rolled back. Writers go through :class:`~spark_jobs.table.action.transaction.Transaction`.
        """
        while True:
            self.reload()
            if self.is_completed(instant.timestamp):
                raise InstantConflictError(
                    f"instant {instant.timestamp}.{instant.action} is already completed (another writer got there first)"
                )
            if instant.timestamp in self.aborted:
                raise InstantAbortedError(f"instant {instant.timestamp}.{instant.action} was rolled back")
            try:
                return self.append(instant, metadata, seq=self.last_seq + 1)
            except SequenceTakenError:
                continue

    def delete_pending(self, instant: Instant) -> None:
        """Remove an instant's plan files: inflight first, so a crash leaves it still pending."""
        if self.is_completed(instant.timestamp):
            raise InstantConflictError(f"{instant.timestamp}.{instant.action} is completed; it cannot be removed")
        self.io.delete(self._path(instant, State.INFLIGHT))
        self.io.delete(self._path(instant, State.REQUESTED))
        self._files.pop((instant.timestamp, instant.action), None)
        self._rebuild()
