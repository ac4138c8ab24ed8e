"""Compaction of data and index: what is due, the plan, and what it commits.

Two kinds of files grow with every upsert and slow what reads them: a merge-on-read file
group's logs (every read merges them) and a record-index bucket's deltas (every lookup
consults them, RFC-08). One ``compaction`` action folds both: a due file group's base and
logs into a new base, a due index bucket's base and deltas into a new base with tombstones
dropped. The plan names the exact files: logs and deltas committed after it stay on top of
the new bases and keep winning (format.md §5.2, §6.1), so compaction never blocks or
conflicts with upserts.

What is due, the plan, the check that a plan still holds when it runs, which file a retried
task's duplicate loses to, what the commit records, and the order of a run (waiting plans,
then a new one: :func:`run`) live here. An engine only writes a plan's new bases: Spark
(``spark_jobs.jobs.compact``) or in-process on Arrow (``spark_jobs.arrow_engine.compact``),
both through the task functions of ``spark_jobs.kernels.tasks``.

An *index rebuild* (:func:`run_rebuild`, ``compact --rebuild-index``) is the same action and
commit with its buckets' new bases built from a scan of the snapshot's rows instead of the
files they replace: the repair of a missing or damaged index file (format.md §6.2).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterable, Sequence

from spark_jobs.exceptions import BadInputError, ConflictError, WriterAliveError
from spark_jobs.index.record_index import IndexFile, index_file_error, is_sealed_base
from spark_jobs.table.action.options import (
    POSITIONAL,
    REPEAT,
    SWITCH,
    VerbOptions,
    check_choice,
    check_engine,
    check_heartbeat_timeout,
    option,
)
from spark_jobs.table.action.rollback import rollback
from spark_jobs.table.action.service import execute, execute_waiting, schedule
from spark_jobs.table.commit import EngineInfo, FileGroupChange, IndexFileChange, Written
from spark_jobs.table.config import INDEX_RECORD
from spark_jobs.table.table import Table, is_writer_alive, pending_plans
from spark_jobs.table.timeline import Action, State, check_instant
from spark_jobs.table.view import FileSlice, FileSystemView, is_index_delta
from spark_jobs.table.faults import maybe_crash
from spark_jobs.table.heartbeat import owner_alive
from spark_jobs.text import plural

if TYPE_CHECKING:
    from spark_jobs.table.action.engine import EngineChoice
    from spark_jobs.table.action.transaction import Transaction

__all__ = ["StalePlanError", "CompactOptions", "CompactionPolicy", "plan_compaction", "schedule_compaction", "compaction_metadata", "compactable",
           "DEFAULT_INDEX_BASE_CAP", "check_plan", "plan_index_base_cap", "execute_plan", "run", "Write", "Pick",
           "REBUILD_OPERATION", "is_rebuild", "plan_index_rebuild", "run_rebuild", "AutoCompaction", "auto_compact",
           "is_auto", "AUTO_TRIGGER", "DEFAULT_AUTO_MAX_GROUPS", "DEFAULT_AUTO_MAX_BYTES",
           "DEFAULT_AUTO_MAX_BUCKETS"]

log = logging.getLogger("bucketindex.compact")

#: defaults measured on the development VM (docs/benchmarks.md, merge-on-read): reads of a
#: 100k-row group slow down by a few percent per log; four logs or logs of a fifth of the
#: base's bytes cost about what one compaction saves within a day of hourly upserts
DEFAULT_MIN_LOGS = 4
DEFAULT_LOG_RATIO = 0.2
#: an index bucket is due with this many deltas, or deltas of this fraction of its base's
#: bytes. A lookup opens every file of its bucket: measured (docs/benchmarks.md, table
#: services), 100k keys in a 1M-entry bucket take 50 ms compacted, 80 ms with 10 deltas,
#: 187 ms with 50. 10 deltas cost an upsert tens of milliseconds, a day of hourly commits
#: passes it anyway, and compacting earlier rewrites the base more often for less; the
#: ratio rule catches the buckets that big batches grow
DEFAULT_MIN_DELTAS = 10
DEFAULT_DELTA_RATIO = 0.5
#: entries past which a compaction seals the index base it writes (RFC-08 option 1): a
#: sealed base is never rewritten, so a compaction's cost stays bounded by the cap while the
#: bucket grows, and a lookup opens one more base per cap's worth of entries. Measured by
#: benchmarks/index_base_cap.py (docs/benchmarks.md, "Index base cap")
DEFAULT_INDEX_BASE_CAP = 1_000_000


@dataclass(frozen=True, kw_only=True)
class CompactOptions(VerbOptions):
    """The options of ``bucketindex compact``, validated once: which mode (schedule and execute,
    ``schedule_only``, ``execute`` a plan, or ``rebuild_index``), the scheduling policy and which
    option goes with which mode (one line, exit 2, before anything is read or written)."""

    VERB = "compact"

    table: str = option(form=POSITIONAL)
    #: only write the plan (its instant is printed last)
    schedule_only: bool = option("--schedule-only", form=SWITCH, default=False)
    #: execute this scheduled plan (again, after a failure)
    execute: str | None = option("--execute", default=None)
    #: the policy's values (None: :class:`CompactionPolicy`'s defaults)
    min_logs: int | None = option("--min-logs", default=None)
    log_ratio: float | None = option("--log-ratio", default=None)
    max_groups: int | None = option("--max-groups", default=None)
    max_buckets: int | None = option("--max-buckets", default=None)
    min_deltas: int | None = option("--min-deltas", default=None)
    delta_ratio: float | None = option("--delta-ratio", default=None)
    index_base_cap: int | None = option("--index-base-cap", default=None)
    #: data | index: plan only that kind (None: both)
    only: str | None = option("--only", default=None)
    heartbeat_timeout_s: float | None = option("--heartbeat-timeout", default=None)
    #: rebuild record-index buckets from the data instead of folding their files
    rebuild_index: bool = option("--rebuild-index", form=SWITCH, default=False)
    #: with ``rebuild_index``: only these buckets (None: every bucket)
    bucket: list[int] | None = option("--bucket", form=REPEAT, default=None)
    engine: str | None = option("--engine", default=None)
    memory_budget: str | None = option("--memory-budget", default=None)

    def __post_init__(self) -> None:
        check_heartbeat_timeout(self.heartbeat_timeout_s)
        check_engine(self.engine, self.memory_budget)
        check_choice("--only", self.only, ("data", "index"))
        if self.schedule_only and self.execute is not None:
            raise BadInputError("--schedule-only writes a plan and --execute runs one: give one of them")
        if self.rebuild_index:
            others = {"--schedule-only": self.schedule_only, "--execute": self.execute, "--min-logs": self.min_logs,
                      "--log-ratio": self.log_ratio, "--max-groups": self.max_groups,
                      "--max-buckets": self.max_buckets, "--min-deltas": self.min_deltas, "--delta-ratio": self.delta_ratio, "--only": self.only}
            given = [name for name, v in others.items() if v not in (None, False)]
            if given:
                raise BadInputError(f"--rebuild-index plans and executes one rebuild of the index from the data: "
                                    f"{', '.join(given)} do not apply to it")
            self.policy  # noqa: B018 - the index base cap's own check
            return
        if self.bucket:
            raise BadInputError("--bucket names the index buckets --rebuild-index rebuilds; add --rebuild-index")
        scheduling = (self.min_logs, self.log_ratio, self.max_groups, self.max_buckets, self.min_deltas,
                      self.delta_ratio, self.only, self.index_base_cap)
        if self.execute is not None and any(v is not None for v in scheduling):
            raise BadInputError("--execute runs a plan as scheduled; --min-logs, --log-ratio, --max-groups, "
                                "--max-buckets, --min-deltas, --delta-ratio, --index-base-cap and --only apply when "
                                "scheduling")
        if self.execute is not None:
            check_instant(self.execute, option="--execute")
        self.policy  # noqa: B018 - its values' checks, once

    @property
    def policy(self) -> "CompactionPolicy":
        """What is due, as :func:`run` takes it (the defaults for values not given)."""
        return CompactionPolicy(
            min_logs=DEFAULT_MIN_LOGS if self.min_logs is None else self.min_logs,
            log_ratio=DEFAULT_LOG_RATIO if self.log_ratio is None else self.log_ratio,
            max_groups=self.max_groups,
            max_buckets=self.max_buckets,
            min_deltas=DEFAULT_MIN_DELTAS if self.min_deltas is None else self.min_deltas,
            delta_ratio=DEFAULT_DELTA_RATIO if self.delta_ratio is None else self.delta_ratio,
            index_base_cap=DEFAULT_INDEX_BASE_CAP if self.index_base_cap is None else self.index_base_cap,
            data=self.only in (None, "data"),
            index=self.only in (None, "index"),
        )


@dataclass(frozen=True)
class CompactionPolicy:
    """What is due. A file group: at least ``min_logs`` logs, or logs of at least
    ``log_ratio`` x the base's bytes; at most ``max_groups`` per plan (most log bytes first).
    A record-index bucket: at least ``min_deltas`` eligible deltas, or eligible deltas of at
    least ``delta_ratio`` x its open base's bytes; a new index base of more than
    ``index_base_cap`` entries is sealed (format.md §6.1). ``data`` / ``index``: which kinds
    to plan."""

    min_logs: int = DEFAULT_MIN_LOGS
    log_ratio: float = DEFAULT_LOG_RATIO
    max_groups: int | None = None
    min_deltas: int = DEFAULT_MIN_DELTAS
    delta_ratio: float = DEFAULT_DELTA_RATIO
    index_base_cap: int = DEFAULT_INDEX_BASE_CAP
    data: bool = True
    index: bool = True
    #: at most this many bytes per plan: file groups' bases and logs first (most log bytes
    #: first), then index buckets' open bases and deltas with what is left (most deltas first);
    #: a group or bucket larger than this alone is left to a compaction without the bound (None:
    #: no bound)
    max_bytes: int | None = None
    #: at most this many index buckets per plan, most deltas first (None: every due bucket)
    max_buckets: int | None = None

    def __post_init__(self) -> None:
        if self.max_buckets is not None and self.max_buckets < 1:
            raise BadInputError(f"--max-buckets must be at least 1, got {self.max_buckets}")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise BadInputError(f"the compaction's byte bound must be at least 1 byte, got {self.max_bytes}")
        if self.min_logs < 1:
            raise BadInputError(f"--min-logs must be at least 1, got {self.min_logs}")
        if self.log_ratio <= 0:
            raise BadInputError(f"--log-ratio must be positive, got {self.log_ratio}")
        if self.max_groups is not None and self.max_groups < 1:
            raise BadInputError(f"--max-groups must be at least 1, got {self.max_groups}")
        if self.min_deltas < 1:
            raise BadInputError(f"--min-deltas must be at least 1, got {self.min_deltas}")
        if self.delta_ratio <= 0:
            raise BadInputError(f"--delta-ratio must be positive, got {self.delta_ratio}")
        if not isinstance(self.index_base_cap, int) or self.index_base_cap < 1:
            raise BadInputError(f"--index-base-cap must be at least 1, got {self.index_base_cap}")
        if not (self.data or self.index):
            raise BadInputError("nothing to plan: neither data nor index compaction selected")

    def index_due(self, deltas: int, delta_bytes: int, base_bytes: int) -> bool:
        """A bucket without a base is due by count only (any delta is "large" against nothing)."""
        return deltas > 0 and (deltas >= self.min_deltas or (base_bytes > 0 and delta_bytes >= self.delta_ratio * base_bytes))

    def due(self, s: FileSlice) -> bool:
        log_bytes = s.total_size - s.size
        return bool(s.logs) and (len(s.logs) >= self.min_logs or log_bytes >= self.log_ratio * max(s.size, 1))


def compactable(table: "Table", policy: CompactionPolicy) -> tuple[bool, bool]:
    """Whether this table has (data logs, index deltas) the policy asks to compact."""
    assert table.config is not None
    return (policy.data and table.config.merge_on_read,
            policy.index and table.config.index_type == INDEX_RECORD)


def plan_compaction(table: "Table", view: FileSystemView, policy: CompactionPolicy,
                    *, heartbeat_timeout_s: float | None = None,
                    groups: Collection[tuple[str, str]] | None = None,
                    buckets: Collection[int] | None = None) -> dict[str, Any] | None:
    """The plan of a compaction on ``view``, or None when nothing is due.

    File groups and index buckets in another pending compaction plan are left out: two
    plans never fold the same files. ``groups``: only these (partition, file id) may be
    planned (an automatic compaction's: the groups its upsert touched; None: any); ``buckets``:
    likewise for index buckets (the buckets its upsert wrote a delta to). ``policy.max_bytes``
    bounds the groups' bytes and the buckets' together, groups first. BadInputError when the
    table has nothing of the kinds asked for (a copy-on-write table has no logs; only the
    record index has deltas).
    """
    assert table.config is not None
    data, index = compactable(table, policy)
    if not (data or index):
        kinds = " or ".join(k for k, on in (("logs", policy.data), ("index deltas", policy.index)) if on)
        raise BadInputError(f"{table.uri} is a {table.config.table_type} table with the {table.config.index_type} "
                            f"index: it has no {kinds} to compact")
    pending = pending_plans(table, Action.COMPACTION)
    due = _due_file_groups(view, policy, pending, only=groups) if data else []
    left = None if policy.max_bytes is None else policy.max_bytes - sum(g["base_bytes"] + g["log_bytes"] for g in due)
    due_buckets: list[int] = []
    planned = _due_index_buckets(table, view, policy, pending, heartbeat_timeout_s, only=buckets,
                                 max_bytes=left, due=due_buckets) if index else []
    if not due and not planned:
        return None
    bounded = policy.max_buckets is not None or policy.max_bytes is not None
    return {
        "operation": "compaction",
        "snapshot_seq": view.seq,
        "policy": asdict(policy),
        "index_base_cap": policy.index_base_cap,
        "file_groups": due,
        "index_buckets": planned,
        # a bounded plan (an automatic compaction's) says how many buckets were due before its bounds
        **({"index_buckets_due": len(due_buckets)} if bounded and index else {}),
    }


def schedule_compaction(table: "Table", policy: CompactionPolicy, *,
                        heartbeat_timeout_s: float | None = None) -> dict[str, Any] | None:
    """Plan and schedule a compaction (pure Python: no Spark); None when nothing is due.

    Returns ``{"instant", "file_groups", "logs", "index_buckets", "deltas"}`` (counts of the plan).
    """
    plan = plan_compaction(table, table.view(), policy, heartbeat_timeout_s=heartbeat_timeout_s)
    if plan is None:
        log.info("nothing is due for compaction (policy %s)", policy)
        return None
    inst = schedule(table, Action.COMPACTION, plan)
    out = {"instant": inst.timestamp, "file_groups": len(plan["file_groups"]),
           "logs": sum(len(g["logs"]) for g in plan["file_groups"]),
           "index_buckets": len(plan["index_buckets"]),
           "deltas": sum(int(b["deltas"]) for b in plan["index_buckets"])}
    log.info("compaction %s planned: %s (%s), %s (%s)", inst.timestamp, plural(out["file_groups"], "file group"),
             plural(out["logs"], "log"), plural(out["index_buckets"], "index bucket"), plural(out["deltas"], "delta"))
    return out


def _due_file_groups(view: FileSystemView, policy: CompactionPolicy,
                     pending: list[tuple[Any, dict[str, Any]]],
                     only: Collection[tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    busy = {(g["partition"], g["file_id"]) for _, plan in pending for g in plan.get("file_groups", [])}
    wanted = None if only is None else set(only)
    due = [s for s in view.slices() if policy.due(s) and (s.partition, s.file_id) not in busy
           and (wanted is None or (s.partition, s.file_id) in wanted)]
    due.sort(key=lambda s: (-(s.total_size - s.size), s.partition, s.file_id))
    if policy.max_bytes is not None:
        kept, total = [], 0
        for s in due:  # most log bytes first; one too large alone waits for an unbounded compaction
            if policy.max_groups is not None and len(kept) >= policy.max_groups:
                break
            if total + s.total_size <= policy.max_bytes:
                kept.append(s)
                total += s.total_size
            elif not kept:
                log.info("file group %s/%s (%d bytes) is due but past the bound of %d bytes per plan: left "
                         "for `bucketindex compact`", s.partition, s.file_id, s.total_size, policy.max_bytes)
        due = kept
    if policy.max_groups is not None:
        due = due[: policy.max_groups]
    return [{"partition": s.partition, "file_id": s.file_id, "base": s.path, "logs": [lf.path for lf in s.logs],
             "log_bytes": s.total_size - s.size, "base_bytes": s.size} for s in due]


def _due_index_buckets(table: "Table", view: FileSystemView, policy: CompactionPolicy,
                       pending: list[tuple[Any, dict[str, Any]]],
                       heartbeat_timeout_s: float | None, *, only: Collection[int] | None = None,
                       max_bytes: int | None = None, due: list[int] | None = None) -> list[dict[str, Any]]:
    """Buckets whose open base and oldest deltas are due, with exactly the files to fold.

    A bucket's files are its sealed bases, at most one open base, then its deltas in commit
    order. Sealed bases are never folded again (they are listed under ``sealed``, for the
    tombstone rule); ``files`` is the open base, if any, and a *prefix* of the deltas in
    commit order -- the new base sits below every delta it leaves, so a delta it skipped
    could not be older than one it folded -- and only deltas of instants older than the
    oldest live pending write: that writer tagged its batch on a snapshot, and its delta
    must stay newer than everything folded below it (a dead writer's instant never
    completes and does not hold compaction back).

    ``only``: consider these buckets alone (None: every bucket). Of the due buckets, the most
    deltas first (then the most delta bytes), at most ``policy.max_buckets`` of them and
    ``max_bytes`` of their open bases and deltas (a bucket larger than that alone is left to
    a compaction without the bound): what an automatic compaction may add to an upsert.
    ``due`` (when given) receives every due bucket, planned or not.
    """
    busy = {int(b["bucket"]) for _, plan in pending for b in plan.get("index_buckets", [])}
    live = [i.timestamp for i in table.timeline.pending(Action.WRITES)
            if i.action not in Action.SERVICES and is_writer_alive(table, i, heartbeat_timeout_s)]
    horizon = min(live, default=None)
    wanted = None if only is None else {int(b) for b in only}
    out = []
    for bucket in sorted(view.index_files):
        if bucket in busy or (wanted is not None and bucket not in wanted):
            continue
        files = view.index_files[bucket]
        bases = [f for f in files if not is_index_delta(f)]
        sealed = [f for f in bases if is_sealed_base(f)]
        if bases[: len(sealed)] != sealed or len(bases) - len(sealed) > 1:
            # every compaction seals or replaces the one open base, so this cannot happen
            # unless the metadata was edited by hand: leave the bucket alone
            log.warning("index bucket %d: bases %s are not sealed bases then one open base; not compacted",
                        bucket, bases)
            continue
        open_base = bases[len(sealed):]
        deltas = []
        for f in files[len(bases):]:
            if horizon is not None and _index_file_instant(f) >= horizon:
                break
            deltas.append(f)
        if not deltas:
            continue
        sizes = _index_sizes(table, [*open_base, *deltas])
        delta_bytes = sum(sizes[f] for f in deltas)
        base_bytes = sum(sizes[f] for f in open_base)
        if policy.index_due(len(deltas), delta_bytes, base_bytes):
            out.append({"bucket": bucket, "files": [*open_base, *deltas], "sealed": sealed, "deltas": len(deltas),
                        "delta_bytes": delta_bytes, "base_bytes": base_bytes})
    if due is not None:
        due.extend(b["bucket"] for b in out)
    if policy.max_buckets is not None or max_bytes is not None:
        out.sort(key=lambda b: (-b["deltas"], -b["delta_bytes"], b["bucket"]))
        kept, total = [], 0
        for b in out:
            if policy.max_buckets is not None and len(kept) >= policy.max_buckets:
                break
            size = b["base_bytes"] + b["delta_bytes"]
            if max_bytes is None or total + size <= max_bytes:
                kept.append(b)
                total += size
            elif not kept and max_bytes > 0:
                log.info("index bucket %d (%d bytes) is due but past the bound of %d bytes per plan: left for "
                         "`bucketindex compact`", b["bucket"], size, max_bytes)
            elif not kept:
                log.info("%s due: the plan's file groups took its byte bound; left for the next run",
                         plural(len(out), "index bucket"))
                break
        out = sorted(kept, key=lambda b: b["bucket"])
    for b in out:  # only the buckets planned: a footer read each
        _check_readable(table, [*b["sealed"], *b["files"]])
    return out


def _index_sizes(table: "Table", rels: list[str]) -> dict[str, int]:
    """Bytes of each index file; a missing one is the table's fault, named with its repair
    (IndexCorruptError), not a sum that fails on ``None``."""
    sizes = table.io.sizes([table.abs(r) for r in rels])
    out = {}
    for r in rels:
        size = sizes[table.abs(r)]
        if size is None:
            raise index_file_error(table.io, table.abs(r), why="missing (deleted outside bucketindex?)")
        out[r] = size
    return out


def _check_readable(table: "Table", rels: list[str]) -> None:
    """Open each index file a plan is about to fold (its footer: what the fold opens first), so a
    truncated or overwritten one fails the planning with IndexCorruptError naming it and its
    repair, before a plan that could never run is written."""
    for r in rels:
        IndexFile(table.io, table.abs(r)).close()


def _index_file_instant(rel: str) -> str:
    """``index/bucket=n/<kind>_<instant>[_<attempt>].arrow`` -> ``<instant>``."""
    name = rel.rsplit("/", 1)[-1].split(".", 1)[0]
    return name.split("_")[1]


def compaction_metadata(instant: str, plan: dict[str, Any], written: list[dict[str, Any]],
                        index_written: list[dict[str, Any]] | None = None) -> Written:
    """What the compaction ``instant`` wrote, for its commit: one new base per planned group and
    index bucket, and the logs and index files they replace."""
    by_group = {(w["part"], w["fid"]): w for w in written}
    groups = []
    for g in plan.get("file_groups", []):
        w = by_group.get((g["partition"], g["file_id"]))
        if w is None:
            raise RuntimeError(f"compaction {instant} wrote no base for {g['partition']}/{g['file_id']}")
        groups.append(FileGroupChange(partition=g["partition"], file_id=g["file_id"], path=w["path"],
                                      base_rows=w["num_rows"], size=w["size"], compacted_logs=tuple(g["logs"])))
    by_bucket = {int(w["bucket"]): w for w in index_written or []}
    added, removed = [], []
    for b in plan.get("index_buckets", []):
        w = by_bucket.get(int(b["bucket"]))
        if w is None:
            raise RuntimeError(f"compaction {instant} wrote no index base for bucket {b['bucket']}")
        added.append(IndexFileChange(bucket=int(b["bucket"]), path=w["path"], entries=int(w["entries"]),
                                     size=int(w["size"]), kind="base", sealed=bool(w.get("sealed"))))
        removed += b["files"]
    return Written(
        operation=plan.get("operation") or "compaction", file_groups=tuple(groups), index_added=tuple(added),
        index_removed=tuple(removed),
        counts={"file_groups": len(groups),
                "logs_folded": sum(len(g["logs"]) for g in plan.get("file_groups", [])),
                "rows": sum(int(w["num_rows"]) for w in written),
                "index_buckets": len(added),
                "index_deltas_folded": sum(int(b["deltas"]) for b in plan.get("index_buckets", [])),
                "index_entries": sum(int(a.entries or 0) for a in added),
                "index_bases_sealed": sum(1 for a in added if a.sealed)},
    )


# -- execution: the rules every engine follows ---------------------------------------------

#: an engine's part of executing a plan: write the new bases the plan asks for under ``txn``'s
#: markers (files named with ``txn.attempt``) and return what it wrote -- one row per file group
#: (``part, fid, path, num_rows, size``) and one per index bucket (``bucket, path, entries,
#: size, sealed``), as :data:`spark_jobs.kernels.tasks.COMPACT_OUTPUT` / ``COMPACT_INDEX_OUTPUT``
Write = Callable[["Table", "Transaction"], tuple[list[dict[str, Any]], list[dict[str, Any]]]]
#: ``pick(table, plan)``: the engine that executes one plan and the choice to record (None: none)
Pick = Callable[["Table", dict[str, Any]], tuple[Write, "EngineChoice | None"]]


class StalePlanError(BadInputError):
    """A compaction plan whose files changed since it was planned (:func:`check_plan`): it can
    never run. ``instant``: the plan, which an automatic compaction cancels (its plans race)."""

    def __init__(self, message: str, *, instant: str) -> None:
        super().__init__(message)
        self.instant = instant


def check_plan(txn: "Transaction") -> None:
    """A plan only folds what is still there: each planned group's base is still its base, and
    each planned index bucket still starts with exactly the files the plan folds (a rehash
    would have conflicted). BadInputError otherwise (a retry cannot help: cancel it)."""
    plan, view = txn.plan, txn.view
    assert view is not None
    for g in plan.get("file_groups", []):
        s = view.file_groups.get((g["partition"], g["file_id"]))
        if s is None or s.path != g["base"]:
            raise StalePlanError(f"compaction {txn.ts}: file group {g['partition']}/{g['file_id']} changed "
                                 f"since it was planned; cancel it (`bucketindex rollback {txn.ts}`) and schedule "
                                 f"again", instant=txn.ts)
    for b in plan.get("index_buckets", []):
        # its sealed bases, then exactly the files it folds (open base, oldest deltas)
        below = [*b.get("sealed", []), *b["files"]]
        if view.index_files.get(int(b["bucket"]), [])[: len(below)] != below:
            raise StalePlanError(f"compaction {txn.ts}: index bucket {b['bucket']} changed since it was planned; "
                                 f"cancel it (`bucketindex rollback {txn.ts}`) and schedule again", instant=txn.ts)


def plan_index_base_cap(plan: dict[str, Any]) -> int:
    """The cap past which the plan's new index bases are sealed (a plan scheduled before the cap
    existed seals at the default)."""
    return int(plan.get("index_base_cap") or DEFAULT_INDEX_BASE_CAP)


def execute_plan(table: "Table", txn: "Transaction", write: Write, choice: "EngineChoice | None" = None
                 ) -> Written:
    """Execute the resumed plan ``txn`` with an engine's ``write``; returns what it wrote.

    A retried task (Spark) may have written a group's or bucket's base twice: one file per
    group and bucket is kept, the last by path (the commit's marker cleanup deletes the other).
    """
    t0 = time.perf_counter()
    assert txn.view is not None and txn.view.schema is not None and table.config is not None and txn.attempt
    check_plan(txn)
    written, index_written = write(table, txn)
    one = {(w["part"], w["fid"]): w for w in sorted(written, key=lambda w: w["path"])}
    index_one = {int(w["bucket"]): w for w in sorted(index_written, key=lambda w: w["path"])}
    if one:
        log.info("compaction %s: %s folded into new bases", txn.ts, plural(len(one), "file group"))
    if index_one:
        log.info("compaction %s: %s folded into new bases (%s, %d sealed)", txn.ts,
                 plural(len(index_one), "index bucket"),
                 plural(sum(int(b["deltas"]) for b in txn.plan.get("index_buckets", [])), "delta"),
                 sum(1 for w in index_one.values() if w["sealed"]))
    ms = int((time.perf_counter() - t0) * 1000)
    log.info("compaction %s done in %d ms%s", txn.ts, ms, f" on {choice.engine}" if choice is not None else "")
    return compaction_metadata(txn.ts, txn.plan, list(one.values()), list(index_one.values())).replace(
        engine=EngineInfo.from_json(choice.as_metadata()) if choice is not None else None,
        timings_ms={"compact_ms": ms})


def run(uri: str, pick: Pick, *, policy: CompactionPolicy | None = None, schedule_only: bool = False,
        instant: str | None = None, heartbeat_timeout_s: float | None = None) -> dict[str, Any]:
    """Schedule a compaction (``schedule_only``), execute a scheduled one (``instant``), or both.

    Both (neither ``schedule_only`` nor ``instant``) first executes, oldest first, the
    scheduled plans no live process is executing -- a plan whose scheduler died before it
    could report the instant, or one ``--schedule-only`` left -- since the buckets and file
    groups they hold are left out of every new plan until they run; then it schedules and
    executes what is still due. Executing a plan is idempotent (a completed one is a no-op),
    so a plan picked up here and by its own ``--execute`` is folded once.

    ``pick(table, plan)`` names the engine of each plan executed (called only when a plan
    runs, so scheduling starts no engine). Returns ``{"instant": ts or None, "scheduled":
    bool, "executed": bool, "noop": bool, "resumed": [...], "engine": {...}, ...}``;
    ``instant`` None means nothing was due and nothing was written.
    """
    table = Table.load(uri)
    started = time.perf_counter()
    out: dict[str, Any] = {"instant": instant, "scheduled": False, "executed": False, "noop": False}
    engines: dict[str, dict[str, str]] = {}
    if instant is not None:
        _refuse_rebuild(table, instant)

    def work(txn: "Transaction") -> Written:
        write, choice = pick(table, txn.plan)
        if choice is not None:
            engines[txn.ts] = choice.as_metadata()
        return execute_plan(table, txn, write, choice)

    if instant is None and not schedule_only:
        out["resumed"] = [{"instant": d.instant, "noop": d.noop, "counts": d.metadata.get("counts", {}),
                           **({"engine": engines[d.instant]} if d.instant in engines else {})}
                          for d in execute_waiting(table, Action.COMPACTION, work,
                                                   heartbeat_timeout_s=heartbeat_timeout_s,
                                                   select=lambda plan: not is_rebuild(plan))]
    if instant is None:
        planned = schedule_compaction(table, policy or CompactionPolicy(), heartbeat_timeout_s=heartbeat_timeout_s)
        if planned is None:
            ran = [r for r in out.get("resumed", []) if not r["noop"]]
            if ran:  # nothing new was due, but waiting plans ran
                out.update(instant=ran[-1]["instant"], executed=True, counts=ran[-1]["counts"],
                           total_ms=int((time.perf_counter() - started) * 1000))
                if "engine" in ran[-1]:
                    out["engine"] = ran[-1]["engine"]
                return out
            out["noop"] = True
            return out
        instant = out["instant"] = planned["instant"]
        out.update(scheduled=True, file_groups=planned["file_groups"], index_buckets=planned["index_buckets"])
        if schedule_only:
            return out

    done = execute(table, instant, Action.COMPACTION, work, heartbeat_timeout_s=heartbeat_timeout_s)
    out.update(executed=not done.noop, noop=done.noop, counts=done.metadata.get("counts", {}),
               total_ms=int((time.perf_counter() - started) * 1000))
    engine = engines.get(instant) or done.metadata.get("engine")
    if engine:
        out["engine"] = engine
    return out


# -- automatic compaction: an upsert's post-commit step ------------------------------------

#: an automatic compaction's bounds per upsert (``upsert --auto-compact-max-groups``,
#: ``--auto-compact-max-bytes``): what it may add to an upsert's latency. Measured by
#: benchmarks/auto_compact.py (docs/benchmarks.md, "Automatic compaction"): folding all three
#: groups (up to 100k rows each, 9 columns) of a 200k-row table took 0.9-1.8 s at load 10 on
#: 2 cores, so 4 groups stay around 2-3 s; an upsert touching up to 16 groups a batch keeps
#: up with the 4-log rule. 512 MiB of bases and logs bounds the memory of one plan
DEFAULT_AUTO_MAX_GROUPS = 4
DEFAULT_AUTO_MAX_BYTES = 512 * 1024 * 1024
#: record-index buckets folded per upsert (``upsert --auto-compact-max-buckets``), most deltas
#: first. A bucket's fold reads its open base (at most the index base cap, 1M entries: ~17 MB)
#: and its deltas and writes one base: measured by benchmarks/auto_compact_index.py
#: (docs/benchmarks.md, "Automatic index compaction"), 16 buckets, 100 upserts of 1k rows: the
#: automatic compaction (data groups included) took a median 0.9 s, at most 3.3 s at 1M keys,
#: 2.0 s / 9.1 s at 10M keys (load 8-12), and kept a 1M-key batch's tag phase at 1.2-1.6x a
#: fully compacted index's instead of 10-11x. A uniform batch touches every bucket, so
#: with B buckets they fall due together every ``min_deltas`` upserts and this budget folds
#: them over ceil(B / N) upserts; a bucket then holds at most about min_deltas + B / N deltas
DEFAULT_AUTO_MAX_BUCKETS = 4
#: the plan's ``trigger`` of an automatic compaction (an explicit one has none): the next
#: upsert resumes such a plan left by a crash; ``bucketindex compact`` resumes every plan
AUTO_TRIGGER = "auto"


@dataclass(frozen=True)
class AutoCompaction:
    """What an upsert compacts after its commit: the file groups it touched that the policy's
    ``due`` rule (:meth:`CompactionPolicy.due`, the defaults of ``bucketindex compact``) says
    are due, at most ``max_groups`` of them; and, on a record-index table, the index buckets it
    wrote a delta to that :meth:`CompactionPolicy.index_due` says are due (``--min-deltas`` 10,
    ``--delta-ratio`` 0.5: the defaults of ``compact``), at most ``max_buckets`` of them; in all
    at most ``max_bytes`` of bases, logs and deltas. Index deltas are folded too because every
    lookup opens every file of its bucket: left to a nightly ``compact``, 100 hourly upserts
    left ~100 deltas a bucket and the tag phase of a 1M-key batch took 17-21 s instead of 3-4 s
    (docs/benchmarks.md, "Results at 100M rows")."""

    max_groups: int = DEFAULT_AUTO_MAX_GROUPS
    max_bytes: int = DEFAULT_AUTO_MAX_BYTES
    max_buckets: int = DEFAULT_AUTO_MAX_BUCKETS

    def __post_init__(self) -> None:
        if self.max_groups < 1:
            raise BadInputError(f"--auto-compact-max-groups must be at least 1, got {self.max_groups}")
        if self.max_bytes < 1:
            raise BadInputError(f"--auto-compact-max-bytes must be at least 1 byte, got {self.max_bytes}")
        if self.max_buckets < 1:
            raise BadInputError(f"--auto-compact-max-buckets must be at least 1, got {self.max_buckets}")

    @property
    def policy(self) -> CompactionPolicy:
        """``compact``'s due rules with this run's bounds; data logs and index deltas both."""
        return CompactionPolicy(max_groups=self.max_groups, max_bytes=self.max_bytes, max_buckets=self.max_buckets)


def is_auto(plan: dict[str, Any]) -> bool:
    """Whether a compaction plan was scheduled by an upsert's automatic compaction."""
    return plan.get("trigger") == AUTO_TRIGGER


def auto_compact(table: "Table", *, touched: Iterable[tuple[str, str]], pick: Pick, settings: AutoCompaction,
                 after: str, heartbeat_timeout_s: float | None = None,
                 touched_buckets: Iterable[int] = ()) -> dict[str, Any]:
    """An upsert's post-commit step: compact the due file groups among ``touched`` and the due
    record-index buckets among ``touched_buckets`` (those it wrote a delta to) through the
    protocol of ``bucketindex compact`` -- a scheduled ``compaction`` plan (``trigger: auto``,
    ``after``: the upsert's instant), then its execution and commit point -- so a crash in the
    middle leaves a plan that the next upsert's automatic compaction (one waiting plan per
    upsert, resumed first) or ``bucketindex compact`` finishes, and a racing writer's plan
    never folds the same group (scheduling skips groups held by a pending plan; two plans
    that raced to name one group conflict at the commit point, and the later is cancelled).

    Never raises: the upsert has committed, and nothing here may fail or undo it. An error
    is logged as a warning and returned under ``error``; the plan it may leave is resumed
    later. Returns ``{"instant", "file_groups", "logs", "index_buckets", "deltas",
    "due_index_buckets", "resumed", "total_ms"}`` (``instant`` None: nothing due;
    ``due_index_buckets``: how many of the touched buckets were due, of which the budget
    planned ``index_buckets``)."""
    started = time.perf_counter()
    out: dict[str, Any] = {"instant": None, "file_groups": 0, "logs": 0, "index_buckets": 0, "deltas": 0,
                           "resumed": []}
    try:
        def work(txn: "Transaction") -> Written:
            write, choice = pick(table, txn.plan)
            written = execute_plan(table, txn, write, choice)
            maybe_crash("auto_compact_before_commit")
            return written

        # a plan an earlier upsert's automatic compaction left (killed, or its scheduler died)
        # holds its groups back from every new plan: finish it first, one per upsert
        # (not one its scheduler is about to execute: two attempts at one plan are correct, but
        # the loser's work is wasted)
        def waiting(plan: dict[str, Any]) -> bool:
            return is_auto(plan) and not owner_alive(plan.get("scheduled_by"), heartbeat_timeout_s)

        resumed = _cancelling_stale(table, lambda: execute_waiting(
            table, Action.COMPACTION, work, heartbeat_timeout_s=heartbeat_timeout_s, select=waiting, limit=1))
        out["resumed"] = [d.instant for d in resumed or []]
        policy = settings.policy
        buckets = {int(b) for b in touched_buckets}
        plan = plan_compaction(table, table.view(), policy, heartbeat_timeout_s=heartbeat_timeout_s,
                               groups=set(touched), buckets=buckets)
        if plan is None:
            return out
        planned = plan["index_buckets"]
        due = int(plan.get("index_buckets_due", len(planned)))
        inst = schedule(table, Action.COMPACTION, {**plan, "trigger": AUTO_TRIGGER, "after": after})
        out.update(instant=inst.timestamp, file_groups=len(plan["file_groups"]),
                   logs=sum(len(g["logs"]) for g in plan["file_groups"]), index_buckets=len(planned),
                   deltas=sum(int(b["deltas"]) for b in planned), due_index_buckets=due)
        log.info("automatic compaction %s after %s: %s (%s), %s of %d due (%s; budget %d buckets, %s)",
                 inst.timestamp, after, plural(out["file_groups"], "file group"), plural(out["logs"], "log"),
                 plural(out["index_buckets"], "index bucket"), due, plural(out["deltas"], "delta"),
                 settings.max_buckets, _mib(settings.max_bytes))
        done = _cancelling_stale(table, lambda: [execute(table, inst.timestamp, Action.COMPACTION, work,
                                                         heartbeat_timeout_s=heartbeat_timeout_s)])
        if done is None:
            out.update(instant=None, cancelled=inst.timestamp)
        else:
            out["noop"] = done[0].noop
    except ConflictError as e:  # a concurrent compaction of the same group committed first: it is folded
        log.info("automatic compaction after %s gave way to a concurrent compaction (%s)", after, e)
        out["conflict"] = str(e)
    except Exception as e:  # noqa: BLE001 - post-commit: the upsert stands; the plan waits for the next run
        log.warning("automatic compaction after %s did not complete (%s: %s); the upsert is committed, and the "
                    "next upsert or `bucketindex compact %s` finishes or replaces its plan", after,
                    type(e).__name__, e, table.display_uri)
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        out["total_ms"] = int((time.perf_counter() - started) * 1000)
    return out


def _mib(n: int) -> str:
    return f"{n / 1048576:.0f} MiB" if n >= 1048576 else f"{n} bytes"


def _cancelling_stale(table: "Table", step: Callable[[], list[Any]]) -> list[Any] | None:
    """``step()``; None when it met an automatic plan another writer's compaction made stale
    (two writers planned one group before either plan was on the timeline, and the other
    committed first): that plan can never run, so it is cancelled here rather than left to
    hold its groups back from every later plan."""
    try:
        return step()
    except StalePlanError as e:
        inst = table.timeline.reload().find(e.instant)
        if inst is None or inst.is_completed or not is_auto(table.timeline.read_plan(inst)):
            raise
        log.info("automatic compaction %s: a concurrent compaction folded its groups first; cancelling it",
                 e.instant)
        rollback(table, e.instant, force=True)
        return None


# -- rebuilding the record index from the data ----------------------------------------------

#: the ``operation`` of a compaction that rebuilds index buckets from the snapshot's rows
#: instead of folding their files (format.md §6.2)
REBUILD_OPERATION = "index_rebuild"


def is_rebuild(plan: dict[str, Any]) -> bool:
    """Whether a compaction plan rebuilds index buckets from the data (its buckets' entries are
    a scan of the snapshot's rows, not a merge of the files it replaces)."""
    return plan.get("operation") == REBUILD_OPERATION


def _refuse_rebuild(table: "Table", instant: str) -> None:
    """An index rebuild runs in-process (a scan of every live key): ``compact --execute`` on
    another engine must not fold the damaged files it replaces."""
    inst = table.timeline.find(instant)
    if inst is None or inst.is_completed or inst.action != Action.COMPACTION:
        return  # execute() says what is wrong, or that it is done
    if is_rebuild(table.timeline.read_plan(inst)):
        raise BadInputError(f"compaction {instant} rebuilds the record index from the data: finish it with "
                            f"`bucketindex compact {table.uri} --rebuild-index`")


def plan_index_rebuild(table: "Table", view: FileSystemView, buckets: Sequence[int], *,
                       index_base_cap: int = DEFAULT_INDEX_BASE_CAP) -> dict[str, Any]:
    """The plan of an index rebuild on ``view``: for each bucket, every index file it reads now
    (sealed and open bases, deltas) is replaced by one base holding, for each live row whose
    key hashes to the bucket, its (partition, file id) -- whatever those files say, so a
    missing or damaged one is never opened. Deltas committed after the plan stay on top of the
    new base, as after a compaction (they are newer than any snapshot the rebuild scans)."""
    out = []
    for b in sorted(set(buckets)):
        files = list(view.index_files.get(b, []))
        out.append({"bucket": b, "files": files, "sealed": [], "deltas": sum(1 for f in files if is_index_delta(f)),
                    "rebuild": True})
    return {"operation": REBUILD_OPERATION, "snapshot_seq": view.seq, "index_base_cap": index_base_cap,
            "file_groups": [], "index_buckets": out}


def run_rebuild(uri: str, write: Write, *, buckets: Sequence[int] | None = None,
                index_base_cap: int = DEFAULT_INDEX_BASE_CAP, heartbeat_timeout_s: float | None = None,
                choice: "EngineChoice | None" = None) -> dict[str, Any]:
    """Rebuild record-index buckets (default: every bucket) from the latest snapshot's rows, as
    one compaction commit (:func:`plan_index_rebuild`); ``write`` is an engine's
    :data:`Write` that can build a rebuild plan's bases.

    Crash-safe as every table service: the plan is scheduled first, and a run killed anywhere
    leaves the old snapshot (or, past the commit point, the new one); the next rebuild resumes
    a waiting rebuild plan before planning anew, and its commit's marker cleanup deletes the
    dead attempt's files. A pending ordinary compaction plan holding one of the buckets folds
    the very files being replaced (and cannot read a damaged one): it is cancelled first, unless
    a live process is executing it (WriterAliveError: busy, retry).

    Returns ``{"instant", "executed", "noop", "buckets", "resumed", "counts", "engine"}``.
    """
    table = Table.load(uri)
    assert table.config is not None
    if table.config.index_type != INDEX_RECORD:
        raise BadInputError(f"{table.uri} has the {table.config.index_type} index, which keeps no index files: "
                            f"there is nothing to rebuild (--rebuild-index is for the record index)")
    if not isinstance(index_base_cap, int) or index_base_cap < 1:
        raise BadInputError(f"--index-base-cap must be at least 1, got {index_base_cap}")
    started = time.perf_counter()
    nb = table.num_buckets()
    wanted = sorted(set(range(nb) if buckets is None else buckets))
    wrong = [b for b in wanted if not 0 <= b < nb]
    if wrong:
        raise BadInputError(f"--bucket {wrong[0]}: {table.uri} has {plural(nb, 'index bucket')} (0 to {nb - 1})")

    def work(txn: "Transaction") -> Written:
        return execute_plan(table, txn, write, choice)

    # a rebuild killed before it completed: finish it first (its plan holds its buckets)
    resumed = execute_waiting(table, Action.COMPACTION, work, heartbeat_timeout_s=heartbeat_timeout_s,
                              select=is_rebuild)
    out: dict[str, Any] = {"instant": None, "executed": False, "noop": False, "buckets": [],
                           "resumed": [{"instant": d.instant, "noop": d.noop, "counts": d.metadata.get("counts", {})}
                                       for d in resumed]}
    if choice is not None:
        out["engine"] = choice.as_metadata()
    done_buckets = {int(b["bucket"]) for d in resumed for b in d.metadata.get("index", {}).get("added", [])}
    todo = [b for b in wanted if b not in done_buckets]
    if not todo:
        last = resumed[-1]
        out.update(instant=last.instant, executed=not last.noop, noop=last.noop, buckets=wanted,
                   counts=last.metadata.get("counts", {}), total_ms=int((time.perf_counter() - started) * 1000))
        return out
    _cancel_plans_holding(table, set(todo), heartbeat_timeout_s)
    plan = plan_index_rebuild(table, table.view(), todo, index_base_cap=index_base_cap)
    inst = schedule(table, Action.COMPACTION, plan)
    log.info("index rebuild %s planned: %s from the data of commit %d (%s replaced)", inst.timestamp,
             plural(len(todo), "bucket"), plan["snapshot_seq"],
             plural(sum(len(b["files"]) for b in plan["index_buckets"]), "index file"))
    done = execute(table, inst.timestamp, Action.COMPACTION, work, heartbeat_timeout_s=heartbeat_timeout_s)
    out.update(instant=inst.timestamp, executed=not done.noop, noop=done.noop, buckets=todo,
               counts=done.metadata.get("counts", {}), total_ms=int((time.perf_counter() - started) * 1000))
    return out


def _cancel_plans_holding(table: "Table", buckets: set[int], heartbeat_timeout_s: float | None) -> None:
    """Cancel the pending compaction plans that fold files of ``buckets`` (WriterAliveError when
    a live process executes one): the rebuild replaces every file of those buckets, so such a
    plan could never commit after it -- and a plan folding a damaged file can never run."""
    for inst, plan in pending_plans(table, Action.COMPACTION):
        held = {int(b["bucket"]) for b in plan.get("index_buckets", [])} & buckets
        if not held:
            continue
        if inst.state == State.INFLIGHT and is_writer_alive(table, inst, heartbeat_timeout_s):
            raise WriterAliveError(f"busy: compaction {inst.timestamp} is folding index bucket {min(held)} in a "
                                   f"live process; rebuild it once that completes")
        log.info("cancelling compaction %s: it folds index files of bucket %s, which the rebuild replaces",
                 inst.timestamp, ", ".join(map(str, sorted(held))))
        rollback(table, inst.timestamp, force=True)
