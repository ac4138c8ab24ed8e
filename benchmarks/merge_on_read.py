"""Merge-on-read against copy-on-write: upsert write cost, snapshot read cost with logs, compaction.

For each size of ``--sizes`` the script builds two ``record`` tables from the same generated
data (compare_peers' generator: UUID keys, 9 columns, unpartitioned), one ``copy_on_write``
and one ``merge_on_read``, at defaults. Then it applies ``--upserts`` batches of ``--batch``
rows (half uniform updates of existing keys, half inserts) to both, in turn, timing each
upsert and its write phase; reads the full snapshot of both (a Spark ``read_table`` written
to the ``noop`` sink, so every row and column is materialised and merged, and nothing is
written); compacts the merge-on-read table (``run_compact``, every group with a log); and
reads both again. Correctness: after every step both tables hold the same rows
(``size + upserts x batch/2``), and at the end their contents are equal (a Spark
``exceptAll`` both ways).

    python benchmarks/merge_on_read.py [--sizes 1000000,10000000] [--batch 100000] [--upserts 10]
        [--read-repeats 3] [--workdir DIR] [--json-out FILE]

The issue's goals it reports: ``write_growth`` (merge-on-read write phase at the largest size
/ at the smallest, uniform updates: <= 1.3), ``read_ratio_after_upserts`` (merge-on-read read
/ copy-on-write read after the upserts: <= 1.5) and ``read_ratio_after_compaction`` (~1.0).
Progress goes to stdout; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compare_peers import T0_MS, human_rows, make_rows, uuid4_strings  # noqa: E402
from machine_info import cpu_model, mem_total_gb  # noqa: E402
from results import emit_result  # noqa: E402

TYPES = ("copy_on_write", "merge_on_read")


def log(msg: str) -> None:
    print(msg, flush=True)


def generate(size: int, batch: int, upserts: int, seed: int, out: Path) -> tuple[list[str], list[str]]:
    """Base files (2M rows each at most) and ``upserts`` batch files: half uniform updates of
    keys that exist when the batch runs, half new keys; each batch's ts is above everything before."""
    rng = np.random.default_rng([seed, size])
    out.mkdir(parents=True, exist_ok=True)
    ids = uuid4_strings(rng, size)
    base = []
    for lo in range(0, size, 2_000_000):
        hi = min(size, lo + 2_000_000)
        ordinal = np.arange(lo, hi, dtype=np.int64)
        p = out / f"base-{len(base):03d}.parquet"
        pq.write_table(make_rows(rng, ids.slice(lo, hi - lo), ordinal, T0_MS + ordinal, size, False), p,
                       compression="zstd")
        base.append(str(p))
    import pyarrow as pa

    known = ids
    batches = []
    ts0 = T0_MS + size + 1
    for b in range(upserts):
        half = batch // 2
        upd = rng.choice(len(known), half, replace=False)
        new = uuid4_strings(rng, batch - half)
        b_ids = pa.concat_arrays([known.take(pa.array(upd)), new])
        ordinal = np.concatenate([upd, np.full(batch - half, size - 1)])
        ts = ts0 + b * batch + np.arange(batch, dtype=np.int64)
        tbl = make_rows(rng, b_ids, ordinal, ts, size, False).take(pa.array(rng.permutation(batch)))
        p = out / f"batch-{b:03d}.parquet"
        pq.write_table(tbl, p, compression="zstd")
        batches.append(str(p))
        known = pa.concat_arrays([known, new])
    return base, batches


def timed_read(spark, uri: str, repeats: int) -> float:  # type: ignore[no-untyped-def]
    from spark_jobs.jobs.read import read_table

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        read_table(spark, uri).write.format("noop").mode("overwrite").save()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000000,10000000")
    p.add_argument("--batch", type=int, default=100_000)
    p.add_argument("--upserts", type=int, default=10)
    p.add_argument("--read-repeats", type=int, default=3)
    p.add_argument("--workdir", default=None)
    p.add_argument("--seed", type=int, default=20261123)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bi-mor-"))
    t_script = time.perf_counter()

    from spark_jobs.jobs.compact import run_compact
    from spark_jobs.jobs.read import read_table
    from spark_jobs.jobs.session import get_spark
    from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
    from spark_jobs.table.action.compact import CompactionPolicy
    from spark_jobs.table.describe import describe
    from spark_jobs.table.table import Table

    t0 = time.perf_counter()
    spark = get_spark("local[*]")
    log(f"spark session started in {time.perf_counter() - t0:.1f} s")
    results: dict = {"benchmark": "merge_on_read", "sizes": {}}
    for size in sizes:
        sl = human_rows(size)
        src = work / "src" / sl
        base, batches = generate(size, args.batch, args.upserts, args.seed, src)
        log(f"[{sl}] generated {size:,} rows and {len(batches)} batches of {args.batch:,}")
        uris = {tt: str(work / "tables" / sl / tt) for tt in TYPES}
        for tt, uri in uris.items():
            shutil.rmtree(uri, ignore_errors=True)
            t0 = time.perf_counter()
            for i, f in enumerate(base):
                run_upsert(spark, UpsertOptions(table=uri, source=f, record_key=["id"], precombine_field="ts",
                                                batch_id=f"build-{i}", table_type=tt))
            log(f"[{sl}] built {tt} in {time.perf_counter() - t0:.1f} s")
        per: dict = {tt: {"upsert_s": [], "write_s": [], "tag_s": []} for tt in TYPES}
        expected = size
        for b, f in enumerate(batches):
            expected += args.batch - args.batch // 2
            for tt in (TYPES if b % 2 == 0 else tuple(reversed(TYPES))):
                t0 = time.perf_counter()
                res = run_upsert(spark, UpsertOptions(table=uris[tt], source=f, record_key=["id"],
                                                      precombine_field="ts", batch_id=f"b{b}"))
                wall = time.perf_counter() - t0
                per[tt]["upsert_s"].append(round(wall, 3))
                per[tt]["write_s"].append(res["timings_ms"]["write_ms"] / 1000)
                per[tt]["tag_s"].append(res["timings_ms"]["tag_ms"] / 1000)
                rows = Table.load(uris[tt]).view().num_rows
                assert rows == expected, (tt, b, rows, expected)
                log(f"[{sl}] upsert {b + 1:2d} {tt:13s} {wall:6.2f} s  write {res['timings_ms']['write_ms'] / 1000:5.2f}"
                    f" s  tag {res['timings_ms']['tag_ms'] / 1000:5.2f} s  +{res['counts']['inserted']} "
                    f"~{res['counts']['updated']}")
        reads = {tt: timed_read(spark, uris[tt], args.read_repeats) for tt in TYPES}
        log(f"[{sl}] full read after {args.upserts} upserts: " + ", ".join(f"{k} {v:.2f} s" for k, v in reads.items()))
        logs = describe(Table.load(uris["merge_on_read"]))["logs"]
        t0 = time.perf_counter()
        comp = run_compact(spark, uris["merge_on_read"], policy=CompactionPolicy(min_logs=1))
        compact_s = round(time.perf_counter() - t0, 2)
        log(f"[{sl}] compaction: {comp['counts']} in {compact_s:.1f} s")
        reads_after = {tt: timed_read(spark, uris[tt], args.read_repeats) for tt in TYPES}
        log(f"[{sl}] full read after compaction: " + ", ".join(f"{k} {v:.2f} s" for k, v in reads_after.items()))
        a, b_ = (read_table(spark, uris[tt]) for tt in TYPES)
        same = a.exceptAll(b_).isEmpty() and b_.exceptAll(a).isEmpty()
        log(f"[{sl}] copy-on-write and merge-on-read tables equal: {same}")
        results["sizes"][sl] = {
            "rows": expected, "upserts": per,
            "median_upsert_s": {tt: statistics.median(per[tt]["upsert_s"]) for tt in TYPES},
            "median_write_s": {tt: statistics.median(per[tt]["write_s"]) for tt in TYPES},
            "read_s_after_upserts": reads, "read_s_after_compaction": reads_after,
            "logs_before_compaction": {k: logs[k] for k in ("files", "bytes", "file_groups_with_logs",
                                                            "max_per_group")},
            "compaction_s": compact_s, "compaction": comp.get("counts"), "tables_equal": same,
        }
        shutil.rmtree(work / "tables" / sl, ignore_errors=True)
        shutil.rmtree(src, ignore_errors=True)
    small, big = human_rows(min(sizes)), human_rows(max(sizes))
    r = results["sizes"]
    mor = "merge_on_read"
    results["write_growth"] = {tt: round(r[big]["median_write_s"][tt] / r[small]["median_write_s"][tt], 2)
                               for tt in TYPES}
    results["read_ratio_after_upserts"] = {sl: round(v["read_s_after_upserts"][mor]
                                                     / v["read_s_after_upserts"]["copy_on_write"], 2)
                                           for sl, v in r.items()}
    results["read_ratio_after_compaction"] = {sl: round(v["read_s_after_compaction"][mor]
                                                        / v["read_s_after_compaction"]["copy_on_write"], 2)
                                              for sl, v in r.items()}
    results["all_ok"] = all(v["tables_equal"] for v in r.values())
    results["env"] = {"cpu": cpu_model(), "cores": __import__("os").cpu_count(), "mem_gb": mem_total_gb(),
                      "python": platform.python_version(), "loadavg_end": __import__("os").getloadavg()[0]}
    results["runtime_s"] = round(time.perf_counter() - t_script, 1)
    log(f"write growth {small} -> {big}: {results['write_growth']}; read ratio after upserts "
        f"{results['read_ratio_after_upserts']}, after compaction {results['read_ratio_after_compaction']}")
    emit_result(results, args.json_out)
    spark.stop()


if __name__ == "__main__":
    main()
