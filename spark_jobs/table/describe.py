"""What ``bucketindex show`` prints, as data: :func:`describe` of a table.

It reads the state of every service (the clean's retained window, checkpoints, scheduled
compactions, bucket sizes), so it lives above the actions rather than on
:class:`~spark_jobs.table.table.Table`: the table core imports no action (the actions import
it), and the import graph has no cycle (tests/unit/test_layering.py).
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from spark_jobs.index.record_index import is_sealed_base
from spark_jobs.table.action.checkpoint import describe_checkpoints
from spark_jobs.table.action.clean import describe_clean
from spark_jobs.table.skew import bucket_sizes  # entries per bucket and a suggested count (issue 12)
from spark_jobs.table.table import Table, pending_plans
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import FileSystemView, is_index_delta

__all__ = ["describe"]


def describe(table: Table, *, recent_conflicts: int = 10, recent: int = 30) -> dict[str, Any]:
    """Everything ``bucketindex show`` prints, as data (the last ``recent`` instants of the timeline)."""
    assert table.config is not None
    tl = table.timeline.reload()
    view = FileSystemView.build(tl)
    commits, conflicts = [], []
    for inst in tl.recent(recent):
        meta = tl.read_commit(inst)
        commits.append(
            {
                "seq": inst.seq,
                "instant": inst.timestamp,
                "action": inst.action,
                "batch_id": meta.batch_id,
                "rolled_back": meta.get("rolled_back"),
                "counts": dict(meta.counts or {}),
                "timings_ms": dict(meta.timings_ms or {}),
                "session_start_ms": meta.get("session_start_ms"),
                "engine": meta.engine.to_json() if meta.engine is not None else meta.get("engine"),
                **({"shadow": dict(meta.shadow)} if meta.shadow else {}),  # upsert --shadow-index
                **({"bootstrap": meta.get("bootstrap")} if meta.get("bootstrap") else {}),
                **({"alter": meta.get("alter")} if meta.get("alter") else {}),  # bucketindex alter
                # bucketindex mirror --enable
                **({"properties": dict(meta.properties)} if meta.properties else {}),
            }
        )
        for c in meta.conflicts or ():
            conflicts.append({"instant": inst.timestamp, "batch_id": meta.batch_id, "outcome": "retried",
                              **c})
    for name in table.io.list_names(table.layout.conflicts):
        if name.endswith(".json") and not name.startswith("."):
            note = json.loads(table.io.read_bytes(posixpath.join(table.layout.conflicts, name)))
            for c in note.get("conflicts", [])[-1:]:  # the one it gave up on
                conflicts.append({"instant": note.get("instant"), "batch_id": note.get("batch_id"),
                                  "outcome": f"gave up after {note.get('attempts')} attempt(s)",
                                  "with": c.get("instant"), "with_action": c.get("action"),
                                  "reason": c.get("reason")})
    conflicts.sort(key=lambda c: c["instant"] or "")
    return {
        "bucket_sizes": bucket_sizes(table, view),
        "uri": table.display_uri,
        "config": {
            "record_key_fields": table.config.record_key_fields,
            "partition_fields": table.config.partition_fields,
            "precombine_field": table.config.precombine_field,
            "index_type": table.config.index_type,
            "num_buckets": table.num_buckets(view),
            "table_type": table.config.table_type,
        },
        "timeline": commits,
        "pending": [str(i) for i in tl.pending()],
        "writers": table.writers(),
        "conflicts": conflicts[-recent_conflicts:],
        "file_groups": len(view.file_groups),
        "data_bytes": sum(fs.size for fs in view.file_groups.values()),
        "logs": _log_summary(view, limit=recent_conflicts),
        "rows": view.num_rows,
        "partitions": view.partitions(),
        "index_buckets": {b: len(files) for b, files in sorted(view.index_files.items())},
        "index_deltas": _index_delta_summary(table, view),
        "completed_instants": tl.last_seq,
        "compaction_plans": _compaction_plans(table),
        "clean": describe_clean(table),
        "checkpoints": describe_checkpoints(table),
    }

def _compaction_plans(table: Table) -> list[dict[str, Any]]:
    """Scheduled compactions waiting for (or in) execution, with what each folds."""
    return [{"instant": inst.timestamp, "state": inst.state.name.lower(),
             "file_groups": len(plan.get("file_groups", [])),
             "logs": sum(len(g["logs"]) for g in plan.get("file_groups", [])),
             "index_buckets": len(plan.get("index_buckets", [])),
             "index_deltas": sum(int(b["deltas"]) for b in plan.get("index_buckets", [])),
             "scheduled_by": plan.get("scheduled_by")}
            for inst, plan in pending_plans(table, Action.COMPACTION)]

def _index_delta_summary(table: Table, view: FileSystemView) -> dict[str, Any]:
    """Record-index deltas per bucket (what every lookup opens, and index compaction folds)."""
    per: dict[int, dict[str, int]] = {}
    # one listing of index/ (a page per 1,000 files), not a HEAD per delta (format.md §10)
    sizes = table.io.list_sizes(table.layout.index) if view.index_files else {}
    for b, files in sorted(view.index_files.items()):
        deltas = [f for f in files if is_index_delta(f)]
        per[b] = {"bases": len(files) - len(deltas), "deltas": len(deltas),
                  "delta_bytes": sum(sizes.get(table.abs(f)) or 0 for f in deltas)}
        sealed = sum(map(is_sealed_base, files))
        if sealed:  # bases past the cap, never rewritten (format.md §6.1); told by name
            per[b]["sealed"] = sealed
    return {"total": sum(v["deltas"] for v in per.values()),
            "bytes": sum(v["delta_bytes"] for v in per.values()),
            "max_per_bucket": max((v["deltas"] for v in per.values()), default=0),
            "buckets": per}



def _log_summary(view: FileSystemView, *, limit: int) -> dict[str, Any]:
    """Merge-on-read logs: totals, and the file groups with the most log bytes (compaction's
    candidates), so a user sees what reads pay for merging and what compaction would fold."""
    with_logs = [fs for fs in view.file_groups.values() if fs.logs]
    with_logs.sort(key=lambda fs: (-(fs.total_size - fs.size), fs.partition, fs.file_id))
    return {
        "files": sum(len(fs.logs) for fs in with_logs),
        "bytes": sum(fs.total_size - fs.size for fs in with_logs),
        "file_groups_with_logs": len(with_logs),
        "max_per_group": max((len(fs.logs) for fs in with_logs), default=0),
        "largest": [{"partition": fs.partition, "file_id": fs.file_id, "logs": len(fs.logs),
                     "log_bytes": fs.total_size - fs.size, "base_bytes": fs.size, "rows": fs.num_rows}
                    for fs in with_logs[:limit]],
    }
