"""Peak RSS of the in-process (Arrow) upsert against the memory budget and ``auto``'s estimate.

Why (issue 38, item 5): a 10M-row load in-process peaked at 10.9 GB against the 5.9 GiB budget
``auto`` reported, its estimate 2.6 GiB. This measures, at sizes the shared machine allows (1M
and 3M rows, not 10M), how the peak of a cold CLI upsert relates to the estimate
(``spark_jobs.engines.upsert_footprint``) and to the budget, for a load into a new table and a
batch of half updates / half inserts into the loaded table; and which engine ``auto`` picks
under a given ``--memory-budget`` (the decision only: Spark is not started).

    python benchmarks/memory_bounds.py [--sizes 1000000,3000000] [--workdir DIR]
        [--budgets 256m,1g] [--index record]

Each upsert runs as ``python -m spark_jobs.cli upsert ... --engine arrow`` (no budget: the
engine is not sized, so it runs whatever the estimate), its peak the kernel's high-water mark of
its RSS (``ru_maxrss`` of the child: what ``/usr/bin/time -f %M`` prints). Rows: ``compare_peers.make_rows`` (9 columns, UUID keys). The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from compare_peers import make_rows, uuid4_strings  # noqa: E402
from machine_info import cpu_model, mem_total_gb  # noqa: E402
from results import emit_result  # noqa: E402

MIB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(msg, flush=True)


def generate(work: Path, n: int, seed: int = 5) -> tuple[Path, Path]:
    """A load of ``n`` rows and a batch of ``n`` rows: half updates of loaded keys, half inserts."""
    load, batch = work / f"load_{n}.parquet", work / f"batch_{n}.parquet"
    if load.exists() and batch.exists():
        return load, batch
    rng = np.random.default_rng(seed)
    ids = uuid4_strings(rng, n)
    pq.write_table(make_rows(rng, ids, np.arange(n), np.ones(n), n, False), load)
    upd = ids.take(pa.array(rng.choice(n, size=n // 2, replace=False)))
    new = uuid4_strings(rng, n - n // 2)
    both = pa.concat_arrays([upd, new])
    pq.write_table(make_rows(rng, both, np.full(n, n), np.full(n, 2), n, False), batch)
    return load, batch


def estimate(table: Path, source: Path, index: str, budget: str | None) -> dict:
    """``auto``'s estimate and choice for this upsert, computed as the CLI computes them."""
    from spark_jobs.engines import upsert_footprint
    from spark_jobs.table.action.engine import choose_engine, memory_budget
    from spark_jobs.table.action.upsert import UpsertOptions

    opts = UpsertOptions(table=str(table), source=str(source), record_key=["id"], precombine_field="ts",
                         index=index)
    needed = upsert_footprint(opts)
    b = memory_budget(budget)
    return {"estimate_mib": round(needed / MIB, 1), "budget_mib": round(b / MIB, 1),
            "auto_picks": choose_engine(requested="auto", needed_bytes=needed, budget=b, announce=False).engine}


#: runs the CLI and prints the kernel's high-water mark of its RSS (``ru_maxrss``, KiB): exact,
#: where polling every 100 ms misses short peaks
_PEAK = ("import json, resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
         "print(json.dumps({'rc': p.returncode, 'maxrss_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))")


def upsert(table: Path, source: Path, index: str, table_type: str) -> dict:
    cmd = [sys.executable, "-c", _PEAK, sys.executable, "-m", "spark_jobs.cli", "upsert", str(table), str(source),
           "--record-key", "id", "--precombine-field", "ts", "--index", index, "--table-type", table_type,
           "--engine", "arrow"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    lines = p.stdout.strip().splitlines()
    peak = json.loads(lines[-1])
    if peak["rc"] != 0:
        raise SystemExit(f"upsert of {source} failed: {p.stderr[-2000:]}")
    result = json.loads(lines[-2])
    return {"time_s": round(wall, 2), "peak_rss_mib": round(peak["maxrss_kib"] / 1024, 1),
            "timings_ms": result.get("timings_ms")}


def _commit() -> str:
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return p.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000000,3000000")
    ap.add_argument("--budgets", default="default,256m,1g,4g")
    ap.add_argument("--table-type", default="copy_on_write")
    ap.add_argument("--index", default="record")
    ap.add_argument("--workdir")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bi-mem-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    for n in [int(s) for s in args.sizes.split(",")]:
        load, batch = generate(work, n)
        table = work / f"t_{args.index}_{args.table_type}_{n}"
        shutil.rmtree(table, ignore_errors=True)
        for step, src in (("load", load), ("batch", batch)):
            md = pq.read_metadata(src)
            run = {"rows": n, "step": step, "table_type": args.table_type,
                   "source_mib": round(src.stat().st_size / MIB, 1),
                   "footer_uncompressed_mib": round(sum(md.row_group(i).total_byte_size
                                                        for i in range(md.num_row_groups)) / MIB, 1),
                   "arrow_mib": round(pq.read_table(src).nbytes / MIB, 1)}
            run["auto"] = {b: estimate(table, src, args.index, None if b == "default" else b)
                           for b in args.budgets.split(",")}
            run["estimate_mib"] = next(iter(run["auto"].values()))["estimate_mib"]
            run.update(upsert(table, src, args.index, args.table_type))
            run["peak_over_estimate"] = round(run["peak_rss_mib"] / run["estimate_mib"], 2)
            run["loadavg"] = round(os.getloadavg()[0], 1)
            runs.append(run)
            log(json.dumps(run))
    load_avg = os.getloadavg()
    emit_result({"benchmark": "memory_bounds", "index": args.index, "runs": runs, "commit": _commit(),
                 "env": {"cpu": cpu_model(), "mem_gb": mem_total_gb(), "cores": os.cpu_count(),
                         "loadavg_end": load_avg[0]}}, args.json_out)


if __name__ == "__main__":
    main()
