"""Timeline checkpoints and archival: opening a table costs O(1) in history length.

Every job, CLI run and sensor poke opens the table by building its file-system view. Without
checkpoints that replays every completed instant's metadata: after a year of hourly commits
~9,000 JSON files before any work starts. So, as Delta's log does:

* **checkpoint** (every ``checkpoint_interval`` completed entries, default 10): the view after
  entry ``n`` written atomically as ``checkpoints/<n>.json`` (with the completion state of
  the instants whose plan files are still listed, the newest instant time, the retention
  of the latest clean) and the batch ids committed so far in ``<n>.batches.json``, read
  only to check idempotence. A timeline opens from the latest checkpoint that parses and
  reads only the entries after it; a torn checkpoint is skipped for the previous one.
* **archival**: sequence entries up to the *previous* checkpoint -- and never past the
  snapshot of a live writer, whose conflict check reads the entries after it -- are copied
  into one ``archive/<first>-<last>.json`` (entries and their plans, atomically), and only
  then deleted from ``sequence/`` and ``timeline/``, in chunks of at least
  :data:`ARCHIVE_MIN_ENTRIES`, so both directories stay a bounded size. Time travel and the
  rare question about old history read the archive.

Both are idempotent and crash-safe at every step (format.md §3.5): a crash leaves a
checkpoint that is not there yet (the next commit writes it), or an archive file whose
entries are still also in ``sequence/`` (the next archival deletes them). Both run after a
commit point and never fail the commit that triggered them.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from spark_jobs.io.filesystem import InstantExistsError
from spark_jobs.table.action.rollback import pending_snapshots
from spark_jobs.table.config import DEFAULT_CHECKPOINT_INTERVAL
from spark_jobs.table.timeline import (
    CHECKPOINT_FORMAT,
    Action,
    Instant,
    State,
    Timeline,
    checkpoint_seqs,
    read_checkpoint,
    read_checkpoint_batches,
)
from spark_jobs.table.view import FileSystemView
from spark_jobs.table.faults import maybe_crash
from spark_jobs.table.table import retention
from spark_jobs.text import plural

if TYPE_CHECKING:
    from spark_jobs.table.table import Table

__all__ = ["maybe_checkpoint", "write_checkpoint", "archive", "checkpoint_seqs", "read_batches",
           "DEFAULT_CHECKPOINT_INTERVAL", "ARCHIVE_MIN_ENTRIES", "describe_checkpoints"]

log = logging.getLogger("bucketindex.checkpoint")

#: archive in chunks of at least this many entries: ``sequence/`` then lists at most about
#: this many plus two checkpoint intervals, and ``timeline/`` twice that (measured: listing
#: is most of what opening a table costs once checkpoints exist); ``archive/`` is listed
#: only by time travel and the rare questions about old history
ARCHIVE_MIN_ENTRIES = 30
#: of the checkpoints archival retires, one per this many entries moves to
#: ``archive/checkpoints/`` as a starting point for time travel; the others are deleted
TRAVEL_CHECKPOINT_EVERY = 100


def maybe_checkpoint(table: "Table", *, interval: int | None = None) -> int | None:
    """After a commit point: checkpoint when ``interval`` entries completed since the last
    checkpoint, then archive. Returns the checkpoint's seq, or None. Never raises: the commit
    that called it is already visible, and a missing checkpoint only costs the next opener."""
    assert table.config is not None
    interval = interval or table.config.checkpoint_interval
    tl = table.timeline
    if tl.last_seq - tl.base_seq < interval:
        return None
    try:
        seq = write_checkpoint(table, tl.last_seq)
        archive(table)
        return seq
    except Exception:  # noqa: BLE001 - see the docstring
        log.warning("could not write a timeline checkpoint (the table is fine; the next commit tries again)",
                    exc_info=True)
        return None


def write_checkpoint(table: "Table", seq: int) -> int:
    """Write the checkpoint after entry ``seq`` (idempotent: an existing one is kept)."""
    tl = table.timeline
    if read_checkpoint(table.io, table.layout, seq) is not None:
        return seq
    started = time.perf_counter()
    view = FileSystemView.at_seq(tl, seq)
    batches = _batches_upto(table, tl, seq)
    _create(table, table.layout.checkpoint_batches_file(seq), batches)
    maybe_crash("checkpoint_before_write")
    entries = [tl.entry(n) for n in range(tl.base_seq + 1, seq + 1)]
    previous = tl.checkpoint or {}
    max_instant = max([previous.get("max_instant", ""), *(e["instant"] for e in entries)])
    clean = previous.get("clean")
    for e in entries:
        if e["action"] == Action.CLEAN:
            clean = retention(e["instant"], e["metadata"])
    ckpt = {
        "format": CHECKPOINT_FORMAT,
        "seq": seq,
        "instant": tl.entry(seq)["instant"],
        "max_instant": max_instant,
        "written_at": time.time(),
        "view": view.to_state(),
        "done_with_plans": tl.done_with_plans(seq),
        "clean": clean,
        "complete": True,  # last: a torn file never parses to a checkpoint that claims completeness
    }
    _create(table, table.layout.checkpoint_file(seq), ckpt)
    tl.adopt_checkpoint(seq, ckpt)  # this handle's next reload need not list checkpoints/ to find it
    log.info("checkpoint at entry %d (%s, %s) in %d ms", seq, plural(len(view.file_groups), "file group"),
             plural(len(view.index_files), "index bucket"), int((time.perf_counter() - started) * 1000))
    return seq


def _create(table: "Table", path: str, payload: dict[str, Any]) -> None:
    try:
        table.io.create_exclusive(path, json.dumps(payload, separators=(",", ":"), default=str).encode())
    except InstantExistsError:  # another process wrote the same checkpoint first
        pass


def read_batches(table: "Table", seq: int) -> dict[str, list[Any]] | None:
    """``batch id -> [instant, seq, action]`` of every commit up to checkpoint ``seq``, or None
    if unreadable (:func:`~spark_jobs.table.timeline.read_checkpoint_batches`)."""
    return read_checkpoint_batches(table.io, table.layout, seq)


def _batches_upto(table: "Table", tl: Timeline, seq: int) -> dict[str, list[Any]]:
    start = tl.base_seq if tl.base_seq <= seq else 0
    batches = read_batches(table, start) if start else {}
    if batches is None:  # the previous sidecar is unreadable: rebuild from the whole history
        start, batches = 0, {}
    for n in range(start + 1, seq + 1):
        e = tl.entry(n)
        b = e["metadata"].get("batch_id")
        if b is not None and e["action"] in (Action.COMMIT, Action.BOOTSTRAP):
            batches[str(b)] = [e["instant"], n, e["action"]]
    return batches


def archive(table: "Table", *, min_entries: int = ARCHIVE_MIN_ENTRIES,
            heartbeat_timeout_s: float | None = None) -> tuple[int, int] | None:
    """Move old sequence entries and their plan files into one archive file; returns its range."""
    tl = table.timeline.reload()
    readable: list[int] = []  # the newest two that parse (older ones are not opened: O(1))
    for s in reversed(checkpoint_seqs(table.io, table.layout)):
        if len(readable) == 2:
            break
        if read_checkpoint(table.io, table.layout, s) is not None:
            readable.insert(0, s)
    if len(readable) < 2:
        return None
    # a reader that falls back one checkpoint still finds its entries listed, and a live writer
    # checks the entries after its snapshot for conflicts
    bound = min([readable[-2], *(snap for _, snap in pending_snapshots(table, heartbeat_timeout_s))])
    done = max((last for _, last in tl.archives(refresh=True)), default=0)
    _finish_archived(table, tl, done)
    first = done + 1
    if bound - first + 1 < min_entries:
        _drop_old_checkpoints(table, readable, bound)
        return None
    entries = [tl.entry(n) for n in range(first, bound + 1)]
    plans: dict[str, Any] = {}
    names = set(table.io.list_names(tl.dir))
    for e in entries:
        for state in (State.REQUESTED, State.INFLIGHT):
            name = Instant(e["instant"], e["action"], state).file_name()
            if name in names:
                try:
                    plans[name] = json.loads(table.io.read_bytes(f"{tl.dir}/{name}"))
                except FileNotFoundError:
                    continue
    _create(table, table.layout.archive_file(first, bound),
            {"first": first, "last": bound, "entries": entries, "plans": plans})
    maybe_crash("archive_after_copy")
    # plans of completed instants (pending ones never have an entry); batched (format.md §10)
    table.io.delete_many(f"{tl.dir}/{name}" for name in plans)
    maybe_crash("archive_after_plans")
    table.io.delete_many(table.layout.sequence_file(n) for n in range(first, bound + 1))
    _drop_old_checkpoints(table, readable, bound)
    log.info("archived sequence entries %d..%d (%d plans)", first, bound, len(plans))
    table.timeline.reload()
    return first, bound


def _finish_archived(table: "Table", tl: Timeline, done: int) -> None:
    """An archival that crashed after writing its archive file left entries (and plans) listed:
    delete them now (both are in the archive file already)."""
    listed = [int(n[:20]) for n in table.io.list_names(table.layout.sequence) if n[:20].isdigit()]
    stale = sorted(n for n in listed if n <= done)
    if not stale:
        return
    for first, last in tl.archives():
        if last < stale[0] or first > stale[-1]:
            continue
        data = json.loads(table.io.read_bytes(table.layout.archive_file(first, last)))
        table.io.delete_many(f"{tl.dir}/{name}" for name in data.get("plans", {}))
    table.io.delete_many(table.layout.sequence_file(n) for n in stale)
    log.info("finished an interrupted archival: %d entries removed from sequence/", len(stale))


def _drop_old_checkpoints(table: "Table", readable: list[int], bound: int) -> None:
    """Retire the checkpoints before the archive bound from ``checkpoints/`` (which every open
    lists): one per :data:`TRAVEL_CHECKPOINT_EVERY` entries moves to ``archive/checkpoints/``
    (time travel starts from the nearest), the others and their batch lists (each list is
    cumulative: only the latest is read) are deleted. Copy before delete: a crash leaves the
    checkpoint in both places, which is harmless."""
    kept_blocks = {s // TRAVEL_CHECKPOINT_EVERY for s in checkpoint_seqs(table.io, table.layout, archived=True)}
    doomed: list[str] = []
    for seq in checkpoint_seqs(table.io, table.layout):
        if seq >= bound or seq in readable[-2:]:
            continue
        block = seq // TRAVEL_CHECKPOINT_EVERY
        if block not in kept_blocks:
            try:
                data = table.io.read_bytes(table.layout.checkpoint_file(seq))
                table.io.create_exclusive(table.layout.archived_checkpoint_file(seq), data)
            except InstantExistsError:
                pass
            except FileNotFoundError:  # pragma: no cover - retired by a concurrent archival
                continue
            kept_blocks.add(block)
        doomed += [table.layout.checkpoint_file(seq), table.layout.checkpoint_batches_file(seq)]
    if doomed:  # after every copy: one batch delete (format.md §10)
        table.io.delete_many(doomed)


def describe_checkpoints(table: "Table") -> dict[str, Any]:
    """What ``show`` prints about checkpoints and the archive."""
    tl = table.timeline
    arch = tl.archives(refresh=True)
    assert table.config is not None
    return {
        "interval": table.config.checkpoint_interval,
        "checkpoints": len(checkpoint_seqs(table.io, table.layout)),
        "archived_checkpoints": len(checkpoint_seqs(table.io, table.layout, archived=True)),
        "latest": tl.base_seq or None,
        "latest_instant": (tl.checkpoint or {}).get("instant"),
        "entries_since": tl.last_seq - tl.base_seq,
        "archived_entries": sum(last - first + 1 for first, last in arch),
        "archive_files": len(arch),
        "listed_entries": len(table.io.list_names(table.layout.sequence)),
    }
