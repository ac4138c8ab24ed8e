"""Bootstrap of an existing Parquet dataset, against one full read of that dataset.

The issue's goal: a ``reference`` bootstrap (the user's files stay in place, only the
record index is built) costs at most 1.5x one full read of the dataset, at 1M and 10M rows.

The dataset is generated once per size and layout with plain pyarrow
(``pyarrow.dataset.write_dataset``, Hive-style ``region=<value>/`` directories, or flat with
``--flat``) and cached under ``--work``: ``--rows`` rows of id (unique string like
``user-0000123``), ts int64, region (8 values, among them ``eu west``, ``são paulo`` and
``a/b``, which pyarrow URI-encodes in the directory names), amount double and payload (a
60-character string) -- about 110 bytes a row in memory -- in files of at most
``--rows-per-file`` rows, snappy-compressed (pyarrow's default).

Then, ``--repeats`` times, interleaved (the order rotates each round; a pyarrow read first in
each round, so the page cache holds the dataset for every contender alike), each as a user
runs it -- a new process, untuned defaults (the CLI's default master unless ``--master``):

* **reference**: ``bucketindex bootstrap TABLE SOURCE --record-key id --partition-field
  region --precombine-field ts`` (record index, reference mode: one scan of the key
  columns, then the index) into a new table directory;
* **rewrite**: the same with ``--mode rewrite`` (every row written into the table's layout);
* **bucket**: the same with ``--index bucket`` (rewrite mode, the only one it has);
* **spark_read** (the peer, "one full read"): a new Python process that starts its Spark
  session as the CLI does (``spark_jobs.jobs.session.get_spark(master, ui=False)``), reads
  the whole dataset with ``spark.read.parquet(ROOT)`` (every column) and materialises it
  with ``write.format("noop")``. Timed as a whole process, JVM start included, like the
  CLI; it also reports its session start and its in-process read time;
* **pyarrow_read** (a second reference): ``ds.dataset(ROOT, partitioning="hive").to_table()``
  in this process.

For each case: wall seconds per run (median, min, max); for the bootstraps the job's JSON
timings (``scan_ms``, ``rewrite_ms``, ``index_ms``, ``total_ms``, ...) and
``session_start_ms``, and ``job_ms``: ``total_ms`` less the session start when the job
started its session itself (the CLI hands ``run_bootstrap`` a function that starts it after
the checks that need no Spark, so ``total_ms`` includes it; told apart by the process's wall
time, which cannot be below the sum of two disjoint spans). Ratios to the full read, two
ways: cold process vs cold process (wall / wall), and job vs read inside their processes
(bootstrap ``job_ms`` / peer ``read_ms``; neither includes the session start).

Correctness, after the timed runs, on the tables of the first round: each table's row count
and rows per region equal the dataset's and its ids are unique (``read_arrow`` up to
``--arrow-check-max`` rows, else a Spark ``read_table`` in this process), ``bucketindex
validate TABLE`` exits 0 with ``"ok": true``, and the dataset's files are unchanged (names,
sizes, modification times). Progress goes to stdout; the last line is one JSON object.

    python benchmarks/bootstrap.py --rows 1000000          # the issue's 1M figure
    python benchmarks/bootstrap.py --rows 10000000         # the issue's 10M figure
        [--flat] [--repeats 3] [--master local[2]] [--work DIR] [--json-out FILE]

With ``--work DIR`` the generated dataset is kept there and reused by the next run of the
same size, layout and seed; without it everything is made in a temporary directory and
removed at the end.
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
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machine_info import cpu_model, mem_total_gb  # noqa: E402 (benchmarks/ is on sys.path)
from results import emit_result  # noqa: E402
from upsert_scaling import dir_size, git_head, human_bytes, human_rows  # noqa: E402

REGIONS = ["us-east", "us-west", "eu west", "eu-central", "são paulo", "ap-south", "a/b", "af-south"]
T0_MS = 1_700_000_000_000
PAYLOAD_CHARS = 60
GEN_CHUNK = 262_144
SCHEMA = pa.schema([("id", pa.string()), ("ts", pa.int64()), ("region", pa.string()), ("amount", pa.float64()),
                    ("payload", pa.string())])
BOOTSTRAPS = ("reference", "rewrite", "bucket")
CASES = (*BOOTSTRAPS, "spark_read")
GOAL = 1.5  # reference bootstrap / one full read

#: the peer: one full read of the dataset by Spark, in a new process started as the CLI starts its own
PEER_READ = r"""
import json, sys, time
from spark_jobs.jobs.session import get_spark, session_start_ms
root, master = sys.argv[1], sys.argv[2] or "local[*]"
spark = get_spark(master, ui=False)
t = time.perf_counter()
spark.read.parquet(root).write.format("noop").mode("overwrite").save()
read_ms = int((time.perf_counter() - t) * 1000)
print(json.dumps({"session_start_ms": session_start_ms(), "read_ms": read_ms}), flush=True)
"""


def log(msg: str) -> None:
    print(msg, flush=True)


# -- the dataset -------------------------------------------------------------------------------
def _strings(chars: np.ndarray) -> pa.StringArray:
    """An Arrow string array from an (n, w) uint8 matrix of ASCII characters."""
    n, w = chars.shape
    offsets = np.arange(0, w * (n + 1), w, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(chars).tobytes()))


def id_strings(numbers: np.ndarray, width: int) -> pa.StringArray:
    """``user-`` and each number zero-padded to ``width`` digits."""
    out = np.empty((len(numbers), 5 + width), dtype=np.uint8)
    out[:, :5] = np.frombuffer(b"user-", dtype=np.uint8)
    n = numbers.astype(np.int64)
    for k in range(width):
        out[:, 4 + width - k] = ord("0") + (n // 10**k) % 10
    return _strings(out)


def batches(rows: int, seed: int) -> Iterator[pa.RecordBatch]:
    rng = np.random.default_rng([seed, rows])
    width = max(7, len(str(rows - 1)))
    order = rng.permutation(rows)  # ids in no particular order, as after years of appends
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789 -_.,:;/+=ABCDEFGHIJKLMNOP", dtype=np.uint8)
    regions = pa.array(REGIONS)
    for lo in range(0, rows, GEN_CHUNK):
        n = min(GEN_CHUNK, rows - lo)
        codes = pa.array(rng.integers(0, len(REGIONS), size=n, dtype=np.int32))
        yield pa.RecordBatch.from_arrays([
            id_strings(order[lo:lo + n], width),
            pa.array(T0_MS + rng.integers(0, 90 * 86_400_000, size=n, dtype=np.int64)),
            pa.DictionaryArray.from_arrays(codes, regions).cast(pa.string()),
            pa.array(np.round(rng.random(n) * 1000.0, 2)),
            _strings(letters[rng.integers(0, len(letters), size=(n, PAYLOAD_CHARS))]),
        ], schema=SCHEMA)


def file_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: (size, mtime_ns), to tell that nobody changed the dataset."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            st = (Path(dirpath) / f).stat()
            out[str(Path(dirpath, f).relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def make_dataset(work: Path, rows: int, flat: bool, rows_per_file: int, seed: int) -> tuple[Path, dict]:
    """The dataset (generated once, reused from ``work`` when there) and its facts."""
    name = f"{'flat' if flat else 'hive'}-{human_rows(rows)}-f{rows_per_file}-s{seed}"
    root, facts_path = work / "data" / name, work / "data" / f"{name}.json"
    if root.is_dir() and facts_path.exists():
        facts = json.loads(facts_path.read_text())
        log(f"dataset {root}: reused ({facts['files']} files, {human_bytes(facts['bytes'])})")
        return root, facts
    tmp = work / "data" / f"{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    t = time.perf_counter()
    group = min(rows_per_file, 131_072)
    ds.write_dataset(batches(rows, seed), tmp, schema=SCHEMA, format="parquet",
                     partitioning=None if flat else ["region"], partitioning_flavor=None if flat else "hive",
                     max_rows_per_file=rows_per_file, max_rows_per_group=group, min_rows_per_group=group,
                     basename_template="part-{i}.parquet", existing_data_behavior="error")
    tmp.rename(root)
    # read back as the job discovers it: the Hive values decoded, every row there
    table = ds.dataset(root, format="parquet", partitioning=None if flat else "hive").to_table()
    counts = {r["values"]: r["counts"] for r in table.column("region").value_counts().to_pylist()}
    assert table.num_rows == rows and sorted(counts) == sorted(REGIONS), (table.num_rows, counts)
    state = file_state(root)
    facts = {"rows": rows, "layout": "flat" if flat else "hive", "files": len(state), "bytes": dir_size(root),
             "rows_per_file": rows_per_file, "seed": seed, "region_rows": counts,
             "bytes_per_row_in_memory": round(table.nbytes / rows, 1),
             "bytes_per_row_on_disk": round(dir_size(root) / rows, 1), "generate_s": round(time.perf_counter() - t, 1)}
    del table
    facts_path.write_text(json.dumps(facts, indent=2) + "\n")
    log(f"dataset {root}: generated {rows:,} rows in {facts['generate_s']} s: {facts['files']} files, "
        f"{human_bytes(facts['bytes'])} ({facts['bytes_per_row_on_disk']} B/row on disk, "
        f"{facts['bytes_per_row_in_memory']} B/row in memory)")
    return root, facts


# -- cold processes --------------------------------------------------------------------------
def child_env() -> dict:
    """A user's environment: a local Spark of its own (no Spark Connect), no settings of ours."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_GATEWAY", "BUCKETINDEX_", "SPARK_CONNECT_MODE")) and k != "SPARK_REMOTE"}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def bucketindex() -> list[str]:
    """The console script a user runs (the venv's), or its module."""
    exe = Path(sys.executable).parent / "bucketindex"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "airflow_provider_bucketindex.cli"]


def run_cold(cmd: list[str], logs: Path, name: str, timeout: float) -> dict:
    """Run ``cmd`` as a new process: its wall time, exit code and stdout (the JVM's log to a file)."""
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / f"{name}.out", logs / f"{name}.err"
    env = child_env()
    env["BUCKETINDEX_SPARK_LOG"] = str(logs / f"{name}.spark.log")
    with open(out, "w") as fo, open(err, "w") as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
        try:
            rc: int | str = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = f"timeout after {timeout:.0f} s"
        wall = time.perf_counter() - t0
    text = out.read_text()
    rec = {"wall_s": round(wall, 3), "rc": rc, "stdout": text}
    if rc != 0:
        rec["error"] = f"exit {rc}: " + "\n".join(err.read_text().splitlines()[-15:])[-2000:]
    return rec


def last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON line")


def bootstrap_cmd(case: str, table: Path, src: Path, args: argparse.Namespace) -> list[str]:
    cmd = [*bucketindex(), "bootstrap", str(table), str(src), "--record-key", "id"]
    if not args.flat:
        cmd += ["--partition-field", "region"]
    if args.precombine_field:
        cmd += ["--precombine-field", args.precombine_field]
    cmd += {"reference": [], "rewrite": ["--mode", "rewrite"], "bucket": ["--index", "bucket"]}[case]
    return cmd + (["--master", args.master] if args.master else [])


# -- the checks ------------------------------------------------------------------------------
def check_table(uri: str, facts: dict, args: argparse.Namespace, spark_box: list) -> dict:
    """Rows, rows per region and unique ids of the table against the dataset's."""
    t = time.perf_counter()
    if facts["rows"] <= args.arrow_check_max:
        from spark_jobs.table.reader import read_arrow

        tbl = read_arrow(uri)
        rows = tbl.num_rows
        regions = {r["values"]: r["counts"] for r in tbl.column("region").value_counts().to_pylist()}
        ids = pc.count_distinct(tbl.column("id")).as_py()
        how = "read_arrow"
        del tbl
    else:
        from pyspark.sql import functions as F

        from spark_jobs.jobs.read import read_table
        from spark_jobs.jobs.session import get_spark

        if not spark_box:
            spark_box.append(get_spark(args.master or "local[*]", ui=False))
        df = read_table(spark_box[0], uri)
        regions = {r["region"]: r["count"] for r in df.groupBy("region").count().collect()}
        rows = sum(regions.values())
        ids = df.agg(F.countDistinct("id")).first()[0]
        how = "spark read_table"
    ok = rows == facts["rows"] and regions == facts["region_rows"] and ids == rows
    out = {"rows": rows, "distinct_ids": ids, "regions_match": regions == facts["region_rows"], "via": how,
           "ok": ok, "check_s": round(time.perf_counter() - t, 1)}
    if regions != facts["region_rows"]:
        out["regions"] = regions
    return out


def validate(uri: str, logs: Path, name: str, args: argparse.Namespace) -> dict:
    cmd = [*bucketindex(), "validate", uri] + (["--master", args.master] if args.master else [])
    r = run_cold(cmd, logs, name, args.timeout)
    try:
        report = json.loads(r["stdout"])
    except json.JSONDecodeError:
        report = {}
    out = {"rc": r["rc"], "ok": report.get("ok"), "wall_s": r["wall_s"]}
    if r["rc"] != 0 or report.get("ok") is not True:
        out["problems"] = report.get("problems") or r.get("error")
    return out


# -- figures ---------------------------------------------------------------------------------
def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)} if values else {}


def median_timings(runs: list[dict]) -> dict:
    keys = sorted({k for r in runs for k, v in r.items() if isinstance(v, (int, float))})
    return {k: int(statistics.median([r[k] for r in runs if k in r])) for k in keys}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--flat", action="store_true", help="an unpartitioned dataset (no region=<value>/ directories)")
    p.add_argument("--rows-per-file", type=int, default=250_000, help="pyarrow's max_rows_per_file (default 250000)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each case (interleaved)")
    p.add_argument("--cases", default=",".join(CASES), help=f"a subset of {','.join(CASES)}")
    p.add_argument("--precombine-field", default="ts", help="passed to every bootstrap ('' for none; default ts)")
    p.add_argument("--master", help="Spark master of every process (default: the CLI's, local[*])")
    p.add_argument("--work", help="keeps the generated dataset for later runs (default: a temporary directory, "
                                  "removed at the end)")
    p.add_argument("--keep-tables", action="store_true", help="keep the first round's tables and the logs")
    p.add_argument("--arrow-check-max", type=int, default=2_000_000,
                   help="check tables of up to this many rows with read_arrow, larger ones with Spark")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one process may take")
    p.add_argument("--seed", type=int, default=20240611)
    p.add_argument("--json-out")
    args = p.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not cases or set(cases) - set(CASES):
        p.error(f"--cases: a subset of {','.join(CASES)}")
    t_script = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="bi-bootstrap-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    run_dir = work / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    tables, logs = run_dir / "tables", run_dir / "logs"
    tables.mkdir(parents=True)
    result: dict = {"benchmark": "bootstrap", "rows": args.rows, "layout": "flat" if args.flat else "hive",
                    "repeats": args.repeats, "master": args.master or "local[*] (the CLI's default)",
                    "precombine_field": args.precombine_field or None, "git": git_head(),
                    "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "mem_gb": mem_total_gb(),
                                "python": platform.python_version(), "loadavg_start": os.getloadavg()[0]}}
    src, facts = make_dataset(work, args.rows, args.flat, args.rows_per_file, args.seed)
    result["dataset"] = {k: v for k, v in facts.items() if k not in ("rows", "layout")}
    before = file_state(src)

    runs: dict[str, list[dict]] = {c: [] for c in cases}
    arrow_read_s: list[float] = []
    first_tables: dict[str, Path] = {}
    failures: list[str] = []
    for i in range(args.repeats):
        t = time.perf_counter()
        n = ds.dataset(src, format="parquet", partitioning=None if args.flat else "hive").to_table().num_rows
        arrow_read_s.append(round(time.perf_counter() - t, 3))
        assert n == args.rows, n
        log(f"[{i + 1}/{args.repeats}] pyarrow read of the dataset: {arrow_read_s[-1]:.2f} s")
        order = cases[i % len(cases):] + cases[:i % len(cases)]
        for case in order:
            name = f"{case}-{i}"
            if case == "spark_read":
                r = run_cold([sys.executable, "-c", PEER_READ, str(src), args.master or ""], logs, name, args.timeout)
                if r["rc"] != 0:
                    failures.append(f"{name}: {r.get('error')}")
                    log(f"[{i + 1}/{args.repeats}] {case}: FAILED {r.get('error')}")
                    continue
                j = last_json(r["stdout"])
                runs[case].append({"wall_s": r["wall_s"], "read_ms": j["read_ms"],
                                   "session_start_ms": j["session_start_ms"]})
                log(f"[{i + 1}/{args.repeats}] {case:10s} {r['wall_s']:7.2f} s wall (session start "
                    f"{j['session_start_ms'] / 1000:.1f} s, read {j['read_ms'] / 1000:.2f} s)")
                continue
            table = tables / name
            r = run_cold(bootstrap_cmd(case, table, src, args), logs, name, args.timeout)
            if r["rc"] != 0:
                failures.append(f"{name}: {r.get('error')}")
                log(f"[{i + 1}/{args.repeats}] {case}: FAILED {r.get('error')}")
                continue
            j = last_json(r["stdout"])
            if j.get("noop") or j.get("counts", {}).get("rows") != args.rows:
                failures.append(f"{name}: noop={j.get('noop')} counts={j.get('counts')}")
            tm = j.get("timings_ms", {})
            session_ms = j.get("session_start_ms") or 0
            inside = tm.get("total_ms", 0) + session_ms > r["wall_s"] * 1000  # the session started in the job
            job_ms = tm.get("total_ms", 0) - (session_ms if inside else 0)
            runs[case].append({"wall_s": r["wall_s"], "session_start_ms": session_ms, "session_in_total": inside,
                               "job_ms": job_ms, "timings_ms": tm, "counts": j.get("counts"),
                               "table_bytes": dir_size(table)})
            phases = ", ".join(f"{k[:-3]} {v / 1000:.2f}" for k, v in sorted(tm.items()) if k != "total_ms")
            log(f"[{i + 1}/{args.repeats}] {case:10s} {r['wall_s']:7.2f} s wall (session start {session_ms / 1000:.1f} s"
                f"{' within the job' if inside else ''}, job {job_ms / 1000:.2f} s without it: {phases}; "
                f"table {human_bytes(dir_size(table))})")
            if i == 0:
                first_tables[case] = table
            else:
                shutil.rmtree(table, ignore_errors=True)

    out: dict = {"pyarrow_read": {"read_s": arrow_read_s, **spread(arrow_read_s)}}
    for case, rs in runs.items():
        walls = [r["wall_s"] for r in rs]
        c: dict = {"wall_s": walls, **spread(walls),
                   "session_start_ms": [r["session_start_ms"] for r in rs]}
        if case == "spark_read":
            c["read_ms"] = [r["read_ms"] for r in rs]
            c["read_ms_median"] = int(statistics.median(c["read_ms"])) if rs else None
        else:
            c["timings_ms"] = [r["timings_ms"] for r in rs]
            c["session_in_total"] = [r["session_in_total"] for r in rs]
            c["job_ms"] = [r["job_ms"] for r in rs]
            c["job_ms_median"] = int(statistics.median(c["job_ms"])) if rs else None
            c["timings_ms_median"] = median_timings(c["timings_ms"])
            c["counts"] = rs[0]["counts"] if rs else None
            c["table_bytes"] = rs[0]["table_bytes"] if rs else None
            # what is neither the session nor the job: interpreter and imports, JVM shutdown
            c["outside_job_s"] = spread([r["wall_s"] - (r["session_start_ms"] + r["job_ms"]) / 1000 for r in rs])
        out[case] = c
    result["cases"] = out

    ratios: dict = {}
    peer = out.get("spark_read", {})
    for case in BOOTSTRAPS:
        if case not in out or not runs[case]:
            continue
        if runs.get("spark_read"):
            ratios[f"{case}_vs_spark_read_cold"] = round(out[case]["median"] / peer["median"], 2)
            ratios[f"{case}_job_vs_spark_read_in_process"] = round(
                out[case]["job_ms_median"] / max(1, peer["read_ms_median"]), 2)
        ratios[f"{case}_job_vs_pyarrow_read"] = round(
            out[case]["job_ms_median"] / 1000 / out["pyarrow_read"]["median"], 2)
    result["ratios"] = ratios
    if "reference_vs_spark_read_cold" in ratios:
        result["goal"] = {"reference_over_full_read_max": GOAL,
                          "met_cold": ratios["reference_vs_spark_read_cold"] <= GOAL,
                          "met_in_process": ratios["reference_job_vs_spark_read_in_process"] <= GOAL}
    log("ratios: " + ", ".join(f"{k} {v}" for k, v in ratios.items()))

    checks: dict = {}
    spark_box: list = []
    for case, table in first_tables.items():
        tc = check_table(str(table), facts, args, spark_box)
        log(f"check {case}: {tc['rows']:,} rows, {tc['distinct_ids']:,} distinct ids, regions "
            f"{'match' if tc['regions_match'] else 'DIFFER: ' + str(tc.get('regions'))} ({tc['via']}, {tc['check_s']} s)")
        checks[case] = tc
    for s in spark_box:
        s.stop()
    for case, table in first_tables.items():
        v = validate(str(table), logs, f"validate-{case}", args)
        checks[case]["validate"] = v
        checks[case]["ok"] = checks[case]["ok"] and v["rc"] == 0 and v["ok"] is True
        log(f"validate {case}: exit {v['rc']}, ok {v['ok']} ({v['wall_s']:.1f} s)"
            + (f" problems: {v['problems']}" if "problems" in v else ""))
    after = file_state(src)
    checks["dataset_unchanged"] = after == before
    if after != before:
        changed = sorted(set(after) ^ set(before) | {k for k in after if k in before and after[k] != before[k]})
        checks["dataset_changes"] = changed[:20]
    log(f"dataset files unchanged: {checks['dataset_unchanged']}")
    result["checks"] = checks
    result["failures"] = failures
    result["all_ok"] = (not failures and checks["dataset_unchanged"]
                        and all(v["ok"] for k, v in checks.items() if isinstance(v, dict))
                        and all(len(runs[c]) == args.repeats for c in cases))
    result["machine"]["loadavg_end"] = os.getloadavg()[0]
    result["runtime_s"] = round(time.perf_counter() - t_script, 1)
    if args.keep_tables or not result["all_ok"]:
        log(f"tables and logs kept in {run_dir}")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    emit_result(result, args.json_out)
    if not result["all_ok"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
