"""Where an operator's work runs (``engine``): ``auto`` runs a small batch -- and a small
table's validate -- inside the task on the in-process Arrow engine (no spark-submit), and
submits to Spark what does not fit the memory budget or what the Arrow engine cannot run;
``spark`` always submits (with ``--engine spark``, so the job does not decide again);
connection extras set the defaults. XCom, the Asset event, lineage and the failure mapping
are those of the Spark path.

Table state and the in-task runs are real; only ``BucketIndexHook.submit`` is replaced, by a
recorder of the command it would run (command building only: nothing is submitted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_bucketindex.demo import sample_data, sandbox
from airflow_provider_bucketindex.batch import with_source

pytestmark = pytest.mark.unit

CONN = "AIRFLOW_CONN_BUCKETINDEX_DEFAULT"


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    return operators


@pytest.fixture()
def submitted(ops, monkeypatch):  # type: ignore[no-untyped-def]
    """The commands ``submit`` was asked to run (built, never run); no connection: the embedded default."""
    from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook

    commands: list[list[str]] = []

    def record(self, verb, args, *, extra_conf=None):  # type: ignore[no-untyped-def]
        commands.append(self.build_command(verb, args, extra_conf=extra_conf))

    monkeypatch.setattr(BucketIndexHook, "submit", record)
    monkeypatch.delenv(CONN, raising=False)
    monkeypatch.delenv("BUCKETINDEX_ARROW_MEMORY_BUDGET", raising=False)
    return commands


class FakeTI:
    #: the real task instance's metric tags (ResumableJobMixin reads them)
    stats_tags: dict[str, str] = {}

    def __init__(self, run_id: str = "scheduled__2024-01-01T00:00:00+00:00", task_id: str = "upsert") -> None:
        self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number = "ingest", run_id, task_id, -1, 1
        self.pushed: dict[str, object] = {}

    def xcom_push(self, key, value):  # type: ignore[no-untyped-def]
        self.pushed[key] = value


class FakeEvents(dict):
    """``context["outlet_events"]``: one accessor per outlet, recording ``add``."""

    class Accessor:
        def __init__(self) -> None:
            self.added: list[tuple[object, dict]] = []
            self.extra: dict = {}

        def add(self, asset, extra=None):  # type: ignore[no-untyped-def]
            self.added.append((asset, dict(extra or {})))

    def __missing__(self, key):  # type: ignore[no-untyped-def]
        self[key] = value = self.Accessor()
        return value


def _landing(tmp_path, n: int = 2, rows: int = 200):  # type: ignore[no-untyped-def]
    batches = sample_data.make_batches(n, rows, seed=5)
    paths = []
    for i, b in enumerate(batches):
        paths.append(str(tmp_path / "landing" / f"b{i}"))
        sample_data.write_batch(b, paths[-1])
    return batches, paths


def _upsert(ops, table: str, source: str, **kw):  # type: ignore[no-untyped-def]
    args = dict(task_id="upsert", table_uri=table, source_uri=source, record_key="id", precombine_field="ts",
                delete_field="is_deleted")
    args.update(kw)
    return ops.UpsertWithIndexOperator(**args)


def _engine_of_commit(table: str, instant: str) -> dict:
    from spark_jobs.table import Table

    t = Table.load(table)
    return t.timeline.read_metadata(t.timeline.find(instant)).get("engine")


# -- auto: small batches in the task ------------------------------------------------------


def test_auto_runs_small_batches_in_the_task_with_the_spark_paths_xcom_asset_and_lineage(ops, tmp_path, submitted):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.lineage import TABLE_UPDATES, table_asset

    batches, sources = _landing(tmp_path)
    table = str(tmp_path / "t")
    for i, source in enumerate(sources):
        ti, events = FakeTI(run_id=f"scheduled__{i}"), FakeEvents()
        op = _upsert(ops, table, source)
        out = op.execute({"ti": ti, "outlet_events": events})

        assert submitted == [], "a small batch runs in the task: no spark-submit"
        assert out["engine"] == "arrow" and out["batch_id"] == with_source(f"ingest/scheduled__{i}/upsert", source)
        counts = {k: out[k] for k in ("inserted", "updated", "deleted")}
        assert ti.pushed == {"instant": out["instant"], "counts": counts}
        assert events[TABLE_UPDATES].added == [(table_asset(table), {
            "instant": out["instant"], "batch_id": out["batch_id"], **counts, "engine": "arrow"})]
        lineage = op.get_openlineage_facets_on_complete(None)
        assert [d.name for d in lineage.inputs] == [source]
        assert lineage.outputs[0].facets["outputStatistics"].rowCount == sum(counts.values())
        engine = _engine_of_commit(table, out["instant"])
        assert engine["name"] == "arrow" and engine["reason"].startswith("engine='auto': needs about"), engine
    assert sample_data.compare(table, batches) == []

    # a retry of the last batch (skip_committed_batches=False: the engine itself finds the batch id)
    again = _upsert(ops, table, sources[-1], skip_committed_batches=False).execute({"ti": FakeTI(run_id="scheduled__1")})
    assert again == out and submitted == []
    assert sample_data.compare(table, batches) == []

    check = ops.ValidateTableOperator(task_id="validate", table_uri=table)
    assert check.execute({"ti": FakeTI(task_id="validate")}) == {
        "table_uri": table, "valid": True, "instant": out["instant"], "engine": "arrow"}
    assert submitted == []


def test_the_in_task_paths_never_import_pyspark(tmp_path):  # type: ignore[no-untyped-def]
    _, (source, _) = _landing(tmp_path)
    code = f"""
import sys
from airflow_provider_bucketindex.demo import sandbox
sandbox.isolate_before_import({str(tmp_path / "af")!r})
from airflow_provider_bucketindex.operators import UpsertWithIndexOperator, ValidateTableOperator
from tests.unit.test_provider_engine import FakeTI
out = UpsertWithIndexOperator(task_id="upsert", table_uri={str(tmp_path / "t")!r}, source_uri={source!r},
                              record_key="id", precombine_field="ts", delete_field="is_deleted").execute({{"ti": FakeTI()}})
ok = ValidateTableOperator(task_id="validate", table_uri={str(tmp_path / "t")!r}).execute({{"ti": FakeTI()}})
print(out["engine"], ok["engine"], "pyspark" in sys.modules)
"""
    env = {k: v for k, v in os.environ.items() if k != CONN and not k.startswith("AIRFLOW")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert p.stdout.strip().splitlines()[-1:] == ["arrow arrow False"], p.stderr[-3000:]


# -- what goes to Spark ---------------------------------------------------------------------


def test_a_batch_over_the_memory_budget_is_submitted_with_engine_spark(ops, tmp_path, submitted):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException

    _, (source, _) = _landing(tmp_path)
    table = str(tmp_path / "t")
    op = _upsert(ops, table, source, memory_budget="1k")
    with pytest.raises(AirflowException, match="no commit"):  # the recorder ran nothing
        op.execute({"ti": FakeTI()})
    (cmd,) = submitted
    assert cmd == op.spark_submit_command(with_source("ingest/scheduled__2024-01-01T00:00:00+00:00/upsert", source))
    assert cmd[-2:] == ["--engine", "spark"], "the job must not decide again"
    assert not os.path.exists(table), "nothing was attempted in the task"


def test_a_batch_whose_footers_understate_it_is_submitted_after_the_task_read_it(ops, tmp_path, submitted):  # type: ignore[no-untyped-def]
    """auto sizes the batch from its footers (a few hundred KB of one repeated 2,000-character
    value: fits 400 MiB) and runs it in the task; the engine, having read 116 MiB, finds it over
    the budget the choice carried and hands it to Spark before writing anything."""
    from airflow.sdk.exceptions import AirflowException

    source = tmp_path / "landing" / "wide.parquet"
    source.parent.mkdir(parents=True)
    note = pa.DictionaryArray.from_arrays(pa.array([0] * 60_000, pa.int32()), pa.array(["x" * 2000]))
    pq.write_table(pa.table({"id": [f"r{i:07d}" for i in range(60_000)], "ts": list(range(60_000)),
                             "is_deleted": [False] * 60_000, "note": note}),
                   source, compression="zstd", store_schema=False)
    table = str(tmp_path / "t")
    op = _upsert(ops, table, str(source), memory_budget="400m")
    with pytest.raises(AirflowException, match="no commit"):  # the recorder ran nothing
        op.execute({"ti": FakeTI()})
    (cmd,) = submitted
    assert cmd[-2:] == ["--engine", "spark"], "the job must not decide again"
    assert not os.path.exists(table), "nothing was written in the task"


@pytest.mark.parametrize("task_engine,conn_extra,expected", [
    ("spark", {}, "spark"),
    (None, {"engine": "spark"}, "spark"),  # the connection's default
    ("auto", {"engine": "spark"}, "arrow"),  # the task's own beats the connection's
    (None, {"memory-budget": "1k"}, "spark"),  # the connection's budget
    ("auto", {"memory-budget": "1k"}, "spark"),
    (None, {}, "arrow"),
])  # fmt: skip
def test_engine_and_budget_from_the_task_or_the_connection(ops, tmp_path, submitted, monkeypatch,
                                                           task_engine, conn_extra, expected):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException

    monkeypatch.setenv(CONN, json.dumps({"conn_type": "bucketindex", "host": "spark://10.0.0.5:7077",
                                         "extra": conn_extra}))
    _, (source, _) = _landing(tmp_path)
    table = str(tmp_path / "t")
    op = _upsert(ops, table, source, engine=task_engine)
    _, choice = op.decide_engine("upsert", lambda: 10_000)
    assert choice.engine == expected
    if expected == "spark":
        with pytest.raises(AirflowException, match="no commit"):
            op.execute({"ti": FakeTI()})
        assert [c[:3] for c in submitted] == [[c[0], "--master", "spark://10.0.0.5:7077"] for c in submitted]
        assert len(submitted) == 1 and submitted[0][-2:] == ["--engine", "spark"]
    else:  # a cluster master in the connection does not stop a small batch from running in the task
        assert op.execute({"ti": FakeTI()})["engine"] == "arrow" and submitted == []


def test_validate_goes_to_spark_when_asked_or_over_the_budget(ops, tmp_path, submitted):  # type: ignore[no-untyped-def]
    _, (source, _) = _landing(tmp_path)
    table = str(tmp_path / "t")
    _upsert(ops, table, source).execute({"ti": FakeTI()})
    for kw in ({"engine": "spark"}, {"memory_budget": "1k"}):
        submitted.clear()
        op = ops.ValidateTableOperator(task_id="validate", table_uri=table, **kw)
        out = op.execute({"ti": FakeTI(task_id="validate")})
        assert out["engine"] == "spark" and out["valid"] is True
        assert submitted == [op.spark_submit_command()]
        assert submitted[0][-2:] == ["validate", table]


def test_auto_submits_a_batch_the_arrow_engine_cannot_run_and_arrow_refuses_it(ops, tmp_path, submitted):  # type: ignore[no-untyped-def]
    """A source with subdirectories (a partitioned layout) is read by Spark only: ``auto`` submits it
    (nothing written in the task), ``arrow`` fails without retries."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    batches, _ = _landing(tmp_path)
    nested = tmp_path / "nested"
    sample_data.write_batch(batches[0], str(nested / "region=eu"))
    table = str(tmp_path / "t")
    with pytest.raises(AirflowException, match="no commit"):
        _upsert(ops, table, str(nested)).execute({"ti": FakeTI()})
    assert len(submitted) == 1 and submitted[0][-2:] == ["--engine", "spark"]
    assert not os.path.exists(table)
    with pytest.raises(AirflowFailException, match="engine='arrow' cannot run this batch: .*subdirectories"):
        _upsert(ops, table, str(nested), engine="arrow").execute({"ti": FakeTI()})
    assert len(submitted) == 1 and not os.path.exists(table)


# -- failures map as the Spark path's exit statuses ---------------------------------------------


@pytest.mark.parametrize("kw,message", [
    ({"record_key": "no_such_column"}, "record key field 'no_such_column' is not in the source"),
    ({"engine": "turbo"}, "engine must be one of auto, spark, arrow"),
    ({"memory_budget": "lots"}, "memory budget 'lots' is not a size"),
    ({"num_buckets": "0"}, "--num-buckets must be at least 1"),
    ({"index": "btree"}, "index must be one of"),
    ({"source_uri": "/no/such/landing"}, "source /no/such/landing does not exist"),
])  # fmt: skip
def test_bad_input_in_the_task_fails_without_retries_and_writes_nothing(ops, tmp_path, submitted, kw, message):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    _, (source,) = _landing(tmp_path, n=1)
    table = str(tmp_path / "t")
    kw = dict(kw)
    src = kw.pop("source_uri", source)
    with pytest.raises(AirflowFailException, match=message):
        _upsert(ops, table, src, **kw).execute({"ti": FakeTI()})
    assert submitted == [] and not os.path.exists(table)


def test_a_write_rolled_back_under_the_task_is_a_retryable_failure(ops, tmp_path, submitted, monkeypatch):  # type: ignore[no-untyped-def]
    """``rollback --force`` of the in-task writer (paused just before its commit): the core raises
    InstantRolledBackError (a RetryableError, exit 3 on the Spark path) -> an ordinary, retried failure."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook

    _, (first, second) = _landing(tmp_path)
    table = str(tmp_path / "t")
    _upsert(ops, table, first).execute({"ti": FakeTI(run_id="r0")})
    signals = tmp_path / "signals"
    monkeypatch.setenv("BUCKETINDEX_PAUSE", "before_complete=1.5")
    monkeypatch.setenv("BUCKETINDEX_PAUSE_SIGNAL", str(signals))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _upsert(ops, table, second).execute({"ti": FakeTI(run_id="r1")})
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    deadline = time.monotonic() + 60
    while not (signals / "before_complete").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert BucketIndexHook().rollback_batch(table, with_source("ingest/r1/upsert", second), force=True)
    th.join(60)
    assert len(errors) == 1 and isinstance(errors[0], AirflowException), errors
    assert not isinstance(errors[0], AirflowFailException) and "same batch id" in str(errors[0])
    assert submitted == []
    assert BucketIndexHook().commit_for_batch(table, with_source("ingest/r1/upsert", second)) is None


def test_validate_in_the_task_fails_without_retries_on_a_problem_or_no_table(ops, tmp_path, submitted):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    from spark_jobs.table import Table

    with pytest.raises(AirflowFailException):
        ops.ValidateTableOperator(task_id="v", table_uri=str(tmp_path / "none")).execute({"ti": FakeTI()})
    _, (source, _) = _landing(tmp_path)
    table = str(tmp_path / "t")
    _upsert(ops, table, source).execute({"ti": FakeTI()})
    t = Table.load(table)
    os.remove(t.abs(t.view().slices()[0].path))  # a data file deleted outside bucketindex
    with pytest.raises(AirflowFailException, match="validate found a problem"):
        ops.ValidateTableOperator(task_id="v", table_uri=table).execute({"ti": FakeTI()})
    assert submitted == []


def test_connection_extras_carry_the_engine_defaults(ops):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.hooks.bucketindex import ConnectionSettings

    class Conn:
        conn_id, host, port = "c", "yarn", None
        extra_dejson = {"engine": "spark", "memory-budget": "2g", "index": "bucket"}

    s = ConnectionSettings.from_connection(Conn())
    assert (s.engine, s.memory_budget, s.table_defaults) == ("spark", "2g", {"index": "bucket"})
    Conn.extra_dejson = {}
    assert (ConnectionSettings.from_connection(Conn()).engine, ConnectionSettings.from_connection(Conn()).memory_budget) \
        == (None, None)
