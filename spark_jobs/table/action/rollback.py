"""Rollback: abort a pending instant and delete what it wrote, resumably.

A rollback is an instant like any other: ``<rb>.rollback.requested`` holds the plan (the
target and its marked files), and its entry in the commit sequence is the *decision*. The
decision is claimed only after checking that the target has not completed, and a writer
checks for it before claiming its own slot, so a writer and a rollback never both win.
Files are deleted only after the decision, so a rolled-back instant is never published and
a crash at any step leaves work that :func:`repair` finishes (every step is idempotent).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from spark_jobs.exceptions import BadInputError, WriterAliveError
from spark_jobs.table.action.options import POSITIONAL, SWITCH, VerbOptions, check_heartbeat_timeout, option
from spark_jobs.table.commit import CommitMetadata
from spark_jobs.table.commit import parse as parse_commit
from spark_jobs.table.projection import after_commit
from spark_jobs.table.timeline import Action, Instant, SequenceTakenError, State, check_instant
from spark_jobs.table.faults import maybe_crash
from spark_jobs.table.table import is_writer_alive

if TYPE_CHECKING:
    from spark_jobs.table.table import Table

__all__ = ["RollbackOptions", "rollback", "repair", "pending_snapshots"]

log = logging.getLogger("bucketindex.rollback")


@dataclass(frozen=True, kw_only=True)
class RollbackOptions(VerbOptions):
    """The options of ``bucketindex rollback``, validated once: a malformed instant or a
    non-positive heartbeat timeout is one line (exit 2) before the table is touched."""

    VERB = "rollback"

    table: str = option(form=POSITIONAL)
    #: the pending instant to roll back (None: every abandoned one)
    instant: str | None = option(form=POSITIONAL, default=None)
    #: even if its writer looks alive
    force: bool = option("--force", form=SWITCH, default=False)
    heartbeat_timeout_s: float | None = option("--heartbeat-timeout", default=None)

    def __post_init__(self) -> None:
        check_heartbeat_timeout(self.heartbeat_timeout_s)
        if self.instant is not None:
            check_instant(self.instant, option="INSTANT")


def pending_snapshots(table: "Table", timeout_s: float | None = None, *,
                      scheduled: bool = False) -> list[tuple[str, int]]:
    """``(instant, snapshot_seq)`` of the pending instants that still read the snapshot they
    planned on: writes (and table-service executions) whose writer is alive, and with
    ``scheduled`` every table-service plan, which reads its snapshot whenever it runs.
    Archival keeps the entries after these listed; clean keeps the files they read."""
    tl = table.timeline
    out = []
    for inst in tl.pending():
        if inst.action in (Action.ROLLBACK, Action.CLEAN):
            continue
        if not (scheduled and inst.action in Action.SERVICES) and not is_writer_alive(table, inst, timeout_s):
            continue
        try:
            out.append((inst.timestamp, int(tl.read_plan(inst).get("snapshot_seq") or 0)))
        except FileNotFoundError:  # completed or cancelled meanwhile
            continue
    return out


def rollback(table: "Table", instant: str | None = None, *, force: bool = False,
             timeout_s: float | None = None) -> list[str]:
    """Roll back pending instants (every abandoned one, or the one named); returns their timestamps.

    Finishes interrupted rollbacks first. An instant whose writer is alive is left alone
    (named: refused with WriterAliveError) unless ``force``; a forced rollback makes that
    writer fail cleanly at its commit point with nothing visible.
    """
    repair(table)
    tl = table.timeline
    targets = [i for i in tl.pending() if i.action != Action.ROLLBACK]
    if instant is None:
        # a scheduled table-service plan is not abandoned: its next execution resumes it
        # (naming it cancels it)
        targets = [i for i in targets if i.action not in Action.SERVICES]
    if instant is not None:
        named = [i for i in targets if i.timestamp == instant]
        if not named:
            state = tl.state_of(instant)  # an instant older than the checkpoint is looked up
            if state == "aborted":
                return []  # rolled back already
            if state == "completed":
                raise BadInputError(f"instant {instant} is completed; only pending instants can be rolled back")
            raise BadInputError(f"no pending instant {instant} in {table.uri}")
        targets = named
    done = []
    for target in targets:
        if not force and is_writer_alive(table, target, timeout_s):
            if instant is not None:
                raise WriterAliveError(
                    f"busy: instant {target.timestamp}.{target.action} has a live writer; "
                    f"wait for it to finish or stop it (rollback --force overrides)"
                )
            log.info("instant %s has a live writer: left alone", target)
            continue
        files = table.marked_files(target.timestamp)
        log.info("rolling back %s: %d marked files", target, len(files))
        plan = {"target": target.timestamp, "target_action": target.action, "files": files}
        rb = tl.create_requested(Action.ROLLBACK, plan)
        if _decide_and_clean(table, rb, plan):
            done.append(target.timestamp)
    return done


def repair(table: "Table") -> None:
    """Finish what crashed rollbacks and writers left: pending rollbacks, aborted leftovers, stray markers."""
    tl = table.timeline.reload()
    for rb in tl.pending([Action.ROLLBACK]):
        _decide_and_clean(table, rb, tl.read_plan(rb))
    for inst in tl.aborted_leftovers():
        _clean(table, inst.timestamp, inst.action, [])
    # List first, then reload: a writer creates its plan before its markers and heartbeat,
    # so any instant listed here that is still being written shows up as pending below.
    marker_dirs = [n for n in table.io.list_names(table.layout.markers) if not n.startswith(".")]
    beats = [n for n in table.io.list_names(table.layout.heartbeats) if not n.startswith(".")]
    tl.reload()
    for ts in marker_dirs:
        state = tl.state_of(ts)  # looks into old history only for a marker dir it cannot place
        if state == "completed":  # crashed after its commit point, before cleanup
            inst = tl.find(ts)
            assert inst is not None
            table.finalize_markers(ts, tl.read_commit(inst).referenced_files())
        elif state == "aborted":  # files a rolled-back writer wrote after the rollback's cleanup
            table.delete_marked(ts)
    for ts in beats:
        if tl.is_completed(ts) or ts in tl.aborted:
            table.io.delete(table.layout.heartbeat_file(ts))


def referenced_files(meta: "Mapping[str, Any] | CommitMetadata") -> set[str]:
    """Every data and index file a completed action's metadata names."""
    return parse_commit(meta).referenced_files()


def _decide_and_clean(table: "Table", rb: Instant, plan: dict[str, Any]) -> bool:
    """Claim the rollback decision for ``plan["target"]`` unless it completed; then delete its files."""
    tl = table.timeline
    target = plan["target"]
    claimed: int | None = None  # the sequence entry this process wrote, if it decided
    while True:
        tl.reload()
        if tl.is_completed(target):  # its writer won: nothing to roll back, drop our plan
            log.info("instant %s completed before the rollback could decide; nothing rolled back", target)
            tl.delete_pending(rb)
            return False
        if target in tl.aborted:  # decided: finishing its cleanup is safe
            # by another rollback: ours is not needed; by this one, completed by another process
            # finishing it too (both found it pending): its entry stays, nothing to remove
            if not tl.is_completed(rb.timestamp):
                tl.delete_pending(rb)
            break
        # the decision: its own protocol (no Transaction), with typed metadata as every commit's
        meta = CommitMetadata(action=Action.ROLLBACK, instant=rb.timestamp, rolled_back=target,
                              target_action=plan["target_action"], deleted_files=tuple(plan["files"]))
        try:
            claimed = tl.append(rb, meta.to_json(), seq=tl.last_seq + 1).seq
            break
        except SequenceTakenError:
            continue
    _clean(table, target, plan["target_action"], plan["files"])
    if claimed is not None:
        # the decision is a sequence entry like a commit's, so a mirrored table gets its Delta
        # version now (a commitInfo only: a rollback changes no published file), not at the
        # next commit; Delta version == sequence number (format.md §11)
        after_commit(table, claimed, properties=table.view().properties,
                     fault_point="after_rollback_before_mirror")
    return True


def _clean(table: "Table", target: str, action: str, files: list[str]) -> None:
    if files:
        table.delete_files(files)  # never outside the root; a file never created is fine
        maybe_crash("rollback_after_delete")
    table.delete_marked(target)  # files marked after the plan (a writer still finishing a task)
    table.io.delete(table.layout.heartbeat_file(target))
    table.timeline.delete_pending(Instant(target, action, State.REQUESTED))
