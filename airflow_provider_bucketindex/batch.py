"""Batch ids: what makes a retried -- or re-run -- Airflow task apply its batch at most once.

A table remembers the batch id of every commit; an upsert whose batch id is already
committed is a no-op. The default id names the task and the run's **data interval**
(``<dag_id>/<task_id>/<start>--<end>``, UTC; the start alone for a point interval): every try of the task in a run carries it, and
so does every later run of the same interval -- ``airflow dags test DAG 2024-01-01`` after
2024-01-02 finds the first day's batch committed and does nothing, instead of applying it again
under a new id and bringing back what the second day deleted. A run without a data interval
(a manual or asset-triggered run with no logical date) falls back to its run id
(``<dag_id>/<run_id>/<task_id>``). ``replay=True`` on the upsert appends ``/replay/<run_id>``:
that run applies the batch again, on purpose (a corrected source for a past interval), and its
retries still share one id. A mapped task instance (``.expand()`` over landing files) appends its
map index: each file is its own batch, and each can fail, be retried and be rolled back on its own.

Another task (a rollback) finds the batch of the upsert it cleans up after by the same
rule: inside a mapped task group the upsert instance with *its own* map index (the one it
depends on); outside, every instance of a mapped upsert (:func:`upstream_batches`).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, NamedTuple

__all__ = ["UpstreamBatches", "batch_base", "batch_id_from_context", "default_batch_id", "interval_batch_id",
           "replay_suffix", "upstream_batches"]


def default_batch_id(dag_id: str, run_id: str, task_id: str, map_index: int | None = -1) -> str:
    """``<dag_id>/<run_id>/<task_id>`` (``/<map_index>`` appended for a mapped task instance).

    Airflow forbids ``/`` in DAG ids, task ids and run ids, so the id is unambiguous.
    """
    parts = [dag_id, run_id, task_id]
    if map_index is not None and map_index >= 0:
        parts.append(str(map_index))
    return "/".join(parts)


def _utc(value: Any) -> str:
    """An interval bound as UTC ISO-8601 (pendulum or datetime; naive means UTC, as Airflow stores it)."""
    from datetime import timezone

    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat()


def interval_batch_id(dag_id: str, task_id: str, start: Any, end: Any, map_index: int | None = -1) -> str:
    """``<dag_id>/<task_id>/<start>--<end>`` (UTC ISO-8601; ``<start>`` alone when the interval is a
    point, as the cron-trigger timetable of ``@daily`` makes it; ``/<map_index>`` appended for a
    mapped task instance): the batch of this task for one data interval, whichever run processes it."""
    first, last = _utc(start), _utc(end)
    parts = [dag_id, task_id, first if first == last else f"{first}--{last}"]
    if map_index is not None and map_index >= 0:
        parts.append(str(map_index))
    return "/".join(parts)


def batch_base(context: Mapping[str, Any], task_id: str, map_index: int | None = -1) -> str:
    """The default batch id of ``task_id`` in the running task's DAG run: by its data interval when
    the run has one, else by its run id (:func:`interval_batch_id`, :func:`default_batch_id`)."""
    ti = context["ti"]
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is not None and end is not None:
        return interval_batch_id(ti.dag_id, task_id, start, end, map_index)
    return default_batch_id(ti.dag_id, ti.run_id, task_id, map_index)


def replay_suffix(context: Mapping[str, Any]) -> str:
    """What ``replay=True`` appends to a batch id: ``/replay/<run_id>`` (new for each run, the same
    for its tries)."""
    return f"/replay/{context['ti'].run_id}"


class UpstreamBatches(NamedTuple):
    """The batches of task ``task_id`` in this run that another task may act on.

    ``batch_id``: exactly one batch (an unmapped upsert, or the instance of a mapped upsert
    with the caller's own map index); ``None`` when the upsert is mapped and the caller is
    not -- then every batch id matching ``pattern`` (``<dag>/<run>/<task>/<n>``) is one.
    """

    batch_id: str | None
    pattern: "re.Pattern[str]"

    def matches(self, batch_id: str | None) -> bool:
        return batch_id is not None and (batch_id == self.batch_id or
                                         (self.batch_id is None and self.pattern.fullmatch(batch_id) is not None))


def _is_mapped(task: Any) -> bool:
    """The task is ``.expand()``-ed or sits in a mapped task group."""
    if task is None:
        return False
    if getattr(task, "is_mapped", False):
        return True
    closest = getattr(task, "get_closest_mapped_task_group", None)
    return closest is not None and closest() is not None


def upstream_batches(context: Mapping[str, Any], task_id: str) -> UpstreamBatches:
    """The batch(es) of ``task_id`` (an upsert) that the running task (a rollback) refers to."""
    ti = context["ti"]
    own_index = getattr(ti, "map_index", -1)
    own_index = -1 if own_index is None else int(own_index)
    task = context.get("task")
    dag = getattr(task, "dag", None) if task is not None else None
    target = dag.get_task(task_id) if dag is not None and dag.has_task(task_id) else None
    base = batch_base(context, task_id)
    # an instance of a mapped upsert, with or without replay=True (``/replay/<this run>`` after its index)
    pattern = re.compile(re.escape(base) + r"/\d+" + f"(?:{re.escape(replay_suffix(context))})?")
    if target is None or not _is_mapped(target):
        return UpstreamBatches(base, pattern)
    if own_index >= 0:  # mapped alongside it (a mapped task group): the instance it depends on
        return UpstreamBatches(batch_base(context, task_id, own_index), pattern)
    return UpstreamBatches(None, pattern)


def batch_id_from_context(context: Mapping[str, Any], task_id: str | None = None) -> str:
    """The default batch id of ``task_id`` (default: the running task) in this DAG run
    (:func:`batch_base`: the data interval's, else the run's), without ``replay``'s suffix.

    For another task that is mapped, the instance with the running task's map index (both
    in one mapped task group); raises ValueError when that names no single instance (the
    running task is not mapped): use :func:`upstream_batches` then.
    """
    ti = context["ti"]
    if task_id is None or task_id == ti.task_id:
        return batch_base(context, ti.task_id, getattr(ti, "map_index", -1))
    found = upstream_batches(context, task_id)
    if found.batch_id is None:
        raise ValueError(f"task {task_id!r} is mapped and {ti.task_id!r} is not: it has one batch per map index")
    return found.batch_id
