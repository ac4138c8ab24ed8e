"""Rehash in-process: the rules of :mod:`spark_jobs.table.action.rehash` executed on Arrow.

The action validates the count, lists the units of work, keeps one file per target, checks a
record-index split and commits; this engine only writes, by the same per-unit kernels Spark's
tasks run (:mod:`spark_jobs.kernels.rehash_tasks`), one unit -- an old file group (split) or new
one (merge), a new or old index bucket -- per call, :data:`~spark_jobs.arrow_engine.compact.WORKERS`
at a time. Every call writes under the rehash's own instant with the same token (``0-0-0``
outside a Spark task), so two calls write the same path only for the same (directory, file
id) or bucket, which the units never share: a split's children are its own bucket's, a
merge's new group or bucket is one unit.

:func:`needed_bytes` is what ``--engine auto`` sizes a rehash by (decoded,
:data:`~spark_jobs.table.action.engine.IN_MEMORY_EXPANSION`):

* bucket index: the largest ``WORKERS`` units' slices (base and logs), read whole and written again;
* record index, merge: the largest ``WORKERS`` new buckets' old index files;
* record index, split: every live key with its location, fingerprints and buckets (what
  ``validate`` holds, :func:`spark_jobs.arrow_engine.validate.needed_bytes`) plus the largest
  ``WORKERS`` old buckets' index files.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa

from spark_jobs.arrow_engine.compact import WORKERS, _parallel
from spark_jobs.arrow_engine.validate import keys_with_location
from spark_jobs.arrow_engine.validate import needed_bytes as validate_bytes
from spark_jobs.index.hashing import buckets_of, fingerprints
from spark_jobs.kernels import rehash_tasks
from spark_jobs.kernels.tasks import KEY
from spark_jobs.table.action import rehash as action
from spark_jobs.table.action.engine import ARROW, IN_MEMORY_EXPANSION, EngineChoice
from spark_jobs.table.action.rehash import RehashPlan
from spark_jobs.table.config import INDEX_BUCKET
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView

__all__ = ["run_rehash", "ArrowRehash", "needed_bytes"]

log = logging.getLogger("bucketindex.rehash")

#: what a rehash run through :func:`run_rehash` records as its engine choice
API_CHOICE = EngineChoice(ARROW, "spark_jobs.arrow_engine.rehash.run_rehash")

#: the one unit a kernel call runs: task 0 of slot 0 (``rehash_tasks._units``)
_ONE_UNIT = pa.RecordBatch.from_pydict({"id": pa.array([0], pa.int64())})
_SPLIT_INPUT = pa.schema([("old_bucket", pa.int32()), ("new_bucket", pa.int32()), ("fp_hi", pa.int64()),
                          ("fp_lo", pa.int64()), ("part", pa.string()), ("fid", pa.string())])


def run_rehash(uri: str, num_buckets: int, *, heartbeat_timeout_s: float | None = None,
               choice: EngineChoice | None = None) -> dict[str, Any]:
    """Rehash the table at ``uri`` to ``num_buckets`` in this process
    (:func:`spark_jobs.table.action.rehash.run`; the arguments of
    :func:`spark_jobs.jobs.rehash.run_rehash` without the session). ``choice``: the engine
    choice recorded in the commit (default: this API's)."""
    return action.run(uri, num_buckets, lambda table, plan, view: (ArrowRehash(), choice or API_CHOICE),
                      heartbeat_timeout_s=heartbeat_timeout_s)


def needed_bytes(table: Table, plan: RehashPlan, view: FileSystemView) -> int:
    """Bytes this engine holds at its peak for ``plan`` on ``view`` (see the module's docstring)."""
    assert table.config is not None
    if table.config.index_type == INDEX_BUCKET:
        sizes: dict[str, int] = {}
        for s in view.slices():
            sizes[s.path] = int(s.size or 0)
            sizes.update((lf.path, int(lf.size or 0)) for lf in s.logs)
        units = sorted((sum(sizes.get(base, 0) + sum(sizes.get(lf, 0) for lf in logs) for _, base, logs in t["sources"])
                        for t in action.bucket_tasks(plan, view)), reverse=True)
        return sum(units[:WORKERS]) * IN_MEMORY_EXPANSION

    def size(rel: str) -> int:
        try:
            return table.io.size(table.abs(rel))
        except (OSError, ValueError):
            return 0

    if plan.split:
        buckets = sorted((sum(map(size, files)) for files in view.index_files.values()), reverse=True)
        return validate_bytes(table, view) + sum(buckets[:WORKERS]) * IN_MEMORY_EXPANSION
    merged = sorted((sum(size(f) for files in t["sources"] for f in files) for t in action.index_merge_tasks(plan, view)),
                    reverse=True)
    return sum(merged[:WORKERS]) * IN_MEMORY_EXPANSION


class ArrowRehash:
    """The in-process engine's primitives (:class:`spark_jobs.table.action.rehash.RehashEngine`)."""

    def write_file_groups(self, table: Table, instant: str, plan: RehashPlan, view: FileSystemView,
                          tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        assert view.schema is not None and table.config is not None
        schema, precombine = view.schema, table.config.precombine_field

        def one(task: dict[str, Any]) -> Any:
            return rehash_tasks.rehash_file_groups([_ONE_UNIT], table_uri=table.uri, instant=instant, tasks=[task],
                                                   slots=[[0]], num_buckets=plan.new, schema=schema,
                                                   precombine=precombine, snapshot_seq=view.seq)

        return _parallel(one, tasks)

    def merge_index_buckets(self, table: Table, instant: str, plan: RehashPlan, view: FileSystemView,
                            tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        def one(task: dict[str, Any]) -> Any:
            return rehash_tasks.merge_index_buckets([_ONE_UNIT], table_uri=table.uri, instant=instant, tasks=[task],
                                                    slots=[[0]], snapshot_seq=view.seq)

        return _parallel(one, tasks)

    def split_index_buckets(self, table: Table, instant: str, plan: RehashPlan, view: FileSystemView,
                            files: dict[int, list[str]]) -> list[dict[str, Any]]:
        """Every live key's fingerprint, old and new bucket, grouped by old bucket in this process
        (Spark's shuffle), then each old bucket split by the kernel Spark's task runs."""
        rows = keys_with_location(table, view)
        keys = rows.column(KEY).to_pylist()
        if not keys and not files:
            return []
        hi, lo = fingerprints(keys)
        # a split: new = hash mod (k * old), so the old bucket is new mod old -- one hash per key
        new = buckets_of(keys, plan.new)
        old = new % plan.old
        data = pa.Table.from_arrays(
            [pa.array(old.astype(np.int32)), pa.array(new.astype(np.int32)),
             pa.array(hi.view(np.int64)), pa.array(lo.view(np.int64)),
             rows.column("part").combine_chunks(), rows.column("fid").combine_chunks()], schema=_SPLIT_INPUT)
        order = np.argsort(old, kind="stable")
        bounds = np.flatnonzero(np.diff(old[order])) + 1
        of_bucket = {int(old[idx[0]]): idx for idx in np.split(order, bounds)} if len(order) else {}
        # every old bucket with index files gets a call, even one whose keys are all gone from the data
        units = [{"bucket": b} for b in sorted(set(files) | set(of_bucket))]

        def one(unit: dict[str, Any]) -> Any:
            b = unit["bucket"]
            part = data.take(pa.array(of_bucket[b])) if b in of_bucket else data.slice(0, 0)
            return rehash_tasks.split_index_bucket((pa.scalar(b, pa.int32()),), part, table_uri=table.uri,
                                                   instant=instant, files=files, snapshot_seq=view.seq).to_batches()

        return _parallel(one, units)
