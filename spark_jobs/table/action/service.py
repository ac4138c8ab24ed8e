"""Table services as actions on the timeline: a plan is scheduled, and executed later or at once.

Every service -- data compaction now; index compaction, clean and the others of the table
services -- is the same two steps, as in Hudi's ``table/action``:

* **schedule** writes ``<instant>.<action>.requested`` with the plan (what to read, what to
  replace). A plan is durable: it has no heartbeat, writers' automatic rollbacks leave it
  alone, and it can be executed by another process, on another day;
* **execute** resumes the plan (:meth:`Transaction.resume`), lets the service's Spark job
  write its files under the instant's markers, and commits through the same conflict check
  and commit point as every write. Executing a completed plan is a no-op; executing after a
  crash writes new files under a new attempt token, and the commit's marker cleanup deletes
  the crashed attempt's files. A failed attempt deletes its own files and keeps the plan.

Which services may run beside which writes is the matrix in ``docs/format.md`` §4.5
(:data:`spark_jobs.table.action.conflict.MATRIX`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from spark_jobs.exceptions import BadInputError, ConflictError, InstantRolledBackError, WriterAliveError
from spark_jobs.table.action.rollback import rollback
from spark_jobs.table.action.transaction import Transaction, reserve
from spark_jobs.table.commit import Written
from spark_jobs.table.heartbeat import owner_info
from spark_jobs.table.table import is_writer_alive, pending_plans
from spark_jobs.table.timeline import Action, Instant, InstantConflictError, State
from spark_jobs.table.faults import maybe_crash

if TYPE_CHECKING:
    from spark_jobs.table.table import Table

__all__ = ["schedule", "execute", "execute_waiting", "Executed", "rehash_after"]

log = logging.getLogger("bucketindex.service")


def schedule(table: "Table", action: str, plan: dict[str, Any]) -> Instant:
    """Write ``plan`` as a requested ``action`` instant (reserved as every instant is:
    :func:`~.transaction.reserve`); returns it."""
    assert action in Action.SERVICES, action
    maybe_crash("schedule_after_plan")
    inst = reserve(table, action, {**plan, "scheduled_by": owner_info()})
    log.info("scheduled %s %s", action, inst.timestamp)
    maybe_crash("schedule_after_requested")
    return inst


@dataclass
class Executed:
    instant: str
    #: the plan had completed already (by an earlier or a concurrent attempt): nothing was done
    noop: bool
    metadata: dict[str, Any]


def execute(table: "Table", instant: str, action: str, run: Callable[[Transaction], Written], *,
            heartbeat_timeout_s: float | None = None) -> Executed:
    """Execute the scheduled plan ``instant``: ``run`` writes the files and reports them.

    BadInputError (exit 2): no such plan, another action's, or cancelled before this run
    (final: a retry cannot help). WriterAliveError (exit 3): an attempt at it is running.
    ConflictError (exit 3): an action completed since it was planned makes it invalid (a
    rehash), or it was cancelled while it ran; a retry then finds it cancelled (exit 2).
    """
    tl = table.timeline.reload()
    if instant in tl.aborted:  # final: running it again cannot help (a scheduler must not retry it)
        raise BadInputError(f"{action} {instant} was cancelled (rolled back, e.g. by a rehash that changed the "
                            f"bucket count) before it ran; schedule a new one")
    inst = tl.find(instant)  # a plan completed long ago is found in the archive
    if inst is not None and inst.is_completed:
        log.info("%s %s is already completed: nothing to do", action, instant)
        return Executed(instant, True, tl.read_metadata(inst))
    if inst is None:
        raise BadInputError(f"no scheduled {action} {instant} in {table.uri}")
    if inst.action != action:
        raise BadInputError(f"instant {instant} is a {inst.action}, not a {action}")
    if inst.state == State.INFLIGHT and is_writer_alive(table, inst, heartbeat_timeout_s):
        raise WriterAliveError(f"busy: {action} {instant} is being executed by a live process")
    cancelled = _cancel_if_rehashed(table, inst)
    if cancelled:
        raise ConflictError(cancelled)
    if inst.state == State.INFLIGHT:
        log.info("%s %s: resuming after a failed or crashed attempt", action, instant)
    txn = Transaction.resume(table, inst)
    try:
        # a plan is fixed: no retry on a new snapshot can help it; a conflict cancels it (run())
        metadata = txn.run(lambda view, retries: run(txn), max_retries=0, what=f"{action} {instant}",
                           give_up=f"{action} {instant} was cancelled, schedule a new one").metadata
    except InstantConflictError:  # a concurrent attempt committed the same plan first (run() aborted ours)
        done = table.timeline.reload().find(instant)
        assert done is not None
        return Executed(instant, True, table.timeline.read_metadata(done))
    except InstantRolledBackError as e:
        # cancelled while it ran (a rehash's commit, a `rollback --force`): its tasks stopped
        # with InstantRolledBackError inside an engine's exception, or the commit found it
        raise ConflictError(f"conflict: {action} {instant} was cancelled (rolled back, e.g. by a concurrent "
                            f"rehash) while it ran; nothing was written, schedule a new one") from e
    return Executed(instant, False, metadata)


def _cancel_if_rehashed(table: "Table", inst: Instant) -> str | None:
    """A plan made before a rehash names the old layout's files and can never commit (§4.5):
    cancel it instead of running it, and say why (the rehash cancels such plans after its
    commit point; this covers a rehash that crashed right after it). A clean's plan lists
    files no retained snapshot reads, whatever the layout: it stays."""
    if inst.action == Action.CLEAN:
        return None
    hit = rehash_after(table, int(table.timeline.read_plan(inst).get("snapshot_seq") or 0))
    if hit is None:
        return None
    rollback(table, inst.timestamp, force=True)
    return (f"conflict: {inst.action} {inst.timestamp} was planned before rehash {hit['instant']} changed the "
            f"bucket count; it was cancelled, schedule a new one")


def execute_waiting(table: "Table", action: str, run: Callable[[Transaction], Written], *,
                    heartbeat_timeout_s: float | None = None,
                    select: Callable[[dict[str, Any]], bool] | None = None,
                    limit: int | None = None) -> list[Executed]:
    """Execute, oldest first, the scheduled ``action`` plans no live process is executing: a
    plan whose scheduler died before reporting it, or whose executor crashed. They hold their
    files back from every new plan until they run, so a service runs them before planning.
    ``select(plan)``: only the plans this caller can execute (default: every one); ``limit``:
    at most this many (an upsert's automatic compaction resumes one, to bound its latency)."""
    out: list[Executed] = []
    for inst, plan in pending_plans(table, action):
        if limit is not None and len(out) >= limit:
            break
        if select is not None and not select(plan):
            continue
        if inst.state == State.INFLIGHT and is_writer_alive(table, inst, heartbeat_timeout_s):
            continue  # its executor is at work
        cancelled = _cancel_if_rehashed(table, inst)
        if cancelled:
            log.info("%s", cancelled)
            continue
        try:
            done = execute(table, inst.timestamp, action, run, heartbeat_timeout_s=heartbeat_timeout_s)
        except WriterAliveError:  # another process started it meanwhile
            continue
        log.info("%s %s was waiting for its execution: %s", action, inst.timestamp,
                 "completed meanwhile" if done.noop else "executed")
        out.append(done)
    return out


def rehash_after(table: "Table", seq: int) -> dict[str, Any] | None:
    """The first completed rehash entry after sequence entry ``seq``, or None: a plan made
    before it names the old layout's files. Here, not in :mod:`.rehash`, which cancels such
    plans through this module, so the import goes one way (rehash -> service)."""
    tl = table.timeline
    return next((e for e in tl.entries_after(seq) if e["action"] == Action.REHASH), None)
