"""The file-system view: which data files and index files make up a snapshot.

The view is derived from the metadata of completed instants only -- never from listing
data directories -- so a file written by a failed, pending or duplicate (speculative) task
attempt is invisible even though it sits on disk. Completed instants are replayed in commit
order (the commit sequence), which is not always instant order when writers run
concurrently; replaying a prefix of the sequence gives time travel for free.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import pyarrow as pa

from spark_jobs.table.commit import CommitMetadata
from spark_jobs.table.commit import parse as parse_commit
from spark_jobs.table.timeline import (
    Action,
    Instant,
    State,
    Timeline,
    checkpoint_seqs,
    read_checkpoint,
)

__all__ = ["FileSlice", "LogFile", "FileSystemView", "encode_schema", "decode_schema"]


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


@dataclass(frozen=True)
class LogFile:
    """One merge-on-read log of a file group: the rows one commit wrote to it (format.md §5.1)."""

    path: str  # relative to the table root
    instant: str
    num_rows: int
    size: int = 0


@dataclass(frozen=True)
class FileSlice:
    """The current version of one file group: a base Parquet file and, for merge-on-read,
    the logs written on top of it in commit order (empty for copy-on-write)."""

    partition: str
    file_id: str
    path: str  # the base file, relative to the table root
    instant: str  # the instant that wrote the base
    num_rows: int  # live rows: the base merged with its logs
    size: int = 0  # bytes of the base
    logs: tuple[LogFile, ...] = ()

    @property
    def total_size(self) -> int:
        return self.size + sum(lf.size for lf in self.logs)

    @property
    def files(self) -> list[str]:
        """Every file of the slice, base first."""
        return [self.path, *(lf.path for lf in self.logs)]


@dataclass
class FileSystemView:
    as_of: str | None
    file_groups: dict[tuple[str, str], FileSlice] = field(default_factory=dict)
    #: bucket -> index files (relative paths) in merge order: base first, then deltas oldest first
    index_files: dict[int, list[str]] = field(default_factory=dict)
    schema: pa.Schema | None = None
    num_buckets: int | None = None
    #: table properties set on the timeline (``properties`` of the entries so far, later ones
    #: replacing earlier keys): ``mirrors``, turned on by ``bucketindex mirror --enable``
    properties: dict[str, Any] = field(default_factory=dict)
    instants: list[Instant] = field(default_factory=list)
    #: the commit sequence number this view was built at: a writer planning on this view
    #: checks every entry after it for conflicts before it commits
    seq: int = 0

    @classmethod
    def build(cls, timeline: Timeline, as_of: str | None = None) -> "FileSystemView":
        """The snapshot after the last entry at or before ``as_of`` (default: the latest)."""
        seq = timeline.last_seq if as_of is None else timeline.seq_as_of(as_of)
        view = cls.at_seq(timeline, seq)
        view.as_of = as_of
        return view

    @classmethod
    def at_seq(cls, timeline: Timeline, seq: int) -> "FileSystemView":
        """The snapshot right after sequence entry ``seq``: the latest checkpoint at or before
        it, then the entries after the checkpoint (O(1) in history length for recent ``seq``)."""
        start = 0
        view = cls(as_of=None)
        ckpt = timeline.checkpoint if timeline.checkpoint is not None and timeline.base_seq <= seq else None
        if ckpt is None and seq > 0:
            ckpt = _checkpoint_at_or_before(timeline, seq)
        if ckpt is not None:
            view = cls.from_state(ckpt["view"])
            start = int(ckpt["seq"])
        for n in range(start + 1, seq + 1):
            e = timeline.entry(n)
            if e["action"] in Action.WRITES:
                view.apply(Instant(e["instant"], e["action"], State.COMPLETED, n), e["metadata"])
        view.seq = seq
        return view

    # -- checkpoints -------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """This view as JSON-able data: what a timeline checkpoint stores (format.md §3.5)."""
        return {
            "file_groups": [
                {"partition": s.partition, "file_id": s.file_id, "path": s.path, "instant": s.instant,
                 "num_rows": s.num_rows, "size": s.size,
                 "logs": [[lf.path, lf.instant, lf.num_rows, lf.size] for lf in s.logs]}
                for s in self.slices()
            ],
            "index_files": {str(b): list(files) for b, files in sorted(self.index_files.items())},
            "schema": encode_schema(self.schema) if self.schema is not None else None,
            "num_buckets": self.num_buckets,
            # only when set: checkpoints of tables without properties keep the bytes they had
            **({"properties": dict(self.properties)} if self.properties else {}),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "FileSystemView":
        view = cls(as_of=None)
        for g in state["file_groups"]:
            view.file_groups[(g["partition"], g["file_id"])] = FileSlice(
                g["partition"], g["file_id"], g["path"], g["instant"], int(g["num_rows"]), int(g["size"]),
                tuple(LogFile(p, i, int(n), int(z)) for p, i, n, z in g["logs"]))
        view.index_files = {int(b): list(files) for b, files in state["index_files"].items() if files}
        view.schema = decode_schema(state["schema"]) if state.get("schema") else None
        view.num_buckets = state.get("num_buckets")
        view.properties = dict(state.get("properties") or {})
        return view

    def all_files(self) -> set[str]:
        """Every data, log and index file this snapshot reads (relative paths)."""
        out = {f for s in self.file_groups.values() for f in s.files}
        out.update(f for files in self.index_files.values() for f in files)
        return out

    def apply(self, inst: Instant, meta: "Mapping[str, Any] | CommitMetadata") -> None:
        """Replay one completed entry's metadata (parsed by :func:`spark_jobs.table.commit.parse`)."""
        self.instants.append(inst)
        commit = parse_commit(meta)
        for fg in commit.groups:
            key = fg.key
            old = self.file_groups.get(key)
            if fg.removed:
                self.file_groups.pop(key, None)
            elif fg.log is not None:  # merge-on-read: one more log on the group's base
                lf = fg.log
                assert old is not None, f"a log for file group {key} without a base"
                self.file_groups[key] = replace(
                    old, num_rows=old.num_rows + int(fg.row_delta or 0),
                    logs=(*old.logs, LogFile(lf.path, inst.timestamp, int(lf.num_rows or 0), int(lf.size or 0))))
            elif fg.compacted_logs is not None and old is not None:
                # data compaction: a new base for the logs it folded; logs committed after its
                # plan stay on top, and the live row count does not change
                folded = set(fg.compacted_logs)
                self.file_groups[key] = replace(
                    old, path=fg.path, instant=inst.timestamp, size=fg.size or 0,
                    logs=tuple(lf for lf in old.logs if lf.path not in folded))
            else:
                self.file_groups[key] = FileSlice(
                    fg.partition, fg.file_id, fg.path, inst.timestamp, fg.num_rows or 0, fg.size or 0
                )
        for rel in commit.removed_index_files:
            for files in self.index_files.values():
                if rel in files:
                    files.remove(rel)
        # a bucket left without files is no bucket of the snapshot (a rehash to fewer buckets
        # removes every file of the old ones above the new count)
        for b in [b for b, files in self.index_files.items() if not files]:
            del self.index_files[b]
        for f in commit.added:
            files = self.index_files.setdefault(int(f.bucket), [])
            files.append(f.path)
            # a base first, then deltas in commit order (a stable sort keeps that order)
            files.sort(key=is_index_delta)
        if commit.schema:
            self.schema = decode_schema(commit.schema)
        if commit.num_buckets:
            self.num_buckets = int(commit.num_buckets)
        if commit.properties:
            self.properties.update(commit.properties)

    # -- queries ---------------------------------------------------------------------
    def slices(self, partition: str | None = None) -> list[FileSlice]:
        return sorted(
            (s for s in self.file_groups.values() if partition is None or s.partition == partition),
            key=lambda s: (s.partition, s.file_id),
        )

    def partitions(self) -> list[str]:
        return sorted({p for p, _ in self.file_groups})

    @property
    def num_rows(self) -> int:
        return sum(s.num_rows for s in self.file_groups.values())


def _checkpoint_at_or_before(timeline: Timeline, seq: int) -> dict[str, Any] | None:
    """The latest readable checkpoint at or before ``seq`` (time travel into older history):
    the recent ones first, then those archival kept for time travel."""
    for archived in (False, True):
        for n in reversed(checkpoint_seqs(timeline.io, timeline.layout, archived=archived)):
            if n <= seq:
                ckpt = read_checkpoint(timeline.io, timeline.layout, n, archived=archived)
                if ckpt is not None:
                    return ckpt
    return None


def is_index_delta(rel: str) -> bool:
    return not rel.rsplit("/", 1)[-1].startswith("base_")
