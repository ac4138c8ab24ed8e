"""``bucketindex demo``: the whole pipeline on the embedded defaults, with a summary.

1. generates a few sample batches into a landing folder, one folder per logical date;
2. sets up a private Airflow (its own ``AIRFLOW_HOME`` and SQLite DB in the work folder, a
   DAG folder linking to the installed example DAGs) and a ``bucketindex_default`` connection
   to local Spark, and runs a one-task warm-up DAG (``dag.test()`` starts its in-process
   Execution API inside the first task it runs; its start-up is not the task's time);
3. runs the example DAG ``bucketindex_ingest`` once per batch through ``dag.test()``:
   upsert -> validate, rollback branch on failure. The small batches run **inside the
   task** (``engine`` ``auto``: the in-process Arrow engine, no spark-submit); the upsert of
   the last run (``--spark-runs``) is forced to ``engine="spark"`` and submitted to Spark,
   so both paths write the same table (its validate stays ``auto``);
4. runs the example DAG ``bucketindex_nightly_compaction`` once, the night after the last
   batch, with a policy the few batches meet (``min_deltas`` 2): compaction due ->
   schedule -> execute (spark-submit) -> clean -> validate (in the task);
5. checks the table against the oracle (batches reduced by key) and prints commits (with
   the engine that wrote each), rows, index buckets, what compaction and clean did, and
   per-phase timings.

Airflow and Spark output goes to ``<workdir>/demo.log``; the terminal gets the summary. The
work folder is a new one under ``$BUCKETINDEX_HOME/demo`` (:mod:`spark_jobs.home`), removed
when the demo succeeds (``--keep`` keeps it) and kept, and named, when it fails; a folder
given with ``--workdir`` is the user's and never removed. Each DAG run is named after its
logical date (``manual__2024-01-01T00:00:00+00:00``), so its batch ids name the data they carry.
Airflow reads its configuration when first imported, so this module imports it only
after the environment is set; if Airflow is already imported in this process the demo
re-runs itself in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from datetime import date, datetime, timedelta, timezone
from typing import Any, Iterator

from spark_jobs.text import plural

__all__ = ["main"]

DAG_ID = "bucketindex_ingest"
NIGHTLY_DAG_ID = "bucketindex_nightly_compaction"
#: the nightly run folds index buckets with this many deltas (the DAG's default is 10)
NIGHTLY_MIN_DELTAS = 2
#: and clean keeps what the latest commit reads, so the demo shows files going
NIGHTLY_RETAIN_COMMITS = 1
FIRST_DATE = date(2024, 1, 1)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bucketindex demo", description=__doc__.splitlines()[0])
    p.add_argument("--workdir", help="folder for landing data, table and Airflow home (default: a new folder under "
                                     "$BUCKETINDEX_HOME/demo, by default ~/.cache/bucketindex/demo, removed when the "
                                     "demo succeeds unless --keep; a folder you name is never removed)")
    p.add_argument("--keep", action="store_true",
                   help="keep the work folder (table, landing data, Airflow home, demo.log) after a successful demo; "
                        "a failed demo always keeps it")
    p.add_argument("--batches", type=int, default=3, help="number of batches / DAG runs (default 3)")
    p.add_argument("--rows", type=int, default=200, help="rows in the first batch (default 200)")
    p.add_argument("--index", choices=("record", "bucket", "global_simple"), default="record",
                   help="the demo table's index type (default record)")
    p.add_argument("--num-buckets", type=int, default=None, help="index buckets (default: the index type's)")
    p.add_argument("--master", default="local[2]", help="Spark master for the demo connection (default local[2])")
    p.add_argument("--spark-runs", type=int, default=1, metavar="N",
                   help="force engine=spark (spark-submit) in the last N DAG runs; the others run with "
                        "engine=auto, which runs these small batches inside the task (default 1; 0: none)")
    p.add_argument("--verbose", action="store_true", help="stream Airflow and Spark output to the terminal")
    return p


class _Clock:
    def __init__(self) -> None:
        self.phases: list[tuple[str, float, str]] = []

    @contextlib.contextmanager
    def phase(self, name: str, note: str = "") -> Iterator[dict[str, str]]:
        info = {"note": note}
        t0 = time.perf_counter()
        try:
            yield info
        finally:
            self.phases.append((name, time.perf_counter() - t0, info["note"]))


@contextlib.contextmanager
def _output_to(path: str, enabled: bool) -> Iterator[None]:
    """Send this process's stdout/stderr (and its children's) to ``path`` at the fd level."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _say(msg: str) -> None:
    print(msg, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if "airflow" in sys.modules:  # too late to point Airflow at our home: start afresh
        return subprocess.call([sys.executable, "-m", "airflow_provider_bucketindex.demo", *(argv or [])])

    from airflow_provider_bucketindex.demo import sample_data, sandbox

    t_start = time.perf_counter()
    clock = _Clock()
    if args.workdir:
        workdir = os.path.abspath(args.workdir)
        os.makedirs(workdir, exist_ok=True)
    else:
        from spark_jobs.home import demo_dir

        os.makedirs(demo_dir(), exist_ok=True)
        workdir = tempfile.mkdtemp(prefix=time.strftime("run-%Y%m%dT%H%M%S-", time.gmtime()), dir=demo_dir())
    landing = os.path.join(workdir, "landing")
    table_uri = os.path.join(workdir, "table")
    log_file = os.path.join(workdir, "demo.log")
    quiet = not args.verbose
    _say(f"bucketindex demo: working in {workdir}")

    # 1. sample batches --------------------------------------------------------------------
    with clock.phase("generate sample batches") as ph:
        batches = sample_data.make_batches(args.batches, args.rows)
        dates = [FIRST_DATE + timedelta(days=i) for i in range(args.batches)]
        for d, b in zip(dates, batches):
            sample_data.write_batch(b, os.path.join(landing, d.isoformat()))
        ph["note"] = f"{plural(len(batches), 'batch')}, {plural(sum(b.num_rows for b in batches), 'row')}"
    _say(f"  generated {plural(len(batches), 'batch')} in {landing}")

    # 2. private Airflow ---------------------------------------------------------------
    with clock.phase("airflow setup (db migrate)"):
        env = sandbox.airflow_env(
            os.path.join(workdir, "airflow"),
            sandbox.demo_dags_folder(os.path.join(workdir, "dags")),  # links to the installed examples
            connection=sandbox.connection_json(args.master, conf=sandbox.LOCAL_TEST_CONF),
        )
        os.environ.update(env)
        sandbox.migrate_db(env, log_file=log_file)
    _say(f"  airflow home {env['AIRFLOW_HOME']} (SQLite), connection bucketindex_default -> {args.master}")

    # 3. one DAG run per batch ----------------------------------------------------------
    with clock.phase("load the ingest DAG"):
        with _output_to(log_file, quiet):
            dag = sandbox.load_dag(DAG_ID)
    with clock.phase("warm up dag.test()") as ph:
        # dag.test() starts its in-process API inside the first task it runs: without this run of a
        # one-task DAG, that start-up (seconds) would count in the first upsert's duration
        try:
            with _output_to(log_file, quiet):
                warm = sandbox.run_dag(sandbox.load_dag(sandbox.WARM_UP_DAG_ID))
            ph["note"] = f"one empty task ({warm.state}): starts dag.test()'s in-process Execution API"
        except Exception as e:  # noqa: BLE001 - only the first task's timing depends on it
            ph["note"] = f"skipped ({type(e).__name__}: {e})"[:120]
    runs: list[Any] = []
    forced = set(dates[max(0, len(dates) - args.spark_runs):]) if args.spark_runs > 0 else set()
    upsert_task = dag.get_task("upsert")
    templated_engine = upsert_task.engine  # "{{ params.engine }}"
    for d in dates:
        engine = "spark" if d in forced else "auto"
        conf = {"table_uri": table_uri, "landing_uri": landing, "index": args.index, "num_buckets": args.num_buckets}
        logical = datetime(d.year, d.month, d.day, tzinfo=timezone.utc)
        _say(f"  DAG run {_run_id(logical)} (the batch of {d}): upsert (engine={engine}) -> validate (engine=auto) ...")
        with clock.phase(f"DAG run {d}") as ph:
            upsert_task.engine = engine  # one task forced to Spark; the DAG's `engine` param would force both
            try:
                with _output_to(log_file, quiet):
                    run = sandbox.run_dag(dag, logical, conf, named_after_date=True)
            finally:
                upsert_task.engine = templated_engine
            runs.append(run)
            ph["note"] = ", ".join(_task_note(run, t, i) for t, i in run.tasks.items())
        _say(f"    {run.state}: {ph['note']}")
        if run.state != "success":
            break

    # 4. the nightly table services -------------------------------------------------------
    ok = all(r.state == "success" for r in runs) and len(runs) == len(dates)
    nightly = None
    nightly_conf: dict[str, Any] = {}
    if ok:
        with clock.phase("load the nightly DAG"):
            with _output_to(log_file, quiet):
                ndag = sandbox.load_dag(NIGHTLY_DAG_ID)
        ndag.get_task("compaction_due").timeout = 0  # one look: the demo does not wait for deltas to pile up
        night = dates[-1] + timedelta(days=1)
        nightly_conf = {"table_uri": table_uri, "min_deltas": min(NIGHTLY_MIN_DELTAS, len(dates)),
                        "retain_commits": NIGHTLY_RETAIN_COMMITS}
        night_at = datetime(night.year, night.month, night.day, tzinfo=timezone.utc)
        _say(f"  nightly run {_run_id(night_at)}: compaction_due -> schedule -> execute -> clean -> validate ...")
        with clock.phase("nightly compaction run") as ph:
            with _output_to(log_file, quiet):
                nightly = sandbox.run_dag(ndag, night_at, nightly_conf, named_after_date=True)
            ph["note"] = ", ".join(_task_note(nightly, t, i) for t, i in nightly.tasks.items())
        _say(f"    {nightly.state}: {ph['note']}")
        ok = nightly.state == "success"

    # 5. check and summarise ------------------------------------------------------------
    problems: list[str] = []
    with clock.phase("check against the oracle"):
        if ok:
            problems = sample_data.compare(table_uri, batches)
    _print_summary(workdir, table_uri, runs, problems if ok else None, clock, time.perf_counter() - t_start, log_file,
                   nightly, nightly_conf)
    if not ok:
        _say(f"demo FAILED: a DAG run did not succeed; see {log_file} (the work folder {workdir} is kept)")
        return 1
    if problems:
        _say(f"demo FAILED: the table differs from the oracle ({len(problems)} differences); "
             f"the work folder {workdir} is kept")
        return 1
    if args.workdir or args.keep:
        _say(f"work folder kept: {workdir}")
    else:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
        _say(f"work folder {workdir} removed (--keep keeps it)")
    return 0


def _run_id(logical: datetime) -> str:
    """The id ``dag.test`` gives a run named after its logical date (``sandbox.run_dag``'s
    ``named_after_date``): what the batch ids of its tasks contain."""
    return f"manual__{logical.isoformat()}"


#: the upsert's phases in the order they run (``spark_jobs.table.action.upsert``)
_PHASES = ["validate_ms", "dedupe_ms", "tag_ms", "write_ms", "index_ms", "commit_ms"]
#: what the engine names mean in the demo's lines
_WHERE = {"arrow": "in the task", "spark": "spark-submit"}


def _task_note(run: Any, task_id: str, info: dict[str, Any]) -> str:
    """``upsert success 0.9s (arrow, in the task)``: state, duration and, for a task that reports
    it (upsert, validate), the engine it ran on."""
    note = f"{task_id} {info['state']}" + (f" {info['duration']:.1f}s" if info["duration"] else "")
    if info["state"] == "success" and task_id in ("upsert", "validate"):
        try:
            out = run.xcom(task_id)
        except Exception:  # noqa: BLE001 - a summary line never fails the demo
            out = None
        engine = out.get("engine") if isinstance(out, dict) else None
        if engine:
            note += f" ({engine}, {_WHERE.get(engine, engine)})"
    return note


def _print_summary(
    workdir: str,
    table_uri: str,
    runs: list[Any],
    problems: list[str] | None,
    clock: _Clock,
    total_s: float,
    log_file: str,
    nightly: Any = None,
    nightly_conf: dict[str, Any] | None = None,
) -> None:
    from spark_jobs.table import Table
    from spark_jobs.table.describe import describe

    _say("")
    _say("bucketindex demo summary")
    _say("=" * 72)
    _say(f"work dir       {workdir}")
    _say(f"log            {log_file}")
    _say(f"DAG runs       {len(runs)} x {DAG_ID}: {', '.join(r.state for r in runs)}")
    t = Table.open(table_uri)
    if t.exists:
        d = describe(t)
        c = d["config"]
        _say(f"table          {table_uri}")
        _say(f"               {c['index_type']} index, {plural(c['num_buckets'], 'bucket')}, key {','.join(c['record_key_fields'])}")
        commits = [x for x in d["timeline"] if x["action"] == "commit"]
        _say(f"commits        {len(commits)}")
        _say(f"  {'instant':<18} {'inserted':>8} {'updated':>8} {'deleted':>8}  {'engine':<6}  batch id")
        for x in commits:
            n = x["counts"]
            engine = x.get("engine") or {}
            name = engine.get("name", "?") if isinstance(engine, dict) else str(engine)
            _say(
                f"  {x['instant']:<18} {n.get('inserted', 0):>8} {n.get('updated', 0):>8} {n.get('deleted', 0):>8}"
                f"  {name:<6}  {x['batch_id']}"
            )
        _say(f"rows           {plural(d['rows'], 'live row')} in {plural(d['file_groups'], 'file group')}")
        check = "not run" if problems is None else ("OK, equals the batches reduced by key" if not problems else
                                                    f"{len(problems)} differences, e.g. {problems[:3]}")
        _say(f"oracle check   {check}")
        files = sum(d["index_buckets"].values())
        _say(f"index buckets  {len(d['index_buckets'])} of {c['num_buckets']} hold index files ({plural(files, 'file')})")
        _say(f"pending        {', '.join(d['pending']) or 'none'}")
        _print_nightly(nightly, nightly_conf or {})
        phases: dict[str, dict[str, int]] = {}  # engine -> phase -> ms
        for x in commits:
            engine = x.get("engine") or {}
            name = engine.get("name", "?") if isinstance(engine, dict) else str(engine)
            for k, v in (x["timings_ms"] or {}).items():
                if k != "total_ms" and isinstance(v, (int, float)):
                    mine = phases.setdefault(name, {})
                    mine[k] = mine.get(k, 0) + int(v)
        if phases:
            _say("job phases     (summed over each engine's commits, from commit metadata)")
            names = sorted({k for p in phases.values() for k in p},
                           key=lambda k: (_PHASES.index(k) if k in _PHASES else len(_PHASES), k))
            engines = sorted(phases)
            _say(f"  {'':<26} " + " ".join(f"{e + ' (' + str(_count(commits, e)) + ')':>12}" for e in engines))
            for k in names:
                cells = " ".join(f"{phases[e][k] / 1000:10.2f} s" if k in phases[e] else f"{'-':>12}" for e in engines)
                _say(f"  {k[:-3] if k.endswith('_ms') else k:<26} {cells}")
    else:
        _say(f"table          {table_uri} was not created")
    _say("timings")
    for name, secs, note in clock.phases:
        _say(f"  {name:<26} {secs:8.2f} s  {note}")
    _say(f"  {'total':<26} {total_s:8.2f} s")
    _say("=" * 72)


def _count(commits: list[dict[str, Any]], engine: str) -> int:
    """How many of ``commits`` the engine named ``engine`` wrote."""
    def name(x: dict[str, Any]) -> str:
        e = x.get("engine") or {}
        return e.get("name", "?") if isinstance(e, dict) else str(e)

    return sum(1 for x in commits if name(x) == engine)


def _print_nightly(run: Any, conf: dict[str, Any]) -> None:
    """What the nightly run's compaction and clean did, from their XComs."""
    if run is None:
        _say(f"nightly        {NIGHTLY_DAG_ID} not run (an ingest run failed)")
        return
    _say(f"nightly        {NIGHTLY_DAG_ID}: {run.state} (min_deltas {conf.get('min_deltas')}, "
         f"clean retains {plural(conf.get('retain_commits') or 0, 'commit')})")
    planned = run.xcom("schedule_compaction") if run.task_state("schedule_compaction") == "success" else None
    if planned is None:
        due = run.xcom("compaction_due") or {}
        _say(f"  compaction   nothing due ({run.task_state('compaction_due')}{': ' + due['reason'] if due else ''})")
    else:
        executed = run.xcom("execute_compaction") or {}
        counts = executed.get("counts") or {}
        entries = f" ({plural(counts['index_entries'], 'entry')})" if "index_entries" in counts else ""
        _say(f"  compaction   {planned['instant']}: {plural(planned['deltas'], 'index delta')} folded into "
             f"{plural(planned['index_buckets'], 'bucket base')}{entries}, {plural(planned['logs'], 'log')} into "
             f"{plural(planned['file_groups'], 'file group base')} (execute {run.task_state('execute_compaction')})")
    cleaned = run.xcom("clean") if run.task_state("clean") == "success" else None
    if cleaned is None:
        _say(f"  clean        {run.task_state('clean')}")
    elif cleaned["noop"]:
        _say(f"  clean        nothing to delete (earliest retained {cleaned['earliest_retained']})")
    else:
        _say(f"  clean        {cleaned['instant']}: deleted {plural(cleaned['files'], 'file')}, {cleaned['bytes']:,} bytes "
             f"(earliest retained {cleaned['earliest_retained']})")
    _say(f"  validate     {run.task_state('validate')}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
