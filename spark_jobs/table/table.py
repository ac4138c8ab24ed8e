"""The table facade: config, timeline, view and the write/rollback protocol in one place.

Pure Python (pyarrow only): the CLI, Airflow sensors and operators, and Spark executors
all use it to read table state and to follow the commit protocol.
"""

from __future__ import annotations

import logging
from typing import Any

from spark_jobs.io.filesystem import FileIO, resolve
from spark_jobs.table.config import BadInputError, TableConfig
from spark_jobs.table.heartbeat import is_alive
from spark_jobs.table.layout import TableLayout
from spark_jobs.table.timeline import Action, Instant, State, Timeline
from spark_jobs.table.view import FileSystemView
from spark_jobs.testing.faults import maybe_crash

__all__ = ["Table", "TableNotFoundError", "WriterAliveError"]

log = logging.getLogger(__name__)


class TableNotFoundError(BadInputError):
    pass


class WriterAliveError(BadInputError):
    """A pending instant still has a live writer: the table is busy."""


class Table:
    def __init__(self, uri: str, io: FileIO, root: str, config: TableConfig | None) -> None:
        self.uri = uri
        self.io = io
        self.root = root
        self.layout = TableLayout(root)
        self.config = config
        self.timeline = Timeline(io, self.layout.timeline)

    # -- opening ---------------------------------------------------------------------
    @classmethod
    def open(cls, uri: str) -> "Table":
        """A handle on ``uri`` whether or not a table exists there yet (``config`` is None if not)."""
        io, root = resolve(uri)
        return cls(uri, io, root, TableConfig.load(io, TableLayout(root).config_file))

    @classmethod
    def load(cls, uri: str) -> "Table":
        t = cls.open(uri)
        if t.config is None:
            raise TableNotFoundError(f"no bucketindex table at {uri} (no .bucketindex/table.json)")
        return t

    @property
    def exists(self) -> bool:
        return self.config is not None

    def create(self, config: TableConfig) -> TableConfig:
        self.config = config.create(self.io, self.layout.config_file)
        return self.config

    # -- state -----------------------------------------------------------------------
    def view(self, as_of: str | None = None) -> FileSystemView:
        if as_of is not None and not self.timeline.completed(as_of=as_of):
            raise BadInputError(f"no completed instant at or before {as_of}")
        return FileSystemView.build(self.timeline.reload(), as_of)

    def num_buckets(self, view: FileSystemView | None = None) -> int:
        """The bucket count in force: from the latest completed rehash, else the table config."""
        assert self.config is not None
        v = view if view is not None else self.view()
        return v.num_buckets or self.config.num_buckets

    def commit_for_batch(self, batch_id: str) -> Instant | None:
        for inst in reversed(self.timeline.reload().completed([Action.COMMIT, Action.BOOTSTRAP])):
            if self.timeline.read_metadata(inst).get("batch_id") == batch_id:
                return inst
        return None

    def pending_for_batch(self, batch_id: str) -> Instant | None:
        """The pending write instant whose plan carries ``batch_id`` (a crashed attempt of that batch)."""
        tl = self.timeline.reload()
        for inst in tl.pending():
            if inst.action != Action.ROLLBACK and tl.read_plan(inst).get("batch_id") == batch_id:
                return inst
        return None

    def abs(self, rel: str) -> str:
        return self.layout.abs(rel)

    # -- markers ---------------------------------------------------------------------
    def create_marker(self, instant: str, rel_path: str) -> None:
        """Record that ``rel_path`` is about to be written for ``instant`` (before writing it)."""
        self.io.write_bytes(self.layout.marker_file(instant, rel_path), b"")

    def marked_files(self, instant: str) -> list[str]:
        d = self.layout.marker_dir(instant)
        return [TableLayout.marker_target(n) for n in self.io.list_names(d) if n.endswith(".marker")]

    def finalize_markers(self, instant: str, keep: set[str]) -> list[str]:
        """After a commit: delete marked files the commit does not reference (failed or
        duplicate task attempts), then the markers. Returns the deleted files."""
        extra = [f for f in self.marked_files(instant) if f not in keep]
        for rel in extra:
            self.io.delete(self.abs(rel))
        self.io.delete_dir(self.layout.marker_dir(instant))
        return extra

    # -- rollback --------------------------------------------------------------------
    def rollback(self, instant: str | None = None, *, force: bool = False) -> list[str]:
        """Roll back pending instants (all abandoned ones, or the one named). Returns their timestamps.

        Resumes an interrupted rollback first. A pending instant whose writer is alive is
        refused unless ``force``. Committed data is never touched: only files listed under
        the pending instant's markers are deleted, and those are invisible to readers.
        """
        tl = self.timeline.reload()
        for rb in tl.pending([Action.ROLLBACK]):
            self._finish_rollback(rb, tl.read_plan(rb))
        tl.reload()
        targets = [i for i in tl.pending() if i.action != Action.ROLLBACK]
        if instant is not None:
            named = [i for i in targets if i.timestamp == instant]
            if not named:
                found = tl.find(instant)
                if found is not None and found.is_completed:
                    raise BadInputError(f"instant {instant} is completed; only pending instants can be rolled back")
                if found is None and instant not in {i.timestamp for i in tl.completed([Action.ROLLBACK])}:
                    raise BadInputError(f"no pending instant {instant} in {self.uri}")
                return []
            targets = named
        done = []
        for target in targets:
            if not force and is_alive(self.io, self.layout, target.timestamp):
                raise WriterAliveError(
                    f"instant {target.timestamp}.{target.action} has a live writer; "
                    f"wait for it to finish or stop it (rollback --force overrides)"
                )
            files = self.marked_files(target.timestamp)
            log.info("rolling back %s: %d marked files", target, len(files))
            plan = {"target": target.timestamp, "target_action": target.action, "files": files}
            rb = tl.create_requested(Action.ROLLBACK, plan)
            self._finish_rollback(rb, plan)
            done.append(target.timestamp)
        return done

    def _finish_rollback(self, rb: Instant, plan: dict[str, Any]) -> None:
        tl = self.timeline
        if rb.state == State.REQUESTED:
            rb = tl.transition_to_inflight(rb)
        target_ts = plan["target"]
        for rel in plan["files"]:
            self.io.delete(self.abs(rel))
            maybe_crash("rollback_after_delete")
        # files marked after the plan was made (a writer that was still finishing a task)
        for rel in self.marked_files(target_ts):
            self.io.delete(self.abs(rel))
        self.io.delete_dir(self.layout.marker_dir(target_ts))
        self.io.delete(self.layout.heartbeat_file(target_ts))
        target = Instant(target_ts, plan["target_action"], State.REQUESTED)
        tl.delete_pending(target)
        tl.complete(rb, {"action": Action.ROLLBACK, "rolled_back": target_ts, "deleted_files": plan["files"]})

    # -- description -----------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Everything ``bucketindex show`` prints, as data."""
        assert self.config is not None
        tl = self.timeline.reload()
        view = self.view()
        commits = []
        for inst in tl.completed():
            meta = tl.read_metadata(inst)
            commits.append(
                {
                    "instant": inst.timestamp,
                    "action": inst.action,
                    "batch_id": meta.get("batch_id"),
                    "counts": meta.get("counts", {}),
                    "timings_ms": meta.get("timings_ms", {}),
                }
            )
        return {
            "uri": self.uri,
            "config": {
                "record_key_fields": self.config.record_key_fields,
                "partition_fields": self.config.partition_fields,
                "precombine_field": self.config.precombine_field,
                "index_type": self.config.index_type,
                "num_buckets": self.num_buckets(view),
            },
            "timeline": commits,
            "pending": [str(i) for i in tl.pending()],
            "file_groups": len(view.file_groups),
            "rows": view.num_rows,
            "partitions": view.partitions(),
            "index_buckets": {b: len(files) for b, files in sorted(view.index_files.items())},
        }

