"""The bootstrap in-process (``bucketindex bootstrap --engine arrow``).

The rules are :mod:`spark_jobs.table.action.bootstrap`'s; this module supplies its primitives
on Arrow tables in this process, with the kernels Spark's tasks run (the action's
:func:`~spark_jobs.table.action.bootstrap.scan_keys`, ``check_bucket``, ``rewrite_files``,
``read_files`` and :mod:`spark_jobs.kernels.tasks`' index and data-file writers, free of
``pyspark``). Keys, buckets and partition directories are Spark's
(:mod:`spark_jobs.arrow_engine.keys`); a partition column whose text form only Spark
defines raises :class:`EngineUnsupportedError` before anything is written, so ``--engine
auto`` runs Spark. Rewrite mode is the in-process upsert of the dataset's rows.

Memory: the dataset is held decoded (rewrite mode) or its key columns (reference mode);
``auto`` sizes the dataset (:func:`spark_jobs.engines.bootstrap_footprint`) and runs Spark
when it would not fit the budget; a rewrite checks the rows it read against the budget again
(their exact decoded size, which footers can under-state) before it writes anything.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.arrow_engine.keys import bucket_ids, partition_dirs, record_keys
from spark_jobs.arrow_engine.upsert import THREADS, ArrowUpsertEngine, refuse_over_budget
from spark_jobs.kernels import tasks
from spark_jobs.table.action import bootstrap as action
from spark_jobs.table.action import upsert as upsert_action
from spark_jobs.table.action.bootstrap import (
    KEY,
    BootstrapOptions,
    Prepared,
    SourceDataset,
    check_bucket,
    read_files,
    rewrite_files,
    scan_keys,
    scan_schema,
)
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.shadow import SAMPLES
from spark_jobs.table.schema import stored_schema
from spark_jobs.table.table import Table

__all__ = ["ArrowBootstrapEngine", "run_bootstrap"]

log = logging.getLogger("bucketindex.bootstrap")


def run_bootstrap(opts: BootstrapOptions, *, choice: Any = None, prepared: Prepared | None = None) -> dict[str, Any]:
    """Bootstrap in-process (:func:`spark_jobs.table.action.bootstrap.run`)."""
    def engine_for(_: Prepared) -> tuple[ArrowBootstrapEngine, int | None]:
        return ArrowBootstrapEngine(choice=choice), None

    return action.run(engine_for, opts, choice=choice, prepared=prepared)


def _file_ordinals(n: int) -> list[pa.RecordBatch]:
    return [pa.record_batch({"fno": pa.array(range(n), pa.int32())})]


class ArrowBootstrapEngine:
    """The bootstrap's primitives on Arrow tables in this process."""

    name = "arrow"

    def __init__(self, *, choice: Any = None) -> None:
        self.choice = choice
        self._keys: pa.Table | None = None
        self._buckets: np.ndarray | None = None

    def partition_dirs(self, source: SourceDataset, field: str | None) -> dict[Any, str]:
        """By :func:`spark_jobs.arrow_engine.keys.partition_dirs`, Spark's ``partition_expr``'s twin."""
        if not field:
            return {None: ""}
        values = sorted({f.values.get(field) for f in source.files}, key=lambda v: (v is None, str(v)))
        t = pa.table({field: pa.array(values, source.schema.field(field).type)})
        return dict(zip(values, partition_dirs(t, [field]).to_pylist()))

    def scan(self, source: SourceDataset, opts: BootstrapOptions, *, num_buckets: int) -> list[dict[str, Any]]:
        pre = opts.precombine_field
        batches = scan_keys(_file_ordinals(len(source.files)), source_uri=source.uri,
                            paths=[f.path for f in source.files], values=[f.values for f in source.files],
                            schema=source.schema, path_columns=source.path_columns, record_key=opts.record_key,
                            precombine=pre, batch_rows=tasks.READ_BATCH_ROWS)
        keys = pa.Table.from_batches(list(batches), schema=scan_schema(source, pre))
        self._keys = keys
        self._buckets = bucket_ids(keys.column(KEY), num_buckets)
        # every copy of a key is in this one table: the checks of all buckets at once
        return check_bucket((), keys, precombine=pre).to_pylist()

    def rewrite_files(self, table: Table, todo: list[tuple[int, str, str, str, list[int]]], *, instant: str,
                      snapshot_seq: int, schema: pa.Schema) -> list[dict[str, Any]]:
        rows = pa.record_batch({"fno": pa.array([t[0] for t in todo], pa.int32()), "rel": [t[1] for t in todo],
                                "part": [t[2] for t in todo], "fid": [t[3] for t in todo],
                                "drop": pa.array([t[4] for t in todo], pa.list_(pa.int64()))})
        out = rewrite_files([rows], table_uri=table.uri, instant=instant, snapshot_seq=snapshot_seq, schema=schema,
                            token=tasks.task_token, write=tasks.write_marked_parquet)
        return [r for b in out for r in b.to_pylist()]

    def write_index(self, table: Table, *, losers: dict[int, list[int]], locations: list[tuple[str, str]],
                    instant: str, snapshot_seq: int) -> list[dict[str, Any]]:
        assert self._keys is not None and self._buckets is not None
        keys = self._keys
        fno = keys.column("fno").to_numpy()
        live = np.ones(keys.num_rows, dtype=bool)
        if losers:
            # a (file, row) pair as one integer: rows of a file number under 2**40
            lost = np.fromiter((f << 40 | r for f, rows in losers.items() for r in rows), dtype=np.int64)
            live &= ~np.isin(fno.astype(np.int64) << 40 | keys.column("row").to_numpy(), lost)
        parts = pa.array([p for p, _ in locations], pa.string())
        fids = pa.array([f for _, f in locations], pa.string())
        idx = pa.array(fno[live])
        entries = pa.table({"key": keys.column(KEY).filter(pa.array(live)), "part": parts.take(idx),
                            "fid": fids.take(idx), "tomb": pa.array(np.zeros(int(live.sum()), dtype=bool))})
        buckets = self._buckets[live]
        order = np.argsort(buckets, kind="stable")
        sorted_b = buckets[order]
        cuts = np.flatnonzero(np.diff(sorted_b)) + 1
        groups = [(int(sorted_b[s]), pa.array(order[s:e])) for s, e in
                  zip(np.r_[0, cuts], np.r_[cuts, len(order)]) if e > s]

        def delta(group: tuple[int, pa.Array]) -> pa.Table:
            bucket, take = group
            return tasks.write_index_delta((pa.scalar(bucket, pa.int32()),), entries.take(take), table_uri=table.uri,
                                           instant=instant, snapshot_seq=snapshot_seq)

        with ThreadPoolExecutor(THREADS) as pool:
            written = list(pool.map(delta, groups))
        return [r for t in written for r in t.to_pylist()]

    def read_dataset(self, source: SourceDataset) -> pa.Table:
        batches = read_files(_file_ordinals(len(source.files)), source_uri=source.uri,
                             paths=[f.path for f in source.files], values=[f.values for f in source.files],
                             schema=source.schema, path_columns=source.path_columns,
                             batch_rows=tasks.READ_BATCH_ROWS)
        frame = pa.Table.from_batches(list(batches), schema=stored_schema(source.schema))
        budget = getattr(self.choice, "budget", None)
        if budget is not None:  # a rewrite holds every row: checked with their exact size, before anything is written
            refuse_over_budget(frame, what="the dataset", budget=budget, table_bytes=0)
        return frame

    def count_identities(self, frame: pa.Table, *, record_key: list[str], identity_field: str | None
                         ) -> tuple[int, int, int, list[str]]:
        cols = {KEY: record_keys(frame, record_key)}
        if identity_field:
            cols["_bi_id"] = frame.column(identity_field)
        keyed = pa.table(cols)
        groups = keyed.group_by(list(cols)).aggregate([([], "count_all")])
        n = groups.column("count_all")
        dup = groups.filter(pc.greater(n, 1))
        n_dup = dup.num_rows
        dup_rows = int(pc.sum(dup.column("count_all")).as_py() or 0) if n_dup else 0
        samples = sorted(v for v in dup.column(KEY).to_pylist() if v is not None)[:SAMPLES]
        return frame.num_rows, n_dup, dup_rows, samples

    def upsert(self, opts: UpsertOptions) -> dict[str, Any]:
        # the bootstrap logged its engine choice: the rewrite's upsert records it without logging it again
        return upsert_action.run(ArrowUpsertEngine(), opts, choice=self.choice, announce=False)

    def release(self) -> None:
        self._keys = self._buckets = None
