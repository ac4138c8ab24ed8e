"""Profile of the Spark engine's upsert (issue 38, item 4): Spark jobs, wall time and CPU per row.

Why: ``--engine auto`` hands a batch above the memory budget to Spark, so the Spark engine is the
scale-out path; this says what one upsert costs there and where the time goes, on the same data
and tables for every run, so a change to the engine is measured before and after.

Command (what docs/benchmarks.md reports; ``--keep`` reuses the data and tables of an earlier run)::

    nice -n 10 python benchmarks/spark_profile.py --workdir /tmp/spark_profile --keep \\
        [--rows 1000000] [--batches 100000,1000000] [--table-types merge_on_read,copy_on_write] \\
        [--masters 'local[2]'] [--scaling-batch 1000000] [--small 200] [--json-out FILE]

Data: a ``--rows`` table of UUID4 keys and 9 mixed columns (``compare_peers.make_rows``), built
with the record index by the Arrow engine (one upsert per 250k-row file), once per table type;
batches of half uniform updates (a newer ``ts``: every update wins) and half inserts, plus a
``--small`` batch for the job count of a scheduled upsert.

Each measured upsert runs in a new process (``--child``) on a fresh copy of the built table, in a
session of that ``--master``: the session's start is reported apart (``start_s``); ``wall_s`` is
``run_upsert`` alone; ``cpu_s`` is the user + system CPU of the whole process tree over that call
(this Python driver, the JVM, the Python workers; from ``/proc/<pid>/stat``, children reaped by
their parents included); ``jobs`` counts the Spark jobs the upsert started (``statusTracker``, one
job group), and the event log gives each job's duration and task time (``jobs_detail``: where the
time goes) and, from the process tree's CPU sampled every 0.25 s, how many cores each job used
(``cores``); ``outside_jobs`` is the wall and CPU time of the upsert when none of its jobs ran
(driver-side planning in the JVM, Py4J, the commit), with its gaps of 0.3 s or more; ``timings``
the upsert's phases. ``--profile`` also writes a cProfile of the driver's ``run_upsert``
(``WORKDIR/profiles/NAME.prof``). ``local[1]`` against ``local[2]`` runs on ``--scaling-batch``
(``speedup``).

Correctness, per (table type, batch): the same batch upserted by the Arrow engine into another copy;
both tables read whole (``read_arrow``) and compared row for row (``equal``), and ``validate``
(in-process, the check ``bucketindex validate`` runs) must find no problem in the Spark engine's.
The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import emit_result  # noqa: E402
from compare_peers import T0_MS, make_rows, uuid4_strings  # noqa: E402

FILE_ROWS = 250_000
TICKS = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


# == data and tables ==============================================================================
def generate(work: Path, rows: int, batches: list[int], small: int, seed: int) -> dict:
    """Base files and batches (reused when ``manifest.json`` says they were made with these parameters)."""
    key = {"rows": rows, "batches": batches, "small": small, "seed": seed, "file_rows": FILE_ROWS}
    manifest = work / "data" / "manifest.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        if m["key"] == key:
            return m
    shutil.rmtree(work / "data", ignore_errors=True)
    (work / "data" / "base").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    ids = uuid4_strings(rng, rows)
    files = []
    for lo in range(0, rows, FILE_ROWS):
        hi = min(rows, lo + FILE_ROWS)
        ordinal = np.arange(lo, hi, dtype=np.int64)
        path = work / "data" / "base" / f"part-{len(files):05d}.parquet"
        pq.write_table(make_rows(rng, ids.slice(lo, hi - lo), ordinal, T0_MS + ordinal, rows, False), path)
        files.append(str(path))
    out = {}
    for n in [*batches, small]:
        half = n // 2
        upd = rng.choice(rows, half, replace=False)
        b_ids = pa.concat_arrays([ids.take(pa.array(upd)), uuid4_strings(rng, n - half)])
        ordinal = np.concatenate([upd, np.full(n - half, rows - 1)])
        ts = T0_MS + rows + 1 + np.arange(n, dtype=np.int64)
        tbl = make_rows(rng, b_ids, ordinal, ts, rows, False).take(pa.array(rng.permutation(n)))
        path = work / "data" / f"batch_{n}.parquet"
        pq.write_table(tbl, path)
        out[str(n)] = str(path)
    m = {"key": key, "files": files, "batches": out}
    manifest.write_text(json.dumps(m))
    return m


def build(work: Path, table_type: str, files: list[str], key: dict) -> Path:
    """The record-index table of ``table_type`` over the base files, built by the Arrow engine."""
    from spark_jobs.arrow_engine.upsert import run_upsert as run_arrow
    from spark_jobs.table.action.upsert import UpsertOptions

    path = work / "tables" / table_type
    stamp = path.parent / f"{table_type}.json"
    if stamp.exists() and path.exists() and json.loads(stamp.read_text()) == key:
        return path
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for i, f in enumerate(files):
        run_arrow(UpsertOptions(table=str(path), source=f, record_key=["id"], precombine_field="ts", index="record",
                                table_type=table_type, batch_id=f"build-{i}", engine="arrow"))
    log(f"built {table_type} in {time.perf_counter() - t0:.1f} s")
    stamp.write_text(json.dumps(key))
    return path


def fresh(work: Path, built: Path, name: str) -> Path:
    dst = work / "runs" / name
    shutil.rmtree(dst, ignore_errors=True)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(built, dst)
    return dst


# == the measured child ===========================================================================
def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of ``root`` and every live descendant (with their reaped children)."""
    parent: dict[int, int] = {}
    times: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            text = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        parent[int(d)] = int(fields[1])
        times[int(d)] = sum(int(x) for x in fields[11:15]) / TICKS  # utime stime cutime cstime
    keep = {root}
    grew = True
    while grew:
        grew = False
        for pid, pp in parent.items():
            if pp in keep and pid not in keep:
                keep.add(pid)
                grew = True
    return sum(times.get(p, 0.0) for p in keep)


def event_log_jobs(directory: Path) -> list[dict]:
    """Per job of the event log: its call site, duration, stages, tasks and task run/CPU time."""
    jobs: dict[int, dict] = {}
    stage_job: dict[int, int] = {}
    for f in sorted(x for x in directory.rglob("*") if x.is_file() and not x.name.startswith(".")):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            ev = e.get("Event")
            if ev == "SparkListenerJobStart":
                props = e.get("Properties") or {}
                jobs[e["Job ID"]] = {"job": e["Job ID"], "group": props.get("spark.jobGroup.id"),
                                     "site": (props.get("callSite.short") or "")[:80],
                                     "start": e["Submission Time"], "stages": 0, "tasks": 0,
                                     "run_ms": 0, "cpu_ms": 0}
                for s in e["Stage IDs"]:
                    stage_job[s] = e["Job ID"]
            elif ev == "SparkListenerJobEnd" and e["Job ID"] in jobs:
                j = jobs[e["Job ID"]]
                j["ms"] = e["Completion Time"] - j["start"]
                j["t0"], j["t1"] = j.pop("start") / 1000, e["Completion Time"] / 1000
            elif ev == "SparkListenerStageCompleted":
                info = e["Stage Info"]
                j = jobs.get(stage_job.get(info["Stage ID"], -1))
                if j is None:
                    continue
                j["stages"] += 1
                j["tasks"] += info["Number of Tasks"]
                j.setdefault("names", []).append(info["Stage Name"][:60])
                for acc in info.get("Accumulables", []):
                    if acc.get("Name") == "internal.metrics.executorRunTime":
                        j["run_ms"] += int(acc["Value"])
                    elif acc.get("Name") == "internal.metrics.executorCpuTime":
                        j["cpu_ms"] += int(acc["Value"]) // 1_000_000
    return [j for _, j in sorted(jobs.items())]


class CpuSampler:
    """The process tree's CPU seconds every ``every`` s (a thread of the child): how many cores
    each job used, and what the time outside the jobs cost."""

    def __init__(self, root: int, every: float = 0.25) -> None:
        import threading

        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._root, self._every = root, every
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), tree_cpu_s(self._root)))
            self._stop.wait(self._every)

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.time(), tree_cpu_s(self._root)))
        return self.samples


def _cpu_at(samples: list[tuple[float, float]], t: float) -> float:
    """The tree's CPU seconds at ``t``, interpolated between samples."""
    for (ta, ca), (tb, cb) in zip(samples, samples[1:]):
        if ta <= t <= tb:
            return ca + (cb - ca) * ((t - ta) / (tb - ta) if tb > ta else 0.0)
    return samples[0][1] if t < samples[0][0] else samples[-1][1]


def cores_between(samples: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """Average cores the process tree used over ``[t0, t1]`` (CPU s / wall s)."""
    if t1 <= t0 or len(samples) < 2:
        return None
    return round((_cpu_at(samples, t1) - _cpu_at(samples, t0)) / (t1 - t0), 2)


def outside_jobs(jobs: list[dict], samples: list[tuple[float, float]], t_start: float, t_end: float) -> dict:
    """Wall and CPU seconds of the upsert when no job of it ran (driver planning, Py4J, commit)."""
    spans = sorted((j["t0"], j["t1"]) for j in jobs if "t1" in j and j.get("group") == "bi_upsert")
    gaps, at = [], t_start
    for a, b in spans:
        if a > at:
            gaps.append((at, a))
        at = max(at, b)
    if t_end > at:
        gaps.append((at, t_end))
    wall = sum(b - a for a, b in gaps)
    cpu = sum(_cpu_at(samples, b) - _cpu_at(samples, a) for a, b in gaps)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "gaps": [[round(a - t_start, 2), round(b - a, 2)] for a, b in gaps if b - a >= 0.3]}


def child(args) -> None:
    from spark_jobs.jobs.session import get_spark
    from spark_jobs.jobs.upsert import run_upsert
    from spark_jobs.table.action.upsert import UpsertOptions

    t0 = time.perf_counter()
    spark = get_spark(args.master, app_name="spark-profile", ui=False, datasource=False)
    start_s = time.perf_counter() - t0
    sc = spark.sparkContext
    sc.setJobGroup("bi_upsert", "the measured upsert")
    opts = UpsertOptions(table=args.table, source=args.source, record_key=["id"], precombine_field="ts",
                         index="record", batch_id=f"profile-{Path(args.source).stem}", engine="spark")
    load_before = load()
    sampler = CpuSampler(os.getpid())
    profile = None
    if args.driver_profile:
        import cProfile

        profile = cProfile.Profile()
    cpu0, w0, t_start = tree_cpu_s(os.getpid()), time.perf_counter(), time.time()
    if profile is not None:
        profile.enable()
    res = run_upsert(spark, opts)
    if profile is not None:
        profile.disable()
    wall, cpu, t_end = time.perf_counter() - w0, tree_cpu_s(os.getpid()) - cpu0, time.time()
    samples = sampler.stop()
    jobs = len(sc.statusTracker().getJobIdsForGroup("bi_upsert"))
    spark.stop()
    detail = event_log_jobs(Path(args.event_log))
    if profile is not None:
        profile.dump_stats(args.driver_profile)
    out = {"master": args.master, "start_s": round(start_s, 2), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
           "jobs": jobs, "load": f"{load_before}-{load()}", "timings": res.get("timings_ms"),
           "counts": (res.get("counts") or {}),
           "outside_jobs": outside_jobs(detail, samples, t_start, t_end),
           "jobs_detail": [{**j, "cores": cores_between(samples, j["t0"], j["t1"])} if "t1" in j else j
                           for j in detail]}
    print(json.dumps(out), flush=True)


def run_child(work: Path, table: Path, source: str, master: str, name: str, *, profile: bool = False) -> dict:
    ev = work / "events" / name
    shutil.rmtree(ev, ignore_errors=True)
    ev.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               PYSPARK_SUBMIT_ARGS=f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir=file://{ev} "
                                   f"--conf spark.eventLog.compress=false pyspark-shell")
    cmd = [sys.executable, __file__, "--child", "--table", str(table), "--source", source, "--master", master,
           "--event-log", str(ev)]
    if profile:
        cmd += ["--driver-profile", str(work / "profiles" / f"{name}.prof")]
        (work / "profiles").mkdir(exist_ok=True)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"child failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# == correctness ==================================================================================
def arrow_result(work: Path, built: Path, source: str, name: str) -> tuple[Path, float]:
    from spark_jobs.arrow_engine.upsert import run_upsert as run_arrow
    from spark_jobs.table.action.upsert import UpsertOptions

    dst = fresh(work, built, name)
    t0 = time.perf_counter()
    run_arrow(UpsertOptions(table=str(dst), source=source, record_key=["id"], precombine_field="ts",
                            index="record", batch_id=f"profile-{Path(source).stem}", engine="arrow"))
    return dst, time.perf_counter() - t0


def same_rows(a: Path, b: Path) -> bool:
    from spark_jobs.table.reader import read_arrow

    ta, tb = read_arrow(str(a)), read_arrow(str(b))
    cols = [c for c in ta.column_names if not c.startswith("_bi_")]
    ta, tb = ta.select(cols).sort_by("id"), tb.select(cols).sort_by("id")
    return ta.num_rows == tb.num_rows and ta.equals(tb)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--table", help=argparse.SUPPRESS)
    p.add_argument("--source", help=argparse.SUPPRESS)
    p.add_argument("--event-log", help=argparse.SUPPRESS)
    p.add_argument("--driver-profile", help=argparse.SUPPRESS)
    p.add_argument("--profile", action="store_true",
                   help="cProfile the driver's run_upsert (WORKDIR/profiles/NAME.prof; its overhead is in wall_s)")
    p.add_argument("--master", default="local[2]", help=argparse.SUPPRESS)
    p.add_argument("--workdir", default="/tmp/spark_profile")
    p.add_argument("--keep", action="store_true", help="reuse data and built tables of an earlier run")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batches", default="100000,1000000")
    p.add_argument("--small", type=int, default=200, help="a small batch for the job count (0: none)")
    p.add_argument("--table-types", default="merge_on_read,copy_on_write")
    p.add_argument("--masters", default="local[2]", help="masters for every batch")
    p.add_argument("--scaling-batch", type=int, default=1_000_000, help="the batch run on local[1] too (0: none)")
    p.add_argument("--no-check", action="store_true", help="skip the Arrow-engine comparison and validate")
    p.add_argument("--seed", type=int, default=38)
    p.add_argument("--tag", default="", help="prefix of the run directories (two runs sharing a --workdir)")
    p.add_argument("--json-out")
    args = p.parse_args()
    if args.child:
        child(args)
        return
    work = Path(args.workdir)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    batches = [int(x) for x in args.batches.split(",") if x]
    data = generate(work, args.rows, batches, args.small, args.seed)
    runs = []
    for tt in args.table_types.split(","):
        built = build(work, tt, data["files"], data["key"])
        sizes = ([args.small] if args.small else []) + batches
        for n in sizes:
            src = data["batches"][str(n)]
            masters = args.masters.split(",")
            if n == args.scaling_batch and "local[1]" not in masters:
                masters = ["local[1]", *masters]
            for master in masters:
                name = f"{args.tag}{tt}_{n}_{master.replace('[', '').replace(']', '')}"
                table = fresh(work, built, name)
                rec = run_child(work, table, src, master, name, profile=args.profile)
                rec.update(table_type=tt, batch=n, cpu_s_per_row=rec["cpu_s"] / n)
                log(f"{tt} batch {n} {master}: {rec['jobs']} jobs, {rec['wall_s']} s, cpu {rec['cpu_s']} s "
                    f"({rec['cpu_s'] / n * 1e6:.1f} us/row), load {rec['load']}")
                o = rec["outside_jobs"]
                log(f"   outside the jobs: {o['wall_s']} s wall, {o['cpu_s']} CPU s; gaps >= 0.3 s "
                    f"(start s, length s): {o['gaps']}; phases: {rec['timings']}")
                for j in rec["jobs_detail"]:
                    if j.get("group") == "bi_upsert":
                        log(f"   job {j['job']}: {j.get('ms')} ms, {j['stages']} stages, {j['tasks']} tasks, "
                            f"run {j['run_ms']} ms, cpu {j['cpu_ms']} ms, tree {j.get('cores')} cores: "
                            f"{j['site']} {j.get('names', [])[-1:]}")
                if master == masters[-1] and not args.no_check and n != args.small:
                    ref, arrow_s = arrow_result(work, built, src, f"{name}_arrow")
                    from spark_jobs.arrow_engine.validate import run_validate

                    rec["equal_to_arrow"] = same_rows(table, ref)
                    rec["arrow_wall_s"] = round(arrow_s, 2)
                    report = run_validate(str(table))
                    rec["validate_ok"] = report["ok"]
                    log(f"   equal to the Arrow engine's: {rec['equal_to_arrow']}; validate ok: {report['ok']}"
                        f" {report.get('problems') or ''}; Arrow engine {arrow_s:.2f} s")
                    shutil.rmtree(ref, ignore_errors=True)
                shutil.rmtree(table, ignore_errors=True)
                runs.append(rec)
    for tt in args.table_types.split(","):
        one = {r["master"]: r for r in runs if r["table_type"] == tt and r["batch"] == args.scaling_batch}
        if "local[1]" in one and "local[2]" in one:
            log(f"{tt} batch {args.scaling_batch}: local[2] is {one['local[1]']['wall_s'] / one['local[2]']['wall_s']:.2f}x"
                f" local[1]")
    for r in runs:
        r["jobs_detail"] = [{k: v for k, v in j.items() if k not in ("t0", "t1")}
                            for j in r["jobs_detail"] if j.get("group") == "bi_upsert"]
    emit_result({"benchmark": "spark_profile", "rows": args.rows, "runs": runs}, args.json_out)


if __name__ == "__main__":
    main()
