"""End to end: the example nightly compaction DAG through ``dag.test()``, a real SQLite
metadata DB and real ``spark-submit`` on local Spark.

1. On a record-index table made by two real upserts (the CLI, local Spark), the test variant
   ``bucketindex_test_nightly`` -- the example DAG from its own factory, plus a real
   ``UpsertWithIndexOperator`` task between ``schedule_compaction`` and
   ``execute_compaction`` -- runs with ``min_deltas=2``: the compaction folds the two
   upserts' deltas, the upsert committed meanwhile keeps its deltas above the new bases,
   clean and validate run, and the table equals the three batches reduced by key. The
   extra task is a DAG dependency, not a thread, so the interleaving "scheduled, then an
   upsert commits, then executed" is the same in every run, and it is the real operator
   the ingest DAG uses, committing in its own spark-submit. ``execute_compaction`` runs
   in the task on the in-process engine (``engine`` auto picks Arrow for this table): its
   commit records that engine and its reason, no spark-submit.
2. The example DAG on that table, its compaction killed before the commit point: the
   failure branch cancels the plan, the run fails, the table is unchanged.
3. Nothing due: the example DAG itself; its sensor (soft_fail) skips, every downstream task
   is skipped, the run succeeds and nothing is written. No Spark.
4. Deferral: the example DAG's sensor with ``deferrable=True`` defers (nothing due at its
   first look), ``dag.test()`` runs its trigger inline, a commit lands meanwhile (as the
   hourly ingest would) and the sensor resumes from the trigger's event. No Spark: the
   Spark tasks downstream are marked success (test 1 runs them for real).
5. The plan's instant as ``schedule_compaction.output["instant"]`` (an XComArg): a failed
   execute's failure branch cancels exactly the pushed plan, and the next night's execute
   compacts its own plan in the task. No Spark.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

import pytest

from airflow_provider_bucketindex.batch import with_source
from airflow_provider_bucketindex.demo import sample_data

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(900)]

NIGHTLY = "bucketindex_nightly_compaction"
TEST_NIGHTLY = "bucketindex_test_nightly"
SERVICES = ("schedule_compaction", "execute_compaction", "clean", "validate", "cancel_failed_compaction")
TRIGGER_CLASSPATH = "airflow_provider_bucketindex.triggers.table_state.CompactionDueTrigger"


def _cli_upserts(table: str, batches: list[tuple[str, str]],
                 options: tuple[str, ...] = ("--index", "record", "--num-buckets", "2")) -> None:
    """``bucketindex upsert`` of each (source, batch id), one after the other in one process
    (one JVM start for all: the CLI's session is reused)."""
    runs = [[table, src, "--record-key", "id", "--precombine-field", "ts", "--delete-field", "is_deleted",
             *options, "--batch-id", batch_id, "--master", "local[2]"]
            for src, batch_id in batches]
    code = ("import sys; from spark_jobs.cli import main\n"
            f"for args in {runs!r}:\n"
            "    rc = main(['upsert', *args])\n"
            "    if rc: sys.exit(rc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


def _index_files(table: str) -> dict[int, list[str]]:
    from spark_jobs.table import Table

    return {b: list(fs) for b, fs in Table.load(table).view().index_files.items()}


def _rows(table: str) -> dict[str, dict]:
    from spark_jobs.table.reader import read_arrow

    cols = ["id", "name", "amount", "region", "ts"]
    got = read_arrow(table).to_pylist()
    assert len({r["id"] for r in got}) == len(got), "a key appears twice"
    return {r["id"]: {c: r[c] for c in cols} for r in got}


def _expected(batches) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    cols = ["id", "name", "amount", "region", "ts"]
    return {r["id"]: {c: r[c] for c in cols} for r in sample_data.expected_rows(batches)}


@pytest.fixture(scope="module")
def lake(tmp_path_factory, airflow_db):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("nightly")
    batches = sample_data.make_batches(3, 80, seed=23)
    sources = [sample_data.write_batch(b, str(root / "landing" / f"b{i}")) for i, b in enumerate(batches)]
    table = str(root / "table")
    _cli_upserts(table, [(sources[0], "setup-0"), (sources[1], "setup-1")])
    return {"table": table, "batches": batches, "sources": sources}


def test_nightly_run_compacts_beside_a_concurrent_upsert_cleans_and_validates(lake):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox
    from spark_jobs.table import Action, Table
    from spark_jobs.table.view import is_index_delta

    table = lake["table"]
    before = _index_files(table)
    assert sorted(before) == [0, 1] and all(len(fs) == 2 and all(map(is_index_delta, fs)) for fs in before.values())
    dag = sandbox.load_dag(TEST_NIGHTLY)
    assert dag.get_task("concurrent_upsert").downstream_task_ids == {"execute_compaction"}

    run = sandbox.run_dag(dag, None, {"table_uri": table, "min_deltas": 2, "retain_commits": 1,
                                      "concurrent_source_uri": lake["sources"][2]})

    assert run.state == "success", run
    for task in ("compaction_due", "schedule_compaction", "concurrent_upsert", "execute_compaction", "clean",
                 "validate"):
        assert run.task_state(task) == "success", (task, run)
    assert run.task_state("cancel_failed_compaction") == "skipped"
    assert run.xcom("compaction_due")["due"] is True

    planned = run.xcom("schedule_compaction")
    instant = str(planned["instant"])
    assert (planned["index_buckets"], planned["deltas"], planned["file_groups"]) == (2, 4, 0)
    executed = run.xcom("execute_compaction")
    assert str(executed["instant"]) == instant and executed["counts"]["index_buckets"] == 2
    # executed in the task, on the in-process engine: auto chose it and said why (no spark-submit)
    assert executed["engine"] == "arrow", executed
    print(f"execute_compaction took {run.tasks['execute_compaction']['duration']:.2f} s in the task")

    t = Table.load(table)
    tl = t.timeline.reload()
    done = tl.find(instant)
    assert done is not None and done.is_completed and done.action == Action.COMPACTION
    assert tl.pending() == []
    engine = tl.read_metadata(done)["engine"]
    assert engine["name"] == "arrow" and "engine='auto'" in engine["reason"] and "in the Airflow task" in engine["reason"]
    plan = tl.read_plan(done)
    assert {b["bucket"]: b["files"] for b in plan["index_buckets"]} == before  # exactly the two upserts' deltas
    # the upsert that committed between schedule and execute is there, after the plan, before the compaction
    # the default batch id: the run's (no data interval) and the source's digest
    upsert = t.commit_for_batch(with_source(f"{TEST_NIGHTLY}/{run.run_id}/concurrent_upsert", lake["sources"][2]))
    assert upsert is not None and upsert.timestamp > instant and upsert.seq < done.seq
    assert run.xcom("concurrent_upsert", "instant") == upsert.timestamp
    its_deltas = {f["bucket"]: f["path"] for f in tl.read_metadata(upsert)["index"]["added"]}
    assert its_deltas, "the concurrent upsert wrote index deltas"
    after = _index_files(table)
    for bucket in (0, 1):
        base, *rest = after[bucket]
        assert not is_index_delta(base) and instant in base, after
        assert rest == ([its_deltas[bucket]] if bucket in its_deltas else []), "its delta stays above the new base"

    cleaned = run.xcom("clean")
    assert cleaned["table_uri"] == table and cleaned["dry_run"] is False
    assert cleaned["noop"] is False and cleaned["files"] > 0 and cleaned["bytes"] > 0, cleaned
    assert cleaned["instant"] and tl.reload().is_completed(str(cleaned["instant"]))
    for fs in before.values():  # the folded deltas are no longer read by the retained snapshot
        for rel in fs:
            assert not os.path.exists(os.path.join(table, rel)), f"clean left {rel}"
    assert run.xcom("validate")["valid"] is True

    assert _rows(table) == _expected(lake["batches"])
    lake["compacted"] = True


def test_failed_execute_cancels_the_compaction_and_fails_the_run(lake):  # type: ignore[no-untyped-def]
    """The compaction's writer is killed just before its commit point (``BUCKETINDEX_FAULT``,
    the whole spark-submit session, as a node dying): the failure branch cancels the plan,
    the run fails, and the table is as it was."""
    from airflow_provider_bucketindex.demo import sandbox
    from spark_jobs.table import Table

    if not lake.get("compacted"):
        pytest.skip("needs the first run's table")
    table = lake["table"]
    before_files, before_rows = _index_files(table), _rows(table)
    dag = sandbox.load_dag(NIGHTLY)
    execute = dag.get_task("execute_compaction")
    # a spark-submit to kill (in the task, the fault would kill the scheduler's own process)
    execute.env_vars, execute.retries, execute.engine = {"BUCKETINDEX_FAULT": "after_conflict_check"}, 0, "spark"

    run = sandbox.run_dag(dag, datetime(2024, 4, 1, tzinfo=timezone.utc), {"table_uri": table, "min_deltas": 1})

    assert run.state == "failed", run
    assert run.task_state("schedule_compaction") == "success"
    assert run.task_state("execute_compaction") == "failed"
    assert run.task_state("cancel_failed_compaction") == "success"
    assert run.task_state("clean") == "upstream_failed" and run.task_state("validate") == "upstream_failed"
    instant = str(run.xcom("schedule_compaction")["instant"])
    assert run.xcom("cancel_failed_compaction") == {"instant": instant, "rolled_back": instant}
    tl = Table.load(table).timeline.reload()
    assert tl.pending() == [] and instant in tl.aborted and not tl.is_completed(instant)
    assert _index_files(table) == before_files and _rows(table) == before_rows
    written = [os.path.join(d, f) for d, _, fs in os.walk(table) for f in fs
               if instant in f and ".bucketindex/timeline" not in d]
    assert written == [], "the killed compaction's files are deleted with its plan"


def _hand_made_table(path: str, deltas: int) -> "object":
    """A record-index table whose bucket 0 has ``deltas`` deltas (commits written with the core, no Spark)."""
    from spark_jobs.table import Table, TableConfig
    from tests.unit.test_table_format import write_commit

    t = Table.open(path)
    t.create(TableConfig(record_key_fields=["id"], num_buckets=2))
    for i in range(deltas):
        write_commit(t, [(f"k{i}", i)], file_id=f"fg{i}")
    return t


def test_nothing_due_skips_the_services_and_the_run_succeeds(tmp_path, airflow_db):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox

    t = _hand_made_table(str(tmp_path / "t"), 1)
    timeline = sorted(os.listdir(tmp_path / "t" / ".bucketindex" / "timeline"))
    dag = sandbox.load_dag(NIGHTLY)
    sensor = dag.get_task("compaction_due")
    assert sensor.soft_fail is True and sensor.deferrable is False  # [operators] default_deferrable
    sensor.timeout = 0  # one look (the DAG waits up to an hour for deltas to pile up)

    run = sandbox.run_dag(dag, datetime(2024, 5, 1, tzinfo=timezone.utc), {"table_uri": t.uri})

    assert run.state == "success", run
    assert run.task_state("compaction_due") == "skipped"
    for task in SERVICES:
        # clean runs every night (copy-on-write versions pile up without compaction); one
        # commit is less than it retains, so it deletes and writes nothing
        assert run.task_state(task) == ("success" if task == "clean" else "skipped"), (task, run)
    assert sorted(os.listdir(tmp_path / "t" / ".bucketindex" / "timeline")) == timeline  # nothing written


def _trigger_rows(table_uri: str) -> int:
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(select(Trigger).where(Trigger.classpath == TRIGGER_CLASSPATH)).all()
        return sum(1 for r in rows if (r.kwargs or {}).get("table_uri") == table_uri)


def test_deferred_sensor_resumes_through_its_trigger(tmp_path, airflow_db):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox
    from tests.unit.test_table_format import write_commit

    t = _hand_made_table(str(tmp_path / "t"), 1)
    dag = sandbox.load_dag(NIGHTLY)
    sensor = dag.get_task("compaction_due")
    sensor.deferrable, sensor.poke_interval = True, 1
    assert _trigger_rows(t.uri) == 0

    def ingest_meanwhile() -> None:
        """Once the sensor has deferred (its trigger row exists), commit a second delta, as the
        hourly ingest would; after 120 s commit anyway, so a sensor that never defers cannot
        hang the run (the assertions below then fail)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if _trigger_rows(t.uri):
                    break
            except Exception:  # the DB is busy with the run: look again
                pass
            time.sleep(0.2)
        write_commit(t, [("k-late", 99)], file_id="fg-late")

    writer = threading.Thread(target=ingest_meanwhile, daemon=True)
    writer.start()
    dr = dag.test(logical_date=datetime(2024, 5, 2, tzinfo=timezone.utc), run_conf={"table_uri": t.uri, "min_deltas": 2},
                  mark_success_pattern="|".join(SERVICES))
    writer.join(5)
    run = sandbox.run_report(dr)

    assert run.state == "success", run
    assert run.task_state("compaction_due") == "success"
    assert _trigger_rows(t.uri) == 1, "the sensor deferred to its trigger once"
    assert run.tasks["compaction_due"]["try_number"] == 1
    value = run.xcom("compaction_due")  # the trigger's event: the first look found one delta
    assert value["due"] is True and value["index_buckets"] == 1 and value["index_deltas"] == 2, value


def test_the_plans_instant_reaches_execute_and_cancel_as_an_xcomarg(tmp_path, airflow_db):  # type: ignore[no-untyped-def]
    """``schedule_compaction.output["instant"]`` (no Jinja pull) in the example DAG itself, no Spark:
    a run whose execute task fails hands the plan's instant to ``cancel_failed_compaction``, which
    cancels exactly that plan; the next night's run hands its plan to ``execute_compaction``, which
    compacts it in the task, and the table still equals the oracle."""
    import pyarrow as pa

    from airflow_provider_bucketindex.demo import sandbox
    from spark_jobs import Table
    from spark_jobs.table import Action
    from spark_jobs.table import Table as CoreTable
    from tests.oracle import reduce_batches

    schema = pa.schema([("id", pa.string()), ("v", pa.int64()), ("ts", pa.int64())])
    first = [{"id": k, "v": i, "ts": 1} for i, k in enumerate(["a b", "x/y", "50%", "1+1", "Zürich ☃", "tab\tnul"])]
    second = [{"id": k, "v": 10 + i, "ts": 2} for i, k in enumerate(["a b", "neu é", "50%"])]
    uri = str(tmp_path / "nightly table")
    t = Table.create(uri, pa.Table.from_pylist(first, schema=schema), record_key="id", precombine_field="ts",
                     index="record", num_buckets=2)
    t.upsert(pa.Table.from_pylist(second, schema=schema))
    expect = reduce_batches([first, second], key="id", precombine="ts", delete_field="is_deleted")

    def rows() -> dict:
        return {r["id"]: r for r in Table(uri).read().to_pylist()}

    assert rows() == expect
    conf = {"table_uri": uri, "min_deltas": 2}

    # night 1: execute fails (its table is elsewhere) -> the failure branch cancels the pushed plan
    dag = sandbox.load_dag(NIGHTLY)
    execute = dag.get_task("execute_compaction")
    execute.table_uri, execute.retries = str(tmp_path / "no such table"), 0
    run = sandbox.run_dag(dag, datetime(2024, 6, 1, tzinfo=timezone.utc), conf)
    assert run.state == "failed", run
    assert (run.task_state("execute_compaction"), run.task_state("cancel_failed_compaction")) == ("failed", "success")
    planned = str(run.xcom("schedule_compaction")["instant"])
    assert run.xcom("cancel_failed_compaction") == {"instant": planned, "rolled_back": planned}
    tl = CoreTable.load(uri).timeline.reload()
    assert tl.pending() == [] and planned in tl.aborted and not tl.is_completed(planned)
    assert rows() == expect

    # night 2: the plan reaches execute through the same XComArg and is compacted in the task
    run = sandbox.run_dag(sandbox.load_dag(NIGHTLY), datetime(2024, 6, 2, tzinfo=timezone.utc), conf)
    assert run.state == "success", run
    assert run.task_state("cancel_failed_compaction") == "skipped"
    planned = str(run.xcom("schedule_compaction")["instant"])
    assert planned not in tl.aborted
    done = run.xcom("execute_compaction")
    assert (str(done["instant"]), done["engine"]) == (planned, "arrow")
    tl = CoreTable.load(uri).timeline.reload()
    assert tl.is_completed(planned) and tl.find(planned).action == Action.COMPACTION
    assert rows() == expect and run.task_state("validate") == "success"
