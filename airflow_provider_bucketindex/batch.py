"""Batch ids: what makes a retried Airflow task apply its batch at most once.

A table remembers the batch id of every commit; an upsert whose batch id is already
committed is a no-op. The default id names the task *instance* without its try number,
so every try of the same task in the same DAG run carries the same id.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["default_batch_id", "batch_id_from_context"]


def default_batch_id(dag_id: str, run_id: str, task_id: str, map_index: int | None = -1) -> str:
    """``<dag_id>/<run_id>/<task_id>`` (``/<map_index>`` appended for a mapped task instance).

    Airflow forbids ``/`` in DAG ids, task ids and run ids, so the id is unambiguous.
    """
    parts = [dag_id, run_id, task_id]
    if map_index is not None and map_index >= 0:
        parts.append(str(map_index))
    return "/".join(parts)


def batch_id_from_context(context: Mapping[str, Any], task_id: str | None = None) -> str:
    """The default batch id of ``task_id`` (default: the running task) in this DAG run."""
    ti = context["ti"]
    if task_id is None or task_id == ti.task_id:
        return default_batch_id(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1))
    return default_batch_id(ti.dag_id, ti.run_id, task_id)
