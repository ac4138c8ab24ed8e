"""Questions a scheduler asks about a table, answered from its metadata alone.

Pure Python over :class:`~spark_jobs.table.table.Table` (no Spark, no Airflow): the
provider's sensors and triggers call these every poke, so each one lists the timeline once,
reads only small JSON files (config, commit sequence, plans, heartbeats) and writes nothing.
The answers are JSON-able, because a trigger sends them back to its task as an event payload.

Every function raises :class:`~spark_jobs.table.config.BadInputError` (one line) when no
table exists at ``uri``.
"""

from __future__ import annotations

from typing import Any

from spark_jobs.exceptions import BadInputError
from spark_jobs.table.action.compact import (
    DEFAULT_DELTA_RATIO,
    DEFAULT_LOG_RATIO,
    DEFAULT_MIN_DELTAS,
    DEFAULT_MIN_LOGS,
    CompactionPolicy,
    compactable,
    plan_compaction,
)
from spark_jobs.table.table import Table, pending_plans
from spark_jobs.table.timeline import Action, State

__all__ = ["compaction_due", "pending_writes", "find_commit", "commits_after", "COMMIT_ACTIONS"]

#: the actions ``find_commit`` returns: the ones that add a batch of user data (an upsert,
#: a bootstrap), as :meth:`Table.commit_for_batch`; compactions and rehashes change no rows
COMMIT_ACTIONS = (Action.COMMIT, Action.BOOTSTRAP)


def compaction_due(uri: str, *, min_logs: int = DEFAULT_MIN_LOGS, log_ratio: float = DEFAULT_LOG_RATIO,
                   min_deltas: int = DEFAULT_MIN_DELTAS, delta_ratio: float = DEFAULT_DELTA_RATIO) -> dict[str, Any]:
    """What a compaction scheduled now would fold, without scheduling it.

    The decision is :func:`~spark_jobs.table.action.compact.plan_compaction`'s (the same
    :class:`CompactionPolicy`, the same exclusion of file groups and index buckets already in
    a pending compaction plan), so "due" here means ``bucketindex compact`` would write a plan.
    Returns ``{"due", "file_groups", "logs", "log_bytes", "index_buckets", "index_deltas",
    "reason", "pending_plans"}``: the counts are the would-be plan's (0 when nothing is due);
    ``pending_plans`` lists scheduled compactions still waiting for ``compact --execute``
    (what they fold is not counted again). A table with nothing to compact (copy-on-write
    without the record index: no logs, no index deltas) is never due, which is an answer,
    not an error. BadInputError for a missing table or a policy out of range.
    """
    policy = CompactionPolicy(min_logs=int(min_logs), log_ratio=float(log_ratio), min_deltas=int(min_deltas),
                              delta_ratio=float(delta_ratio))
    table = Table.load(uri)
    assert table.config is not None
    out: dict[str, Any] = {"due": False, "file_groups": 0, "logs": 0, "log_bytes": 0, "index_buckets": 0,
                           "index_deltas": 0, "reason": "", "pending_plans": []}
    data, index = compactable(table, policy)
    no_logs = f"{table.config.table_type} table: upserts rewrite base files, there are no logs to compact"
    if not (data or index):
        out["reason"] = f"{no_logs}, and the {table.config.index_type} index has no deltas"
        return out
    view = table.view()
    plan = plan_compaction(table, view, policy)  # computes only: scheduling is a separate step
    out["pending_plans"] = [inst.timestamp for inst, _ in pending_plans(table, Action.COMPACTION)]
    rule = f"min_logs={policy.min_logs}, log_ratio={policy.log_ratio:g}"
    index_rule = f"min_deltas={policy.min_deltas}, delta_ratio={policy.delta_ratio:g}"
    reasons = []
    groups = plan["file_groups"] if plan else []
    buckets = plan["index_buckets"] if plan else []
    if groups:
        out.update(file_groups=len(groups), logs=sum(len(g["logs"]) for g in groups),
                   log_bytes=sum(int(g["log_bytes"]) for g in groups))
        reasons.append(f"{out['file_groups']} file group(s) due ({rule}): "
                       f"{out['logs']} log(s), {out['log_bytes']} log bytes")
    elif not data:
        reasons.append(no_logs)
    else:
        with_logs = [s for s in view.slices() if s.logs]
        if not with_logs:
            reasons.append("no file group has logs")
        elif any(policy.due(s) for s in with_logs):
            reasons.append(f"every due file group is in a pending compaction plan "
                           f"({', '.join(out['pending_plans'])}): execute it instead")
        else:
            reasons.append(f"{len(with_logs)} file group(s) have logs, none is due ({rule})")
    if buckets:
        out.update(index_buckets=len(buckets), index_deltas=sum(int(b["deltas"]) for b in buckets))
        reasons.append(f"{out['index_buckets']} index bucket(s) due ({index_rule}): {out['index_deltas']} delta(s)")
    elif index:
        reasons.append(f"no index bucket is due ({index_rule})")
    out["due"] = plan is not None
    out["reason"] = "; ".join(reasons)
    return out


def pending_writes(uri: str, *, heartbeat_timeout_s: float | None = None) -> list[dict[str, Any]]:
    """Writes in progress right now: pending instants of a writing action whose writer is alive.

    * ``commit``, ``rehash``, ``bootstrap`` (:data:`Action.WRITES` minus the services): counted
      while their writer heartbeats (:func:`~spark_jobs.table.table.is_writer_alive`
      with ``heartbeat_timeout_s``, default 60 s). An abandoned one -- a killed or crashed
      writer -- is not in progress: nothing will ever complete it, and waiting for it would
      wait for ever (``bucketindex rollback`` or the next writer's repair removes it).
    * table services (``compaction``, :data:`Action.SERVICES`): a scheduled plan
      (``requested``) is durable and may wait days for its executor, so it is **not** a
      write in progress; it is counted only while a live process executes it (``inflight``
      with a live heartbeat). A crashed execution (``inflight``, dead heartbeat) waits for
      the next ``compact --execute`` and is not counted either.
    * ``rollback`` and ``clean`` are not writes (they only delete files no snapshot shows).

    Returns one dict per write, oldest first: :meth:`Table.writers`'s (``instant``,
    ``action``, ``state``, ``batch_id``, ``host``, ``pid``, ``started``, ``last_heartbeat``, ...).
    """
    table = Table.load(uri)
    return [w for w in table.writers(heartbeat_timeout_s)
            if w["action"] in Action.WRITES and w["alive"]
            and not (w["action"] in Action.SERVICES and w["state"] != State.INFLIGHT.name.lower())]


def find_commit(uri: str, *, batch_id: str | None = None, after_instant: str | None = None) -> dict[str, Any] | None:
    """The completed commit of ``batch_id``, or the first one whose instant is after ``after_instant``.

    Exactly one of the two. ``batch_id`` is compared exactly (the commit metadata's
    ``batch_id``; a batch committed twice -- not possible through the writers, which skip
    committed batches -- gives the latest). ``after_instant`` is an instant time (digits,
    ``yyyyMMddHHmmssSSS``; a prefix such as ``20240131`` compares as that day's start): the
    first such commit *in commit order*, i.e. the first one a reader could have seen. Only
    :data:`COMMIT_ACTIONS` count. Returns ``{"instant", "action", "seq", "batch_id",
    "counts"}`` or None if there is none yet.
    """
    if (batch_id is None) == (after_instant is None):
        raise BadInputError("find_commit needs exactly one of batch_id and after_instant")
    if after_instant is not None:
        after_instant = str(after_instant)
        if not after_instant.isdigit():
            raise BadInputError(f"after_instant must be an instant time (yyyyMMddHHmmssSSS digits), "
                                f"got {after_instant!r}")
    table = Table.load(uri)
    tl = table.timeline
    if batch_id is not None:
        found = table.commit_for_batch(str(batch_id))  # reloads the timeline
    else:
        tl.reload()
        # entries before the checkpoint can only qualify if one has a later instant than asked
        old = (tl.checkpoint or {}).get("max_instant", "") > after_instant
        found = next((i for i in tl.completed(COMMIT_ACTIONS, after_seq=0 if old else tl.base_seq)
                      if i.timestamp > after_instant), None)
    if found is None:
        return None
    meta = tl.read_commit(found)
    return {"instant": found.timestamp, "action": found.action, "seq": found.seq,
            "batch_id": meta.batch_id, "counts": dict(meta.counts or {})}


def commits_after(uri: str, *, after_seq: int = 0, after_instant: str | None = None,
                  actions: tuple[str, ...] | list[str] | None = None, limit: int | None = None) -> dict[str, Any]:
    """The completed timeline entries after sequence position ``after_seq``, in commit order:
    what a watcher that has seen everything up to ``after_seq`` has not seen yet, whoever
    committed it (an Airflow task, the CLI, another scheduler, the Python API).

    ``after_instant`` is the instant of entry ``after_seq`` as the caller saw it: when the
    table's entry there has another instant (or the sequence is shorter), the table was
    replaced by a new one at the same place since, and the entries are listed from the
    start (``"replaced": True``) -- a position in one table's sequence means nothing in
    another's. ``actions`` keeps only these actions (None: every action); ``limit`` caps
    the list (the rest comes on the next call, after the last one returned).

    Returns ``{"last_seq", "last_instant", "replaced", "commits": [{"seq", "instant",
    "action", "batch_id", "counts"}, ...]}``; ``last_seq``/``last_instant`` are the
    sequence's end (0 and None for a table without a commit). JSON values only.
    """
    after_seq = int(after_seq)
    if after_seq < 0:
        raise BadInputError(f"after_seq must be at least 0, got {after_seq}")
    if limit is not None and int(limit) < 1:
        raise BadInputError(f"limit must be at least 1, got {limit}")
    tl = Table.load(uri).timeline
    tl.reload()
    last_seq = tl.last_seq
    replaced = after_seq > last_seq
    if not replaced and after_seq and after_instant is not None:
        replaced = _instant_at(tl, after_seq) != str(after_instant)
    start = 0 if replaced else after_seq
    found = tl.completed(actions, after_seq=start)
    if limit is not None:
        found = found[:int(limit)]
    commits = []
    for i in found:
        meta = tl.read_commit(i)
        commits.append({"seq": i.seq, "instant": i.timestamp, "action": i.action, "batch_id": meta.batch_id,
                        "counts": dict(meta.counts or {})})
    return {"last_seq": last_seq, "last_instant": _instant_at(tl, last_seq) if last_seq else None,
            "replaced": replaced, "commits": commits}


def _instant_at(tl: Any, seq: int) -> str:
    """The instant of sequence entry ``seq`` (an archived entry is read on demand)."""
    return str(tl._entry(seq)["instant"])
