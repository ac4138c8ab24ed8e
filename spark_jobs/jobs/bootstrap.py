"""The bootstrap job: make a table of an existing Parquet dataset (``bucketindex bootstrap``).

The checks and the dataset's discovery are in :mod:`spark_jobs.table.action.bootstrap`;
this module runs them, then one of the two modes:

* **reference** -- one scan of the key columns of every file (a task per few files, Arrow
  reads, no rows moved), which also checks each file's schema and finds duplicate keys;
  with ``--precombine-field`` the file groups holding a losing duplicate are rewritten into
  the table's layout (those files are *replaced*); then one index delta per index bucket, and
  one ``bootstrap`` instant naming every file -- the user's in place -- as a file slice.
* **rewrite** -- the dataset's rows (read by pyarrow, which decodes Hive directory values as
  it wrote them; Spark's discovery decodes ``%C3%A3`` byte by byte) go through the upsert
  pipeline into the empty table, recorded as a ``bootstrap`` instant.

Either way the instant goes through the Transaction: a crash leaves a pending instant that
readers ignore and the next run (of bootstrap or any writer) rolls back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.exceptions import BadInputError
from spark_jobs.io.storage import redact_uri
from spark_jobs.kernels import tasks
from spark_jobs.jobs.keys import bucket_expr, key_expr, partition_expr
from spark_jobs.jobs.session import default_parallelism, job_conf, session_start_ms
from spark_jobs.table.action import Transaction
from spark_jobs.table.action.bootstrap import (
    MODE_REFERENCE,
    MODE_REWRITE,
    SourceDataset,
    check_bootstrap,
    commit_bootstrap,
    default_batch_id,
    default_mode,
    discover,
    existing_bootstrap,
    file_id_of,
    reference_path,
    reference_written,
    schema_problem,
)
from spark_jobs.table.commit import Written
from spark_jobs.table.config import (
    DEFAULT_NUM_BUCKETS,
    EVOLVING_FORMAT_VERSION,
    INDEX_RECORD,
    REFERENCE_FORMAT_VERSION,
    TableConfig,
)
from spark_jobs.table.layout import data_file_name, partition_path
from spark_jobs.table.reader import canonical_keys, read_data_file
from spark_jobs.table.schema import check_timestamp_units, stored_schema, stored_type
from spark_jobs.table.shadow import SAMPLES
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import FileSystemView
from spark_jobs.table.faults import maybe_crash
from spark_jobs.text import plural

__all__ = ["BootstrapOptions", "run_bootstrap"]

log = logging.getLogger("bucketindex.bootstrap")

KEY = tasks.KEY
#: the key scan's output: a row per source row (``problem`` set on one row per bad file)
SCAN_FIELDS = [("_bi_key", pa.string()), ("fno", pa.int32()), ("row", pa.int64()), ("problem", pa.string())]


@dataclass
class BootstrapOptions:
    table: str
    source: str
    record_key: list[str]
    partition_field: str | None = None
    precombine_field: str | None = None
    index: str = INDEX_RECORD
    #: reference | rewrite; default reference for the record index, rewrite for bucket
    mode: str | None = None
    num_buckets: int | None = None
    table_type: str | None = None
    batch_id: str | None = None
    target_file_rows: int | None = None
    heartbeat_timeout_s: float | None = None
    #: ``--mirror delta``: the table's Delta projection from its first commit (format.md §11)
    mirror: str | None = None


def run_bootstrap(spark: SparkSession | Callable[[], SparkSession], opts: BootstrapOptions) -> dict[str, Any]:
    """Bootstrap ``opts.table`` from ``opts.source``; returns the instant, counts and timings.

    Raises BadInputError (nothing written) for a bad dataset or options, duplicate keys
    without a precombine field, or a table that already holds data. ``spark`` may be a
    function that starts a session: it is called after the checks that need no Spark (a
    bad option or a rerun of a completed bootstrap costs no JVM).
    """
    started = time.perf_counter()
    mode = opts.mode or default_mode(opts.index)
    source = discover(opts.source)
    check_timestamp_units(source.schema, source=opts.source)
    table = Table.open(opts.table)
    check_bootstrap(table, source, record_key=opts.record_key, partition_field=opts.partition_field,
                    precombine_field=opts.precombine_field, index=opts.index, mode=mode)
    batch_id = opts.batch_id or default_batch_id(opts.source)
    done = existing_bootstrap(table, batch_id)
    if done is not None:
        log.info("%s was bootstrapped from %s already (instant %s): nothing to do", redact_uri(opts.table),
                 redact_uri(opts.source),
                 done.timestamp)
        meta = table.timeline.read_metadata(done)
        return {"instant": done.timestamp, "batch_id": batch_id, "noop": True, "mode": mode,
                "index_type": meta.get("index_type"), "counts": (meta.get("bootstrap") or {}).get("counts", {}),
                "timings_ms": {}}
    log.info("bootstrapping %s from %s (%s mode, %s, %s index)", redact_uri(opts.table), redact_uri(opts.source), mode,
             plural(len(source.files), "file"), opts.index)
    # the session's start is reported beside the total, not inside it, as an upsert's is: the
    # commit (which ``show`` prints) records the same two figures
    session_ms, session_here = session_start_ms(), 0
    if callable(spark):
        t = time.perf_counter()
        spark = spark()
        session_ms = session_here = int((time.perf_counter() - t) * 1000)
    if mode == MODE_REFERENCE:
        result = _reference(spark, table, source, opts, batch_id, session_ms=session_ms)
    else:
        result = _rewrite(spark, source, opts, batch_id)
    result["timings_ms"]["total_ms"] = int((time.perf_counter() - started) * 1000) - session_here
    result["session_start_ms"] = session_ms
    return result


# -- shared -------------------------------------------------------------------------
def _file_list(spark: SparkSession, source: SourceDataset) -> DataFrame:
    """One row per dataset file (its ordinal and path), spread over a few waves of tasks."""
    rows = [(i, f.path) for i, f in enumerate(source.files)]
    tasks_n = max(1, min(len(rows), 4 * default_parallelism(spark)))
    return spark.createDataFrame(rows, "fno int, path string").repartition(tasks_n)


def _refuse_duplicates(n_keys: int, n_rows: int, samples: list[str], key: list[str]) -> None:
    raise BadInputError(
        f"{n_keys} record key(s) ({','.join(key)}) appear more than once in the source ({n_rows} rows), "
        f"e.g. {', '.join(map(repr, samples))}; pass --precombine-field to keep the row with its highest value")


# -- reference mode -------------------------------------------------------------------
def scan_keys(files: Iterable[pa.RecordBatch], *, source_uri: str, paths: list[str], values: list[dict[str, Any]],
              schema: pa.Schema, path_columns: list[str], record_key: list[str],
              precombine: str | None) -> Iterator[pa.RecordBatch]:
    """mapInArrow over the file list: each file's keys (canonical, as a reader computes
    them), row numbers and precombine values; a file whose columns differ from the
    dataset's yields one row naming the problem instead."""
    import pyarrow.parquet as pq

    from spark_jobs.io.filesystem import resolve

    io, _ = resolve(source_uri)
    out_fields = SCAN_FIELDS + ([("pre", stored_type(schema.field(precombine).type))] if precombine else [])
    out_schema = pa.schema(out_fields)
    for b in files:
        for fno in b.column("fno").to_pylist():
            path = paths[fno]
            with io.open_input_file(path) as f:
                pf = pq.ParquetFile(f)
                problem = schema_problem(schema, pf.schema_arrow, path_columns)
                if problem is not None:
                    yield pa.RecordBatch.from_pylist([{"fno": fno, "problem": problem}], schema=out_schema)
                    continue
                stored = pf.schema_arrow.names
                need = [c for c in dict.fromkeys([*record_key, *([precombine] if precombine else [])]) if c in stored]
                data = pf.read(columns=need)
            n = data.num_rows
            cols = {**_path_values_from(values[fno], schema, path_columns, n), **dict(zip(data.column_names, data.columns))}
            arrays = [canonical_keys([cols[k] for k in record_key]), pa.array([fno] * n, pa.int32()),
                      pa.array(range(n), pa.int64()), pa.nulls(n, pa.string())]
            if precombine:
                arrays.append(cols[precombine].cast(out_schema.field("pre").type))
            yield from pa.table(arrays, schema=out_schema).to_batches(max_chunksize=tasks.READ_BATCH_ROWS)


def _path_values_from(values: dict[str, Any], schema: pa.Schema, path_columns: list[str], n: int) -> dict[str, Any]:
    return {c: pa.array([values.get(c)] * n, schema.field(c).type) for c in path_columns}


CHECK_OUTPUT = "kind string, fno int, n long, bad long, problem string, key string, row long"


def check_bucket(key: tuple, t: pa.Table, *, precombine: str | None) -> pa.Table:
    """applyInArrow per index bucket of the key scan: ``file`` rows (a file's rows, its null
    or empty keys, its schema problem), one ``dups`` row (keys seen more than once, the rows
    holding them), up to SAMPLES ``sample`` keys, and with ``precombine`` the ``loser`` rows:
    of each duplicated key every row but the one with the highest value (format.md §8's order:
    nulls lowest, NaN highest; ties: the later file, then the later row)."""
    import pyarrow.compute as pc

    from spark_jobs.table.ordering import ranks

    out: list[dict[str, Any]] = []
    for r in t.filter(pc.is_valid(t.column("problem"))).group_by("fno").aggregate(
            [("problem", "max")]).to_pylist():
        out.append({"kind": "file", "fno": r["fno"], "n": 0, "bad": 0, "problem": r["problem_max"]})
    ok = t.filter(pc.is_null(t.column("problem")))
    k = ok.column(KEY)
    bad = pc.fill_null(pc.or_(pc.is_null(k), pc.equal(k, "")), True)
    files = ok.append_column("_bad", pc.cast(bad, pa.int64())).group_by("fno").aggregate(
        [("row", "count"), ("_bad", "sum")])
    for r in files.to_pylist():
        out.append({"kind": "file", "fno": r["fno"], "n": r["row_count"], "bad": r["_bad_sum"]})
    good = ok.filter(pc.invert(bad))
    counts = good.group_by(KEY).aggregate([("row", "count")])
    dup = counts.filter(pc.greater(counts.column("row_count"), 1))
    if dup.num_rows:
        out.append({"kind": "dups", "n": dup.num_rows, "bad": int(pc.sum(dup.column("row_count")).as_py())})
        for key_ in sorted(dup.column(KEY).to_pylist())[:SAMPLES]:
            out.append({"kind": "sample", "key": key_})
        if precombine:
            rows = good.filter(pc.is_in(good.column(KEY), value_set=dup.column(KEY)))
            # by rank in format.md §8's order (an Arrow sort by value, descending, would put NaN
            # below every number and disagree with the upserts and the read-time merge)
            rows = rows.append_column("_rank", pa.array(ranks(rows.column("pre")), pa.int64()))
            order = pc.sort_indices(rows, sort_keys=[(KEY, "ascending"), ("_rank", "descending"),
                                                     ("fno", "descending"), ("row", "descending")])
            rows = rows.take(order)
            keys_ = rows.column(KEY).combine_chunks()
            first = pc.not_equal(keys_.slice(1), keys_.slice(0, len(keys_) - 1))
            winner = pa.concat_arrays([pa.array([True]), first.combine_chunks() if hasattr(first, "combine_chunks")
                                       else first])
            for r in rows.filter(pc.invert(winner)).select(["fno", "row"]).to_pylist():
                out.append({"kind": "loser", "fno": r["fno"], "row": r["row"]})
    return pa.Table.from_pylist(out, schema=pa.schema([
        ("kind", pa.string()), ("fno", pa.int32()), ("n", pa.int64()), ("bad", pa.int64()), ("problem", pa.string()),
        ("key", pa.string()), ("row", pa.int64())]))


def rewrite_files(rows: Iterable[pa.RecordBatch], *, table_uri: str, instant: str, snapshot_seq: int,
                  schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """mapInArrow over ``(fno, rel, part, fid, drop)``: each referenced file with a losing
    duplicate, rewritten into the table's layout without the rows in ``drop``."""
    import numpy as np

    t = Table.open(table_uri)
    token = tasks.task_token()
    out = pa.schema([("fno", pa.int32()), ("path", pa.string()), ("num_rows", pa.int64()), ("size", pa.int64())])
    for b in rows:
        for fno, rel, part, fid, drop in zip(*[b.column(c).to_pylist() for c in ("fno", "rel", "part", "fid", "drop")]):
            data = read_data_file(t, rel, schema.names).cast(schema)
            keep = np.ones(data.num_rows, dtype=bool)
            keep[np.asarray(drop, dtype=np.int64)] = False
            data = data.filter(pa.array(keep))
            new_rel = f"{part}/{data_file_name(fid, token, instant)}" if part else data_file_name(fid, token, instant)
            size = tasks.write_marked_parquet(t, instant, new_rel, data, snapshot_seq=snapshot_seq)
            yield pa.RecordBatch.from_pylist([{"fno": fno, "path": new_rel, "num_rows": data.num_rows, "size": size}],
                                             schema=out)


def _partition_paths(spark: SparkSession, source: SourceDataset, field: str | None) -> dict[Any, str]:
    """Each partition value's directory as the table names it, by the expression every write
    uses -- or its Python twin for the string and integer values Hive directories infer (a
    query costs a cold JVM seconds)."""
    if not field:
        return {None: ""}
    values = sorted({f.values.get(field) for f in source.files}, key=lambda v: (v is None, str(v)))
    if all(v is None or (isinstance(v, (str, int)) and not isinstance(v, bool)) for v in values):
        return {v: partition_path(field, v) for v in values}
    schema = from_arrow_schema(pa.schema([source.schema.field(field)]))
    df = spark.createDataFrame([(v,) for v in values], schema)
    return {r[0]: r[1] for r in df.select(F.col(field), partition_expr([field]).alias("p")).collect()}


def _reference(spark: SparkSession, table: Table, source: SourceDataset, opts: BootstrapOptions,
               batch_id: str, *, session_ms: int | None) -> dict[str, Any]:
    timings: dict[str, int] = {}
    t0 = time.perf_counter()
    pre = opts.precombine_field
    parts = _partition_paths(spark, source, opts.partition_field)
    # the table's paths of the dataset's files need the table root, not the table: computed
    # before anything is written
    rels = [reference_path(table, f.path) for f in source.files]
    fids = [file_id_of(r) for r in rels]
    fparts = [parts[source.partition_value(f, opts.partition_field)] for f in source.files]
    scan_schema = pa.schema(SCAN_FIELDS + ([("pre", stored_type(source.schema.field(pre).type))] if pre else []))
    scan = tasks.bind_batches(scan_keys, source_uri=opts.source, paths=[f.path for f in source.files],
                              values=[f.values for f in source.files], schema=source.schema,
                              path_columns=source.path_columns, record_key=opts.record_key, precombine=pre)
    # one shuffle for the whole job: the keys by index bucket. The duplicate check groups by
    # (bucket, key) and the index tasks by bucket, so neither shuffles again
    num_buckets = table.config.num_buckets if table.config is not None else (
        opts.num_buckets or DEFAULT_NUM_BUCKETS[INDEX_RECORD])
    tasks_n = max(default_parallelism(spark), min(num_buckets, 200))
    keys = _file_list(spark, source).mapInArrow(scan, from_arrow_schema(scan_schema))
    keys = keys.withColumn("bucket", bucket_expr(F.col(KEY), num_buckets)).repartition(tasks_n, "bucket")
    keys = keys.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return _reference_scanned(spark, table, source, opts, batch_id, keys, rels, fids, fparts, timings, t0,
                                  num_buckets=num_buckets, tasks_n=tasks_n, session_ms=session_ms)
    finally:
        keys.unpersist()


def _reference_scanned(spark: SparkSession, table: Table, source: SourceDataset, opts: BootstrapOptions,
                       batch_id: str, keys: DataFrame, rels: list[str], fids: list[str], fparts: list[str],
                       timings: dict[str, int], t0: float, *, num_buckets: int, tasks_n: int,
                       session_ms: int | None) -> dict[str, Any]:
    # one job over the keys partitioned by bucket (every copy of a key is in one task):
    # per file its rows, bad keys and schema problem; per bucket its duplicated keys, and
    # with a precombine field the rows that lose (Arrow in the task; only these small
    # results reach the driver)
    per_file: dict[int, int] = {}
    bad_keys = n_dup = dup_rows = 0
    samples: list[str] = []
    drops: dict[int, list[int]] = {}
    with job_conf(spark, **{"spark.sql.shuffle.partitions": tasks_n}):
        found = keys.groupBy("bucket").applyInArrow(
            tasks.bind(check_bucket, precombine=opts.precombine_field), CHECK_OUTPUT).collect()
    for r in found:
        kind = r["kind"]
        if kind == "file":
            if r["problem"] is not None:
                raise BadInputError(f"dataset file {source.files[int(r['fno'])].path}: {r['problem']}")
            per_file[int(r["fno"])] = per_file.get(int(r["fno"]), 0) + int(r["n"])
            bad_keys += int(r["bad"])
        elif kind == "dups":
            n_dup += int(r["n"])
            dup_rows += int(r["bad"])
        elif kind == "sample":
            samples.append(r["key"])
        elif kind == "loser":
            drops.setdefault(int(r["fno"]), []).append(int(r["row"]))
    if bad_keys:
        raise BadInputError(f"{bad_keys} row(s) have a null or empty record key ({','.join(opts.record_key)})")
    n_rows = sum(per_file.values())
    if not n_rows:
        raise BadInputError(f"the dataset at {opts.source} has no rows")
    samples = sorted(samples)[:SAMPLES]
    if n_dup and not opts.precombine_field:
        _refuse_duplicates(n_dup, dup_rows, samples, opts.record_key)
    for rows in drops.values():
        rows.sort()
    losers = None
    if drops:
        losers = spark.createDataFrame([(f, r) for f, rows in drops.items() for r in rows], "fno int, row long")
    timings["scan_ms"] = int((time.perf_counter() - t0) * 1000)
    log.info("phase scan     %6d ms %s, %s, %s", timings["scan_ms"], plural(n_rows, "row"),
             plural(len(source.files), "file"), plural(n_dup, "duplicated key"))

    cfg = TableConfig(
        record_key_fields=list(opts.record_key), index_type=INDEX_RECORD,
        num_buckets=num_buckets,
        partition_fields=[opts.partition_field] if opts.partition_field else [],
        precombine_field=opts.precombine_field,
        **({"table_type": opts.table_type} if opts.table_type else {}),
        **({"target_file_rows": opts.target_file_rows} if opts.target_file_rows else {}),
        format_version=REFERENCE_FORMAT_VERSION,
        mirrors=[opts.mirror] if opts.mirror else [],
        reference={"source": redact_uri(opts.source),
                   "path_columns": {c: str(source.schema.field(c).type) for c in source.path_columns}},
    )
    existing = table.create(cfg)  # a rerun after a crash finds it: the options must agree
    if existing.reference != cfg.reference or existing.mirrors != cfg.mirrors or existing.format_version not in (
            cfg.format_version, EVOLVING_FORMAT_VERSION):
        raise BadInputError(f"{opts.table} was created by a bootstrap of {(existing.reference or {}).get('source')} "
                            f"with other options; remove it (it holds no data) or bootstrap that dataset")
    table = Table.load(opts.table)
    view = table.view()
    assert table.num_buckets(view) == num_buckets, (table.num_buckets(view), num_buckets)
    # timestamps are stored in microseconds, zone-aware ones in UTC (format.md §5), as an upsert
    # or a rewrite stores them; the files keep their own types, and every reader casts to this schema
    data_schema = stored_schema(source.schema).append(pa.field(KEY, pa.string()))
    plan = {"batch_id": batch_id, "operation": "bootstrap", "mode": MODE_REFERENCE, "source": redact_uri(opts.source),
            "index_type": INDEX_RECORD, "num_buckets": num_buckets}

    def attempt(txn: Transaction, view: FileSystemView) -> Written:
        ts = txn.ts  # one attempt: a bootstrap never retries (commit_bootstrap)
        log.info("instant %s: bootstrapping %d files of %s into %s", ts, len(source.files), redact_uri(opts.source),
                 redact_uri(opts.table))
        t1 = time.perf_counter()
        rewritten: dict[int, dict[str, Any]] = {}
        if drops:
            todo = [(fno, rels[fno], fparts[fno], fids[fno], rows) for fno, rows in sorted(drops.items())]
            df = spark.createDataFrame(todo, "fno int, rel string, part string, fid string, drop array<long>")
            df = df.repartition(max(1, min(len(todo), 4 * default_parallelism(spark))))
            out = df.mapInArrow(tasks.bind_batches(rewrite_files, table_uri=table.uri, instant=ts,
                                                   snapshot_seq=view.seq, schema=data_schema),
                                "fno int, path string, num_rows long, size long").collect()
            rewritten = {int(r["fno"]): r.asDict() for r in out}
        timings["rewrite_ms"] = int((time.perf_counter() - t1) * 1000)
        log.info("phase rewrite  %6d ms %d files with losing duplicates rewritten", timings["rewrite_ms"],
                 len(rewritten))

        t2 = time.perf_counter()
        locs = spark.createDataFrame([(i, fparts[i], fids[i]) for i in range(len(rels))],
                                     "fno int, part string, fid string")
        # broadcast joins keep the keys' partitioning by bucket: the index tasks do not shuffle
        live = keys if losers is None else keys.join(F.broadcast(losers), ["fno", "row"], "left_anti")
        entries = live.join(F.broadcast(locs), "fno").select(
            F.col(KEY).alias("key"), "part", "fid", F.lit(False).alias("tomb"), "bucket")
        with job_conf(spark, **{"spark.sql.shuffle.partitions": tasks_n}):
            written = entries.groupBy("bucket").applyInArrow(
                tasks.bind(tasks.write_index_delta, table_uri=table.uri, instant=ts, snapshot_seq=view.seq),
                tasks.DELTA_OUTPUT).collect()
        timings["index_ms"] = int((time.perf_counter() - t2) * 1000)
        log.info("phase index    %6d ms %d index deltas", timings["index_ms"], len(written))

        report = reference_written(
            source=source, source_label=redact_uri(opts.source), rels=rels, fids=fids, fparts=fparts,
            rows_per_file=per_file, dropped=drops, rewritten=rewritten, index_written=[r.asDict() for r in written],
            n_rows=n_rows, n_dup=n_dup, num_buckets=num_buckets, schema=data_schema, session_start_ms=session_ms)
        maybe_crash("before_complete")
        return report.replace(timings_ms={**timings, "total_ms": int((time.perf_counter() - t0) * 1000)})

    done = commit_bootstrap(table, plan, view, attempt, batch_id=batch_id, heartbeat_timeout_s=opts.heartbeat_timeout_s)
    if done.instant is None:  # a concurrent writer committed this batch
        meta = table.timeline.read_metadata(table.timeline.reload().find(done.applied_by))
        return {"instant": done.applied_by, "batch_id": batch_id, "noop": True, "mode": MODE_REFERENCE,
                "index_type": meta.get("index_type"), "counts": (meta.get("bootstrap") or {}).get("counts", {}),
                "timings_ms": dict(timings)}
    ts = done.instant.timestamp
    metadata = done.metadata
    summary = metadata["bootstrap"]
    log.info("committed %s: %s in %s (%d referenced in place, %d rewritten)", ts,
             plural(summary["counts"]["rows"], "row"), plural(len(metadata["file_groups"]), "file group"),
             summary["counts"]["files_referenced"],
             summary["counts"]["files_rewritten"])
    return {"instant": ts, "batch_id": batch_id, "noop": False, "mode": MODE_REFERENCE, "index_type": INDEX_RECORD,
            "counts": summary["counts"], "timings_ms": dict(timings)}


# -- rewrite mode ---------------------------------------------------------------------
def read_files(files: Iterable[pa.RecordBatch], *, source_uri: str, paths: list[str], values: list[dict[str, Any]],
               schema: pa.Schema, path_columns: list[str]) -> Iterator[pa.RecordBatch]:
    """mapInArrow over the file list: every row of each file, its Hive path columns added."""
    import pyarrow.parquet as pq

    from spark_jobs.io.filesystem import resolve

    io, _ = resolve(source_uri)
    out = stored_schema(schema)  # timestamps as Spark holds them: microseconds, zone-aware ones in UTC
    for b in files:
        for fno in b.column("fno").to_pylist():
            with io.open_input_file(paths[fno]) as f:
                pf = pq.ParquetFile(f)
                for batch in pf.iter_batches(batch_size=tasks.READ_BATCH_ROWS):
                    cols = {**_path_values_from(values[fno], schema, path_columns, batch.num_rows),
                            **dict(zip(batch.schema.names, batch.columns))}
                    yield pa.RecordBatch.from_arrays([cols[n] for n in schema.names], schema=schema).cast(out)


def _check_schemas(source: SourceDataset) -> None:
    """Every file's columns are the dataset's (read from the footers, a few at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    from spark_jobs.io.filesystem import resolve

    io, _ = resolve(source.uri)

    def problem(path: str) -> str | None:
        with io.open_input_file(path) as f:
            return schema_problem(source.schema, pq.ParquetFile(f).schema_arrow, source.path_columns)

    with ThreadPoolExecutor(8) as pool:
        for f, p in zip(source.files, pool.map(problem, [f.path for f in source.files])):
            if p is not None:
                raise BadInputError(f"dataset file {f.path}: {p}")


def _rewrite(spark: SparkSession, source: SourceDataset, opts: BootstrapOptions, batch_id: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    _check_schemas(source)
    read = tasks.bind_batches(read_files, source_uri=opts.source, paths=[f.path for f in source.files],
                              values=[f.values for f in source.files], schema=source.schema,
                              path_columns=source.path_columns)
    # read once: the duplicate check and the upsert's passes reuse it
    df = _file_list(spark, source).mapInArrow(read, from_arrow_schema(stored_schema(source.schema)))
    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return _rewrite_read(spark, source, opts, batch_id, df, t0)
    finally:
        df.unpersist()


def _rewrite_read(spark: SparkSession, source: SourceDataset, opts: BootstrapOptions, batch_id: str,
                  df: DataFrame, t0: float) -> dict[str, Any]:
    from spark_jobs.jobs.upsert import UpsertOptions, run_upsert

    keyed = df.select(key_expr(opts.record_key).alias(KEY), *([opts.partition_field] if opts.partition_field and
                                                                opts.index != INDEX_RECORD else []))
    identity = [KEY] + ([opts.partition_field] if opts.partition_field and opts.index != INDEX_RECORD else [])
    groups = keyed.groupBy(*identity).agg(F.count(F.lit(1)).alias("n"))
    agg = groups.agg(F.sum("n").alias("total"), F.sum(F.when(F.col("n") > 1, 1)).alias("keys"),
                     F.sum(F.when(F.col("n") > 1, F.col("n"))).alias("rows")).first()
    total, n_dup, dup_rows = int(agg["total"] or 0), int(agg["keys"] or 0), int(agg["rows"] or 0)
    if not total:
        raise BadInputError(f"the dataset at {opts.source} has no rows")
    if n_dup and not opts.precombine_field:
        samples = [r[0] for r in groups.filter("n > 1").orderBy(KEY).limit(SAMPLES).collect()]
        _refuse_duplicates(n_dup, dup_rows, samples, opts.record_key)
    scan_ms = int((time.perf_counter() - t0) * 1000)
    log.info("phase scan     %6d ms %d duplicated keys", scan_ms, n_dup)
    dropped = dup_rows - n_dup  # of each duplicated key, every row but the winner
    out_counts = {"rows": total - dropped, "source_rows": total, "files_referenced": 0,
                  "files_rewritten": len(source.files), "duplicate_keys": n_dup, "rows_dropped": dropped}
    upsert = UpsertOptions(
        table=opts.table, source=opts.source, record_key=list(opts.record_key),
        precombine_field=opts.precombine_field, partition_field=opts.partition_field, index=opts.index,
        num_buckets=opts.num_buckets, table_type=opts.table_type, batch_id=batch_id,
        target_file_rows=opts.target_file_rows, heartbeat_timeout_s=opts.heartbeat_timeout_s, mirror=opts.mirror,
        source_df=df, action=Action.BOOTSTRAP, operation="bootstrap",
        extra_metadata={"bootstrap": {"source": redact_uri(opts.source), "mode": MODE_REWRITE, "counts": out_counts}},
    )
    result = run_upsert(spark, upsert)
    return {"instant": result["instant"], "batch_id": batch_id, "noop": result["noop"], "mode": MODE_REWRITE,
            "index_type": opts.index, "counts": out_counts,
            "timings_ms": {"scan_ms": scan_ms, **result.get("timings_ms", {})}}
