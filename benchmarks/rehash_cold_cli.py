"""A 200k-row rehash as a user runs it: ``bucketindex rehash`` in a fresh process, defaults only.

Builds a ``--rows`` row table (copy-on-write, ``--from`` buckets, partitioned by region into
``--partitions``) per index (``bucket``: the rehash rewrites every row; ``record``: only the
index) with one in-process upsert, then times, each in a cold ``bucketindex`` process with no
option but the count (``--engine auto`` picks the engine and says why): ``--from`` ->
``--to`` (a split), back (a merge), ``--repeats`` times. The wall time of the process is the
figure (interpreter start and imports included), with its CPU time (user + system), which a
loaded machine inflates less. Correctness: after each rehash the row count
equals the table's and ``validate`` passes at the end. The last line is one JSON object.

    python benchmarks/rehash_cold_cli.py [--rows 200000] [--from 4] [--to 16] [--partitions 4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machine_info import cpu_model, mem_total_gb  # noqa: E402 (benchmarks/ is on sys.path)
from results import emit_result  # noqa: E402
from upsert_scaling import git_head, make_rows, region_names, uuid4_strings  # noqa: E402


def cli(*args: str) -> tuple[float, float, dict]:
    """Wall and CPU (user + system) seconds of one cold ``bucketindex`` process, and its JSON
    result line. CPU time is the figure that survives a loaded machine better."""
    exe = Path(sys.executable).with_name("bucketindex")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "spark_jobs.cli"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([*cmd, *args], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode:
        raise SystemExit(f"{' '.join(args)} exited {out.returncode}: {out.stderr[-2000:]}")
    return took, cpu, json.loads(out.stdout.strip().splitlines()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--from", dest="old", type=int, default=4)
    ap.add_argument("--to", dest="new", type=int, default=16)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from spark_jobs.arrow_engine.upsert import run_upsert
    from spark_jobs.arrow_engine.validate import run_validate
    from spark_jobs.table.action.upsert import UpsertOptions
    from spark_jobs.table.table import Table

    rng = np.random.default_rng(37)
    regions = region_names(args.partitions)
    import pyarrow as pa

    rows = make_rows(rng, uuid4_strings(rng, args.rows), rng.integers(0, args.partitions, size=args.rows),
                     np.full(args.rows, 1), pa.array(regions))
    result: dict = {"benchmark": "rehash_cold_cli", "rows": args.rows, "from": args.old, "to": args.new,
                    "partitions": args.partitions, "git": git_head(), "cpu": cpu_model(), "mem_gb": mem_total_gb(),
                    "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="rehash-cold-") as tmp:
        src = Path(tmp) / "src.parquet"
        pq.write_table(rows, src)
        for index in ("bucket", "record"):
            uri = str(Path(tmp) / index)
            run_upsert(UpsertOptions(table=uri, source=str(src), record_key=["id"], precombine_field="ts",
                                     partition_field="region", index=index, num_buckets=args.old, batch_id="b0"))
            runs: dict[str, list[float]] = {"split": [], "merge": [], "split_cpu": [], "merge_cpu": []}
            engines = set()
            for _ in range(args.repeats):
                for kind, m in (("split", args.new), ("merge", args.old)):
                    took, cpu, res = cli("rehash", uri, "--num-buckets", str(m))
                    assert res["counts"]["rows"] == args.rows, res["counts"]
                    engines.add(f"{res['engine']['name']}: {res['engine']['reason']}")
                    runs[kind].append(round(took, 2))
                    runs[f"{kind}_cpu"].append(round(cpu, 2))
                    print(f"{index} {kind} -> {m}: {took:.2f} s wall, {cpu:.2f} s CPU ({res['engine']['name']}, "
                          f"rehash {res['timings_ms']['rehash_ms']} ms)", flush=True)
            report = run_validate(uri)
            assert report["ok"], report
            assert Table.load(uri).view().num_rows == args.rows
            result[index] = {"split_s": runs["split"], "merge_s": runs["merge"], "split_cpu_s": runs["split_cpu"],
                             "merge_cpu_s": runs["merge_cpu"],
                             "median_s": statistics.median(runs["split"] + runs["merge"]), "engines": sorted(engines)}
    result["load_after"] = os.getloadavg()
    emit_result(result, args.json_out)


if __name__ == "__main__":
    main()
