"""Data compaction of merge-on-read file groups: what is due, the plan, and what it commits.

A file group's logs make every read merge them and grow with every upsert; compaction
folds a group's base and logs into a new base (``spark_jobs.jobs.compact`` does the Spark
part). The plan names the exact files: logs committed after it stay on top of the new base
and keep winning (format.md §5.2), so compaction never blocks or conflicts with upserts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from spark_jobs.table.action.service import pending_plans
from spark_jobs.table.config import BadInputError
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import FileSlice, FileSystemView

if TYPE_CHECKING:
    from spark_jobs.table.table import Table

__all__ = ["CompactionPolicy", "plan_compaction", "compaction_metadata"]

#: defaults measured on the development VM (docs/benchmarks.md, merge-on-read): reads of a
#: 100k-row group slow down by a few percent per log; four logs or logs of a fifth of the
#: base's bytes cost about what one compaction saves within a day of hourly upserts
DEFAULT_MIN_LOGS = 4
DEFAULT_LOG_RATIO = 0.2


@dataclass(frozen=True)
class CompactionPolicy:
    """Which file groups are due: at least ``min_logs`` logs, or logs of at least
    ``log_ratio`` x the base's bytes; at most ``max_groups`` per plan (most log bytes first)."""

    min_logs: int = DEFAULT_MIN_LOGS
    log_ratio: float = DEFAULT_LOG_RATIO
    max_groups: int | None = None

    def __post_init__(self) -> None:
        if self.min_logs < 1:
            raise BadInputError(f"--min-logs must be at least 1, got {self.min_logs}")
        if self.log_ratio <= 0:
            raise BadInputError(f"--log-ratio must be positive, got {self.log_ratio}")
        if self.max_groups is not None and self.max_groups < 1:
            raise BadInputError(f"--max-groups must be at least 1, got {self.max_groups}")

    def due(self, s: FileSlice) -> bool:
        log_bytes = s.total_size - s.size
        return bool(s.logs) and (len(s.logs) >= self.min_logs or log_bytes >= self.log_ratio * max(s.size, 1))


def plan_compaction(table: "Table", view: FileSystemView, policy: CompactionPolicy) -> dict[str, Any] | None:
    """The plan of a data compaction on ``view``, or None when no file group is due.

    File groups in another pending compaction plan are left out: two plans never fold the
    same logs.
    """
    assert table.config is not None
    if not table.config.merge_on_read:
        raise BadInputError(f"{table.uri} is a {table.config.table_type} table: it has no logs to compact")
    busy = {(g["partition"], g["file_id"]) for _, plan in pending_plans(table, Action.COMPACTION)
            for g in plan.get("file_groups", [])}
    due = [s for s in view.slices() if policy.due(s) and (s.partition, s.file_id) not in busy]
    due.sort(key=lambda s: (-(s.total_size - s.size), s.partition, s.file_id))
    if policy.max_groups is not None:
        due = due[: policy.max_groups]
    if not due:
        return None
    return {
        "operation": "compaction",
        "snapshot_seq": view.seq,
        "policy": asdict(policy),
        "file_groups": [
            {"partition": s.partition, "file_id": s.file_id, "base": s.path, "logs": [lf.path for lf in s.logs],
             "log_bytes": s.total_size - s.size, "base_bytes": s.size}
            for s in due
        ],
    }


def compaction_metadata(instant: str, plan: dict[str, Any], written: list[dict[str, Any]]) -> dict[str, Any]:
    """The completed compaction's metadata: one new base per planned group, the logs it folds."""
    by_group = {(w["part"], w["fid"]): w for w in written}
    groups = []
    for g in plan["file_groups"]:
        w = by_group.get((g["partition"], g["file_id"]))
        if w is None:
            raise RuntimeError(f"compaction {instant} wrote no base for {g['partition']}/{g['file_id']}")
        groups.append({"partition": g["partition"], "file_id": g["file_id"], "path": w["path"],
                       "base_rows": w["num_rows"], "size": w["size"], "compacted_logs": g["logs"]})
    return {
        "action": Action.COMPACTION,
        "instant": instant,
        "operation": "compaction",
        "file_groups": groups,
        "index": {"added": [], "removed": []},
        "counts": {"file_groups": len(groups), "logs_folded": sum(len(g["logs"]) for g in plan["file_groups"]),
                   "rows": sum(int(w["num_rows"]) for w in written)},
    }
