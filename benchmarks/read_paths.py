"""Reading one snapshot through every path other engines use, against the project's own readers.

For each table type of ``--table-types`` the script builds a ``record`` table of ``--rows`` rows
(compare_peers' generator: UUID keys, 10 columns, partitioned by ``month``) with the in-process
Arrow engine, in batches of 2M rows; a merge-on-read table then gets one upsert of
``--update-fraction`` x rows updates spread over every file group, so its snapshot is read
merged (a copy-on-write table gets the same upsert, rewritten). Then it times, best of
``--repeats``:

* ``read_arrow``: :func:`spark_jobs.table.reader.read_arrow`, the whole snapshot as one Arrow table;
* ``dataset_to_table``: ``spark_jobs.table.dataset(uri).to_table()`` (the pyarrow dataset);
* ``duckdb_count``: ``select count(*)`` over the dataset in DuckDB;
* ``duckdb_filtered_agg``: ``select region, sum(amount) ... where month = M and qty > 500000
  group by region`` over the dataset (DuckDB pushes the filter and projection into the scanner);
* ``polars_filtered_agg``: the same query through ``polars.scan_pyarrow_dataset``;
* ``deltalake``: ``deltalake.DeltaTable(uri).to_pyarrow_table()`` over the Delta projection the
  table is built with (``--mirror delta``); a merge-on-read table's Delta version is its
  read-optimized view (bases only, docs/format.md §11): its rows are checked against the
  bases' (inserts a log holds are not there until a compaction);
* ``spark_datasource``: ``spark.read.format("bucketindex").load(uri)`` written to Spark's
  ``noop`` sink (every row and column materialised, nothing written), and ``spark_read_table``:
  the same through :func:`spark_jobs.jobs.read.read_table` (Spark's own Parquet reader), both
  on a ``local[2]`` session started once (its start is not timed; ``--no-spark`` skips both).

Every path's row count is checked against the snapshot's. Ratios are to ``read_arrow`` of the
same table, in one run (machines here are shared and noisy).

    python benchmarks/read_paths.py [--rows 10000000] [--table-types copy_on_write,merge_on_read]
        [--update-fraction 0.05] [--repeats 3] [--no-spark] [--workdir DIR] [--json-out FILE]

Progress goes to stdout; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compare_peers import MONTHS, human_rows, make_rows, uuid4_strings  # noqa: E402
from machine_info import cpu_model, mem_total_gb  # noqa: E402
from results import emit_result  # noqa: E402

CHUNK = 2_000_000


def log(msg: str) -> None:
    print(msg, flush=True)


def build(uri: str, *, rows: int, table_type: str, update_fraction: float, work: Path, seed: int) -> None:
    from spark_jobs.arrow_engine.upsert import run_upsert
    from spark_jobs.table.action.upsert import UpsertOptions

    rng = np.random.default_rng([seed, rows])
    ids = uuid4_strings(rng, rows)
    common = dict(table=uri, record_key=["id"], precombine_field="ts", partition_field="month", index="record",
                  table_type=table_type, mirror="delta")
    for n, lo in enumerate(range(0, rows, CHUNK)):
        hi = min(rows, lo + CHUNK)
        ordinal = np.arange(lo, hi, dtype=np.int64)
        t = make_rows(rng, ids.slice(lo, hi - lo), ordinal, np.ones(hi - lo, dtype=np.int64), rows, True)
        src = work / f"load-{n}.parquet"
        pq.write_table(t, src)
        run_upsert(UpsertOptions(source=str(src), batch_id=f"load-{n}", **common))
        src.unlink()
    k = int(rows * update_fraction)
    if k:
        pick = np.sort(rng.choice(rows, k, replace=False))
        t = make_rows(rng, ids.take(pick), pick, np.full(k, 2, dtype=np.int64), rows, True)
        src = work / "update.parquet"
        pq.write_table(t, src)
        run_upsert(UpsertOptions(source=str(src), batch_id="update", **common))
        src.unlink()


def best(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def measure(uri: str, *, repeats: int, spark: Any) -> dict[str, Any]:
    import duckdb
    import polars as pl
    from deltalake import DeltaTable

    from spark_jobs.table import dataset
    from spark_jobs.table.reader import read_arrow

    out: dict[str, Any] = {}

    def record(name: str, fn: Callable[[], Any], rows: Callable[[Any], int] | None = None) -> Any:
        s, got = best(fn, repeats)
        out[name] = round(s, 3)
        log(f"  {name:22s} {s:8.3f} s")
        if rows is not None:
            out.setdefault("_rows", {})[name] = rows(got)
        return got

    snap = record("read_arrow", lambda: read_arrow(uri), lambda t: t.num_rows)
    n = snap.num_rows
    del snap
    record("dataset_open", lambda: dataset(uri))
    record("dataset_to_table", lambda: dataset(uri).to_table(), lambda t: t.num_rows)
    month = MONTHS[len(MONTHS) // 2]
    sql = (f"select region, sum(amount) as s from d where month = '{month}' and qty > 500000 "
           f"group by region order by region")

    def duck_count() -> int:
        d = dataset(uri)  # noqa: F841 - DuckDB finds it by name
        return duckdb.sql("select count(*) from d").fetchall()[0][0]

    def duck_agg() -> list:
        d = dataset(uri)  # noqa: F841
        return duckdb.sql(sql).fetchall()

    def polars_agg() -> list:
        lf = pl.scan_pyarrow_dataset(dataset(uri))
        q = lf.filter((pl.col("month") == month) & (pl.col("qty") > 500000)).group_by("region").agg(
            pl.col("amount").sum().alias("s")).sort("region")
        return q.collect().rows()

    record("duckdb_count", duck_count, lambda c: c)
    record("deltalake", lambda: DeltaTable(uri).to_pyarrow_table(), lambda t: t.num_rows)
    agg = record("duckdb_filtered_agg", duck_agg)
    pagg = record("polars_filtered_agg", polars_agg)
    assert [r[0] for r in agg] == [r[0] for r in pagg] and all(
        abs(a[1] - b[1]) < 1e-6 * max(1.0, abs(a[1])) for a, b in zip(agg, pagg, strict=True)), (agg, pagg)
    if spark is not None:
        from spark_jobs.jobs.read import read_table

        def noop(df: Any) -> int:
            df.write.format("noop").mode("overwrite").save()
            return n

        record("spark_datasource", lambda: noop(spark.read.format("bucketindex").load(uri)))
        record("spark_read_table", lambda: noop(read_table(spark, uri)))
        c = spark.read.format("bucketindex").load(uri).count()
        out["_rows"]["spark_datasource_count"] = c
    # a merge-on-read table's Delta version is its read-optimized view: the bases' rows only
    # (inserts that went to logs reach it with a compaction)
    from spark_jobs.table.table import Table

    table = Table.load(uri)
    bases = sum(pq.ParquetFile(table.abs(s.path)).metadata.num_rows for s in table.view().slices())
    rows = out.pop("_rows", {})
    if table.config.merge_on_read:
        out["deltalake_rows"] = rows["deltalake"]
        if rows.pop("deltalake") != bases:
            raise AssertionError(f"deltalake read {out['deltalake_rows']} rows, the bases hold {bases}")
    bad = {k: v for k, v in rows.items() if v != n}
    assert not bad, f"row counts differ from the snapshot's {n}: {bad}"
    out["rows"] = n
    base = out["read_arrow"]
    out["ratio_to_read_arrow"] = {k: round(v / base, 2) for k, v in out.items()
                                  if isinstance(v, float) and k != "read_arrow" and base > 0}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--table-types", default="copy_on_write,merge_on_read")
    p.add_argument("--update-fraction", type=float, default=0.05)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-spark", action="store_true")
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--workdir")
    p.add_argument("--json-out")
    args = p.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="read-paths-"))
    work.mkdir(parents=True, exist_ok=True)
    spark = None
    if not args.no_spark:
        from spark_jobs.jobs.session import get_spark

        spark = get_spark("local[2]", app_name="read-paths", ui=False)
    result: dict[str, Any] = {"benchmark": "read_paths", "rows": args.rows, "repeats": args.repeats,
                              "update_fraction": args.update_fraction, "machine": {
                                  "cpu": cpu_model(), "mem_gb": mem_total_gb(), "python": platform.python_version()},
                              "tables": {}}
    try:
        for table_type in args.table_types.split(","):
            uri = str(work / f"t-{table_type}")
            shutil.rmtree(uri, ignore_errors=True)
            log(f"building a {human_rows(args.rows)}-row {table_type} table at {uri}")
            t0 = time.perf_counter()
            build(uri, rows=args.rows, table_type=table_type, update_fraction=args.update_fraction, work=work,
                  seed=args.seed)
            from spark_jobs.table.table import Table

            view = Table.load(uri).view()
            merged = sum(1 for s in view.slices() if s.logs)
            log(f"  built in {time.perf_counter() - t0:.1f} s: {len(view.slices())} slices, {merged} with logs")
            res = measure(uri, repeats=args.repeats, spark=spark)
            res.update(slices=len(view.slices()), merged_slices=merged)
            result["tables"][table_type] = res
            shutil.rmtree(uri, ignore_errors=True)
    finally:
        if spark is not None:
            spark.stop()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    emit_result(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
