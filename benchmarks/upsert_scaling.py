"""Upsert latency as the table grows, per index type: ``record``, ``bucket``, ``global_simple``.

For every table size of ``--sizes`` (default 1M and 10M rows) the script builds one table per
index type from the same generated data (``--build-batches`` upserts of equal size, so every
table -- and every record-index bucket -- has the same number of commits behind it at every
size), then times ONE batch of ``--batch`` records (half updates of random existing keys with a
higher precombine value, half new keys) per (index, size) through ``run_upsert``. The measured
batch file is the same for the three index types of one size.

Reported per run: the phases ``run_upsert`` times itself (validate, dedupe, tag, write, index --
record only --, commit, total) plus the wall time of the ``run_upsert`` call. Spark session start
is measured apart (``spark_start_s``) and a warm-up (small throwaway upserts into scratch tables,
one per index type) runs before anything is measured, so JIT and first-job costs land on no
contender. Table building is timed and printed, never part of the figures.

Fairness on a shared, noisy machine: all tables are built first; then the measured upserts run
back to back, the order of the index types rotating between sizes and repeats. Before every
measured upsert ``spark.sql.shuffle.partitions`` is reset to the session default (8), because
``run_upsert`` leaves whatever value its last phase set on the session (see docs/benchmarks.md).

``--local-batch`` adds, after the repeats, one batch per (index, size) whose updates and inserts all
fall in one partition (update locality), reported apart (``local_runs``, ``*_speedup_vs_global_simple_local``).
Every run also reports the data files and rows its commit rewrote, and the task count of every Spark
stage it ran (``stage_tasks``).

Correctness, checked once per table after each measured upsert: the snapshot's row count (from a
Spark count of the snapshot files) equals size + batch/2 per applied batch, and the commit counts
show batch/2 updates and batch/2 inserts.

    python benchmarks/upsert_scaling.py [--sizes 1000000,10000000] [--batch 100000]
        [--indexes record,bucket,global_simple] [--repeats 1] [--table-type merge_on_read]
        [--workdir DIR] [--keep]

Progress goes to stdout; the last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from results import emit_result  # noqa: E402
from machine_info import cpu_model, mem_total_gb  # noqa: E402 (benchmarks/ is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

INDEX_TYPES = ("record", "bucket", "global_simple")
PHASES = ("validate_ms", "dedupe_ms", "tag_ms", "write_ms", "index_ms", "commit_ms", "total_ms")
SESSION_SHUFFLE_PARTITIONS = "8"  # what spark_jobs.jobs.session.get_spark sets


def log(msg: str) -> None:
    print(msg, flush=True)


# -- machine facts -----------------------------------------------------------------------
# -- data generation (vectorised: no Python loop per row) -------------------------------------
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _fixed_width_strings(chars: np.ndarray) -> pa.StringArray:
    """An Arrow string array from an (n, w) uint8 matrix of ASCII characters."""
    n, w = chars.shape
    offsets = np.arange(0, w * (n + 1), w, dtype=np.int64)
    return pa.LargeStringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(chars).tobytes())
    ).cast(pa.string())


def uuid4_strings(rng: np.random.Generator, n: int) -> pa.StringArray:
    """``n`` random UUID4 strings (36 chars), formatted with numpy."""
    b = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    b[:, 6] = (b[:, 6] & 0x0F) | 0x40  # version 4
    b[:, 8] = (b[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
    h = np.empty((n, 32), dtype=np.uint8)
    h[:, 0::2] = _HEX[b >> 4]
    h[:, 1::2] = _HEX[b & 0x0F]
    out = np.full((n, 36), ord("-"), dtype=np.uint8)
    for dst, src in ((slice(0, 8), slice(0, 8)), (slice(9, 13), slice(8, 12)), (slice(14, 18), slice(12, 16)),
                     (slice(19, 23), slice(16, 20)), (slice(24, 36), slice(20, 32))):
        out[:, dst] = h[:, src]
    return _fixed_width_strings(out)


def note_strings(rng: np.random.Generator, n: int) -> pa.StringArray:
    """20-character lowercase payload strings."""
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    return _fixed_width_strings(letters[rng.integers(0, 26, size=(n, 20))])


def region_names(partitions: int) -> list[str]:
    return [f"r{i:02d}" for i in range(partitions)]


def make_rows(rng: np.random.Generator, ids: pa.Array, region_codes: np.ndarray, ts: np.ndarray,
              regions: pa.Array) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "id": ids,
            "region": pa.DictionaryArray.from_arrays(pa.array(region_codes.astype(np.int32)), regions).cast(pa.string()),
            "ts": pa.array(ts.astype(np.int64)),
            "amount": pa.array(rng.random(n) * 1000.0),
            "note": note_strings(rng, n),
            "qty": pa.array(rng.integers(0, 1_000_000, size=n, dtype=np.int32)),
        }
    )


# -- helpers ---------------------------------------------------------------------------------
def dir_size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += (Path(dirpath) / f).stat().st_size
            except OSError:
                pass
    return total


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def human_rows(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def git_head() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):  # an exported tree: `git archive` + a COMMIT file
        f = ROOT / "COMMIT"
        return f.read_text().strip() if f.exists() else "unknown"


def parse_ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def table_facts(uri: str) -> dict:
    """Rows, data files and bytes of the current snapshot; index buckets and files (record)."""
    from spark_jobs.table.table import Table

    t = Table.load(uri)
    view = t.view()
    slices = view.slices()
    rows_per_file = [s.num_rows for s in slices]
    snapshot_bytes = sum(s.size for s in slices)
    idx_files = {b: len(f) for b, f in view.index_files.items() if f}
    return {
        "rows_meta": view.num_rows,
        "files": len(slices),
        "partitions": len(view.partitions()),
        "file_rows_min": min(rows_per_file) if rows_per_file else 0,
        "file_rows_max": max(rows_per_file) if rows_per_file else 0,
        "snapshot_bytes": snapshot_bytes,
        "disk_bytes": dir_size(Path(t.root)),
        "num_buckets": t.num_buckets(view),
        "index_buckets": len(idx_files),
        "index_files_per_bucket": max(idx_files.values()) if idx_files else 0,
        "index_bytes": dir_size(Path(t.layout.index)) if idx_files else 0,
    }


def snapshot_count(spark, uri: str) -> int:
    """Rows of the current snapshot, counted by Spark (merge-on-read slices merged with their logs)."""
    from spark_jobs.jobs.read import read_table

    return read_table(spark, uri).count()


def table_options(index: str, size: int, args) -> dict:
    """num_buckets / target_file_rows per index type (see the --help of the options)."""
    tt = {"table_type": args.table_type}
    if index == "bucket":
        nb = args.bucket_buckets or max(1, round(size / args.partitions / args.bucket_file_rows))
        return {"num_buckets": nb, "target_file_rows": None, **tt}
    if index == "record":
        return {"num_buckets": args.record_buckets, "target_file_rows": args.target_file_rows, **tt}
    return {"num_buckets": None, "target_file_rows": args.target_file_rows, **tt}


def upsert(spark, table: str, source: str, index: str, opts: dict, batch_id: str,
           group: str | None = None) -> tuple[dict, float]:
    from spark_jobs.jobs.upsert import UpsertOptions, run_upsert

    spark.conf.set("spark.sql.shuffle.partitions", SESSION_SHUFFLE_PARTITIONS)
    spark.sparkContext.setJobGroup(group or batch_id, f"upsert {index} {batch_id}")
    t0 = time.perf_counter()
    res = run_upsert(
        spark,
        UpsertOptions(
            table=table, source=source, record_key=["id"], precombine_field="ts", partition_field="region",
            index=index, num_buckets=opts.get("num_buckets"), target_file_rows=opts.get("target_file_rows"),
            batch_id=batch_id, table_type=opts.get("table_type"),
        ),
    )
    wall = (time.perf_counter() - t0) * 1000
    spark.sparkContext.setJobGroup("bench", "benchmark bookkeeping")
    return res, wall


def stage_tasks(spark, group: str) -> list[int]:
    """Tasks of every stage the jobs of ``group`` ran, in order: how parallel each step was."""
    st = spark.sparkContext.statusTracker()
    out = []
    for job in sorted(st.getJobIdsForGroup(group)):
        info = st.getJobInfo(job)
        for sid in sorted(info.stageIds) if info else []:
            s = st.getStageInfo(sid)
            if s is not None and s.numCompletedTasks:
                out.append(s.numCompletedTasks)
    return out


# -- the benchmark ---------------------------------------------------------------------------
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000000,10000000", help="table sizes in rows (comma separated)")
    p.add_argument("--batch", type=int, default=100_000, help="measured batch: half updates, half inserts")
    p.add_argument("--indexes", default=",".join(INDEX_TYPES))
    p.add_argument("--workdir", default=None, help="where tables and sources go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the tables and sources at the end")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="4g",
                   help="spark.driver.memory (local mode: the executors live in the driver JVM)")
    p.add_argument("--repeats", type=int, default=1,
                   help="measured batches per (index, size), each a new batch on the updated table; median")
    p.add_argument("--partitions", type=int, default=8, help="distinct values of the partition field 'region'")
    p.add_argument("--build-batches", type=int, default=5,
                   help="upserts that build each table (same count at every size: equal commit history)")
    p.add_argument("--record-buckets", type=int, default=16, help="record index: index buckets (fixed, RFC-08)")
    p.add_argument("--bucket-file-rows", type=int, default=150_000,
                   help="bucket index: buckets per partition = round(size / partitions / this), at least 1")
    p.add_argument("--bucket-buckets", type=int, default=None, help="bucket index: force this bucket count")
    p.add_argument("--target-file-rows", type=int, default=500_000,
                   help="record and global_simple: target rows per data file")
    p.add_argument("--spark-conf", action="append", default=[], metavar="K=V",
                   help="extra session conf set after start (diagnostics), repeatable")
    p.add_argument("--local-batch", action="store_true",
                   help="also time one batch per (index, size) whose updates and inserts all fall in one partition "
                        "(update locality), after the random batches; reported apart")
    p.add_argument("--table-type", choices=("copy_on_write", "merge_on_read"), default=None,
                   help="table type of every table (default: the product's default)")
    p.add_argument("--seed", type=int, default=20240611)
    p.add_argument("--json-out", default=None, help="also write the final JSON object to this file")
    args = p.parse_args()

    sizes = parse_ints(args.sizes)
    indexes = [x.strip() for x in args.indexes.split(",") if x.strip()]
    for ix in indexes:
        if ix not in INDEX_TYPES:
            p.error(f"unknown index {ix!r}")
    if args.batch % 2:
        p.error("--batch must be even (half updates, half inserts)")
    if any(s < args.batch // 2 for s in sizes):
        p.error("every size must hold at least batch/2 rows to update")
    t_script = time.perf_counter()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--driver-memory {args.driver_memory} pyspark-shell"
    os.environ.setdefault("BUCKETINDEX_SPARK_LOG_LEVEL", "ERROR")
    import logging

    logging.basicConfig(level=logging.WARNING)

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="upsert_scaling_"))
    workdir.mkdir(parents=True, exist_ok=True)
    made_workdir = args.workdir is None
    log(f"workdir {workdir}")

    import pyspark

    t0 = time.perf_counter()
    from spark_jobs.jobs.session import get_spark

    spark = get_spark(args.master, app_name="upsert-scaling")
    spark_start_s = time.perf_counter() - t0
    for kv in args.spark_conf:
        k, _, v = kv.partition("=")
        spark.conf.set(k, v)
    log(f"spark {pyspark.__version__} session ({args.master}, driver memory {args.driver_memory}) "
        f"started in {spark_start_s:.1f} s")
    env = {
        "cpu": cpu_model(), "cores": os.cpu_count(), "mem_gb": mem_total_gb(), "python": platform.python_version(),
        "pyspark": pyspark.__version__, "pyarrow": pa.__version__, "numpy": np.__version__,
        "java": spark.sparkContext._jvm.System.getProperty("java.version"),  # type: ignore[union-attr]
        "commit": git_head(),
    }
    log("machine: " + ", ".join(f"{k} {v}" for k, v in env.items()))

    try:
        result = run(spark, args, sizes, indexes, workdir, spark_start_s, env)
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(workdir if made_workdir else workdir / "tables", ignore_errors=True)
            if not made_workdir:
                shutil.rmtree(workdir / "src", ignore_errors=True)
                shutil.rmtree(workdir / "warmup", ignore_errors=True)
    result["runtime_s"] = round(time.perf_counter() - t_script, 1)
    log(f"benchmark runtime {result['runtime_s']:.0f} s")
    emit_result(result, args.json_out)


def warm_up(spark, workdir: Path, indexes: list[str], partitions: int) -> float:
    """Two small upserts (create, then update + insert) per index type into scratch tables."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(1)
    regions = pa.array(region_names(partitions))
    src = workdir / "warmup"
    src.mkdir(parents=True, exist_ok=True)
    n = 2000
    ids = uuid4_strings(rng, n)
    codes = rng.integers(0, partitions, n)
    pq.write_table(make_rows(rng, ids, codes, np.ones(n), regions), src / "a.parquet")
    upd = np.concatenate([np.arange(n // 2), np.arange(n // 2)])[: n // 2]
    new_ids = uuid4_strings(rng, n // 2)
    second = pa.concat_arrays([ids.take(pa.array(upd)), new_ids])
    pq.write_table(make_rows(rng, second, np.concatenate([codes[upd], rng.integers(0, partitions, n // 2)]),
                             np.full(n, 2), regions), src / "b.parquet")
    for ix in indexes:
        table = str(src / f"t_{ix}")
        for name in ("a", "b"):
            upsert(spark, table, str(src / f"{name}.parquet"), ix, {"num_buckets": 2} if ix == "bucket" else {},
                   f"warm-{ix}-{name}")
    shutil.rmtree(src, ignore_errors=True)
    return time.perf_counter() - t0


def measure(spark, workdir: Path, ix: str, size: int, src: str, batch_id: str, label: str, expected: int,
            half: int) -> dict:
    """One measured upsert plus its correctness check; returns its record."""
    from spark_jobs.table.table import Table

    table = str(workdir / "tables" / f"{ix}_{size}")
    group = f"{batch_id}-{ix}-{size}"
    res, wall_ms = upsert(spark, table, src, ix, {}, batch_id, group)
    stages = stage_tasks(spark, group)
    t, c = res["timings_ms"], res["counts"]
    tl = Table.load(table).timeline
    meta = tl.read_metadata(tl.reload().find(res["instant"]))
    rewritten = [fg for fg in meta.get("file_groups", []) if not fg.get("removed")]
    t0 = time.perf_counter()
    rows = snapshot_count(spark, table)
    check_s = time.perf_counter() - t0
    facts = table_facts(table)
    ok = rows == expected and facts["rows_meta"] == expected and c["updated"] == half and c["inserted"] == half
    rec = {"wall_ms": round(wall_ms), **{k: int(t.get(k, 0)) for k in PHASES},
           "rows": rows, "expected_rows": expected, "files": facts["files"],
           "files_written": len(rewritten),
           # a merge-on-read log holds only the batch's rows of its group, a base the whole group
           "rows_written": sum(int((fg.get("log") or fg).get("num_rows") or 0) for fg in rewritten),
           "updated": c["updated"], "inserted": c["inserted"], "ok": ok, "stage_tasks": stages}
    log(f"[{human_rows(size)}] {ix:13s} {label}: wall {wall_ms / 1000:6.2f} s | "
        + " ".join(f"{k[:-3]} {t.get(k, 0) / 1000:.2f}" for k in PHASES)
        + f" | {c['updated']:,} updated, {c['inserted']:,} inserted; wrote {rec['files_written']}/{facts['files']} "
        f"files, {rec['rows_written']:,} rows; rows {rows:,} (expected {expected:,}) "
        f"{'OK' if ok else 'MISMATCH'} [check {check_s:.1f} s]")
    log(f"    tasks per stage: {' '.join(map(str, stages))}")
    if not ok:
        raise SystemExit(f"correctness check failed for {ix}@{size} ({label}): {rec}")
    return rec


def run(spark, args, sizes: list[int], indexes: list[str], workdir: Path, spark_start_s: float, env: dict) -> dict:
    half = args.batch // 2
    regions = pa.array(region_names(args.partitions))
    warm_s = warm_up(spark, workdir, indexes, args.partitions)
    log(f"warm-up (2 small upserts per index type into scratch tables): {warm_s:.1f} s")

    setup: dict[str, dict] = {}
    build_s: dict[str, float] = {}
    # measured batches per size: list of source paths, one per repeat
    batches: dict[int, list[str]] = {}
    local_batches: dict[int, str] = {}
    for size in sizes:
        rng = np.random.default_rng([args.seed, size])
        sdir = workdir / "src" / str(size)
        sdir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        ids = uuid4_strings(rng, size)
        codes = rng.integers(0, args.partitions, size).astype(np.int8)
        chunk_paths = []
        bounds = np.linspace(0, size, args.build_batches + 1).astype(np.int64)
        for i in range(args.build_batches):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            path = sdir / f"build_{i:02d}.parquet"
            pq.write_table(make_rows(rng, ids.slice(lo, hi - lo), codes[lo:hi], np.full(hi - lo, 1 + i), regions),
                           path, compression="zstd")
            chunk_paths.append(str(path))
        batches[size] = []
        for r in range(args.repeats):
            upd = np.sort(rng.choice(size, half, replace=False))
            new_ids = uuid4_strings(rng, half)
            b_ids = pa.concat_arrays([ids.take(pa.array(upd)), new_ids])
            b_codes = np.concatenate([codes[upd], rng.integers(0, args.partitions, half).astype(np.int8)])
            # updates carry a precombine value above every build batch's: they must win
            tbl = make_rows(rng, b_ids, b_codes, np.full(args.batch, 1_000 + r), regions)
            tbl = tbl.take(pa.array(rng.permutation(args.batch)))  # updates and inserts interleaved
            path = sdir / f"measured_{r:02d}.parquet"
            pq.write_table(tbl, path, compression="zstd")
            batches[size].append(str(path))
        if args.local_batch:
            # update locality: every update and insert falls into partition r00
            in_p0 = np.nonzero(codes == 0)[0]
            if in_p0.size < half:
                raise SystemExit(f"--local-batch: partition r00 of the {size:,}-row table has fewer than {half:,} rows")
            upd = np.sort(rng.choice(in_p0, half, replace=False))
            b_ids = pa.concat_arrays([ids.take(pa.array(upd)), uuid4_strings(rng, half)])
            tbl = make_rows(rng, b_ids, np.zeros(args.batch, dtype=np.int8), np.full(args.batch, 2_000), regions)
            path = sdir / "measured_local.parquet"
            pq.write_table(tbl.take(pa.array(rng.permutation(args.batch))), path, compression="zstd")
            local_batches[size] = str(path)
        del ids, codes
        log(f"[{human_rows(size)}] generated {size:,} rows in {args.build_batches} build batches + "
            f"{args.repeats} measured batch(es) of {args.batch:,} in {time.perf_counter() - t0:.1f} s "
            f"({human_bytes(dir_size(sdir))} of zstd Parquet)")
        for ix in indexes:
            table = str(workdir / "tables" / f"{ix}_{size}")
            opts = table_options(ix, size, args)
            t0 = time.perf_counter()
            for i, src in enumerate(chunk_paths):
                t1 = time.perf_counter()
                res, _ = upsert(spark, table, src, ix, opts, f"build-{i}")
                log(f"[{human_rows(size)}] {ix:13s} build batch {i + 1}/{len(chunk_paths)}: "
                    f"{res['counts']['inserted']:,} inserted in {time.perf_counter() - t1:.1f} s")
            key = f"{ix}@{size}"
            build_s[key] = round(time.perf_counter() - t0, 1)
            facts = table_facts(table)
            setup[key] = {"index": ix, "size": size, **opts, **facts}
            log(f"[{human_rows(size)}] {ix:13s} built in {build_s[key]:.1f} s: {facts['rows_meta']:,} rows, "
                f"{facts['files']} data files ({facts['file_rows_min']:,}-{facts['file_rows_max']:,} rows each, "
                f"snapshot {human_bytes(facts['snapshot_bytes'])}, on disk {human_bytes(facts['disk_bytes'])}), "
                f"{facts['num_buckets']} buckets"
                + (f", {facts['index_buckets']} index buckets x {facts['index_files_per_bucket']} files "
                   f"({human_bytes(facts['index_bytes'])})" if ix == "record" else ""))

    # measured upserts: all tables exist; index order rotates between sizes and repeats
    runs: dict[str, list[dict]] = {}
    turn = 0
    for r in range(args.repeats):
        for size in sizes:
            order = indexes[turn % len(indexes):] + indexes[: turn % len(indexes)]
            turn += 1
            for ix in order:
                rec = measure(spark, workdir, ix, size, batches[size][r], f"measured-{r}", f"repeat {r + 1}/{args.repeats}",
                              size + half * (r + 1), half)
                runs.setdefault(f"{ix}@{size}", []).append({"repeat": r, **rec})
    local_runs: dict[str, dict] = {}
    if args.local_batch:
        for size in sizes:
            order = indexes[turn % len(indexes):] + indexes[: turn % len(indexes)]
            turn += 1
            for ix in order:
                local_runs[f"{ix}@{size}"] = measure(spark, workdir, ix, size, local_batches[size], "local",
                                                     "local batch", size + half * (args.repeats + 1), half)

    # medians and headline ratios
    out_runs = []
    med: dict[str, dict] = {}
    for size in sizes:
        for ix in indexes:
            key = f"{ix}@{size}"
            rs = runs[key]
            m = {k: int(statistics.median(x[k] for x in rs)) for k in (*PHASES, "wall_ms")}
            med[key] = m
            s = setup[key]
            out_runs.append({
                "index": ix, "size": size, **m, "rows": rs[-1]["rows"], "files": rs[-1]["files"],
                "num_buckets": s["num_buckets"], "index_buckets": s["index_buckets"],
                "index_files_per_bucket": s["index_files_per_bucket"], "target_file_rows": s["target_file_rows"],
                "file_rows_min": s["file_rows_min"], "file_rows_max": s["file_rows_max"],
                "snapshot_bytes": s["snapshot_bytes"], "build_s": build_s[key],
                "files_written": rs[-1]["files_written"], "rows_written": rs[-1]["rows_written"],
                "repeats": len(rs), "wall_ms_all": [x["wall_ms"] for x in rs], "stage_tasks": rs[-1]["stage_tasks"],
            })
    out_local = []
    for size in sizes:
        for ix in indexes:
            if f"{ix}@{size}" in local_runs:
                lr = local_runs[f"{ix}@{size}"]
                out_local.append({"index": ix, "size": size, **{k: v for k, v in lr.items() if k != "ok"}})

    small, big = min(sizes), max(sizes)

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 2) if b else None

    result: dict = {}
    for ix in INDEX_TYPES:
        if ix in indexes and len(sizes) > 1:
            result[f"{ix}_tag_growth"] = ratio(med[f"{ix}@{big}"]["tag_ms"], med[f"{ix}@{small}"]["tag_ms"])
            result[f"{ix}_wall_growth"] = ratio(med[f"{ix}@{big}"]["wall_ms"], med[f"{ix}@{small}"]["wall_ms"])
    for ix in ("record", "bucket"):
        if ix in indexes and "global_simple" in indexes:
            result[f"{ix}_speedup_vs_global_simple"] = ratio(med[f"global_simple@{big}"]["wall_ms"],
                                                             med[f"{ix}@{big}"]["wall_ms"])
            result[f"{ix}_tag_speedup_vs_global_simple"] = ratio(med[f"global_simple@{big}"]["tag_ms"],
                                                                 med[f"{ix}@{big}"]["tag_ms"])
    for ix in ("record", "bucket"):
        if local_runs and ix in indexes and "global_simple" in indexes:
            result[f"{ix}_speedup_vs_global_simple_local"] = ratio(local_runs[f"global_simple@{big}"]["wall_ms"],
                                                                   local_runs[f"{ix}@{big}"]["wall_ms"])
    goals = {"record_tag_growth": "<= 1.5", "bucket_tag_growth": "<= 1.5", "record_speedup_vs_global_simple": ">= 4"}
    met = {}
    for k, g in goals.items():
        v = result.get(k)
        if v is not None:
            met[k] = v <= 1.5 if g.startswith("<=") else v >= 4
    result.update({
        "goals": goals, "goals_met": met, "small_size": small, "big_size": big,
        "spark_start_s": round(spark_start_s, 2), "warmup_s": round(warm_s, 1),
        "batch": args.batch, "partitions": args.partitions, "build_batches": args.build_batches,
        "repeats": args.repeats, "master": args.master, "driver_memory": args.driver_memory,
        "spark_conf": args.spark_conf, "build_s": build_s, "env": env, "runs": out_runs,
        "local_runs": out_local,
    })

    log("")
    log(f"{'index':19s} {'rows':>5s} {'files':>5s} {'bkts':>4s} " + " ".join(f"{k[:-3]:>8s}" for k in PHASES)
        + f" {'wall':>8s}   (seconds, median of {args.repeats})")
    for rr in out_runs:
        nb = rr["index_buckets"] if rr["index"] == "record" else rr["num_buckets"] if rr["index"] == "bucket" else "-"
        log(f"{rr['index']:19s} {human_rows(rr['size']):>5s} {rr['files']:>5d} {nb!s:>4s} "
            + " ".join(f"{rr[k] / 1000:8.2f}" for k in PHASES) + f" {rr['wall_ms'] / 1000:8.2f}"
            + f"   wrote {rr['files_written']}/{rr['files']} files, {rr['rows_written']:,} rows")
    for rr in out_local:
        log(f"{rr['index'] + ' local':19s} {human_rows(rr['size']):>5s} {rr['files']:>5d} {'':>4s} "
            + " ".join(f"{rr[k] / 1000:8.2f}" for k in PHASES) + f" {rr['wall_ms'] / 1000:8.2f}"
            + f"   wrote {rr['files_written']}/{rr['files']} files, {rr['rows_written']:,} rows")
    log("")
    for k in ("record_tag_growth", "bucket_tag_growth", "global_simple_tag_growth",
              "record_speedup_vs_global_simple", "bucket_speedup_vs_global_simple",
              "record_speedup_vs_global_simple_local", "bucket_speedup_vs_global_simple_local"):
        if k in result:
            log(f"{k:34s} {result[k]}" + (f"   goal {goals[k]}: {'met' if met[k] else 'MISSED'}" if k in goals else ""))
    return result


if __name__ == "__main__":
    main()
