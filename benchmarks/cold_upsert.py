"""A cold 200-row ``bucketindex upsert`` into a small existing table, before and after (issue 38).

Builds once, under ``--work``: a table of ``--rows`` rows (``bucketindex upsert`` with
``--record-key id --precombine-field ts``, defaults otherwise: record index, 16 buckets,
copy-on-write, unpartitioned) and a 200-row Parquet batch (100 updates of stored keys, 100 new
keys). Then, for ``--rounds`` interleaved rounds, each tree given by ``--tree NAME=PATH`` (a
checkout of the repository) upserts the batch into its own fresh copy of the table (copied
before the clock starts, so every run does the same work), as the console script does: the
venv's ``bucketindex`` with ``PYTHONPATH`` at the tree. The figures are the process's wall time
and CPU time (user + system) and the upsert's own ``timings_ms.total_ms``; the median per tree,
the load average before and after. The last line is one JSON object.

    python benchmarks/cold_upsert.py --work /tmp/cold --tree before=/tmp/old --tree after=. [--rounds 10]
        [--bytecode cached|none] [--floor]

``--floor`` adds two commands to every round, timed the same way: the venv's interpreter doing
nothing (``-c pass``: start-up and ``site``) and importing what no Arrow upsert can go without
(``numpy``, ``pyarrow``, ``pyarrow.compute``, ``pyarrow.parquet``, ``pyarrow.fs``): the floor
under any cold run of the program on this machine.

``--bytecode cached`` (default): the trees' modules compiled once into a ``PYTHONPYCACHEPREFIX``
outside the repository (what an installed package has); ``none``: ``PYTHONDONTWRITEBYTECODE=1``
and no cache, what the test suite's cold processes pay.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

BATCH_ROWS = 200


def bucketindex_exe() -> str:
    exe = Path(sys.executable).with_name("bucketindex")
    if not exe.exists():
        raise SystemExit(f"no console script next to {sys.executable}")
    return str(exe)


def rows(ids: list[str], ts: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = len(ids)
    return pa.table({"id": pa.array(ids, pa.string()), "ts": pa.array(np.full(n, ts, dtype=np.int64)),
                     "amount": pa.array(rng.random(n) * 1000.0),
                     "note": pa.array([f"note {i} é/%" for i in range(n)], pa.string()),
                     "qty": pa.array(rng.integers(0, 1_000_000, size=n, dtype=np.int32))})


def build(work: Path, table_rows: int, env: dict[str, str]) -> tuple[Path, Path]:
    """The table fixture and the batch, built once with the CLI of the interpreter's own tree."""
    table, batch = work / "table", work / "b200.parquet"
    if (table / ".bucketindex").exists() and batch.exists():
        return table, batch
    shutil.rmtree(table, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    ids = [f"user-{i:08d}@example.org" for i in range(table_rows)]
    pq.write_table(rows(ids, 1, 0), work / "initial.parquet")
    subprocess.run([bucketindex_exe(), "upsert", str(table), str(work / "initial.parquet"), "--record-key", "id",
                    "--precombine-field", "ts", "--engine", "arrow"], check=True, env=env, capture_output=True)
    half = BATCH_ROWS // 2
    new = [f"user-{table_rows + i:08d}@example.org" for i in range(half)]
    pq.write_table(rows(ids[::max(1, table_rows // half)][:half] + new, 2, 1), batch)
    return table, batch


def one(exe: str, table: Path, batch: Path, scratch: Path, env: dict[str, str]) -> dict[str, float]:
    target = scratch / "t"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(table, target)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([exe, "upsert", str(target), str(batch)], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        raise SystemExit(f"upsert exited {p.returncode}: {p.stderr[-2000:]}")
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["engine"] == "arrow" and result["counts"]["inserted"] == BATCH_ROWS // 2, result
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "total_ms": result["timings_ms"]["total_ms"]}


#: ``--floor``: what every cold Arrow upsert pays before any bucketindex code runs
FLOORS = {"python": "pass",
          "pyarrow": "import numpy, pyarrow, pyarrow.compute, pyarrow.parquet, pyarrow.fs"}


def floor(code: str, env: dict[str, str]) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "total_ms": 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--table-rows", type=int, default=1000)
    ap.add_argument("--bytecode", choices=("cached", "none"), default="cached")
    ap.add_argument("--floor", action="store_true", help="also time the interpreter and the imports alone")
    a = ap.parse_args()
    trees = dict(t.split("=", 1) for t in a.tree)
    exe = bucketindex_exe()
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "SPARK_REMOTE")}
    envs = {}
    for name, path in trees.items():
        env = {**base, "PYTHONPATH": str(Path(path).resolve())}
        if a.bytecode == "cached":
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str((a.work / f"pycache-{name}").resolve())
        else:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        envs[name] = env
    table, batch = build(a.work, a.table_rows, envs[next(iter(trees))])
    for name in trees:  # a warm-up per tree: fills its bytecode cache and the OS's page cache
        one(exe, table, batch, a.work / f"scratch-{name}", envs[name])
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    floors = FLOORS if a.floor else {}
    first_env = envs[next(iter(trees))]
    for name, code in floors.items():  # a warm-up each, as for the trees
        floor(code, first_env)
        runs[f"floor:{name}"] = []
    for _ in range(a.rounds):
        for name in trees:
            runs[name].append(one(exe, table, batch, a.work / f"scratch-{name}", envs[name]))
        for name, code in floors.items():
            runs[f"floor:{name}"].append(floor(code, first_env))
    load_after = os.getloadavg()
    summary = {}
    for name, rs in runs.items():
        walls = [r["wall_s"] for r in rs]
        summary[name] = {"wall_median_s": round(statistics.median(walls), 3), "wall_min_s": round(min(walls), 3),
                         "wall_max_s": round(max(walls), 3),
                         "cpu_median_s": round(statistics.median(r["cpu_s"] for r in rs), 3),
                         "total_ms_median": statistics.median(r["total_ms"] for r in rs)}
        print(f"{name:>14}: wall {summary[name]['wall_median_s']:.3f} s "
              f"({summary[name]['wall_min_s']:.3f}-{summary[name]['wall_max_s']:.3f}), "
              f"CPU {summary[name]['cpu_median_s']:.3f} s, total_ms {summary[name]['total_ms_median']}")
    print(json.dumps({"rounds": a.rounds, "bytecode": a.bytecode, "table_rows": a.table_rows,
                      "load_before": [round(x, 2) for x in load_before],
                      "load_after": [round(x, 2) for x in load_after], "trees": summary}))


if __name__ == "__main__":
    main()
