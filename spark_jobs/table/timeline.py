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
from datetime import datetime, timedelta, timezone
from enum import IntEnum
from typing import Any, Iterable


from spark_jobs.exceptions import BadInputError, TableCorruptError
from spark_jobs.io.filesystem import FileIO, InstantExistsError
from spark_jobs.table.commit import CommitMetadata
from spark_jobs.table.layout import TableLayout
from spark_jobs.vocabulary import AS_OF_FORMS, INSTANT_FORM, TIME_FORMS

__all__ = [
    "Action",
    "State",
    "Instant",
    "Timeline",
    "InstantConflictError",
    "InstantAbortedError",
    "SequenceTakenError",
    "read_checkpoint",
    "checkpoint_seqs",
    "CHECKPOINT_FORMAT",
    "load_json",
    "check_instant",
    "AS_OF_FORMS",
    "AsOf",
    "parse_as_of",
    "resolve_as_of",
    "seq_at_time",
    "instant_to_iso",
    "utc_stamp",
]


def utc_stamp(*, seconds_ago: float = 0.0) -> str:
    """Now (less ``seconds_ago``) in UTC in the instants' form ``YYYYMMDDHHmmssSSS``: the
    clock of instant times, ``completed`` stamps and retention cut-offs, with the standard
    library only (a cold CLI process should not pay for a calendar library here)."""
    now = datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)
    return now.strftime("%Y%m%d%H%M%S") + f"{now.microsecond // 1000:03d}"


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
    SERVICES = (COMPACTION, CLEAN)


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
_ARCHIVE_NAME = re.compile(r"^(\d{20})-(\d{20})\.json$")
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


#: version of the checkpoint file's layout (format.md §3.5)
CHECKPOINT_FORMAT = 1
#: a reload lists ``checkpoints/`` again once this many entries passed the timeline's
#: checkpoint (the default checkpoint interval): a long-lived handle moves on to newer ones
RELIST_CHECKPOINTS_AFTER = 10


def checkpoint_seqs(io: FileIO, layout: TableLayout, *, archived: bool = False) -> list[int]:
    """Sequence positions of the checkpoints on storage (readable or not), ascending:
    the recent ones, or (``archived``) the older ones kept for time travel."""
    where = posixpath.join(layout.archive, "checkpoints") if archived else layout.checkpoints
    return sorted(int(m.group(1)) for m in map(_SEQ_NAME.match, io.list_names(where)) if m)


def read_checkpoint(io: FileIO, layout: TableLayout, seq: int, *, archived: bool = False) -> dict[str, Any] | None:
    """Checkpoint ``seq``, or None when it is torn, half-written or not one we understand.

    A checkpoint is created atomically, so a torn one should not exist; but a reader must
    not trust it blindly (a copy tool, a full disk): it falls back to the previous one.
    """
    try:
        path = layout.archived_checkpoint_file(seq) if archived else layout.checkpoint_file(seq)
        ckpt = json.loads(io.read_bytes(path))
    except (OSError, ValueError):
        return None
    if not isinstance(ckpt, dict) or ckpt.get("seq") != seq or ckpt.get("format") != CHECKPOINT_FORMAT \
            or ckpt.get("complete") is not True or "view" not in ckpt:
        return None
    return ckpt


def read_checkpoint_batches(io: FileIO, layout: TableLayout, seq: int) -> dict[str, list[Any]] | None:
    """``batch id -> [instant, seq, action]`` of every commit up to checkpoint ``seq`` (its
    ``<seq>.batches.json`` sidecar), or None if unreadable. Read only to check a batch's
    idempotence, so it lives beside :func:`read_checkpoint` for ``Table.commit_for_batch``."""
    try:
        data = json.loads(io.read_bytes(layout.checkpoint_batches_file(seq)))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def load_json(io: FileIO, path: str, *, what: str) -> Any:
    """A metadata file the commit protocol wrote atomically: one that does not parse was damaged
    outside bucketindex (a copy tool, a full disk, a hand edit). Named as such
    (:class:`TableCorruptError`, exit 1) instead of a bare ``JSONDecodeError`` naming no file."""
    data = io.read_bytes(path)
    try:
        return json.loads(data)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise TableCorruptError.damaged(path, what=what, why=f"not valid JSON, {len(data)} bytes") from e


#: an instant time: yyyyMMddHHmmssSSS in UTC (:meth:`Timeline.new_instant_time`)
_INSTANT = re.compile(r"^\d{17}$")


def check_instant(value: str, *, option: str) -> str:
    """``value`` if it is an instant time (17 digits, yyyyMMddHHmmssSSS, UTC), else BadInputError.

    Instants compare as strings, so anything else -- ``yesterday``, a date, an ISO time --
    compares after (or before) every instant and silently selects the latest (or no) snapshot.
    """
    from datetime import datetime

    ok = bool(_INSTANT.match(value))
    if ok:
        try:
            datetime.strptime(value[:14], "%Y%m%d%H%M%S")
        except ValueError:
            ok = False
    if not ok:
        raise BadInputError(f"{option} {value!r} is not an instant: expected 17 digits yyyyMMddHHmmssSSS "
                            f"(UTC), e.g. 20240101120000000 (`bucketindex show` lists the table's instants)")
    return value


_ISO_TIME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,9}))?)?)?"
                       r"\s*(Z|z|[+-]\d{2}(?::?\d{2})?)?$")


def _parse_time(text: str) -> datetime | None:
    """``text`` as an aware UTC datetime if it is one of the ISO-8601 forms of :data:`AS_OF_FORMS`, else None.

    Parsed by hand rather than with ``datetime.fromisoformat``: that one also takes week dates,
    ordinal dates and compact forms (``20261125``), and a compact date must never be mistaken
    for an instant prefix or the other way round.
    """
    m = _ISO_TIME.match(text.strip())
    if not m:
        return None
    y, mo, d, h, mi, sec, frac, zone = m.groups()
    try:
        if zone is None or zone in ("Z", "z"):
            tz = timezone.utc
        else:
            digits = zone[1:].replace(":", "")
            hours, minutes = int(digits[:2]), int(digits[2:] or 0)
            if hours > 23 or minutes > 59:
                return None
            sign = -1 if zone[0] == "-" else 1
            tz = timezone(sign * timedelta(hours=hours, minutes=minutes))
        micro = int((frac or "0").ljust(6, "0")[:6])
        t = datetime(int(y), int(mo), int(d), int(h or 0), int(mi or 0), int(sec or 0), micro, tzinfo=tz)
        return t.astimezone(timezone.utc)
    except (ValueError, OverflowError):  # 2026-02-30, 25:00, 0001-01-01T00:00+01:00
        return None


def _time_instant(t: datetime) -> str:
    """A UTC time in the instants' form (yyyyMMddHHmmssSSS), truncated to the millisecond: an
    instant (a millisecond) is at or before ``t`` exactly when its string is ``<=`` this one."""
    u = t.astimezone(timezone.utc)  # formatted by hand: strftime's %Y does not pad years before 1000
    return f"{u.year:04d}{u.month:02d}{u.day:02d}{u.hour:02d}{u.minute:02d}{u.second:02d}{u.microsecond // 1000:03d}"


def instant_to_iso(instant: str) -> str:
    """An instant (or a completion time) as an ISO-8601 UTC time, for messages:
    ``20261125092400123`` -> ``2026-11-25T09:24:00.123Z``."""
    i = instant.ljust(17, "0")
    return f"{i[0:4]}-{i[4:6]}-{i[6:8]}T{i[8:10]}:{i[10:12]}:{i[12:14]}.{i[14:17]}Z"


def parse_as_of(text: str, *, option: str = "--as-of", instant_prefix: bool = False) -> str | datetime:
    """What an ``--as-of`` / ``--since`` value names, before any table is read: an instant
    (returned as the string) or a time (an aware UTC datetime). BadInputError (exit 2, one line
    saying what is accepted) for anything else.

    ``instant_prefix``: also take 1 to 16 digits as an instant (``--since``'s leading-digits
    form, compared as a string). Why refuse rather than guess: instants compare as strings, so a
    value of another shape would silently select the latest (or no) snapshot.
    """
    value = str(text).strip()
    if re.fullmatch(r"\d+", value):
        if len(value) == 17:
            return check_instant(value, option=option)
        if instant_prefix and len(value) < 17:
            return value
    else:
        t = _parse_time(value)
        if t is not None:
            return t
    raise BadInputError(f"{option} must be an instant or a time: {text!r} is not an instant ({INSTANT_FORM}) "
                        f"or an ISO-8601 time ({TIME_FORMS})")


def completion_floors(timeline: "Timeline") -> list[str]:
    """For each sequence position 1..last (index 0 = entry 1), the earliest time it can have
    completed, in the instants' form.

    Entries written since completion times are recorded carry ``completed`` (the writer's UTC
    clock when it claimed the slot, format.md §3.2); older ones only their instant, the time the
    action was *requested*, which is at or before its completion. Entry ``n`` was claimed after
    entry ``n - 1`` existed, so the running maximum is a lower bound that also absorbs writers'
    clock skew: a position whose floor is after ``T`` certainly completed after ``T``.
    """
    timeline.load_history()
    floors: list[str] = []
    floor = ""
    for seq in range(1, timeline.last_seq + 1):
        e = timeline.entry(seq)
        floor = max(floor, str(e.get("completed") or ""), e["instant"])
        floors.append(floor)
    return floors


def seq_at_time(timeline: "Timeline", t: datetime) -> int:
    """The snapshot a reader at time ``t`` could see: the last sequence position that had
    completed by ``t`` (0: none had). A commit requested before ``t`` and completed after it is
    not in it (when its entry records its completion; see :func:`completion_floors`)."""
    cutoff = _time_instant(t)
    if timeline.last_seq and timeline.max_instant() <= cutoff:
        done = timeline.entry(timeline.last_seq).get("completed")  # the common case, "as of now":
        if done and done <= cutoff:                                 # no history read
            return timeline.last_seq
    return sum(1 for f in completion_floors(timeline) if f <= cutoff)  # floors ascend: a prefix


@dataclass(frozen=True)
class AsOf:
    """A resolved ``--as-of``: the snapshot right after sequence entry ``seq`` (0: before any)."""

    text: str
    seq: int
    #: the instant of entry ``seq`` ("" when ``seq`` is 0)
    instant: str
    #: the time asked for (UTC), None when an instant was given
    time: datetime | None = None


def resolve_as_of(timeline: "Timeline", text: str, *, option: str = "--as-of",
                  allow_empty: bool = False) -> AsOf:
    """The snapshot ``text`` names -- the one engine-neutral rule behind ``read --as-of``,
    ``shadow-compare --since``, :func:`~spark_jobs.table.reader.read_arrow` and ``Table.view``.

    * an instant (17 digits): the snapshot right after the last sequence entry whose instant is
      at or before it (time travel by commit order, format.md §4.1);
    * an ISO-8601 time (:data:`AS_OF_FORMS`; no zone means UTC, the instants' clock): the
      snapshot a reader at that time could see (:func:`seq_at_time`).

    BadInputError (one line) for any other text, and -- unless ``allow_empty`` (``--since``:
    everything is after a time before the table) -- for a value before the first commit,
    naming that commit's time.
    """
    what = parse_as_of(text, option=option, instant_prefix=allow_empty)
    if isinstance(what, datetime):
        seq = seq_at_time(timeline, what)
    else:
        seq = timeline.seq_as_of(what)
    if seq == 0 and not allow_empty:
        if timeline.last_seq == 0:
            raise BadInputError(f"{option} {text}: the table has no completed commit yet")
        floors = completion_floors(timeline)
        first = timeline.entry(1)
        raise BadInputError(
            f"{option} {text}: no completed instant at or before it; the first commit is instant "
            f"{first['instant']}, completed {'at' if first.get('completed') else 'at or after'} "
            f"{instant_to_iso(floors[0])}")
    return AsOf(text=str(text), seq=seq, instant=timeline.entry(seq)["instant"] if seq else "",
                time=what if isinstance(what, datetime) else None)


def _parse(name: str) -> tuple[str, str, State] | None:
    m = _NAME.match(name)
    if not m or m.group(2) not in Action.ALL:
        return None
    return m.group(1), m.group(2), State.REQUESTED if m.group(3) == "requested" else State.INFLIGHT


class Timeline:
    """The timeline as listed at construction; :meth:`reload` lists again.

    Opening costs O(1) in history length (format.md §3.5): the timeline starts from the
    latest valid *checkpoint* (the file-system view after sequence entry ``base_seq``, plus
    the completion state of the instants whose plan files are still listed) and reads only
    the sequence entries after it. Older entries -- in ``sequence/`` or moved to
    ``archive/`` -- are read on demand (:meth:`entries_after`, :meth:`find`, time travel,
    :meth:`completed`), never on the paths every job and sensor takes.

    Sequence entries never change once written, so they are read once and cached: a
    reload lists two small directories and reads only the entries added since the last one.
    """

    def __init__(self, io: FileIO, layout: TableLayout) -> None:
        self.io = io
        self.layout = layout
        self.dir = layout.timeline
        self.instants: list[Instant] = []
        #: every sequence entry read so far, by seq
        self._entries: dict[int, dict[str, Any]] = {}
        #: instant -> seq of the completed instants this timeline knows (None: known from the
        #: checkpoint only, its entry not read)
        self._completed: dict[str, int | None] = {}
        self.aborted: set[str] = set()
        self._files: dict[tuple[str, str], State] = {}
        #: the checkpoint the timeline starts from (None: it replays from entry 1)
        self.checkpoint: dict[str, Any] | None = None
        self.base_seq = 0
        self.last_seq = 0
        self._history = False  # every entry 1..last_seq is in _entries
        self._archives: list[tuple[int, int]] | None = None
        self._aborted_at: dict[str, int | None] = {}
        self._checkpoints_listed = False
        self.reload()

    def reload(self) -> "Timeline":
        seqs = [int(m.group(1)) for m in map(_SEQ_NAME.match, self.io.list_names(self.layout.sequence)) if m]
        if self._needs_checkpoint_listing(seqs):
            self._adopt_checkpoint(max(seqs, default=0))
            self._checkpoints_listed = True
        self.last_seq = max([self.base_seq, *seqs, *self._entries])
        for seq in range(self.base_seq + 1, self.last_seq + 1):
            self._entry(seq)  # the entries after the checkpoint: read once, cached
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

    def _needs_checkpoint_listing(self, seqs: list[int]) -> bool:
        """Whether a reload must list ``checkpoints/``: when the timeline is opened, when an
        entry it has not read is no longer listed (archived: a newer checkpoint covers it), and
        once :data:`RELIST_CHECKPOINTS_AFTER` entries passed its checkpoint. Otherwise every
        entry after its checkpoint is cached or listed, and a newer checkpoint would save no
        read: a LIST saved on every reload of a verb (format.md §10)."""
        if not self._checkpoints_listed:
            return True
        last = max(seqs, default=0)
        if last - self.base_seq >= RELIST_CHECKPOINTS_AFTER:
            return True
        listed = set(seqs)
        return any(n not in self._entries and n not in listed for n in range(self.base_seq + 1, last + 1))

    def adopt_checkpoint(self, seq: int, ckpt: dict[str, Any]) -> None:
        """Start from checkpoint ``seq`` this process just wrote (what the next listing would find)."""
        if seq > self.base_seq and seq <= self.last_seq:
            self.checkpoint, self.base_seq = ckpt, seq
            self._rebuild()

    def _adopt_checkpoint(self, listed_last: int) -> None:
        """Start from the latest checkpoint that parses (a torn or foreign one is skipped)."""
        for seq in reversed(checkpoint_seqs(self.io, self.layout)):
            if seq <= self.base_seq:
                return  # the one we have (or an older one): keep it
            if seq > max(listed_last, self.last_seq):
                continue  # pragma: no cover - a checkpoint never precedes its entry
            ckpt = read_checkpoint(self.io, self.layout, seq)
            if ckpt is not None:
                self.checkpoint, self.base_seq = ckpt, seq
                return

    def _rebuild(self) -> None:
        """Completion state and the instant list from what is known, without listing storage again."""
        completed: dict[str, int | None] = {}
        aborted: dict[str, int | None] = {}
        if self.checkpoint is not None:
            for ts, (state, _action) in self.checkpoint.get("done_with_plans", {}).items():
                if state == "completed":
                    completed[ts] = None
                else:
                    aborted[ts] = None
        for seq in sorted(self._entries):
            e = self._entries[seq]
            completed[e["instant"]] = seq
            if e["action"] == Action.ROLLBACK and e["metadata"].get("rolled_back"):
                aborted[e["metadata"]["rolled_back"]] = seq
        self._completed, self._aborted_at = completed, aborted
        self.aborted = set(aborted)
        instants = [Instant(e["instant"], e["action"], State.COMPLETED, seq)
                    for seq, e in self._entries.items() if seq > self.base_seq]
        instants += [
            Instant(ts, a, s)
            for (ts, a), s in self._files.items()
            if ts not in completed and ts not in aborted
        ]
        self.instants = sorted(instants)

    def _entry(self, seq: int) -> dict[str, Any]:
        """Sequence entry ``seq``: cached, else from ``sequence/``, else from the archive."""
        entry = self._entries.get(seq)
        if entry is not None:
            return entry
        try:
            entry = load_json(self.io, self.layout.sequence_file(seq), what="commit sequence entry")
        except FileNotFoundError:  # archived (after we listed, or long ago)
            self._read_archive_covering(seq)
            entry = self._entries.get(seq)
            if entry is None:  # neither listed nor archived: deleted, or the entries after it planted
                raise self._gap_error(seq) from None
            return entry
        if not isinstance(entry, dict) or not {"seq", "instant", "action", "metadata"} <= entry.keys():
            raise TableCorruptError.damaged(self.layout.sequence_file(seq), what="commit sequence entry",
                                            why="not a sequence entry")
        if entry["seq"] != seq:  # a copy of another entry
            raise TableCorruptError.damaged(self.layout.sequence_file(seq), what="commit sequence entry",
                                            why=f"it says it is entry {entry['seq']}")
        self._entries[seq] = entry
        return entry

    def _gap_error(self, seq: int) -> TableCorruptError:
        """Entry ``seq`` is neither in ``sequence/`` nor in ``archive/``: the one-line error a
        damaged entry gets (:meth:`TableCorruptError.damaged`), naming the missing file and the
        first entry after the gap.

        Archival copies entries before deleting them, and a writer claims a slot only after the
        one before it exists, so bucketindex never leaves a gap: either the missing entry was
        deleted outside bucketindex, or the entry after the gap was planted (copied in by
        hand or a tool). Which one, only the user can tell, so both files are named. An error
        path: the one extra LIST costs nothing on the paths that succeed."""
        listed = (int(m.group(1)) for m in map(_SEQ_NAME.match, self.io.list_names(self.layout.sequence)) if m)
        later = sorted(n for n in listed if n > seq)
        missing = self.layout.sequence_file(seq)
        if not later:
            return TableCorruptError.damaged(missing, what="commit sequence entry", why="missing")
        gap = f"entry {seq}" if later[0] == seq + 1 else f"entries {seq}-{later[0] - 1}"
        return TableCorruptError(
            f"commit sequence entry {missing} is missing ({gap} absent, yet {self.layout.sequence_file(later[0])} "
            f"follows): restore the missing entries from a backup of the table's .bucketindex directory, or move "
            f"the later ones away if bucketindex did not write them; every command that reads this entry fails "
            f"until then", path=missing)

    def archives(self, *, refresh: bool = False) -> list[tuple[int, int]]:
        """``(first, last)`` sequence ranges moved to ``archive/``."""
        if self._archives is None or refresh:
            self._archives = sorted((int(m.group(1)), int(m.group(2)))
                                    for m in map(_ARCHIVE_NAME.match, self.io.list_names(self.layout.archive)) if m)
        return self._archives

    def _read_archive_covering(self, seq: int) -> None:
        for refresh in (False, True):
            for first, last in self.archives(refresh=refresh):
                if first <= seq <= last:
                    data = load_json(self.io, self.layout.archive_file(first, last), what="timeline archive")
                    for e in data["entries"]:
                        self._entries.setdefault(int(e["seq"]), e)
                    return

    def load_history(self) -> "Timeline":
        """Read every entry from 1 (archive included): for the rare questions about old history."""
        if not self._history:
            for seq in range(1, self.last_seq + 1):
                self._entry(seq)
            self._history = True
            self._rebuild()
        return self

    # -- queries ---------------------------------------------------------------------
    @property
    def entries(self) -> list[dict[str, Any]]:
        """The entries after the checkpoint the timeline starts from."""
        return [self._entry(seq) for seq in range(self.base_seq + 1, self.last_seq + 1)]

    def entry(self, seq: int) -> dict[str, Any]:
        return self._entry(seq)

    def completed(self, actions: Iterable[str] | None = None, as_of: str | None = None, *,
                  after_seq: int = 0) -> list[Instant]:
        """Completed instants after entry ``after_seq`` (default: the whole history, archive
        included) in commit order.

        ``as_of``: the prefix of the sequence up to the last entry whose instant is at or
        before it -- the snapshot right after that commit (time travel by commit order).
        Entries older than the checkpoint are read on demand: jobs pass
        ``after_seq=base_seq``, or use :meth:`recent` and :meth:`last_completed`.
        """
        acts = set(actions) if actions is not None else None
        last = self.last_seq if as_of is None else self.seq_as_of(as_of)
        return [
            Instant(e["instant"], e["action"], State.COMPLETED, seq)
            for seq in range(after_seq + 1, last + 1)
            for e in (self._entry(seq),)
            if acts is None or e["action"] in acts
        ]

    def seq_as_of(self, as_of: str) -> int:
        """The last sequence position whose instant is at or before ``as_of`` (0: none)."""
        if self.last_seq and self._entry(self.last_seq)["instant"] <= as_of and \
                self.max_instant() <= as_of:  # the common case: as of now or later
            return self.last_seq
        self.load_history()
        return max((seq for seq, e in self._entries.items() if e["instant"] <= as_of), default=0)

    def max_instant(self) -> str:
        """The greatest instant time of any completed entry (instants complete out of order)."""
        known = [e["instant"] for s, e in self._entries.items() if s > self.base_seq]
        if self.checkpoint is not None:
            known.append(self.checkpoint.get("max_instant", ""))
        return max(known, default="")

    def recent(self, n: int, actions: Iterable[str] | None = None, *, after_seq: int = 0) -> list[Instant]:
        """The last ``n`` completed instants (of ``actions``, after entry ``after_seq``) in
        commit order, reading back only as far as needed."""
        acts = set(actions) if actions is not None else None
        out = []
        for seq in range(self.last_seq, after_seq, -1):
            if len(out) >= n:
                break
            e = self._entry(seq)
            if acts is None or e["action"] in acts:
                out.append(Instant(e["instant"], e["action"], State.COMPLETED, seq))
        return out[::-1]

    def entries_after(self, seq: int) -> list[dict[str, Any]]:
        return [self._entry(n) for n in range(seq + 1, self.last_seq + 1)]

    def pending(self, actions: Iterable[str] | None = None) -> list[Instant]:
        """Instants with a plan that neither completed nor were rolled back."""
        acts = set(actions) if actions is not None else None
        return [i for i in self.instants if not i.is_completed and (acts is None or i.action in acts)]

    def aborted_leftovers(self) -> list[Instant]:
        """Rolled-back instants whose plan files are still there (a rollback cut short)."""
        return sorted(Instant(ts, a, s) for (ts, a), s in self._files.items() if ts in self.aborted)

    def last_completed(self, actions: Iterable[str] | None = None) -> Instant | None:
        done = self.recent(1, actions)
        return done[-1] if done else None

    def find(self, timestamp: str) -> Instant | None:
        """The instant ``timestamp`` in any state; looks into old history only when it must."""
        for i in self.instants:
            if i.timestamp == timestamp:
                return i
        seq = self._completed.get(timestamp)
        if seq is None and (timestamp in self._completed or self.base_seq):
            self.load_history()
            seq = next((s for s, e in self._entries.items() if e["instant"] == timestamp), None)
        if seq is not None:
            e = self._entry(seq)
            return Instant(e["instant"], e["action"], State.COMPLETED, seq)
        return None

    def is_completed(self, timestamp: str) -> bool:
        return timestamp in self._completed

    def done_with_plans(self, upto_seq: int) -> dict[str, list[str]]:
        """Listed plan files of instants completed or aborted at or before ``upto_seq``:
        what a checkpoint at ``upto_seq`` must remember so that a timeline opened from it
        never takes them for pending (a pending instant may be rolled back)."""
        out: dict[str, list[str]] = {}
        for ts, action in self._files:
            for state, known in (("completed", self._completed), ("aborted", self._aborted_at)):
                if ts in known and (known[ts] is None or known[ts] <= upto_seq):
                    out[ts] = [state, action]
        return out

    def state_of(self, timestamp: str) -> str | None:
        """``completed``, ``aborted``, ``pending`` or None (unknown), looking into old history if needed."""
        for _ in range(2):
            if timestamp in self._completed:
                return "completed"
            if timestamp in self.aborted:
                return "aborted"
            if any(i.timestamp == timestamp for i in self.pending()):
                return "pending"
            if self._history or not self.base_seq:
                return None
            self.load_history()
        return None  # pragma: no cover

    @staticmethod
    def rolled_back_since(io: FileIO, layout: TableLayout, timestamp: str, after_seq: int) -> bool:
        """Whether a rollback decided against ``timestamp``, reading only the entries after ``after_seq``.

        For a writer's tasks, which must not leave files behind an instant rolled back under
        them (a Spark Connect server keeps running a killed client's tasks). A rollback can
        only decide after the instant's plan exists, so its entry follows the snapshot the
        writer planned on: one listing and the few entries since, not the whole history
        (archival never moves entries after a live writer's snapshot).
        """
        for name in sorted(n for n in io.list_names(layout.sequence) if _SEQ_NAME.match(n)):
            if int(name[:20]) <= after_seq:
                continue
            try:
                entry = load_json(io, posixpath.join(layout.sequence, name), what="commit sequence entry")
            except FileNotFoundError:  # pragma: no cover - archived meanwhile: older than our snapshot
                continue
            if entry["action"] == Action.ROLLBACK and entry["metadata"].get("rolled_back") == timestamp:
                return True
        return False

    def _path(self, instant: Instant, state: State) -> str:
        return posixpath.join(self.dir, instant.file_name(state))

    def read_plan(self, instant: Instant) -> dict[str, Any]:
        return json.loads(self.io.read_bytes(self._path(instant, State.REQUESTED)))

    def read_metadata(self, instant: Instant) -> dict[str, Any]:
        seq = instant.seq if instant.seq is not None else self._completed.get(instant.timestamp)
        if seq is None:
            found = self.find(instant.timestamp) if instant.timestamp in self._completed else None
            seq = found.seq if found is not None else None
        if seq is None:
            raise ValueError(f"{instant} is not completed; only completed instants have metadata")
        return self._entry(seq)["metadata"]

    def read_commit(self, instant: Instant) -> CommitMetadata:
        """The completed ``instant``'s metadata, typed (:mod:`spark_jobs.table.commit`)."""
        return CommitMetadata.from_json(self.read_metadata(instant))

    # -- transitions -----------------------------------------------------------------
    def new_instant_time(self) -> str:
        """A 17-digit UTC timestamp (yyyyMMddHHmmssSSS) strictly after every instant seen.

        Two processes can still pick the same time; creating the requested file decides
        (:meth:`create_requested` raises for the loser, who picks again).
        """
        now = utc_stamp()
        self.reload()
        last = max([i.timestamp for i in self.instants] + [ts for ts, _ in self._files] + [self.max_instant()],
                   default="")
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
        # "completed": when the slot was claimed (UTC, the instants' form), so that a reader can
        # travel to a *time* and leave out commits requested before it but completed after it
        entry = {"seq": seq, "instant": instant.timestamp, "action": instant.action, "metadata": metadata,
                 "completed": utc_stamp()}
        data = json.dumps(entry, indent=1, sort_keys=True, default=str).encode()
        try:
            self.io.create_exclusive(self.layout.sequence_file(seq), data)
        except InstantExistsError as e:
            raise SequenceTakenError(f"sequence slot {seq} is taken") from e
        if seq > 1 and not self.io.is_file(self.layout.sequence_file(seq - 1)):
            # the slot before ours is gone from sequence/: archived. Archival never moves an
            # entry after a live writer's snapshot, so only a writer stalled past its
            # heartbeat gets here -- and its slot may be a hole below a checkpoint that
            # readers would never replay. Give the slot back and check again.
            if any(first <= seq <= last for first, last in self.archives(refresh=True)):
                self.io.delete(self.layout.sequence_file(seq))
                raise SequenceTakenError(f"sequence slot {seq} was archived; this writer's view is stale")
        self._entries[seq] = entry
        self.last_seq = max(self.last_seq, seq)
        for n in range(self.base_seq + 1, seq):  # entries before ours this handle had not seen
            self._entry(n)
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
        self.io.delete(self._path(instant, State.INFLIGHT))  # two requests, in this order: a crash
        self.io.delete(self._path(instant, State.REQUESTED))  # between them leaves it pending
        self._files.pop((instant.timestamp, instant.action), None)
        self._rebuild()
