"""Typed commit metadata (format.md §3.3-3.4, §5.2-5.3), with one JSON round trip.

Every completed timeline entry's ``metadata`` is a JSON object; :meth:`CommitMetadata.from_json`
parses it into the dataclasses below and :meth:`CommitMetadata.to_json` gives the same object
back: ``CommitMetadata.from_json(m).to_json() == m`` for every metadata the product writes.
Keys absent stay absent (a log entry has no ``path``/``removed``, a plain entry no ``log``), and
keys the types do not name -- or known keys holding ``null`` where a value is expected -- are
kept verbatim in ``extra`` and written back, so nothing is lost.

Readers (the file-system view, the conflict check, rollback, ``show``) parse here, in one place.
No pyspark, no airflow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

_EMPTY: Mapping[str, Any] = MappingProxyType({})
#: the counts of a commit that writes no row (an alter, a property change)
NO_ROWS_CHANGED: Mapping[str, int] = MappingProxyType({"inserted": 0, "updated": 0, "deleted": 0, "moved": 0})


def _take(d: Mapping[str, Any], known: tuple[str, ...], nullable: tuple[str, ...] = ()
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``d`` into the known keys holding a value and everything else (kept verbatim).

    A known key holding ``null`` goes to the extras unless it is ``nullable`` (None = absent)."""
    vals: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for k, v in d.items():
        if k in known and (v is not None or k in nullable):
            vals[k] = v
        else:
            extra[k] = v
    return vals, extra


def _put(out: dict[str, Any], **kv: Any) -> dict[str, Any]:
    for k, v in kv.items():
        if v is not None:
            out[k] = v
    return out


@dataclass(frozen=True, kw_only=True)
class LogChange:
    """One merge-on-read log a commit put on a file group's base: ``{"path", "num_rows", "size"}``."""

    path: str
    num_rows: int | None = None
    size: int | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LogChange:
        vals, extra = _take(d, ("path", "num_rows", "size"))
        if "path" not in vals:
            raise ValueError(f"a log entry without a path: {dict(d)!r}")
        return cls(**vals, extra=MappingProxyType(extra) if extra else _EMPTY)

    def to_json(self) -> dict[str, Any]:
        return _put({"path": self.path}, num_rows=self.num_rows, size=self.size) | dict(self.extra)


#: the name the view uses for a log of a slice is different (view.LogFile); this is the change
LogFile = LogChange


@dataclass(frozen=True, kw_only=True)
class FileGroupChange:
    """One file group a commit touched (``file_groups[*]``).

    Shapes (format.md): a new base ``{partition, file_id, path, num_rows, size, removed}``
    (``removed: true, path: null`` when the group became empty); a merge-on-read log
    ``{partition, file_id, row_delta, log}``; a data compaction ``{partition, file_id, path,
    base_rows, size, compacted_logs}``; a bootstrap base adds ``reference: true`` or
    ``replaces``; a rehash removal ``{partition, file_id, path: null, removed: true}``.
    ``path`` is written exactly when ``log`` is None; every other None field is absent.
    """

    partition: str
    file_id: str
    path: str | None = None
    num_rows: int | None = None
    size: int | None = None
    removed: bool | None = None
    log: LogChange | None = None
    row_delta: int | None = None
    base_rows: int | None = None
    compacted_logs: tuple[str, ...] | None = None
    reference: bool | None = None
    replaces: str | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    _KNOWN = ("partition", "file_id", "path", "num_rows", "size", "removed", "log", "row_delta",
              "base_rows", "compacted_logs", "reference", "replaces")

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FileGroupChange:
        vals, extra = _take(d, cls._KNOWN, nullable=("path",))
        if "partition" not in vals or "file_id" not in vals:
            raise ValueError(f"a file group entry without partition and file_id: {dict(d)!r}")
        if "log" in vals:
            vals["log"] = LogChange.from_json(vals["log"])
            if "path" in vals:  # a log entry names no base: keep an odd one verbatim
                extra["path"] = vals.pop("path")
        elif "path" not in vals:
            raise ValueError(f"a file group entry with neither a path nor a log: {dict(d)!r}")
        if "compacted_logs" in vals:
            vals["compacted_logs"] = tuple(vals["compacted_logs"])
        return cls(**vals, extra=MappingProxyType(extra) if extra else _EMPTY)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"partition": self.partition, "file_id": self.file_id}
        if self.log is None:
            out["path"] = self.path
        _put(out, num_rows=self.num_rows, size=self.size, removed=self.removed, row_delta=self.row_delta,
             log=self.log.to_json() if self.log is not None else None, base_rows=self.base_rows,
             compacted_logs=list(self.compacted_logs) if self.compacted_logs is not None else None,
             reference=self.reference, replaces=self.replaces)
        return out | dict(self.extra)

    @property
    def key(self) -> tuple[str, str]:
        return (self.partition, self.file_id)

    @property
    def is_removed(self) -> bool:
        return bool(self.removed)

    @property
    def is_compaction(self) -> bool:
        return self.compacted_logs is not None

    def files(self) -> set[str]:
        """The data files this change wrote (its new base or its log)."""
        out = {self.path} if self.path else set()
        if self.log is not None:
            out.add(self.log.path)
        return out


@dataclass(frozen=True, kw_only=True)
class IndexFileChange:
    """One record-index file a commit wrote (``index.added[*]``)."""

    bucket: int
    path: str
    entries: int | None = None
    size: int | None = None
    kind: str | None = None  # "delta" | "base"
    sealed: bool | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> IndexFileChange:
        vals, extra = _take(d, ("bucket", "path", "entries", "size", "kind", "sealed"))
        if "bucket" not in vals or "path" not in vals:
            raise ValueError(f"an index entry without bucket and path: {dict(d)!r}")
        return cls(**vals, extra=MappingProxyType(extra) if extra else _EMPTY)

    def to_json(self) -> dict[str, Any]:
        return _put({"bucket": self.bucket, "path": self.path}, entries=self.entries, size=self.size,
                    kind=self.kind, sealed=self.sealed) | dict(self.extra)

    @property
    def is_delta(self) -> bool:
        return self.kind == "delta"


@dataclass(frozen=True, kw_only=True)
class ReadSet:
    """What a write decided on its snapshot without writing anything for it (``reads``): deletes
    of keys absent from the snapshot and rows dropped as stale against their stored row.

    Nothing of such a row is in the file groups or index deltas, yet a concurrent write of its
    key changes what it should have done; the conflict check compares this with the write sets
    of commits after the snapshot (format.md §4.5). Per index type: ``index`` -- record index
    files (kind ``read``: the keys' fingerprints, one per index bucket, not index content);
    ``groups`` -- the (partition, file id) groups those rows route to or were stored in;
    ``absent_keys`` -- global_simple: some row deleted a key absent from the snapshot.
    An absent ``reads`` (every older commit) is the empty set."""

    index: tuple[IndexFileChange, ...] = ()
    groups: frozenset[tuple[str, str]] = frozenset()
    absent_keys: bool = False
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ReadSet:
        vals, extra = _take(d, ("index", "groups", "absent_keys"))
        out: dict[str, Any] = {}
        if "index" in vals:
            out["index"] = tuple(IndexFileChange.from_json(f) for f in vals["index"])
        if "groups" in vals:
            out["groups"] = frozenset((g["partition"], g["file_id"]) for g in vals["groups"])
        if "absent_keys" in vals:
            out["absent_keys"] = bool(vals["absent_keys"])
        return cls(**out, extra=MappingProxyType(extra) if extra else _EMPTY)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.index:
            out["index"] = [f.to_json() for f in self.index]
        if self.groups:
            out["groups"] = [{"partition": p, "file_id": f} for p, f in sorted(self.groups)]
        if self.absent_keys:
            out["absent_keys"] = True
        return out | dict(self.extra)

    def __bool__(self) -> bool:
        return bool(self.index or self.groups or self.absent_keys)


@dataclass(frozen=True, kw_only=True)
class EngineInfo:
    """Which engine wrote a commit and why (``engine``)."""

    name: str | None = None
    reason: str | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EngineInfo:
        vals, extra = _take(d, ("name", "reason"))
        return cls(**vals, extra=MappingProxyType(extra) if extra else _EMPTY)

    def to_json(self) -> dict[str, Any]:
        return _put({}, name=self.name, reason=self.reason) | dict(self.extra)


#: keys one kind of action records of its own, typed on :class:`CommitMetadata` and
#: :class:`Written`: the JSON type each must have (any other is kept verbatim in ``extra``)
_SECTION_TYPES: Mapping[str, type | tuple[type, ...]] = MappingProxyType({
    "ignored": dict, "session_start_ms": int, "previous_num_buckets": int, "bootstrap": dict, "alter": dict,
    "earliest_retained_seq": int, "earliest_retained_instant": str, "previous_retained_seq": int, "policy": dict,
    "rolled_back": str, "target_action": str, "deleted_files": list})
_SECTION_KEYS = tuple(_SECTION_TYPES)
_SECTION_MAPPINGS = tuple(k for k, t in _SECTION_TYPES.items() if t is dict)


def _section_json(value: Any) -> Any:
    """A section field as JSON: a mapping as a dict, a tuple as a list (None stays None)."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _freeze(value: Any) -> Any:
    """A list as a tuple and a dict as a read-only mapping (a frozen dataclass stays unchanged)."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return MappingProxyType(dict(value))
    return value


@dataclass(frozen=True, kw_only=True)
class _Reported:
    """The fields an action reports about its own attempt, shared by :class:`Written` (what
    an engine hands the commit protocol) and :class:`CommitMetadata` (what the timeline
    keeps): declared once, so the two cannot drift apart. None is absent."""

    operation: str | None = None
    index_type: str | None = None
    num_buckets: int | None = None
    schema: str | None = None
    #: the file groups written, replaced (a compaction's ``compacted_logs``, a bootstrap's
    #: ``replaces``) and removed (``removed``)
    file_groups: tuple[FileGroupChange, ...] | None = None
    index_added: tuple[IndexFileChange, ...] | None = None
    index_removed: tuple[str, ...] | None = None
    counts: Mapping[str, Any] | None = None
    timings_ms: Mapping[str, Any] | None = None
    engine: EngineInfo | None = None
    shadow: Mapping[str, Any] | None = None
    #: what the write decided without writing (:class:`ReadSet`); None: absent (nothing)
    reads: ReadSet | None = None
    #: table properties this entry sets (``bucketindex mirror --enable``: ``{"mirrors": [...]}``);
    #: a property of the snapshot from this entry on, like ``schema`` (format.md §3.2)
    properties: Mapping[str, Any] | None = None
    # -- what one kind of action records of its own (format.md §3.3-3.4, §5.3, §10) ----------
    #: an upsert's batch identities that changed nothing, by reason (``stale_upserts``, ...)
    ignored: Mapping[str, Any] | None = None
    #: JVM and Spark session start of a Spark job, apart from its phases
    session_start_ms: int | None = None
    #: a rehash: the bucket count it replaced
    previous_num_buckets: int | None = None
    #: a bootstrap: ``{"source", "mode", "counts"}``
    bootstrap: Mapping[str, Any] | None = None
    #: an alter: ``{"changes": [...]}``
    alter: Mapping[str, Any] | None = None
    #: a clean: the retained window it leaves and the one before, and its policy
    earliest_retained_seq: int | None = None
    earliest_retained_instant: str | None = None
    previous_retained_seq: int | None = None
    policy: Mapping[str, Any] | None = None
    #: every key the type does not name
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True, kw_only=True)
class CommitMetadata(_Reported):
    """A completed timeline entry's ``metadata`` (every action: commit, compaction, rehash,
    bootstrap, clean, rollback). Fields that are None (or ``file_groups``/``index_*`` None)
    were absent; every key the type does not name is in ``extra``
    (``bootstrap``, ``rolled_back``, ``previous_num_buckets``, plan fields, ...).

    What an action reports is declared in :class:`_Reported`; the fields here are the ones
    only the commit protocol (or a rollback) records."""

    action: str | None = None
    instant: str | None = None
    batch_id: str | None = None
    snapshot_seq: int | None = None
    #: keys of ``index`` other than added/removed (None: none; {} an ``index`` with neither)
    index_extra: Mapping[str, Any] | None = None
    conflicts: tuple[Mapping[str, Any], ...] | None = None
    #: a rollback: the instant it aborted, that instant's action and the files it deleted
    rolled_back: str | None = None
    target_action: str | None = None
    deleted_files: tuple[str, ...] | None = None

    _KNOWN = ("action", "instant", "batch_id", "operation", "index_type", "num_buckets", "snapshot_seq",
              "schema", "file_groups", "index", "counts", "conflicts", "timings_ms", "engine", "shadow", "reads",
              "properties", *_SECTION_KEYS)

    # -- the JSON round trip -----------------------------------------------------------
    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CommitMetadata:
        vals, extra = _take(d, cls._KNOWN)
        for k, typ in (("file_groups", list), ("conflicts", list), ("index", dict), ("engine", dict),
                       ("counts", dict), ("timings_ms", dict), ("shadow", dict), ("reads", dict),
                       ("properties", dict), *_SECTION_TYPES.items()):
            if k in vals and not isinstance(vals[k], typ):  # not the documented shape: keep verbatim
                extra[k] = vals.pop(k)
        if "file_groups" in vals:
            vals["file_groups"] = tuple(FileGroupChange.from_json(g) for g in vals["file_groups"])
        if "conflicts" in vals:
            if all(isinstance(c, dict) for c in vals["conflicts"]):
                vals["conflicts"] = tuple(MappingProxyType(dict(c)) for c in vals["conflicts"])
            else:
                extra["conflicts"] = vals.pop("conflicts")
        if "engine" in vals:
            vals["engine"] = EngineInfo.from_json(vals["engine"])
        if "reads" in vals:
            vals["reads"] = ReadSet.from_json(vals["reads"])
        for k in ("counts", "timings_ms", "shadow", "properties", *_SECTION_MAPPINGS):
            if k in vals:
                vals[k] = MappingProxyType(dict(vals[k]))
        if "deleted_files" in vals:
            vals["deleted_files"] = tuple(vals["deleted_files"])
        if "index" in vals:
            index = vals.pop("index")
            ivals, iextra = _take(index, ("added", "removed"))
            for k in ("added", "removed"):
                if k in ivals and not isinstance(ivals[k], list):
                    iextra[k] = ivals.pop(k)
            if "added" in ivals:
                vals["index_added"] = tuple(IndexFileChange.from_json(f) for f in ivals["added"])
            if "removed" in ivals:
                vals["index_removed"] = tuple(ivals["removed"])
            if iextra or not ivals:
                vals["index_extra"] = MappingProxyType(iextra)
        return cls(**vals, extra=MappingProxyType(dict(extra)) if extra else _EMPTY)

    def to_json(self) -> dict[str, Any]:
        out = _put({}, action=self.action, instant=self.instant, batch_id=self.batch_id, operation=self.operation,
                   index_type=self.index_type, num_buckets=self.num_buckets, snapshot_seq=self.snapshot_seq,
                   schema=self.schema)
        if self.file_groups is not None:
            out["file_groups"] = [g.to_json() for g in self.file_groups]
        if self.index_added is not None or self.index_removed is not None or self.index_extra is not None:
            index = _put({}, added=[f.to_json() for f in self.index_added] if self.index_added is not None else None,
                         removed=list(self.index_removed) if self.index_removed is not None else None)
            out["index"] = index | dict(self.index_extra or {})
        _put(out, counts=dict(self.counts) if self.counts is not None else None,
             conflicts=[dict(c) for c in self.conflicts] if self.conflicts is not None else None,
             timings_ms=dict(self.timings_ms) if self.timings_ms is not None else None,
             engine=self.engine.to_json() if self.engine is not None else None,
             shadow=dict(self.shadow) if self.shadow is not None else None,
             reads=self.reads.to_json() if self.reads is not None else None,
             properties=dict(self.properties) if self.properties is not None else None)
        for k in _SECTION_KEYS:
            _put(out, **{k: _section_json(getattr(self, k))})
        return out | dict(self.extra)

    @classmethod
    def of(cls, written: "Written", *, action: str, instant: str, batch_id: str | None = None,
           snapshot_seq: int | None = None, conflicts: Sequence[Mapping[str, Any]] | None = None) -> CommitMetadata:
        """The metadata of ``written`` committed as ``instant`` of ``action``: what the action
        reported, with what only the commit protocol knows (the instant, the batch id, the
        snapshot it was written on, the conflicts retried before). ``Transaction`` calls it;
        nothing else builds a commit's metadata."""
        return cls(action=action, instant=instant, batch_id=batch_id, snapshot_seq=snapshot_seq,
                   conflicts=tuple(MappingProxyType(dict(c)) for c in conflicts) if conflicts is not None else None,
                   **{f.name: getattr(written, f.name) for f in fields(_Reported)})

    # -- what readers ask ----------------------------------------------------------------
    @property
    def groups(self) -> tuple[FileGroupChange, ...]:
        """``file_groups``, empty when absent."""
        return self.file_groups or ()

    @property
    def added(self) -> tuple[IndexFileChange, ...]:
        """``index.added``, empty when absent."""
        return self.index_added or ()

    @property
    def removed_index_files(self) -> tuple[str, ...]:
        """``index.removed``, empty when absent."""
        return self.index_removed or ()

    def group_keys(self) -> frozenset[tuple[str, str]]:
        """Every (partition, file id) the commit touched."""
        return frozenset(g.key for g in self.groups)

    def index_deltas(self) -> dict[int, str]:
        """Index bucket -> the delta file this commit wrote there."""
        return {int(f.bucket): f.path for f in self.added if f.is_delta}

    @property
    def read_set(self) -> ReadSet:
        """``reads``, empty when absent (every commit before the field existed)."""
        return self.reads if self.reads is not None else ReadSet()

    def count(self, name: str) -> Any:
        return (self.counts or {}).get(name)

    def get(self, key: str, default: Any = None) -> Any:
        """A key of one kind of action (``rolled_back``, ``bootstrap``, ``session_start_ms``, ...)
        or an ``extra`` key, as it is in the JSON (``default`` when absent)."""
        if key in self.extra:
            return self.extra[key]
        if key in _SECTION_KEYS:
            value = _section_json(getattr(self, key))
            return default if value is None else value
        return default

    def referenced_files(self) -> set[str]:
        """Every data and index file the metadata names (new bases, logs, added index files and
        ``reads`` files: markers keep them, rollback deletes them, clean deletes them with the
        file versions of the commits its range covers)."""
        out: set[str] = set()
        for g in self.groups:
            out |= g.files()
        out.update(f.path for f in self.added)
        out.update(f.path for f in self.read_set.index)
        return out


def parse(meta: Mapping[str, Any]) -> CommitMetadata:
    """The one place commit metadata is parsed (see :meth:`CommitMetadata.from_json`)."""
    return meta if isinstance(meta, CommitMetadata) else CommitMetadata.from_json(meta)


@dataclass(frozen=True, kw_only=True)
class Written(_Reported):
    """What one attempt of an action reports: the file groups it wrote, replaced or removed,
    the index files it added and removed, its counts, the schema or properties it sets, and
    what its kind of action records of its own.

    The commit protocol (``spark_jobs.table.action.transaction.Transaction``) makes it the
    commit's :class:`CommitMetadata` (:meth:`CommitMetadata.of`), adding what only the protocol
    knows -- the action, the instant, the batch id, the snapshot the attempt was written on and
    the conflicts retried before -- so no writer builds commit metadata by hand, and none can
    record an instant or a snapshot other than the one it commits. Every field is a field of
    :class:`CommitMetadata` with the same meaning; None is absent. Lists given are kept as
    tuples and dicts as read-only mappings.
    """

    #: fields the protocol sets (:meth:`CommitMetadata.of`); an action never reports them
    PROTOCOL = ("action", "instant", "batch_id", "snapshot_seq", "conflicts")

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _freeze(getattr(self, f.name)))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Written:
        """An engine's report in the JSON shape of commit metadata (``file_groups``, ``index``,
        ``counts``, ``reads``, ...), parsed by the one parser; ValueError when it names a key
        only the protocol sets, or an ``index`` key other than added/removed."""
        meta = CommitMetadata.from_json(d)
        owned = [k for k in cls.PROTOCOL if getattr(meta, k) is not None]
        if owned or meta.index_extra or meta.rolled_back or meta.target_action or meta.deleted_files:
            raise ValueError(f"an action's report names what the commit protocol sets: {owned or dict(d)!r}")
        return cls(**{f.name: getattr(meta, f.name) for f in fields(_Reported)})

    def replace(self, **changes: Any) -> Written:
        """This report with ``changes`` (``dataclasses.replace``)."""
        return replace(self, **changes)
