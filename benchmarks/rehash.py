"""Rehash of a bucket-index table by a multiple, against rewriting the table with a shuffle.

Builds a ``--rows`` row bucket-index table (copy-on-write, ``--from`` buckets, unpartitioned
unless ``--partitions``) with one upsert, then measures, in one warm local Spark session:

* **upsert before**: one ``--batch`` batch (half updates of existing keys, half new keys)
  through ``run_upsert`` into the ``--from``-bucket table;
* **rehash**: ``run_rehash`` to ``--to`` buckets (each old file group split into its
  children by one task; no shuffle) -- the figure the issue asks about -- ``--repeats``
  times, merged back to ``--from`` in between (also timed), interleaved with the peer;
* **upsert after**: as many such batches into the ``--to``-bucket table;
* **rewrite with a shuffle** (the peer): what changing the bucket count costs without a
  rehash, on the same pre-rehash snapshot: (a) plain Spark -- read the snapshot's files,
  ``repartition(M, pmod(xxhash64(key), M))``, write Parquet (a lower bound: no index, no
  commit); (b) with ``--reupsert``, what a bucketindex user would do: upsert every row into
  a new ``--to``-bucket table;
* **cold CLI**: ``bucketindex rehash`` as a user runs it, in a fresh process with untuned
  defaults: ``--to`` -> ``--from`` (a merge) and back (a split).

Correctness: after each rehash the table's row count equals the snapshot's and ``validate``
passes at the end (every row in bucket ``hash(key) mod M``, no duplicate). Progress goes to
stdout; the last line is one JSON object (DESIGN §5).

    python benchmarks/rehash.py [--rows 10000000] [--from 16] [--to 64] [--batch 100000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machine_info import cpu_model, mem_total_gb  # noqa: E402 (benchmarks/ is on sys.path)
from results import emit_result  # noqa: E402
from upsert_scaling import dir_size, git_head, human_bytes, make_rows, region_names, uuid4_strings  # noqa: E402


def log(msg: str) -> None:
    print(msg, flush=True)


def make_source(path: Path, rng: np.random.Generator, ids: pa.Array, ts0: int, partitions: int) -> str:
    regions = pa.array(region_names(max(partitions, 1)))
    codes = rng.integers(0, max(partitions, 1), size=len(ids))
    path.mkdir(parents=True, exist_ok=True)
    chunk = 2_000_000
    for i, start in enumerate(range(0, len(ids), chunk)):
        sl = slice(start, start + chunk)
        n = len(ids[sl])
        pq.write_table(make_rows(rng, ids[sl], codes[sl], np.full(n, ts0), regions), path / f"part-{i:03d}.parquet")
    return str(path)


def batch_ids(rng: np.random.Generator, existing: pa.Array, n: int) -> pa.Array:
    """Half updates of random existing keys, half new keys."""
    upd = existing.take(pa.array(rng.choice(len(existing), size=n // 2, replace=False)))
    return pa.concat_arrays([upd, uuid4_strings(rng, n - n // 2)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--from", dest="old", type=int, default=16)
    ap.add_argument("--to", dest="new", type=int, default=64)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=0, help="partition the table by region into this many")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each contender (interleaved)")
    ap.add_argument("--reupsert", action="store_true", help="also time upserting every row into a new table")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-CLI runs")
    ap.add_argument("--workdir", help="default: a temporary directory, removed at the end")
    ap.add_argument("--json-out")
    args = ap.parse_args()

    from spark_jobs.jobs.rehash import run_rehash
    from spark_jobs.jobs.session import get_spark
    from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
    from spark_jobs.jobs.validate import run_validate
    from spark_jobs.table.table import Table

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bi-rehash-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(12)
    t0 = time.perf_counter()
    spark = get_spark("local[*]")
    spark_start_s = time.perf_counter() - t0
    uri = str(workdir / "table")
    part = ["region"] if args.partitions else []
    result: dict = {"benchmark": "rehash", "rows": args.rows, "from": args.old, "to": args.new, "batch": args.batch,
                    "partitions": args.partitions, "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                                                               "mem_gb": mem_total_gb()},
                    "git": git_head(), "spark_start_s": round(spark_start_s, 1)}

    def upsert(table: str, src: str, batch_id: str, num_buckets: int | None = None) -> dict:
        return run_upsert(spark, UpsertOptions(table=table, source=src, record_key=["id"], precombine_field="ts",
                                               partition_field=part[0] if part else None, index="bucket",
                                               num_buckets=num_buckets, batch_id=batch_id))

    ids = uuid4_strings(rng, args.rows)
    log(f"building a {args.rows:,}-row bucket-index table with {args.old} buckets ...")
    t = time.perf_counter()
    upsert(uri, make_source(workdir / "src0", rng, ids, 1, args.partitions), "build", args.old)
    result["build_s"] = round(time.perf_counter() - t, 1)
    result["table_bytes"] = dir_size(Path(uri))
    log(f"  built in {result['build_s']} s, {human_bytes(result['table_bytes'])}")
    # a warm-up so JIT and first-job costs land on no contender
    warm = str(workdir / "warm")
    upsert(warm, make_source(workdir / "warmsrc", rng, uuid4_strings(rng, 20_000), 1, args.partitions), "w", 4)
    run_rehash(spark, warm, 8)

    def upserts(label: str, buckets: int, ts: int) -> list[int]:
        """``--repeats`` batches; ``ts`` above every earlier batch's, so every update applies."""
        out = []
        for i in range(args.repeats):
            src = make_source(workdir / f"{label}{i}", rng, batch_ids(rng, ids, args.batch), ts + i, args.partitions)
            t = time.perf_counter()
            res = upsert(uri, src, f"{label}-{i}")
            out.append(int((time.perf_counter() - t) * 1000))
            log(f"upsert of {args.batch:,} rows at {buckets} buckets: {out[-1]} ms "
                f"(write phase {res['timings_ms'].get('write_ms')} ms)")
        return out

    result["upsert_before_ms"] = upserts("before", args.old, 10)
    snapshot = Table.load(uri).view()
    rows = snapshot.num_rows
    files = [str(Path(uri) / s.path) for s in snapshot.slices()]

    from pyspark.sql import functions as F

    def spark_rewrite() -> int:
        """The peer: the pre-rehash snapshot rewritten with a shuffle into M buckets."""
        out = workdir / "rewrite"
        t = time.perf_counter()
        df = spark.read.parquet(*files)
        keys = [*(F.col(c) for c in part), F.pmod(F.xxhash64("_bi_key"), F.lit(args.new))]
        df.repartition(args.new, *keys).write.mode("overwrite").parquet(str(out))
        ms = int((time.perf_counter() - t) * 1000)
        assert spark.read.parquet(str(out)).count() == rows
        shutil.rmtree(out, ignore_errors=True)
        return ms

    def rehash(m: int) -> int:
        t = time.perf_counter()
        r = run_rehash(spark, uri, m)
        ms = int((time.perf_counter() - t) * 1000)
        assert Table.load(uri).view().num_rows == rows
        log(f"rehash -> {m}: {ms} ms ({r['counts']['file_groups_read']} file groups read, "
            f"{r['counts']['file_groups_written']} written)")
        return ms

    # split, peer and merge back interleaved, so the machine's noise lands on every contender
    splits, rewrites, merges = [], [], []
    for i in range(args.repeats):
        if i:
            merges.append(rehash(args.old))
        splits.append(rehash(args.new))
        rewrites.append(spark_rewrite())
        log(f"plain Spark rewrite with a shuffle into {args.new} buckets: {rewrites[-1]} ms")
    result.update(rehash_split_ms=splits, rehash_merge_ms=merges, spark_rewrite_ms=rewrites,
                  rehash_ms=int(statistics.median(splits)), spark_rewrite_median_ms=int(statistics.median(rewrites)))
    result["speedup_vs_spark_rewrite"] = round(result["spark_rewrite_median_ms"] / result["rehash_ms"], 2)
    result["upsert_after_ms"] = upserts("after", args.new, 100)
    if args.reupsert:
        dump = workdir / "dump"
        spark.read.parquet(*files).drop("_bi_key").write.mode("overwrite").parquet(str(dump))
        t = time.perf_counter()
        upsert(str(workdir / "reupsert"), str(dump), "all", args.new)
        result["reupsert_ms"] = int((time.perf_counter() - t) * 1000)
        result["speedup_vs_reupsert"] = round(result["reupsert_ms"] / result["rehash_ms"], 2)
        log(f"upsert of every row into a new {args.new}-bucket table: {result['reupsert_ms']} ms")
        shutil.rmtree(workdir / "reupsert", ignore_errors=True)

    if not args.no_cold:
        for m in (args.old, args.new):  # a merge back, then a split again
            t = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "rehash", uri, "--num-buckets", str(m)],
                               capture_output=True, text=True, cwd=ROOT)
            ms = int((time.perf_counter() - t) * 1000)
            if p.returncode:
                raise SystemExit(f"cold rehash failed: {p.stderr[-2000:]}")
            kind = "merge" if m == args.old else "split"
            result[f"cold_cli_{kind}_ms"] = ms
            log(f"cold CLI rehash -> {m} ({kind}): {ms} ms")
    t = time.perf_counter()
    report = run_validate(spark, uri)
    result["validate_ok"] = bool(report["ok"])
    log(f"validate: {'ok' if report['ok'] else report['problems']} ({time.perf_counter() - t:.0f} s)")
    spark.stop()
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    emit_result(result, args.json_out)
    if not report["ok"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
