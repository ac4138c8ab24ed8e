"""The write protocol of every action, in one object: a job says what it wrote, this commits it.

A :class:`Transaction` owns the steps a writer used to walk by hand: pick an instant time
(a same-millisecond collision picks again and touches nothing of the other writer's),
write the plan with its owner, start the heartbeat, go inflight, and at the end check every
action completed since its snapshot against what it wrote (:mod:`.conflict`) and claim the
next commit-sequence slot -- atomically with that check, because a slot taken meanwhile
sends it back to check the newcomer. After the commit point it deletes files of failed task
attempts and stops the heartbeat. On a conflict the job calls :meth:`rebase` and writes
again on the new snapshot under the same instant; on failure :meth:`abort` removes every
trace. As pyiceberg's ``Transaction`` and delta-rs's commit builder, it keeps the protocol
out of the jobs.

:meth:`run` is that loop, the retry policy of every action: the job passes a function that
writes one attempt on a snapshot and reports what it wrote (:class:`~spark_jobs.table.commit.Written`);
``run`` rolls back abandoned instants first (``repair=True``), begins, builds the commit's
:class:`~spark_jobs.table.commit.CommitMetadata` from the report, commits, rebases and retries on a
conflict, gives up (:class:`ConflictError`, exit 3, one message) after ``max_retries``, and aborts
on any failure. Every way a commit can lose ends retryable. :func:`reserve` is the one place an
instant time is reserved, for a write (:meth:`Transaction.begin`) and a table service's plan
(``service.schedule``) alike.
"""

from __future__ import annotations

import json
import logging
import posixpath
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from spark_jobs.exceptions import ConflictError, InstantRolledBackError, RetryableError
from spark_jobs.table.action.checkpoint import maybe_checkpoint
from spark_jobs.table.action.conflict import Conflict, WriteSet, find_conflict
from spark_jobs.table.action.rollback import referenced_files, rollback
from spark_jobs.table.commit import CommitMetadata, Written
from spark_jobs.table.commit import parse as parse_commit
from spark_jobs.table.projection import after_commit
from spark_jobs.table.heartbeat import Heartbeat, owner_info
from spark_jobs.table.timeline import Action, Instant, InstantConflictError, SequenceTakenError, State
from spark_jobs.table.view import FileSystemView
from spark_jobs.table.faults import maybe_crash

if TYPE_CHECKING:
    from spark_jobs.table.table import Table

__all__ = ["Transaction", "CommitConflict", "Committed", "reserve", "repair_abandoned"]

log = logging.getLogger("bucketindex.transaction")

#: how many instant times to try when other writers keep taking the same millisecond
MAX_INSTANT_ATTEMPTS = 20
#: actions that record the snapshot their commit was written on (a table service's is in its plan)
RECORDS_SNAPSHOT = (Action.COMMIT, Action.BOOTSTRAP, Action.REHASH)
#: actions that write again on a new snapshot after a conflict, and record each retry
RECORDS_CONFLICTS = (Action.COMMIT, Action.BOOTSTRAP)


def reserve(table: "Table", action: str, plan: Mapping[str, Any]) -> Instant:
    """Write ``plan`` as a new requested ``action`` instant at a fresh instant time.

    Two writers that pick the same millisecond both try to create the same plan file; the
    loser picks another time and touches nothing of the winner's. RetryableError (exit 3)
    when ``MAX_INSTANT_ATTEMPTS`` times in a row were taken."""
    tl = table.timeline
    for _ in range(MAX_INSTANT_ATTEMPTS):
        ts = tl.new_instant_time()
        try:
            return tl.create_requested(action, dict(plan), timestamp=ts)
        except InstantConflictError:
            log.info("instant time %s was taken by another writer; picking another", ts)
    raise RetryableError(f"could not reserve an instant time in {MAX_INSTANT_ATTEMPTS} tries; try again")


def repair_abandoned(table: "Table", *, timeout_s: float | None = None) -> list[str]:
    """Roll back the instants of writers that died before their commit point (and finish
    interrupted rollbacks), as every writer does before it writes: their plans would hold
    clean and compaction back, and their files are garbage. Live writers go on. Returns the
    instants rolled back."""
    repaired = rollback(table, timeout_s=timeout_s)
    if repaired:
        log.info("rolled back abandoned instants %s", ", ".join(repaired))
    return repaired


class CommitConflict(Exception):
    """An action completed since the snapshot conflicts with this one: rebase and write again."""

    def __init__(self, conflict: Conflict) -> None:
        self.conflict = conflict
        super().__init__(str(conflict))


@dataclass
class Committed:
    """What :meth:`Transaction.run` committed."""

    #: the completed instant; None when a concurrent writer already applied the batch
    instant: Instant | None
    #: what was committed, as written to the timeline ({} when already applied)
    metadata: dict[str, Any]
    #: one per conflict: ``{"attempt": n, "with": ts, "with_action": action, "reason": text}``
    retries: list[dict[str, Any]]
    #: the concurrent instant that already applied this batch (an ``already_applied`` conflict)
    applied_by: str | None = None


class Transaction:
    """One action on the timeline from plan to commit point.

    :param view: the snapshot the caller already planned on (validation needs it before
        anything is written); built here when omitted. Every action completed after it is
        checked at commit.
    :param repair: :meth:`begin` first rolls back abandoned instants (:func:`repair_abandoned`),
        and takes the snapshot again when it rolled one back: what every writer does before it
        writes. Off for the bare protocol (tests, a resumed service).
    :param heartbeat_timeout_s: how long a silent writer counts as alive for that repair.
    """

    def __init__(self, table: "Table", action: str, plan: dict[str, Any], *,
                 view: FileSystemView | None = None, repair: bool = False,
                 heartbeat_timeout_s: float | None = None) -> None:
        self.table = table
        self.action = action
        self.plan = plan
        self.view = view
        self.repair = repair
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.instant: Instant | None = None
        self.conflicts: list[Conflict] = []
        self._heartbeat: Heartbeat | None = None
        #: a resumed table-service plan (:meth:`resume`): its files carry this attempt's token,
        #: and a failed attempt removes only its own files and keeps the plan
        self.attempt: str | None = None

    @property
    def ts(self) -> str:
        assert self.instant is not None, "begin() first"
        return self.instant.timestamp

    # -- protocol --------------------------------------------------------------------
    def begin(self) -> "Transaction":
        tl = self.table.timeline
        if self.repair and repair_abandoned(self.table, timeout_s=self.heartbeat_timeout_s):
            self.view = None  # the rollbacks are entries after it: plan on the snapshot after them
        if self.view is None:
            self.view = self.table.view()
        # snapshot_seq: archival keeps the entries after it listed, clean keeps its files
        inst = reserve(self.table, self.action, {**self.plan, "owner": owner_info(), "snapshot_seq": self.view.seq})
        self.instant = inst
        self._heartbeat = Heartbeat(self.table.io, self.table.layout, inst.timestamp).start()
        maybe_crash("after_requested")
        self.instant = tl.transition_to_inflight(inst)
        return self

    @classmethod
    def resume(cls, table: "Table", instant: Instant) -> "Transaction":
        """Execute a scheduled plan (a table service): the instant exists, requested or left
        inflight by a crashed attempt.

        Another attempt's files are never deleted here: a crashed attempt's files are only
        unreferenced garbage that the commit's marker cleanup removes, and a concurrent
        attempt's files may be the ones that win. Each attempt names its files with its own
        token (:attr:`attempt`), so two attempts never write the same path.
        """
        txn = cls(table, instant.action, table.timeline.read_plan(instant), view=table.view())
        txn.instant = instant
        txn.attempt = uuid.uuid4().hex[:8]
        txn._heartbeat = Heartbeat(table.io, table.layout, instant.timestamp).start()
        if instant.state == State.REQUESTED:
            try:
                txn.instant = table.timeline.transition_to_inflight(instant)
            except InstantConflictError:  # another attempt started it meanwhile; the commit point decides
                txn.instant = Instant(instant.timestamp, instant.action, State.INFLIGHT)
        return txn

    def rebase(self) -> FileSystemView:
        """Discard this attempt's files and take the latest snapshot; the instant stays."""
        self._delete_own_files()
        self.view = self.table.view()
        return self.view

    def metadata(self, written: Written, *, batch_id: str | None = None,
                 retries: list[dict[str, Any]] | None = None) -> CommitMetadata:
        """The commit's metadata for an attempt's report on the current snapshot: the action,
        this instant, ``batch_id``, the snapshot (:data:`RECORDS_SNAPSHOT`) and the conflicts
        retried so far (:data:`RECORDS_CONFLICTS`) with what the action reported."""
        assert self.instant is not None and self.view is not None, "begin() first"
        return CommitMetadata.of(
            written, action=self.action, instant=self.ts, batch_id=batch_id,
            snapshot_seq=self.view.seq if self.action in RECORDS_SNAPSHOT else None,
            conflicts=list(retries or []) if self.action in RECORDS_CONFLICTS else None)

    def commit(self, metadata: "CommitMetadata | Mapping[str, Any]") -> Instant:
        """Check concurrent actions and claim the next sequence slot: the commit point.

        ``metadata``: built by :meth:`metadata` (what :meth:`run` commits); a mapping is
        committed as it is (the bare protocol's tests).
        Raises :class:`CommitConflict` (rebase and retry, or give up) and
        :class:`InstantRolledBackError` (a rollback aborted this instant).
        """
        assert self.instant is not None and self.view is not None, "begin() first"
        if isinstance(metadata, CommitMetadata):
            metadata = metadata.to_json()
        mine = WriteSet.of(self.action, metadata)
        tl = self.table.timeline
        checked = self.view.seq
        started = time.perf_counter()
        own_entries: dict = {}  # this action's index deltas, read once for every entry checked
        # the table properties after the commit (the post-commit hooks ask them): the snapshot's,
        # then those of every entry committed since, then this commit's
        properties = dict(self.view.properties)
        while True:
            tl.reload()
            if self.ts in tl.aborted:
                raise InstantRolledBackError(
                    f"conflict: instant {self.ts} was rolled back by another process; nothing was written"
                )
            if tl.is_completed(self.ts):  # a concurrent attempt at the same plan won
                raise InstantConflictError(f"instant {self.ts}.{self.action} was completed by another attempt")
            for entry in tl.entries_after(checked):
                if entry["action"] == Action.ROLLBACK and entry["metadata"].get("rolled_back") == self.ts:
                    raise InstantRolledBackError(  # also when the decision is older than the checkpoint
                        f"conflict: instant {self.ts} was rolled back by another process; nothing was written")
                conflict = find_conflict(mine, entry, self.table.io, self.table.layout, own_entries)
                if conflict is not None:
                    self.conflicts.append(conflict)
                    raise CommitConflict(conflict)
                if entry["action"] in Action.WRITES:
                    properties.update(parse_commit(entry["metadata"]).properties or {})
            checked = tl.last_seq
            maybe_crash("after_conflict_check")
            try:
                done = tl.append(self.instant, metadata, seq=checked + 1)
                break
            except SequenceTakenError:
                log.info("sequence slot %d was taken by another action; checking it", checked + 1)
        self.check_ms = int((time.perf_counter() - started) * 1000)
        self.instant = done
        maybe_crash("after_complete")
        self.table.finalize_markers(done.timestamp, referenced_files(metadata))
        self._stop_heartbeat()
        maybe_checkpoint(self.table)
        properties.update(parse_commit(metadata).properties or {})
        # the projections the table asks for (Delta, Iceberg); never fails the commit
        after_commit(self.table, done.seq, properties=properties)
        return done

    def run(self, attempt: Callable[[FileSystemView, list[dict[str, Any]]], "Written | Mapping[str, Any]"], *,
            max_retries: int, batch_id: str | None = None, what: str = "the write",
            give_up: str | None = None) -> Committed:
        """The retry policy: write an attempt, commit it, and on a conflict rebase and write again.

        ``attempt(view, retries)`` writes one attempt's files (under this instant's markers)
        on the snapshot ``view`` and reports them (:class:`Written`); the commit's metadata is
        :meth:`metadata` of that report (a mapping is committed as it is: the bare protocol's
        tests). ``retries`` holds one record per conflict so far (``{"attempt", "with",
        "with_action", "reason"}``). :meth:`begin` is called first unless the instant exists
        (a resumed table service).

        * a conflict with a concurrent commit of the same batch: the instant is aborted and
          the result has ``instant`` None and ``applied_by`` that commit;
        * any other conflict: :meth:`rebase` and try again, up to ``max_retries`` times; then
          a conflict note for ``show`` (:meth:`record_give_up`) and :class:`ConflictError`:
          ``conflict: <the conflict>; <give_up>``, by default that it gave up after so many
          attempts and how to retry. A resumed table-service plan that conflicts can never
          commit (a plan is fixed): it is cancelled (rolled back) after the abort;
        * any failure (the callback's, the commit's, the give-up): :meth:`abort`, and when
          another process rolled the instant back meanwhile, :class:`InstantRolledBackError`
          in its place. A resumed service keeps its plan (:meth:`abort`).

        ``batch_id`` goes into the conflict note and the give-up message; ``what`` names the
        action in the log and in the message when there is no batch id.
        """
        retries: list[dict[str, Any]] = []
        gave_up = False
        try:
            if self.instant is None:
                self.begin()
            while True:
                assert self.view is not None
                report = attempt(self.view, retries)
                metadata = (self.metadata(report, batch_id=batch_id, retries=retries).to_json()
                            if isinstance(report, Written) else dict(report))
                try:
                    done = self.commit(metadata)
                except CommitConflict as c:
                    conflict = c.conflict
                    if conflict.already_applied:
                        log.info("%s: batch %s was committed by a concurrent writer (%s): nothing to do", self.ts,
                                 batch_id, conflict.instant)
                        self.abort()
                        return Committed(None, {}, retries, applied_by=conflict.instant)
                    retries.append({"attempt": len(retries) + 1, "with": conflict.instant,
                                    "with_action": conflict.action, "reason": conflict.reason})
                    if len(retries) > max_retries:
                        self.record_give_up(batch_id, len(retries))
                        gave_up = True
                        if give_up is None:
                            again = "retry with the same batch id" if batch_id is not None else f"run {what} again"
                            give_up = (f"gave up after {len(retries)} attempts (--max-retries {max_retries}); "
                                       f"nothing was written, {again}")
                        raise ConflictError(f"conflict: {conflict}; {give_up}") from None
                    log.warning("%s: attempt %d of %s conflicts with %s: %s; writing again on the new snapshot",
                                self.ts, len(retries), what, conflict.instant, conflict.reason)
                    self.rebase()
                    continue
                return Committed(done, metadata, retries)
        except BaseException as e:
            rolled_back = self.was_rolled_back()
            ts = self.instant.timestamp if self.instant is not None else None
            self.abort()
            if gave_up and self.attempt is not None and ts is not None:  # a fixed plan that cannot commit
                rollback(self.table, ts, force=True)
            if rolled_back and not isinstance(e, InstantRolledBackError):
                raise InstantRolledBackError(
                    f"conflict: instant {ts} was rolled back by another process while it was writing; "
                    f"nothing was written"
                ) from e
            raise

    def abort(self) -> None:
        """Remove every trace of an instant that will not complete.

        Only this transaction could complete its instant, so no rollback decision is
        needed: delete the marked files, then the plan. A crash half-way leaves a pending
        instant without a heartbeat, which the next writer or ``rollback`` repairs.
        """
        self._stop_heartbeat()
        if self.instant is None:
            return
        tl = self.table.timeline.reload()
        if tl.is_completed(self.ts):
            return
        self._delete_own_files()
        if self.attempt is not None:  # a table service: the plan stays for the next attempt
            return
        tl.delete_pending(self.instant)

    def was_rolled_back(self) -> bool:
        return self.instant is not None and self.ts in self.table.timeline.reload().aborted

    def record_give_up(self, batch_id: str | None, attempts: int) -> None:
        """Leave a note for ``show`` (recent conflicts) when the retries ran out; no data trace."""
        note = {"instant": self.ts if self.instant else None, "batch_id": batch_id, "attempts": attempts,
                "at": time.time(), "conflicts": [c.__dict__ for c in self.conflicts]}
        try:
            self.table.io.write_atomic(self.table.layout.conflict_file(self.ts), json.dumps(note).encode())
        except OSError:  # a note is not worth failing over
            log.warning("could not record the conflict note", exc_info=True)

    # -- helpers ---------------------------------------------------------------------
    def _delete_own_files(self) -> None:
        if self.attempt is None:
            self.table.delete_marked(self.ts)
            return
        # a resumed service: only this attempt's files (a concurrent attempt's may be the ones that win)
        for rel in self.table.marked_files(self.ts):
            if self.attempt in posixpath.basename(rel):
                self.table.delete_file(rel)

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop(delete=True)
            self._heartbeat = None

    def __enter__(self) -> "Transaction":
        return self.begin() if self.instant is None else self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
