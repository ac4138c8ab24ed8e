"""A small batch into a large table from a cold CLI process: Spark Connect vs classic local Spark.

The question the warm path answers: how long does ``bucketindex upsert`` take, end to end, for
a small batch (default 200 rows: 100 updates of random existing keys with a higher precombine
value, 100 new keys) into a table of ``--size`` rows (default 1M, record index, partitioned by
``region``), when

* **connect**: a Spark Connect server is already running (started here, warmed by one
  unmeasured upsert) and the CLI is a fresh Python process with ``--remote``;
* **classic**: the CLI is a fresh Python process that starts its own ``--master`` JVM, as
  spark-submit or a plain ``bucketindex upsert`` does.

Both are timed as the wall time of the ``python -m spark_jobs.cli upsert ...`` subprocess, in
alternating order, ``--repeats`` batches each (each a new batch on the updated table), median
reported. The job's own phases (``timings_ms`` of its result line) are reported too, so the
process/session overhead is ``wall - total``. A third figure, **connect_warm**, is a long-lived
client (this process) holding one Connect session and calling ``run_upsert`` directly: the floor
of the Connect path, without interpreter start, imports, session creation and artifact upload.

The server and the classic CLI get the same Spark master and driver memory. The table is built
once (one classic upsert of ``--size`` rows, not timed in the figures).

    python benchmarks/connect_latency.py [--size 1000000] [--batch 200] [--repeats 3] [--workdir DIR]

Progress goes to stdout; the last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
from machine_info import cpu_model, mem_total_gb  # noqa: E402 (benchmarks/ is on sys.path)
from results import emit_result  # noqa: E402
from upsert_scaling import git_head, make_rows, region_names, uuid4_strings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PHASES = ("validate_ms", "dedupe_ms", "tag_ms", "write_ms", "index_ms", "commit_ms", "total_ms")


def log(msg: str) -> None:
    print(msg, flush=True)


def cli(args: list[str], env: dict[str, str]) -> tuple[float, dict]:
    """Run ``python -m spark_jobs.cli ARGS``; returns (wall seconds, its JSON result line)."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"bucketindex {' '.join(args[:3])} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    result = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])
    return wall, result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=1_000_000, help="table rows")
    p.add_argument("--batch", type=int, default=200, help="measured batch: half updates, half inserts")
    p.add_argument("--repeats", type=int, default=3, help="measured batches per path (median)")
    p.add_argument("--partitions", type=int, default=8, help="distinct values of the partition field 'region'")
    p.add_argument("--master", default="local[2]", help="the classic CLI's master and the server's")
    p.add_argument("--driver-memory", default="2g", help="driver memory of the classic CLI and of the server")
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--seed", type=int, default=20241123)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    if args.batch % 2:
        p.error("--batch must be even")
    t_script = time.perf_counter()
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="connect_latency_"))
    workdir.mkdir(parents=True, exist_ok=True)
    src, table = workdir / "src", str(workdir / "table")
    src.mkdir(exist_ok=True)
    log(f"workdir {workdir}")

    # -- data: the table's rows and one batch per measured or warm-up upsert ----------------------
    rng = np.random.default_rng(args.seed)
    regions = pa.array(region_names(args.partitions))
    ids = uuid4_strings(rng, args.size)
    codes = rng.integers(0, args.partitions, args.size).astype(np.int8)
    pq.write_table(make_rows(rng, ids, codes, np.ones(args.size), regions), src / "build.parquet", compression="zstd")
    half = args.batch // 2
    names = ["warm-connect", "warm-classic", "warm-connect_warm"] + [f"{path}-{r}" for r in range(args.repeats)
                                                for path in ("connect", "classic", "connect_warm")]
    # updated keys are distinct across all batches: run order never makes one batch's update stale
    all_upd = rng.choice(args.size, half * len(names), replace=False)
    for i, name in enumerate(names):
        upd = np.sort(all_upd[i * half:(i + 1) * half])
        b_ids = pa.concat_arrays([ids.take(pa.array(upd)), uuid4_strings(rng, half)])
        b_codes = np.concatenate([codes[upd], rng.integers(0, args.partitions, half).astype(np.int8)])
        pq.write_table(make_rows(rng, b_ids, b_codes, np.full(args.batch, 10 + i), regions), src / f"{name}.parquet")

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "BUCKETINDEX_SPARK_LOG_LEVEL": "ERROR",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    classic_env = env
    common = ["--record-key", "id", "--precombine-field", "ts", "--partition-field", "region"]

    t0 = time.perf_counter()
    _, built = cli(["upsert", table, str(src / "build.parquet"), *common, "--index", "record", "--batch-id", "build",
                    "--master", args.master, "--driver-memory", args.driver_memory], classic_env)
    log(f"built the {args.size:,}-row table in {time.perf_counter() - t0:.1f} s (classic CLI): {built['counts']}")

    from spark_jobs.jobs.connect import start_server

    t0 = time.perf_counter()
    server = start_server(0, master=args.master, conf={"spark.driver.memory": args.driver_memory,
                                                       "spark.ui.enabled": "false"},
                          log_path=str(workdir / "connect-server.log"))
    server_start_s = time.perf_counter() - t0
    log(f"Spark Connect server {server.url} ({args.master}, driver memory {args.driver_memory}) "
        f"up in {server_start_s:.1f} s")
    runs: dict[str, list[dict]] = {"connect": [], "classic": [], "connect_warm": []}
    warm = None
    try:
        target = {"connect": ["--remote", server.url],
                  "classic": ["--master", args.master, "--driver-memory", args.driver_memory]}
        for path in ("connect", "classic"):  # server warm-up (JIT, first jobs) and page cache, both paths
            wall, _ = cli(["upsert", table, str(src / f"warm-{path}.parquet"), *common, "--batch-id", f"warm-{path}",
                           *target[path]], classic_env if path == "classic" else env)
            log(f"warm-up {path}: {wall:.2f} s (not measured)")

        from spark_jobs.jobs.connect import remote_session
        from spark_jobs.jobs.upsert import UpsertOptions, run_upsert

        for r in range(args.repeats):
            order = ("connect", "classic", "connect_warm") if r % 2 == 0 else ("classic", "connect_warm", "connect")
            for path in order:
                name = f"{path}-{r}"
                if path == "connect_warm":
                    if warm is None:
                        warm = remote_session(server.url, app_name="connect-latency-warm")
                        run_upsert(warm, UpsertOptions(table=table, source=str(src / "warm-connect_warm.parquet"),
                                                       record_key=["id"], precombine_field="ts",
                                                       partition_field="region", batch_id="warm-connect_warm"))
                    t0 = time.perf_counter()
                    res = run_upsert(warm, UpsertOptions(table=table, source=str(src / f"{name}.parquet"),
                                                         record_key=["id"], precombine_field="ts",
                                                         partition_field="region", batch_id=name))
                    wall = time.perf_counter() - t0
                else:
                    wall, res = cli(["upsert", table, str(src / f"{name}.parquet"), *common, "--batch-id", name,
                                     *target[path]], classic_env if path == "classic" else env)
                c, t = res["counts"], res["timings_ms"]
                ok = c["updated"] == half and c["inserted"] == half and not res["noop"]
                rec = {"wall_s": round(wall, 3), **{k: int(t.get(k, 0)) for k in PHASES},
                       "overhead_s": round(wall - t.get("total_ms", 0) / 1000, 3), "ok": ok}
                runs[path].append(rec)
                log(f"{path:12s} #{r}: wall {wall:6.2f} s | job " + " ".join(f"{k[:-3]} {t.get(k, 0) / 1000:.2f}"
                                                                            for k in PHASES)
                    + f" | process+session {rec['overhead_s']:.2f} s | {c['updated']} updated, {c['inserted']} inserted"
                    + ("" if ok else " MISMATCH"))
                if not ok:
                    raise SystemExit(f"wrong counts for {name}: {c}")
    finally:
        if warm is not None:
            warm.stop()
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        server.stop()

    def med(path: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[path]), 3)

    summary = {p: {"wall_s": med(p, "wall_s"), "job_total_s": round(med(p, "total_ms") / 1000, 3),
                   "overhead_s": med(p, "overhead_s")} for p in runs}
    log("median wall: " + ", ".join(f"{p} {s['wall_s']:.2f} s (job {s['job_total_s']:.2f} s)" for p, s in summary.items()))
    import pyspark

    result = {
        "benchmark": "connect_latency", "size": args.size, "batch": args.batch, "repeats": args.repeats,
        "partitions": args.partitions, "master": args.master, "driver_memory": args.driver_memory,
        "server_start_s": round(server_start_s, 1), "median": summary,
        "classic_over_connect": round(summary["classic"]["wall_s"] / summary["connect"]["wall_s"], 2),
        "goal_connect_le_2s": summary["connect"]["wall_s"] <= 2.0, "runs": runs,
        "env": {"cpu": cpu_model(), "cores": os.cpu_count(), "mem_gb": mem_total_gb(),
                "python": platform.python_version(), "pyspark": pyspark.__version__, "commit": git_head(),
                "loadavg_end": os.getloadavg()[0]},
        "runtime_s": round(time.perf_counter() - t_script, 1),
    }
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    emit_result(result, args.json_out)


if __name__ == "__main__":
    main()
