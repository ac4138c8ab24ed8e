"""Clean: delete the file versions no retained snapshot reads, from a plan on the timeline.

Copy-on-write upserts leave the previous version of every file group they rewrite;
compaction leaves the logs, deltas and bases it folded. They stay for time travel and for
writers still working on an older snapshot, and nothing else ever deletes them. ``clean``
(format.md §3.6):

* picks the *earliest retained* entry ``R``: the snapshot of the N-th last snapshot-changing
  commit (``--retain-commits``, default from ``table.json``) or the last one completed
  ``--retain-hours`` ago -- never after the snapshot of a live writer or of a scheduled
  compaction plan, whose files it must keep;
* plans exactly the files that were in some snapshot between the previous clean's ``R``
  and this ``R`` but are not in snapshot ``R`` (paths are never reused, so no later
  snapshot can read them either). Files of pending or rolled-back instants were never in a
  snapshot and are never touched: markers and rollback own them;
* schedules a ``clean`` instant listing the files (the plan), deletes them, and completes
  -- through the same schedule/execute framework as compaction
  (:mod:`spark_jobs.table.action.service`). A crash leaves a pending plan that the next
  ``clean`` finishes first (deleting is idempotent). From the moment the plan exists,
  ``read --as-of`` before ``R`` fails with a clear error instead of a missing file.

Clean needs no Spark: it deletes files the plan names, many at a time, from the driver.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any


from spark_jobs.exceptions import BadInputError, PathEscapeError
from spark_jobs.table.action.options import POSITIONAL, SWITCH, VerbOptions, check_heartbeat_timeout, option
from spark_jobs.table.action.rollback import pending_snapshots, referenced_files
from spark_jobs.table.action.service import execute, execute_waiting, schedule
from spark_jobs.table.action.transaction import Transaction
from spark_jobs.table.commit import Written
from spark_jobs.table.commit import parse as parse_commit
from spark_jobs.table.layout import is_reference
from spark_jobs.table.timeline import Action, checkpoint_seqs, utc_stamp
from spark_jobs.table.view import FileSystemView
from spark_jobs.table.faults import maybe_crash
from spark_jobs.table.table import Table, pending_plans
from spark_jobs.text import plural

__all__ = ["CleanOptions", "plan_clean", "run_clean", "describe_clean", "CleanPolicy"]

log = logging.getLogger("bucketindex.clean")


@dataclass(frozen=True, kw_only=True)
class CleanOptions(VerbOptions):
    """The options of ``bucketindex clean``, validated once (one line, exit 2): at most one
    retention rule; the rule's values against the table are :class:`CleanPolicy`'s."""

    VERB = "clean"

    table: str = option(form=POSITIONAL)
    #: keep the snapshots of the last N commits (None: the table's ``clean_retain_commits``)
    retain_commits: int | None = option("--retain-commits", default=None)
    #: ... or of the last H hours
    retain_hours: float | None = option("--retain-hours", default=None)
    #: print what would be deleted; write nothing
    dry_run: bool = option("--dry-run", form=SWITCH, default=False)
    heartbeat_timeout_s: float | None = option("--heartbeat-timeout", default=None)

    def __post_init__(self) -> None:
        if self.retain_commits is not None and self.retain_hours is not None:
            raise BadInputError("--retain-commits and --retain-hours are two retention rules: give one of them")
        check_heartbeat_timeout(self.heartbeat_timeout_s)

#: files deleted per request: what one S3 ``DeleteObjects`` takes (format.md §10)
DELETE_BATCH = 1000


class CleanPolicy:
    """How much history to keep: the last ``retain_commits`` snapshots, or ``retain_hours``."""

    def __init__(self, retain_commits: int | None = None, retain_hours: float | None = None) -> None:
        if retain_commits is not None and retain_hours is not None:
            raise BadInputError("give --retain-commits or --retain-hours, not both")
        if retain_commits is not None and int(retain_commits) < 1:
            raise BadInputError(f"--retain-commits must be at least 1, got {retain_commits}")
        if retain_hours is not None and float(retain_hours) <= 0:
            raise BadInputError(f"--retain-hours must be positive, got {retain_hours}")
        self.retain_commits = None if retain_commits is None else int(retain_commits)
        self.retain_hours = None if retain_hours is None else float(retain_hours)

    @classmethod
    def of(cls, table: "Table", retain_commits: int | None, retain_hours: float | None) -> "CleanPolicy":
        """The options given, else the table's defaults (``table.json``)."""
        assert table.config is not None
        if retain_commits is None and retain_hours is None:
            if table.config.clean_retain_hours is not None:
                return cls(retain_hours=table.config.clean_retain_hours)
            return cls(retain_commits=table.config.clean_retain_commits)
        return cls(retain_commits, retain_hours)

    def as_dict(self) -> dict[str, Any]:
        return {"retain_commits": self.retain_commits, "retain_hours": self.retain_hours}

    def __str__(self) -> str:
        return (f"retain the last {plural(self.retain_commits, 'commit')}" if self.retain_commits is not None
                else f"retain {self.retain_hours:g} hour{'s' * (self.retain_hours != 1)}")


def plan_clean(table: "Table", policy: CleanPolicy, *, heartbeat_timeout_s: float | None = None,
               with_sizes: bool = True) -> dict[str, Any] | None:
    """The plan of a clean now, or None when nothing would be deleted (pure: writes nothing)."""
    tl = table.timeline.reload()
    target = _earliest_retained(table, policy)
    if target is None:
        return None
    held_by = None
    for ts, snap in pending_snapshots(table, heartbeat_timeout_s, scheduled=True):
        if snap < target:
            target, held_by = snap, ts
    prev = table.retained_from()
    prev_seq = prev["earliest_retained_seq"] if prev else 0
    if target <= prev_seq:
        return None
    view = FileSystemView.at_seq(tl, prev_seq)
    seen = view.all_files()
    recorded = _recorded_sizes(view)
    for n in range(prev_seq + 1, target + 1):
        e = tl.entry(n)
        if e["action"] in Action.WRITES:
            seen |= referenced_files(e["metadata"])
            recorded.update(_recorded_sizes(e["metadata"]))
    retained = FileSystemView.at_seq(tl, target).all_files()
    doomed = seen - retained - _pending_files(table)
    # a reference bootstrap's user files are the user's: once replaced they are no longer
    # read, but bucketindex never deletes a file outside the table root (format.md §5.3)
    files = sorted(f for f in doomed if not is_reference(f))
    size = _total_size(table, files, recorded) if with_sizes else None
    return {
        "operation": "clean",
        "earliest_retained_seq": target,
        "earliest_retained_instant": tl.entry(target)["instant"] if target else None,
        "previous_retained_seq": prev_seq,
        "held_back_by": held_by,
        "policy": policy.as_dict(),
        "snapshot_seq": tl.last_seq,
        "files": files,
        "bytes": size,
    }


def _earliest_retained(table: "Table", policy: CleanPolicy) -> int | None:
    tl = table.timeline
    if policy.retain_commits is not None:
        writes = tl.recent(policy.retain_commits, Action.WRITES)
        if len(writes) < policy.retain_commits:
            return None  # fewer snapshots than retained: nothing is old enough
        return writes[0].seq
    assert policy.retain_hours is not None
    cutoff = utc_stamp(seconds_ago=int(policy.retain_hours * 3600))
    seq = tl.seq_as_of(cutoff)  # the snapshot a reader as of the cutoff sees must stay readable
    return seq or None


def _pending_files(table: "Table") -> set[str]:
    """Files named by scheduled plans or marked by pending instants: never deleted by clean."""
    out: set[str] = set()
    for _, plan in pending_plans(table, Action.COMPACTION):
        for g in plan.get("file_groups", []):
            out.add(g["base"])
            out.update(g["logs"])
        for b in plan.get("index_buckets", []):
            out.update(b["files"])
    for inst in table.timeline.pending():
        out.update(table.marked_files(inst.timestamp))
    return out


def _recorded_sizes(source: "FileSystemView | dict[str, Any]") -> dict[str, int]:
    """Sizes the table's metadata records (a view's slices, or one commit's files): sizing a
    clean's files from them costs no request, where a HEAD per file is K requests (format.md §10)."""
    out: dict[str, int] = {}
    if isinstance(source, FileSystemView):
        for fs in source.file_groups.values():
            out[fs.path] = fs.size
            out.update((lf.path, lf.size) for lf in fs.logs if lf.size is not None)
        return out
    meta = parse_commit(source)
    for g in meta.groups:
        if g.path and g.size is not None:
            out[g.path] = int(g.size)
        if g.log is not None and g.log.size is not None:
            out[g.log.path] = int(g.log.size)
    out.update((f.path, int(f.size)) for f in meta.added if f.size is not None)
    return out


def _total_size(table: "Table", files: list[str], recorded: dict[str, int]) -> int:
    """Bytes of ``files``: recorded sizes first, the store asked only for the rest (older
    metadata without sizes) -- in one listing per directory, not a request per file."""
    total = sum(recorded[f] for f in files if f in recorded)
    paths: dict[str, str] = {}
    for rel in files:
        if rel in recorded:
            continue
        try:
            paths[table.abs(rel)] = rel
        except PathEscapeError:  # outside the root: never deleted
            continue
    if paths:
        try:
            total += sum(s or 0 for s in table.io.sizes(paths).values())  # None: already gone
        except OSError:
            pass
    return total


def run_clean(uri: str, *, retain_commits: int | None = None, retain_hours: float | None = None,
              dry_run: bool = False, heartbeat_timeout_s: float | None = None) -> dict[str, Any]:
    """Finish crashed cleans, then plan, schedule and execute one (unless ``dry_run``).

    Returns ``{"instant", "noop", "files", "bytes", "earliest_retained", "resumed", "dry_run"}``:
    ``instant`` None when nothing was deleted (nothing old enough, or a dry run).
    """
    table = Table.load(uri)
    policy = CleanPolicy.of(table, retain_commits, retain_hours)
    out: dict[str, Any] = {"instant": None, "noop": True, "files": 0, "bytes": 0, "earliest_retained": None,
                           "resumed": [], "dry_run": dry_run, "policy": str(policy)}
    if not dry_run:
        # a crashed clean: finish it first
        out["resumed"] = [d.instant for d in execute_waiting(table, Action.CLEAN, _deleter(table),
                                                             heartbeat_timeout_s=heartbeat_timeout_s)]
    plan = plan_clean(table, policy, heartbeat_timeout_s=heartbeat_timeout_s)
    if plan is None or not plan["files"]:
        log.info("nothing to clean (%s)", policy)
        if plan is not None:
            out["earliest_retained"] = plan["earliest_retained_instant"]
        return out
    out.update(files=len(plan["files"]), bytes=plan["bytes"], earliest_retained=plan["earliest_retained_instant"],
               held_back_by=plan["held_back_by"])
    if dry_run:
        out["noop"] = False
        return out
    inst = schedule(table, Action.CLEAN, plan)
    maybe_crash("clean_after_plan")
    done = execute(table, inst.timestamp, Action.CLEAN, _deleter(table), heartbeat_timeout_s=heartbeat_timeout_s)
    out.update(instant=inst.timestamp, noop=False, **{k: done.metadata["counts"][k] for k in ("files", "bytes")})
    _drop_unreachable_checkpoints(table, int(plan["earliest_retained_seq"]))
    return out


def _deleter(table: "Table"):  # type: ignore[no-untyped-def]
    def run(txn: Transaction) -> Written:
        plan = txn.plan
        files = plan["files"]
        started = time.perf_counter()
        # batches of what one request deletes (DeleteObjects: 1,000 keys), so K files cost
        # ceil(K / 1000) requests on S3 (format.md §10); a crash between batches leaves some
        # files gone and the rest not, which the next clean finishes from the plan
        for i in range(0, max(len(files), 1), DELETE_BATCH):
            table.delete_files(files[i:i + DELETE_BATCH])  # never outside the root
            if i == 0:
                maybe_crash("clean_after_delete")
            if len(files) > DELETE_BATCH:
                log.info("clean %s: %d of %s deleted", txn.ts, min(i + DELETE_BATCH, len(files)),
                         plural(len(files), "file"))
        ms = int((time.perf_counter() - started) * 1000)
        log.info("clean %s: deleted %s (%s bytes) in %d ms; snapshots from instant %s on are retained",
                 txn.ts, plural(len(files), "file"), plan.get("bytes"), ms, plan["earliest_retained_instant"])
        return Written(operation="clean", earliest_retained_seq=plan["earliest_retained_seq"],
                       earliest_retained_instant=plan["earliest_retained_instant"],
                       previous_retained_seq=plan["previous_retained_seq"], policy=plan["policy"],
                       counts={"files": len(files), "bytes": int(plan.get("bytes") or 0)},
                       timings_ms={"delete_ms": ms})
    return run


def _drop_unreachable_checkpoints(table: "Table", retained_seq: int) -> None:
    """Checkpoints before the latest one at or before the retained window start no read."""
    places = [(s, archived) for archived in (False, True)
              for s in checkpoint_seqs(table.io, table.layout, archived=archived)]
    keep = max((s for s, _ in places if s <= retained_seq), default=None)
    doomed = []
    for s, archived in places:
        if keep is not None and s < keep and s != table.timeline.base_seq:
            if archived:
                doomed.append(table.layout.archived_checkpoint_file(s))
            else:
                doomed += [table.layout.checkpoint_file(s), table.layout.checkpoint_batches_file(s)]
    if doomed:
        table.io.delete_many(doomed)


def describe_clean(table: "Table") -> dict[str, Any]:
    """What ``show`` prints: the retained window and what a clean now would delete."""
    kept = table.retained_from()
    out: dict[str, Any] = {"retained_from": kept["earliest_retained_instant"] if kept else None,
                           "last_clean": kept["instant"] if kept else None}
    try:
        policy = CleanPolicy.of(table, None, None)
        plan = plan_clean(table, policy)
    except BadInputError as e:  # pragma: no cover - table.json options are checked on load
        out["error"] = str(e)
        return out
    out.update(policy=str(policy), would_delete_files=len(plan["files"]) if plan else 0,
               would_delete_bytes=int(plan["bytes"] or 0) if plan else 0,
               would_retain_from=plan["earliest_retained_instant"] if plan else None)
    return out
