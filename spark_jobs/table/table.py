"""The table facade: config, timeline, view and the write/rollback protocol in one place.

Pure Python (pyarrow only): the CLI, Airflow sensors and operators, and Spark executors
all use it to read table state and to follow the commit protocol.

It imports no action: the verbs are functions of ``spark_jobs.table.action`` that take a
``Table`` (``rollback.rollback(table, ...)``, ``clean.run_clean``, ...) and ``show``'s data is
:func:`spark_jobs.table.describe.describe`; the timeline readers both sides need
(:func:`pending_plans`, :func:`retention`, :func:`is_writer_alive`) live here. So the actions
import the table and never the reverse: no import cycle (tests/unit/test_layering.py).
"""

from __future__ import annotations

import json
import logging
import posixpath
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, TypeVar

from spark_jobs.exceptions import (
    BadInputError,
    InstantRolledBackError,
    PathEscapeError,
    TableNotFoundError,
    WriterAliveError,
)
from spark_jobs.io.filesystem import FileIO, refuse_uncommittable, refuse_uncommittable_uri, resolve
from spark_jobs.io.storage import redact_uri
from spark_jobs.table.config import TableConfig
from spark_jobs.table.layout import META_DIR, TableLayout, is_reference
from spark_jobs.table.heartbeat import is_alive
from spark_jobs.table.timeline import Action, Instant, State, Timeline, read_checkpoint_batches, resolve_as_of
from spark_jobs.table.view import FileSystemView

__all__ = ["Table", "TableNotFoundError", "WriterAliveError", "pending_plans", "retention", "is_writer_alive"]

T = TypeVar("T")

log = logging.getLogger(__name__)


class Table:
    def __init__(self, uri: str, io: FileIO, root: str, config: TableConfig | None) -> None:
        self.uri = uri
        # confined to the root: nothing the table writes or deletes -- on the driver or in a
        # Spark task, which opens its own Table -- can lie outside it (format.md §1, "Paths")
        io = io.confined(root)
        self.io = io
        self.root = root
        self.layout = TableLayout(root)
        self.config = config
        self.timeline = Timeline(io, self.layout)

    # -- opening ---------------------------------------------------------------------
    @classmethod
    def open(cls, uri: str) -> "Table":
        """A handle on ``uri`` whether or not a table exists there yet (``config`` is None if not)."""
        refuse_uncommittable_uri(uri)  # by scheme, before a filesystem that may not load is built
        io, root = resolve(uri)
        refuse_uncommittable(io, uri)  # before anything is read or written (format.md §10)
        return cls(uri, io, root, TableConfig.load(io, TableLayout(root).config_file))

    @classmethod
    def load(cls, uri: str) -> "Table":
        t = cls.open(uri)
        if t.config is None:
            raise TableNotFoundError(f"no bucketindex table at {uri} (no .bucketindex/table.json)")
        return t

    @property
    def display_uri(self) -> str:
        """The table's URI as it may be logged, printed or stored: credentials in its query
        redacted (:func:`~spark_jobs.io.storage.redact_uri`). :attr:`uri` keeps them, for the
        tasks that open the table again."""
        return redact_uri(self.uri)

    @property
    def exists(self) -> bool:
        return self.config is not None

    def create(self, config: TableConfig) -> TableConfig:
        self.config = config.create(self.io, self.layout.config_file)
        return self.config

    def require_format(self, version: int, *, why: str) -> None:
        """Raise the table's format version to ``version`` before writing what needs it, so a
        release that does not know it refuses the table instead of misreading it (format.md §9).

        ``table.json`` is otherwise immutable after creation, so every writer that upgrades it
        writes the same bytes: concurrent upgrades cannot lose anything, and a crash after the
        upgrade and before the commit leaves a table that merely claims a feature it may use.
        """
        assert self.config is not None, "a table must exist before its format is upgraded"
        if self.config.format_version >= version:
            return
        current = TableConfig.load(self.io, self.layout.config_file)  # another writer may have upgraded it
        assert current is not None
        new = current.upgraded(version)
        if new is not current:
            self.io.write_atomic(self.layout.config_file, new.to_json())
            log.info("table %s upgraded to format version %d (%s); releases that do not know version %d "
                     "refuse it", self.display_uri, version, why, version)
        self.config = new

    # -- state -----------------------------------------------------------------------
    def view(self, as_of: str | None = None) -> FileSystemView:
        """The snapshot (latest, or as of an instant or an ISO-8601 time: :func:`resolve_as_of`),
        from a fresh listing of the timeline.

        BadInputError when ``as_of`` is neither, when nothing had completed by it, or when it
        is older than what ``clean`` retained (its files may be gone).
        """
        tl = self.timeline.reload()
        if as_of is None:
            return FileSystemView.build(tl)
        seq = resolve_as_of(tl, as_of).seq
        kept = self.retained_from()
        if kept is not None and seq < kept["earliest_retained_seq"]:
            raise BadInputError(
                f"--as-of {as_of} is older than the retained window: clean {kept['instant']} kept the snapshots "
                f"from instant {kept['earliest_retained_instant']} on (see `bucketindex show`; "
                f"`clean --retain-commits/--retain-hours` sets the window)")
        view = FileSystemView.at_seq(tl, seq)
        view.as_of = as_of
        return view

    def missing_files(self, view: FileSystemView, *, references: bool = True) -> list[str]:
        """Absolute paths of the files ``view`` reads (bases and logs) that are not on storage;
        without ``references``, only the table's own (a caller that checks reference files
        itself, e.g. their sizes, asks once per file).

        One existence check per file, so callers ask it when a read already failed or in a
        full check (``validate``): a file deleted outside bucketindex is then named, instead
        of surfacing as an engine's ``PATH_NOT_FOUND``.
        """
        return [self.abs(rel) for s in view.slices() for rel in s.files
                if (references or not is_reference(rel)) and not self.io.exists(self.abs(rel))]

    def retained_from(self) -> dict[str, Any] | None:
        """The retention of the latest clean, completed or pending (its deletions may have
        begun): a clean since the checkpoint, else the one the checkpoint carries; None if none.

        What a read as of an instant checks, so it is the core's (``clean`` plans from it)."""
        tl = self.timeline
        found = [retention(inst.timestamp, plan) for inst, plan in pending_plans(self, Action.CLEAN)]
        last = tl.recent(1, [Action.CLEAN], after_seq=tl.base_seq)
        if last:
            found.append(retention(last[0].timestamp, tl.read_metadata(last[0])))
        elif (tl.checkpoint or {}).get("clean"):
            found.append(tl.checkpoint["clean"])
        return max(found, key=lambda r: r["earliest_retained_seq"], default=None)

    def num_buckets(self, view: FileSystemView | None = None) -> int:
        """The bucket count in force: from the latest completed rehash, else the table config."""
        assert self.config is not None
        v = view if view is not None else self.view()
        return v.num_buckets or self.config.num_buckets

    def commit_for_batch(self, batch_id: str) -> Instant | None:
        """The completed commit of ``batch_id``: the entries after the checkpoint, then the
        checkpoint's batch list (read only now), so idempotence costs O(1) history reads."""
        tl = self.timeline.reload()

        def search(after_seq: int) -> Instant | None:
            return next((inst for inst in reversed(tl.completed([Action.COMMIT, Action.BOOTSTRAP], after_seq=after_seq))
                         if tl.read_metadata(inst).get("batch_id") == batch_id), None)

        found = search(tl.base_seq)
        if found is not None or not tl.base_seq:
            return found
        batches = read_checkpoint_batches(self.io, self.layout, tl.base_seq)
        if batches is None:  # an unreadable sidecar: ask the whole history
            return search(0)
        if batch_id not in batches:
            return None
        ts, seq, action = batches[batch_id]
        return Instant(ts, action, State.COMPLETED, int(seq))

    def pending_for_batch(self, batch_id: str) -> Instant | None:
        """The pending write instant whose plan carries ``batch_id`` (a crashed attempt of that batch)."""
        tl = self.timeline.reload()
        for inst in tl.pending():
            if inst.action != Action.ROLLBACK and tl.read_plan(inst).get("batch_id") == batch_id:
                return inst
        return None

    def abs(self, rel: str) -> str:
        return self.layout.abs(rel)

    def delete_file(self, rel: str) -> bool:
        """Delete the table's file ``rel`` (missing: fine); :meth:`delete_files`' rule. Returns
        whether a delete was attempted."""
        return self.delete_files([rel]) == 1

    def delete_files(self, rels: Iterable[str]) -> int:
        """Delete the table's files ``rels`` (missing ones: fine) in as few requests as the store
        allows (one ``DeleteObjects`` per 1,000 on S3, format.md §10). A path outside the root --
        a reference file, or one an older release recorded outside it -- is never deleted:
        logged and skipped, so a clean or rollback of such a table still completes. Returns how
        many deletes were attempted."""
        paths = []
        for rel in rels:
            try:
                paths.append(self.layout.data_path(rel) if not rel.startswith(f"{META_DIR}/")
                             else self.layout.abs(rel))
            except PathEscapeError as e:
                log.warning("not deleting %s: %s", rel, e)
        if paths:
            self.io.delete_many(paths)
        return len(paths)

    # -- markers ---------------------------------------------------------------------
    def create_marker(self, instant: str, rel_path: str) -> None:
        """Record that ``rel_path`` is about to be written for ``instant`` (before writing it)."""
        self.io.write_bytes(self.layout.marker_file(instant, rel_path), TableLayout.marker_content(rel_path))

    def write_marked(self, instant: str, rel_path: str, write: Callable[[], T], *, snapshot_seq: int) -> T:
        """Write one file of ``instant`` from a task: marker first, then ``write()``, whose result it returns.

        Checked against a rollback before and after (``snapshot_seq``: the sequence position
        the writer planned on): a task that a rollback overtook -- a zombie of a killed
        client, or a writer aborted by ``rollback --force`` -- deletes what it wrote and
        raises :class:`InstantRolledBackError`. The rollback records its decision before it
        lists markers, so either it finds this marker or this check finds the decision.
        """
        if self._rolled_back(instant, snapshot_seq):
            raise InstantRolledBackError(f"instant {instant} was rolled back; task not run")
        self.create_marker(instant, rel_path)
        result = write()
        if self._rolled_back(instant, snapshot_seq):
            # the rollback may have listed the markers before ours: clean as it does (every
            # other task of the instant checks after its write too, so the last one out is clean)
            self.delete_file(rel_path)
            self.delete_marked(instant)
            raise InstantRolledBackError(f"instant {instant} was rolled back while this task wrote {rel_path}; "
                                         "its file is deleted")
        return result

    def delete_marked(self, instant: str) -> None:
        """Delete every file marked for ``instant``, then its markers."""
        self.delete_files(self.marked_files(instant))
        self.io.delete_dir(self.layout.marker_dir(instant))

    def _rolled_back(self, instant: str, snapshot_seq: int) -> bool:
        return Timeline.rolled_back_since(self.io, self.layout, instant, snapshot_seq)

    def marked_files(self, instant: str) -> list[str]:
        d = self.layout.marker_dir(instant)
        out = []
        for name in self.io.list_names(d):
            if not name.endswith(".marker"):
                continue
            target = TableLayout.marker_target(name)
            if target is None:  # a hashed marker holds its path
                try:
                    target = self.io.read_bytes(posixpath.join(d, name)).decode()
                except FileNotFoundError:  # deleted by a concurrent cleanup
                    continue
            out.append(target)
        return out

    def finalize_markers(self, instant: str, keep: set[str]) -> list[str]:
        """After a commit: delete marked files the commit does not reference (failed or
        duplicate task attempts), then the markers. Returns the deleted files."""
        extra = [f for f in self.marked_files(instant) if f not in keep]
        self.delete_files(extra)
        self.io.delete_dir(self.layout.marker_dir(instant))
        return extra

    def writers(self, heartbeat_timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Pending instants with their batch, owner, start, last heartbeat and liveness
        (``heartbeat_timeout_s``: seconds without a beat before a writer counts as dead)."""
        out = []
        for inst in self.timeline.pending():
            try:
                plan = self.timeline.read_plan(inst)
            except FileNotFoundError:
                continue
            try:
                beat = json.loads(self.io.read_bytes(self.layout.heartbeat_file(inst.timestamp)))
            except (OSError, ValueError):
                beat = {}
            owner = plan.get("owner") or plan.get("scheduled_by") or {}
            out.append({
                "instant": inst.timestamp,
                "action": inst.action,
                "state": inst.state.name.lower(),
                "batch_id": plan.get("batch_id"),
                "host": owner.get("host"),
                "pid": owner.get("pid"),
                "started": _iso(owner.get("at")),
                "last_heartbeat": _iso(beat.get("at")),
                "alive": is_writer_alive(self, inst, heartbeat_timeout_s),
                # a table-service plan waiting for its executor is not an abandoned write
                "scheduled": inst.action in Action.SERVICES,
            })
        return out


# -- state the actions share -----------------------------------------------------------
# Readers of the timeline that both ``Table`` and the actions ask. They live here, in the core,
# so the table never imports an action (the actions import the table): no import cycle.

def pending_plans(table: Table, action: str) -> list[tuple[Instant, dict[str, Any]]]:
    """Scheduled, not yet completed plans of ``action`` with their plan, oldest first."""
    out = []
    for inst in table.timeline.reload().pending([action]):
        try:
            out.append((inst, table.timeline.read_plan(inst)))
        except FileNotFoundError:  # cancelled meanwhile
            continue
    return out


def retention(instant: str, fields: dict[str, Any]) -> dict[str, Any]:
    """``{"instant", "earliest_retained_seq", "earliest_retained_instant"}`` of a clean, from
    its plan or its completed metadata (the same fields): what a read as of an instant checks."""
    return {"instant": instant, "earliest_retained_seq": int(fields["earliest_retained_seq"]),
            "earliest_retained_instant": fields.get("earliest_retained_instant")}


def is_writer_alive(table: Table, inst: Instant, timeout_s: float | None = None) -> bool:
    """Whether the process that owns pending ``inst`` still heartbeats (within ``timeout_s``)."""
    try:
        owner = table.timeline.read_plan(inst).get("owner")
    except FileNotFoundError:  # plan removed meanwhile: nothing is writing it any more
        return False
    return is_alive(table.io, table.layout, inst.timestamp, timeout_s, owner=owner)


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(float(epoch), timezone.utc).isoformat().replace("+00:00", "Z")
