"""Rehash: change a bucketed table's bucket count by a multiple or a divisor (format.md §3.4).

Tables grow past the bucket count they were created with (RFC-29 "Bucket Resizing").
Growing by a multiple ``M = k * N`` means bucket ``i`` splits into ``i, i+N, ..., i+(k-1)N``
(``h mod M`` is one of those exactly when ``h mod N == i``), so every new bucket is made
from exactly one old bucket: a task reads one old bucket and writes its ``k`` children,
with no shuffle. Shrinking by a divisor ``M = N / k`` is the mirror image: new bucket ``j``
is the union of old buckets ``j, j+M, ..., j+(k-1)M``. Any other count would scatter every
bucket into every other and is refused -- that is a rewrite of the table, not a rehash.

This module holds the rules, once for every engine: what may be rehashed, which old buckets
feed which new ones, one file per new file group or bucket, the record-index split's check
that index and data agree, the commit's metadata and the commit itself (:func:`run`). An
engine (:class:`RehashEngine`) only writes: Spark tasks (``spark_jobs.jobs.rehash``) or
threads of this process (``spark_jobs.arrow_engine.rehash``), both through the same per-unit
kernels (``spark_jobs.kernels.rehash_tasks``). A rehash
is one ``rehash`` instant: readers as of an instant before it see the old layout (its files
stay until a clean), writers that planned under the old count conflict with it and re-plan
under the new one (``conflict.MATRIX``), and a crash at any point leaves a pending instant
that the next run rolls back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from spark_jobs.exceptions import BadInputError
from spark_jobs.io.storage import redact_uri
from spark_jobs.table.action.engine import EngineChoice
from spark_jobs.table.action.options import POSITIONAL, VerbOptions, check_engine, check_heartbeat_timeout, option
from spark_jobs.table.action.rollback import rollback
from spark_jobs.table.action.service import rehash_after
from spark_jobs.table.action.transaction import Transaction, repair_abandoned
from spark_jobs.table.commit import EngineInfo, FileGroupChange, IndexFileChange, Written
from spark_jobs.table.config import INDEX_BUCKET, INDEX_RECORD, MAX_NUM_BUCKETS
from spark_jobs.table.faults import maybe_crash
from spark_jobs.table.table import Table, is_writer_alive, pending_plans
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import FileSystemView
from spark_jobs.text import plural

__all__ = [
    "RehashOptions",
    "MAX_NUM_BUCKETS",
    "RehashPlan",
    "check_rehash",
    "validate_rehash",
    "bucket_tasks",
    "index_merge_tasks",
    "rehash_metadata",
    "cancel_stale_plans",
    "bucket_file_id",
    "rehash_after",
    "RehashEngine",
    "Pick",
    "run",
    "one_per",
    "check_split",
]

log = logging.getLogger("bucketindex.rehash")


@dataclass(frozen=True, kw_only=True)
class RehashOptions(VerbOptions):
    """The options of ``bucketindex rehash`` (the Airflow operator's command is built from them);
    whether the count is a multiple or a divisor of the one in force is decided on the table."""

    VERB = "rehash"

    table: str = option(form=POSITIONAL)
    #: the new bucket count
    num_buckets: int = option("--num-buckets")
    heartbeat_timeout_s: float | None = option("--heartbeat-timeout", default=None)
    engine: str | None = option("--engine", default=None)
    memory_budget: str | None = option("--memory-budget", default=None)

    def __post_init__(self) -> None:
        if self.num_buckets < 1:
            raise BadInputError(f"--num-buckets must be at least 1, got {self.num_buckets}")
        check_heartbeat_timeout(self.heartbeat_timeout_s)
        check_engine(self.engine, self.memory_budget)


def bucket_file_id(bucket: int) -> str:
    """A bucket-index file id: the zero-padded bucket number (``keys.file_id_for_bucket_expr``)."""
    return f"{bucket:08d}"


@dataclass(frozen=True)
class RehashPlan:
    """A validated rehash from ``old`` to ``new`` buckets."""

    index_type: str
    old: int
    new: int

    @property
    def split(self) -> bool:
        """Growing: every old bucket feeds ``factor`` new ones. Shrinking: the reverse."""
        return self.new > self.old

    @property
    def factor(self) -> int:
        return self.new // self.old if self.split else self.old // self.new

    def children(self, old_bucket: int) -> list[int]:
        """The new buckets old bucket ``old_bucket`` splits into (a split)."""
        return [old_bucket + t * self.old for t in range(self.factor)]

    def sources(self, new_bucket: int) -> list[int]:
        """The old buckets new bucket ``new_bucket`` is made of (a merge)."""
        return [new_bucket + t * self.new for t in range(self.factor)]

    def to_json(self) -> dict[str, Any]:
        return {"index_type": self.index_type, "num_buckets": self.new, "previous_num_buckets": self.old}


def check_rehash(table: Table, view: FileSystemView, num_buckets: int, *,
                 heartbeat_timeout_s: float | None = None) -> RehashPlan | None:
    """The rehash of ``table`` to ``num_buckets``, or None when it already has that many.

    BadInputError (one line, nothing written) for a table without buckets, a count that
    is neither a multiple nor a divisor of the count in force, a count out of range, or a
    rehash already running (a live writer; an abandoned one is rolled back by the next run).
    """
    cfg = table.config
    assert cfg is not None
    if cfg.index_type not in (INDEX_RECORD, INDEX_BUCKET):
        raise BadInputError(f"table {table.uri} uses the {cfg.index_type} index, which has no buckets to rehash "
                            f"(only the record and bucket indexes are bucketed)")
    try:
        m = int(num_buckets)
    except (TypeError, ValueError):
        raise BadInputError(f"--num-buckets must be a whole number, got {num_buckets!r}") from None
    if m < 1:
        raise BadInputError(f"--num-buckets must be at least 1, got {m}")
    if m > MAX_NUM_BUCKETS:
        raise BadInputError(f"--num-buckets {m} is above the maximum of {MAX_NUM_BUCKETS}")
    for inst in table.timeline.pending([Action.REHASH]):
        if is_writer_alive(table, inst, heartbeat_timeout_s):
            raise BadInputError(f"a rehash is already running on {table.uri} (instant {inst.timestamp}, "
                                f"{inst.state.name.lower()}); wait for it to finish (`bucketindex show` lists it)")
    n = table.num_buckets(view)
    if m == n:
        return None
    if m % n and n % m:
        grow = n * max(2, -(-m // n))
        shrink = [d for d in range(min(m, n - 1), 0, -1) if n % d == 0][:1]
        hint = f"e.g. {grow}" + (f" or {shrink[0]}" if shrink else "")
        raise BadInputError(
            f"--num-buckets {m} is neither a multiple nor a divisor of the table's {n} buckets ({hint}): "
            f"a multiple splits each bucket without a shuffle, any other count would rewrite the whole table")
    return RehashPlan(cfg.index_type, n, m)


def validate_rehash(uri: str, num_buckets: int, *, heartbeat_timeout_s: float | None = None) -> dict[str, Any]:
    """Check a rehash of the table at ``uri`` without writing anything (an operator calls this
    before it submits a Spark job). Returns ``{"noop", "index_type", "num_buckets",
    "previous_num_buckets", "rows"}``; BadInputError as :func:`check_rehash`, or for a missing table."""
    table = Table.load(uri)
    view = table.view()
    plan = check_rehash(table, view, num_buckets, heartbeat_timeout_s=heartbeat_timeout_s)
    n = table.num_buckets(view)
    assert table.config is not None
    return {"noop": plan is None, "index_type": table.config.index_type, "num_buckets": int(num_buckets),
            "previous_num_buckets": n, "rows": view.num_rows}


def bucket_tasks(plan: RehashPlan, view: FileSystemView) -> list[dict[str, Any]]:
    """One task per new file-group set of a ``bucket`` index table, each reading whole old slices.

    A split has one task per old file group (it writes the group's children); a merge has
    one task per new bucket per partition (it reads the old buckets that fold into it).
    Each task: ``{"part", "rows", "sources": [[fid, base, [logs]], ...]}`` (``rows``: live
    rows read, to balance Spark tasks).
    """
    tasks: list[dict[str, Any]] = []
    if plan.split:
        for s in view.slices():
            tasks.append({"part": s.partition, "rows": s.num_rows,
                          "sources": [[s.file_id, s.path, [lf.path for lf in s.logs]]]})
        return tasks
    by_part: dict[str, dict[int, Any]] = {}
    for s in view.slices():
        by_part.setdefault(s.partition, {})[int(s.file_id)] = s
    for part, groups in sorted(by_part.items()):
        for j in range(plan.new):
            srcs = [groups[b] for b in plan.sources(j) if b in groups]
            if srcs:
                tasks.append({"part": part, "rows": sum(s.num_rows for s in srcs),
                              "sources": [[s.file_id, s.path, [lf.path for lf in s.logs]] for s in srcs]})
    return tasks


def index_merge_tasks(plan: RehashPlan, view: FileSystemView) -> list[dict[str, Any]]:
    """A record-index merge: one task per new bucket, with the files of the old buckets it takes
    (each old bucket's files in merge order). ``{"bucket", "files", "sources": [[file, ...], ...]}``."""
    out = []
    for j in range(plan.new):
        sources = [list(view.index_files.get(b, [])) for b in plan.sources(j)]
        sources = [s for s in sources if s]
        if sources:
            out.append({"bucket": j, "files": sum(map(len, sources)), "sources": sources})
    return out


def rehash_metadata(instant: str, plan: RehashPlan, view: FileSystemView, *,
                    written_groups: list[dict[str, Any]] | None = None,
                    written_index: list[dict[str, Any]] | None = None) -> Written:
    """What the rehash ``instant`` wrote on ``view``, for its commit: the new layout's files, and
    the old layout's they replace (:func:`run` reports it to the transaction, which
    adds the instant and the snapshot; ``instant`` is not recorded from here).

    ``written_groups``: ``{"part", "fid", "path", "num_rows", "size"}`` per new file group
    (bucket index). ``written_index``: ``{"bucket", "path", "entries", "size"}`` per new
    index base (record index). Old file groups not rewritten under the same id are removed;
    every old index file is removed.
    """
    groups: list[FileGroupChange] = []
    new_keys = set()
    for w in sorted(written_groups or [], key=lambda w: (w["part"], w["fid"])):
        new_keys.add((w["part"], w["fid"]))
        groups.append(FileGroupChange(partition=w["part"], file_id=w["fid"], path=w["path"],
                                      num_rows=int(w["num_rows"]), size=int(w["size"])))
    removed_groups = [FileGroupChange(partition=p, file_id=f, path=None, removed=True)
                      for (p, f) in sorted(view.file_groups) if (p, f) not in new_keys]
    if plan.index_type == INDEX_RECORD:
        removed_groups = []  # the record index leaves the data alone
        groups = []
    added = [IndexFileChange(bucket=int(w["bucket"]), path=w["path"], entries=int(w["entries"]),
                             size=int(w["size"]), kind="base", sealed=False)
             for w in sorted(written_index or [], key=lambda w: int(w["bucket"]))]
    removed_index = sorted(f for files in view.index_files.values() for f in files) if plan.index_type == INDEX_RECORD else []
    counts = {"num_buckets": plan.new, "previous_num_buckets": plan.old,
              "rows": sum(int(g.num_rows or 0) for g in groups) if plan.index_type == INDEX_BUCKET else view.num_rows,
              "file_groups_read": len(view.file_groups) if plan.index_type == INDEX_BUCKET else 0,
              "file_groups_written": len(groups),
              "index_buckets": len(added), "index_entries": sum(int(a.entries or 0) for a in added),
              "index_files_replaced": len(removed_index)}
    return Written(
        operation="rehash", index_type=plan.index_type, num_buckets=plan.new, previous_num_buckets=plan.old,
        file_groups=(*removed_groups, *groups),  # removals first: a new group may reuse no old id
        index_added=tuple(added), index_removed=tuple(removed_index), counts=counts)


def cancel_stale_plans(table: Table) -> list[str]:
    """Cancel scheduled table-service plans made before the latest completed rehash.

    A compaction plan names files of the old layout; after a rehash it can never commit
    (compaction / rehash always conflict), so leaving it would only fail the next
    ``compact`` and hold clean back. Called after a rehash's commit point, and again by the
    executor of such a plan, so a crash in between loses nothing.
    """
    table.timeline.reload()
    cancelled = []
    for action in Action.SERVICES:
        if action == Action.CLEAN:
            continue  # a clean's plan lists files no snapshot reads: a rehash does not change that
        for inst, plan in pending_plans(table, action):
            if rehash_after(table, int(plan.get("snapshot_seq") or 0)) is None:
                continue
            log.info("cancelling %s %s: planned under the bucket count before a rehash", action, inst.timestamp)
            rollback(table, inst.timestamp, force=True)
            cancelled.append(inst.timestamp)
    return cancelled


# -- execution: the rules every engine follows ---------------------------------------------

class RehashEngine(Protocol):
    """What an engine supplies to a rehash: writing, never deciding. Every primitive writes
    under ``instant``'s markers through the shared kernels (``spark_jobs.kernels.rehash_tasks``)
    and returns one row per file it wrote; :func:`run` keeps one file per new file group or
    bucket, checks, builds the metadata and commits."""

    def write_file_groups(self, table: Table, instant: str, plan: RehashPlan, view: FileSystemView,
                          tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Bucket index: each of :func:`bucket_tasks`'s tasks, its rows written to the file groups
        of ``hash(key) mod plan.new``; rows ``{"part", "fid", "path", "num_rows", "size"}``."""
        ...

    def merge_index_buckets(self, table: Table, instant: str, plan: RehashPlan, view: FileSystemView,
                            tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Record index, merge: each of :func:`index_merge_tasks`'s new buckets written as one base;
        rows ``{"bucket", "path", "entries", "size", ...}``."""
        ...

    def split_index_buckets(self, table: Table, instant: str, plan: RehashPlan, view: FileSystemView,
                            files: dict[int, list[str]]) -> list[dict[str, Any]]:
        """Record index, split: every old bucket of ``files`` (and every old bucket holding keys in
        the data) split into its children by the keys the data holds; rows as
        ``rehash_tasks.INDEX_OUTPUT`` (a row with problem counts: nothing written for that bucket)."""
        ...


#: ``pick(table, plan, view)``: the engine that writes the rehash and the choice to record;
#: called once there is work, before the instant is reserved (a Spark session starts there)
Pick = Callable[[Table, RehashPlan, FileSystemView], tuple[RehashEngine, EngineChoice]]


def one_per(written: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> list[dict[str, Any]]:
    """One file per new file group or bucket: a retried Spark task may have written twice
    (the marker cleanup after the commit deletes the other); the last by path is kept."""
    return list({key(w): w for w in sorted(written, key=lambda w: w["path"], reverse=True)}.values())


def check_split(written: list[dict[str, Any]]) -> None:
    """A record-index split must not bake a broken index into a new layout: BadInputError
    (nothing committed) when any old bucket's entries and the data's keys disagree."""
    bad = [w for w in written if w["missing"] or w["extra"] or w["misplaced"] or w["duplicated"]]
    if bad:
        totals = {k: sum(int(w[k]) for w in bad) for k in ("missing", "extra", "misplaced", "duplicated")}
        raise BadInputError(
            f"the record index disagrees with the data in {len(bad)} bucket(s) ({totals['missing']} keys without "
            f"an entry, {totals['extra']} entries without a key, {totals['misplaced']} entries pointing elsewhere, "
            f"{totals['duplicated']} keys stored twice); nothing was rehashed: run `bucketindex validate` first")


def _write(engine: RehashEngine, table: Table, instant: str, plan: RehashPlan,
           view: FileSystemView) -> Written:
    """One attempt's files by ``engine``, as the commit's metadata."""
    if plan.index_type == INDEX_BUCKET:
        todo = bucket_tasks(plan, view)
        groups = one_per(engine.write_file_groups(table, instant, plan, view, todo), lambda w: (w["part"], w["fid"])) \
            if todo else []
        log.info("rehash %s: %s read, %s written", instant, plural(len(view.file_groups), "file group"), len(groups))
        return rehash_metadata(instant, plan, view, written_groups=groups)
    if plan.split:
        files = {b: list(f) for b, f in view.index_files.items() if f}
        written = engine.split_index_buckets(table, instant, plan, view, files)
        check_split(written)
        index = one_per([w for w in written if w["path"]], lambda w: int(w["bucket"]))
        log.info("rehash %s: %s split into %d (%s)", instant, plural(len(files), "old index bucket"), len(index),
                 plural(sum(int(w["entries"]) for w in index), "entry"))
        return rehash_metadata(instant, plan, view, written_index=index)
    todo = index_merge_tasks(plan, view)
    index = one_per(engine.merge_index_buckets(table, instant, plan, view, todo), lambda w: int(w["bucket"])) \
        if todo else []
    log.info("rehash %s: %d old index buckets merged into %d", instant, plan.old, len(index))
    return rehash_metadata(instant, plan, view, written_index=index)


def run(uri: str, num_buckets: int, pick: Pick, *, heartbeat_timeout_s: float | None = None) -> dict[str, Any]:
    """Rehash the table at ``uri`` to ``num_buckets`` with the engine ``pick`` names; returns the
    instant, counts, timings and the engine.

    A count equal to the one in force is a no-op (``instant`` None, no engine picked): running
    a rehash twice, as an Airflow retry does, changes nothing the second time. BadInputError
    (nothing written) for what :func:`check_rehash` refuses; ConflictError when a write
    completed while it ran (a rehash rewrites what it read: run it again).
    """
    started = time.perf_counter()
    table = Table.load(uri)
    view = table.view()
    plan = check_rehash(table, view, num_buckets, heartbeat_timeout_s=heartbeat_timeout_s)
    # abandoned instants (a killed rehash) are rolled back, and leftovers of one killed after
    # its commit point cleaned, as every writer does -- also when there is nothing else to do
    repaired = repair_abandoned(table, timeout_s=heartbeat_timeout_s)
    if plan is None:
        log.info("%s already has %s: nothing to do", redact_uri(uri), plural(num_buckets, "bucket"))
        return {"instant": None, "noop": True, "num_buckets": int(num_buckets),
                "previous_num_buckets": int(num_buckets)}
    if repaired:
        view = table.view()
        plan = check_rehash(table, view, num_buckets, heartbeat_timeout_s=heartbeat_timeout_s)
        assert plan is not None
    engine, choice = pick(table, plan, view)
    txn = Transaction(table, Action.REHASH, plan.to_json(), view=view).begin()
    log.info("rehash %s on %s: %s index %d -> %s (%s by %d), %s in %s", txn.ts, choice.engine, plan.index_type,
             plan.old, plural(plan.new, "bucket"), "split" if plan.split else "merge", plan.factor,
             plural(view.num_rows, "row"), plural(len(view.file_groups), "file group"))

    def attempt(view: FileSystemView, retries: list[dict[str, Any]]) -> Written:
        t0 = time.perf_counter()
        written = _write(engine, table, txn.ts, plan, view).replace(
            engine=EngineInfo.from_json(choice.as_metadata()),
            timings_ms={"rehash_ms": int((time.perf_counter() - t0) * 1000),
                        "total_ms": int((time.perf_counter() - started) * 1000)})
        maybe_crash("before_complete")
        return written

    # the commit: a rehash rewrites what it read, so a write completed meanwhile always
    # conflicts, and the plan (checked on the old snapshot) is not remade here -- the caller runs it again
    meta = txn.run(attempt, max_retries=0, what="the rehash",
                   give_up=f"the rehash was not committed and the table keeps {plan.old} buckets; run it again"
                   ).metadata
    cancelled = cancel_stale_plans(table)
    log.info("rehash %s committed on %s: %s in force (%d ms)%s", txn.ts, choice.engine, plural(plan.new, "bucket"),
             meta["timings_ms"]["rehash_ms"], f"; cancelled compaction plans {', '.join(cancelled)}" if cancelled else "")
    return {"instant": txn.ts, "noop": False, **plan.to_json(), "counts": meta["counts"],
            "cancelled_plans": cancelled, "engine": choice.as_metadata(),
            "timings_ms": {**meta["timings_ms"], "total_ms": int((time.perf_counter() - started) * 1000)}}
