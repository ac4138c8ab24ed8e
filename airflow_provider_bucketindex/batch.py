"""Batch ids: what makes a retried -- or re-run -- Airflow task apply its batch at most once.

A table remembers the batch id of every commit; an upsert whose batch id is already
committed is a no-op. The default id names the task, the run's **data interval** and the
batch's **source**: ``<dag_id>/<task_id>/<start>--<end>/src-<12 hex>`` (UTC; the start alone
for a point interval; the hex digits a digest of the source's normalised location,
:func:`source_identity`). Every try of the task in a run carries it, and so does every later
run of the same interval from the same source -- ``airflow dags test DAG 2024-01-01`` after
2024-01-02 finds the first day's batch committed and does nothing, instead of applying it again
under a new id and bringing back what the second day deleted -- while the same interval read
from another source (another landing folder, a corrected copy elsewhere) is another batch and
is applied. A run without a data interval (a manual or asset-triggered run with no logical
date) falls back to its run id (``<dag_id>/<run_id>/<task_id>/src-...``). ``replay=True`` on
the upsert appends ``/replay/<run_id>``: that run applies the batch again, on purpose (a
corrected file at the same location), and its retries still share one id. A mapped task
instance (``.expand()`` over landing files) has its map index before the source part
(``.../<interval>/<map_index>/src-...``): each file is its own batch, and each can fail, be
retried and be rolled back on its own.

A batch with no location -- a TaskFlow function's in-memory frame (``@task.bucketindex_upsert``
returning a ``pyarrow.Table`` or a pandas/Polars frame) -- has no source part: the task is its
source, and the id is the interval's alone. Hashing the frame's rows instead would make a
re-run whose function fetches *today's* data for a past date a new batch, which is exactly the
re-application the interval id exists to prevent; ``replay=True`` applies such a batch again.

Earlier versions made ids without the source part (``<dag_id>/<task_id>/<interval>``). A table
whose commits carry that form still sees a re-run as a no-op: the upsert accepts both forms
when it checks whether its batch is committed (:func:`legacy_batch_id`), and the rollback
finds a pending write under either form (:func:`upstream_batches`).

Another task (a rollback) finds the batch of the upsert it cleans up after by the same
rule, by pattern (it cannot know the upsert's source: a TaskFlow upsert's is what its function
returned): inside a mapped task group the upsert instance with *its own* map index (the one it
depends on); outside, every instance of a mapped upsert (:func:`upstream_batches`).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, NamedTuple

__all__ = ["SOURCE_PREFIX", "UpstreamBatches", "batch_base", "batch_id_from_context", "default_batch_id",
           "interval_batch_id", "legacy_batch_id", "replay_suffix", "source_identity", "source_suffix",
           "upstream_batches", "with_source"]

#: what the source part of a default batch id starts with (``/src-`` + :data:`SOURCE_DIGITS` hex digits)
SOURCE_PREFIX = "src-"
#: hex digits of the source digest: 48 bits, to tell apart the sources one task reads for one interval
SOURCE_DIGITS = 12
_SOURCE_PART = rf"/{SOURCE_PREFIX}[0-9a-f]{{{SOURCE_DIGITS}}}"


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


def _source_location(value: Any) -> str | None:
    """One source's normalised location (see :func:`source_identity`); None for an empty one."""
    import os

    from airflow_provider_bucketindex.assets import table_location
    from airflow_provider_bucketindex.storage import is_object_storage_path, object_storage_location

    if is_object_storage_path(value):
        value = object_storage_location(value)[0]  # its connection is how to reach it, not where it is
    text = (os.fspath(value) if isinstance(value, os.PathLike) else str(value)).strip()
    if not text:
        return None
    if "://" not in text and not text.startswith("/"):
        # a relative path is read from the worker's working directory: that is the location it names
        text = os.path.abspath(text)
    return table_location(text)


def source_identity(source: Any) -> str | None:
    """The source's identity in a batch id: a short digest of its normalised location(s), or None
    when it has no location (None, an in-memory frame: the task is then its own source).

    ``source`` is a path or URI as rendered (``str``, ``os.PathLike``), an ``ObjectStoragePath``
    (its plain location; the connection is not part of it), or a list/tuple of those (each
    normalised; order and repeats do not matter: the same files are the same source). Normalised
    as a table's Asset location is (:func:`airflow_provider_bucketindex.assets.table_location`):
    ``s3a://``/``s3n://`` are ``s3://``, a trailing ``/``, the query (storage options, which may
    carry credentials) and a user part are dropped, a local path is absolute -- so the spellings
    one source is written in give one id, and no secret reaches the digest's input unhashed."""
    import hashlib

    if source is None:
        return None
    items = list(source) if isinstance(source, (list, tuple)) else [source]
    locations = sorted({loc for loc in map(_source_location, items) if loc is not None})
    if not locations:
        return None
    return hashlib.sha256("\n".join(locations).encode()).hexdigest()[:SOURCE_DIGITS]


def source_suffix(source: Any) -> str:
    """What the source adds to a default batch id: ``/src-<12 hex>`` (:func:`source_identity`), or
    ``""`` for a source without a location."""
    digest = source_identity(source)
    return "" if digest is None else f"/{SOURCE_PREFIX}{digest}"


def with_source(batch_id: str, source: Any) -> str:
    """``batch_id`` (a default id without replay's suffix) with the source's part appended."""
    return batch_id + source_suffix(source)


def legacy_batch_id(batch_id: str) -> str | None:
    """The earlier form of a default batch id (before ids named their source): ``batch_id`` without
    its ``/src-...`` part; None when it has none (replay's suffix is never stripped: a replay is
    always a new batch)."""
    match = re.fullmatch(rf"(.*){_SOURCE_PART}", batch_id)
    return match.group(1) if match else None


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

    ``batch_id``: the id of exactly one instance (an unmapped upsert, or the instance of a mapped
    upsert with the caller's own map index) without its source part -- the earlier form of the id;
    ``None`` when the upsert is mapped and the caller is not (every instance is one). ``pattern``
    matches every id the batch(es) may carry: that base, with or without a source part
    (``/src-<hex>``: the caller cannot know the upsert's source), with or without this run's
    replay suffix (``<base>[/<n>][/src-<hex>][/replay/<run>]``).
    """

    batch_id: str | None
    pattern: "re.Pattern[str]"

    def matches(self, batch_id: str | None) -> bool:
        return batch_id is not None and self.pattern.fullmatch(batch_id) is not None


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
    # after the base (and a map index): a source part or none (the earlier form, or a frame), and
    # replay=True's ``/replay/<this run>`` or none
    tail = f"(?:{_SOURCE_PART})?(?:{re.escape(replay_suffix(context))})?"

    def one(base: str) -> UpstreamBatches:
        return UpstreamBatches(base, re.compile(re.escape(base) + tail))

    if target is None or not _is_mapped(target):
        return one(batch_base(context, task_id))
    if own_index >= 0:  # mapped alongside it (a mapped task group): the instance it depends on
        return one(batch_base(context, task_id, own_index))
    return UpstreamBatches(None, re.compile(re.escape(batch_base(context, task_id)) + r"/\d+" + tail))


def batch_id_from_context(context: Mapping[str, Any], task_id: str | None = None) -> str:
    """The default batch id of ``task_id`` (default: the running task) in this DAG run
    (:func:`batch_base`: the data interval's, else the run's), without the source part
    (:func:`with_source` adds it: only the upsert knows its source) and ``replay``'s suffix.

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
