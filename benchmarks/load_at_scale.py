"""Load 10M and 50M rows into a new table through the CLI at defaults: does it finish, how long, how much memory.

Why: a user's first act is loading what they have. At Spark's defaults (1 GiB heap, a window
over every insert of a partition) a 10M-row load died with ``OutOfMemoryError``; the other
benchmarks built their big tables in a tuned session, so nobody saw it. This script runs the
CLI exactly as a user does -- ``python -m airflow_provider_bucketindex.cli upsert TABLE SOURCE
--record-key id --precombine-field ts`` with no tuning flag and no Spark conf -- once per size
and index type, and reports:

* wall time from process start to exit, and the phases the job logged (session start apart);
* peak RSS of the process tree (python driver + JVM + Python workers), polled every 100 ms;
* the Parquet bytes loaded, the file groups written, and a check that the table's row count
  (from the commit metadata) equals the rows generated, plus ``validate`` for sizes up to
  ``--validate-up-to`` (default 10M).

    python benchmarks/load_at_scale.py [--sizes 10000000,50000000] [--indexes record]
        [--workdir DIR] [--keep]

Data: the 9-column rows of ``compare_peers.py`` (UUID keys), written in 1M-row row groups of one
Parquet file per size. Progress goes to stdout; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_peers import dir_size, human_bytes, make_rows, run_cold, uuid4_strings  # noqa: E402
from machine_info import cpu_model, mem_total_gb  # noqa: E402
from results import emit_result  # noqa: E402

CHUNK = 1_000_000


def log(msg: str) -> None:
    print(msg, flush=True)


def generate(path: Path, n: int, seed: int = 11) -> int:
    rng = np.random.default_rng(seed)
    writer = None
    for lo in range(0, n, CHUNK):
        m = min(CHUNK, n - lo)
        t = make_rows(rng, uuid4_strings(rng, m), np.arange(lo, lo + m), np.ones(m), n, False)
        writer = writer or pq.ParquetWriter(path, t.schema)
        writer.write_table(t, row_group_size=CHUNK)
    assert writer is not None
    writer.close()
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000000,50000000")
    ap.add_argument("--indexes", default="record")
    ap.add_argument("--validate-up-to", type=int, default=10_000_000)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bi-load-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    for size in [int(s) for s in args.sizes.split(",")]:
        src = work / f"src_{size}.parquet"
        t0 = time.perf_counter()
        nbytes = src.stat().st_size if src.exists() else generate(src, size)
        log(f"{size:,} rows: {human_bytes(nbytes)} of Parquet ({time.perf_counter() - t0:.0f} s to generate)")
        for index in args.indexes.split(","):
            table = work / f"t_{index}_{size}"
            shutil.rmtree(table, ignore_errors=True)
            cmd = [sys.executable, "-m", "airflow_provider_bucketindex.cli", "upsert", str(table), str(src),
                   "--record-key", "id", "--precombine-field", "ts", "--index", index]
            log(f"  loading into a new {index} table: {' '.join(cmd[2:])}")
            rec = run_cold(cmd, work / "logs", f"{index}_{size}", timeout=4 * 3600)
            result = rec.get("result") or {}
            run = {"size": size, "index": index, "source_bytes": nbytes, "time_s": rec["time_s"],
                   "peak_mem_mb": rec["peak_mem_mb"], "rc": rec["rc"],
                   "session_start_ms": result.get("session_start_ms"), "timings_ms": result.get("timings_ms"),
                   "rows_committed": (result.get("counts") or {}).get("inserted")}
            if rec["rc"] == 0:
                run["rows_ok"] = run["rows_committed"] == size
                run["table_bytes"] = dir_size(table)
                from spark_jobs.table.table import Table

                run["file_groups"] = len(Table.load(str(table)).view().file_groups)
                if size <= args.validate_up_to:
                    v = run_cold([sys.executable, "-m", "airflow_provider_bucketindex.cli", "validate", str(table)],
                                 work / "logs", f"validate_{index}_{size}", timeout=3600)
                    run["validate_s"], run["validate_peak_mem_mb"] = v["time_s"], v["peak_mem_mb"]
                    run["validate_ok"] = v["rc"] == 0
            else:
                run["error"] = rec.get("error", "")[-600:]
            runs.append(run)
            log(f"  -> {json.dumps({k: v for k, v in run.items() if k != 'error'})}")
            if "error" in run:
                log(f"  !! {run['error']}")
            if not args.keep:
                shutil.rmtree(table, ignore_errors=True)
    emit_result({"benchmark": "load_at_scale", "runs": runs,
                 "env": {"cpu": cpu_model(), "mem_gb": mem_total_gb(), "cores": os.cpu_count()}}, args.json_out)


if __name__ == "__main__":
    main()
