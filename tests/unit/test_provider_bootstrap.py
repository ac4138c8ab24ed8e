"""BootstrapTableOperator: conventions, the exact command it submits, the checks it makes in the
task before anything is submitted, the no-op retry, how job failures map to retries, and what it
reports (XCom, OpenLineage, the table's Asset). Only the submission is mocked: table state is real
(written with the pure-Python core)."""

from __future__ import annotations

import json
import sys

import pytest

from airflow_provider_bucketindex import packaging
from spark_jobs.table.action.bootstrap import default_batch_id, default_mode
from airflow_provider_bucketindex.demo import sandbox
from spark_jobs.resources import local_driver_memory
from spark_jobs.table import Action, Table, TableConfig
from tests.spark.conftest import tree_digest

pytestmark = pytest.mark.unit

SUBMIT = packaging.submit_script()
CONN = "AIRFLOW_CONN_BUCKETINDEX_DEFAULT"
COUNTS = {"rows": 1000, "files_referenced": 12, "files_rewritten": 1, "duplicate_keys": 3, "rows_dropped": 3}


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    return operators


class FakeTI:
    #: the real task instance's metric tags (ResumableJobMixin reads them)
    stats_tags: dict[str, str] = {}

    def __init__(self, try_number: int = 1) -> None:
        self.dag_id, self.run_id, self.task_id = "migrate", "manual__2025-03-01T00:00:00+00:00", "bootstrap"
        self.map_index, self.try_number = -1, try_number
        self.pushed: dict[str, object] = {}

    def xcom_push(self, key, value):  # type: ignore[no-untyped-def]
        self.pushed[key] = value


class FakeEvents(dict):
    """``context["outlet_events"]``: one accessor per outlet, recording ``add`` and ``extra``."""

    class Accessor:
        def __init__(self) -> None:
            self.added: list[tuple[object, dict]] = []
            self.extra: dict = {}

        def add(self, asset, extra=None):  # type: ignore[no-untyped-def]
            self.added.append((asset, dict(extra or {})))

    def __missing__(self, key):  # type: ignore[no-untyped-def]
        self[key] = value = self.Accessor()
        return value




def _batch(tmp_path) -> str:  # type: ignore[no-untyped-def]
    """The default batch id: the CLI's, derived from the source (every run of one migration shares it)."""
    return default_batch_id(str(tmp_path / "warehouse" / "events"))


def _bootstrapped(path: str, batch_id: str, *, action: str = Action.BOOTSTRAP, index: str = "record",
                  mode: str | None = "reference") -> str:
    """What a completed ``bucketindex bootstrap`` leaves (written with the core): a table whose
    timeline holds a completed ``action`` of ``batch_id``, with the job's metadata -- the commit's
    counts, and the bootstrap's own summary under ``bootstrap`` (a rewrite's lacks ``rows`` and
    ``rows_dropped``: the commit's ``inserted`` is the table's rows). ``mode=None``: no summary."""
    t = Table.open(path)
    if not t.exists:
        t.create(TableConfig(record_key_fields=["id"], index_type=index))
    inst = t.timeline.create_requested(action, {"batch_id": batch_id})
    inst = t.timeline.transition_to_inflight(inst)
    meta = {"batch_id": batch_id, "operation": "bootstrap", "index_type": index,
            "counts": {"inserted": COUNTS["rows"], "updated": 0, "deleted": 0, "moved": 0, "rows_in_batch": 1003}}
    if mode == "reference":
        meta["bootstrap"] = {"source": "/warehouse/events", "mode": mode, "counts": {**COUNTS, "source_rows": 1003}}
    elif mode == "rewrite":
        meta["bootstrap"] = {"source": "/warehouse/events", "mode": mode,
                             "counts": {k: COUNTS[k] for k in ("files_referenced", "files_rewritten", "duplicate_keys")}}
    t.timeline.complete(inst, meta)
    return inst.timestamp


@pytest.fixture
def no_spark(monkeypatch):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.hooks import bucketindex

    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit",
                        lambda *a, **k: pytest.fail("no Spark job may be submitted here"))


@pytest.fixture
def job(monkeypatch):  # type: ignore[no-untyped-def]
    """A stand-in for the Spark job: records what was submitted and, unless told to fail with an
    exit status, leaves what the real job leaves -- a completed bootstrap of its batch id."""
    from airflow_provider_bucketindex.hooks import bucketindex

    monkeypatch.delenv(CONN, raising=False)
    state: dict = {"calls": [], "rc": 0, "reason": "", "commit": True}

    def submit(self, verb, args, **kw):  # type: ignore[no-untyped-def]
        args = list(args)
        state["calls"].append((verb, args))
        if state["rc"]:
            raise bucketindex.SparkJobFailed(verb, state["rc"], state["reason"])
        if state["commit"]:
            index = args[args.index("--index") + 1]
            mode = args[args.index("--mode") + 1] if "--mode" in args else default_mode(index)  # the CLI's default
            _bootstrapped(args[0], args[args.index("--batch-id") + 1], index=index, mode=mode)

    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit", submit)
    return state


def _op(ops, tmp_path, **kw):  # type: ignore[no-untyped-def]
    args = dict(task_id="bootstrap", table_uri=str(tmp_path / "lake" / "events"),
                source_uri=str(tmp_path / "warehouse" / "events"), record_key="id",
                engine="spark")  # these tests are of the submitted job (the in-task run: below)
    args.update(kw)
    return ops.BootstrapTableOperator(**args)


# -- conventions ----------------------------------------------------------------------------------


def test_keyword_only(ops):  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError):
        ops.BootstrapTableOperator("bootstrap", "/lake/t", "/warehouse/t", "id")  # type: ignore[misc]
    with pytest.raises(TypeError):
        ops.BootstrapTableOperator("/lake/t", task_id="b", source_uri="/w", record_key="id")  # type: ignore[misc]


def test_template_fields_are_assigned_verbatim_and_init_does_no_work(ops, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.hooks import bucketindex
    from airflow_provider_bucketindex.lineage import TABLE_UPDATES

    def boom(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("work done in __init__")

    monkeypatch.setattr(bucketindex.BucketIndexHook, "__init__", boom)
    monkeypatch.setattr(packaging, "spark_jobs_zip", boom)
    kw = dict(table_uri="{{ params.table }}", source_uri="{{ params.source }}", batch_id="{{ run_id }}",
              mode="{{ params.mode }}", num_buckets="{{ params.n }}", partition_field="{{ params.p }}",
              master="local[2]", conf={"k": "{{ ds }}"}, name="n", env_vars={"E": "1"}, storage_conn_id="{{ params.store }}",
              storage_options={"region": "{{ params.region }}"}, engine="{{ params.engine }}",
              memory_budget="{{ params.budget }}")
    op = ops.BootstrapTableOperator(task_id="b", record_key=["tenant", "id"], conn_id="not_defined_anywhere",
                                    index="{{ not templated }}", **kw)
    assert set(op.template_fields) == set(kw)
    assert all(getattr(op, f) == kw[f] for f in op.template_fields)
    assert op.record_key == ["tenant", "id"] and op.index == "{{ not templated }}"  # verbatim, unchecked yet
    assert "hook" not in vars(op)
    op.on_kill()  # nothing started: nothing to stop, and no hook built for it
    assert "hook" not in vars(op)
    assert op.outlets == [TABLE_UPDATES]  # the table's Asset events go through the alias, as an upsert's


def test_templates_render(ops):  # type: ignore[no-untyped-def]
    op = ops.BootstrapTableOperator(
        task_id="b", table_uri="{{ params.table }}", source_uri="/warehouse/{{ params.name }}", record_key="id",
        batch_id="migration-{{ ds }}", mode="{{ params.mode }}", num_buckets="{{ params.n }}",
        partition_field="{{ params.p }}",
    )
    op.render_template_fields({"params": {"table": "/lake/events", "name": "events", "mode": "rewrite", "n": 64,
                                          "p": "dt"}, "ds": "2025-03-01"})
    assert (op.table_uri, op.source_uri, op.batch_id, op.mode, op.num_buckets, op.partition_field) == (
        "/lake/events", "/warehouse/events", "migration-2025-03-01", "rewrite", "64", "dt")
    assert op.build_args(op.batch_id) == [
        "/lake/events", "/warehouse/events", "--record-key", "id", "--partition-field", "dt", "--index", "record",
        "--mode", "rewrite", "--num-buckets", "64", "--engine", "spark", "--batch-id", "migration-2025-03-01",
    ]


# -- the command ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kw,expected", [
    ({}, ["--record-key", "id", "--index", "record", "--engine", "spark", "--batch-id", "b-1"]),
    (dict(record_key=["tenant", "id"], partition_field="dt", precombine_field="ts", mode="reference"),
     ["--record-key", "tenant,id", "--partition-field", "dt", "--precombine-field", "ts", "--index", "record",
      "--mode", "reference", "--engine", "spark", "--batch-id", "b-1"]),
    (dict(record_key=" tenant , id ", mode="rewrite", num_buckets=32, table_type="merge_on_read",
          heartbeat_timeout_s=120),
     ["--record-key", "tenant,id", "--index", "record", "--mode", "rewrite", "--num-buckets", "32",
      "--table-type", "merge_on_read", "--engine", "spark", "--batch-id", "b-1", "--heartbeat-timeout", "120"]),
    (dict(index="bucket", num_buckets=" 8 ", partition_field="region"),  # rewrite: the CLI's default for bucket
     ["--record-key", "id", "--partition-field", "region", "--index", "bucket", "--num-buckets", "8",
      "--engine", "spark", "--batch-id", "b-1"]),
    (dict(index="bucket", mode="rewrite", table_type="copy_on_write", partition_field="", precombine_field=None),
     ["--record-key", "id", "--index", "bucket", "--mode", "rewrite", "--table-type", "copy_on_write",
      "--engine", "spark", "--batch-id", "b-1"]),
    (dict(mode="None", num_buckets=""),
     ["--record-key", "id", "--index", "record", "--engine", "spark", "--batch-id", "b-1"]),
])
def test_exact_spark_submit_command(ops, tmp_path, monkeypatch, kw, expected):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(CONN, raising=False)  # the embedded default: local[*], spark-submit of this venv
    op = _op(ops, tmp_path, **kw)
    table, source = str(tmp_path / "lake" / "events"), str(tmp_path / "warehouse" / "events")
    assert op.spark_submit_command("b-1") == [
        packaging.resolve_spark_binary("spark-submit"),
        "--master", "local[*]",
        "--py-files", packaging.spark_jobs_zip(),
        "--driver-memory", local_driver_memory(),
        "--name", "bucketindex-bootstrap",
        SUBMIT,
        "bootstrap", table, source, *expected,
    ]  # fmt: skip
    assert not (tmp_path / "lake").exists()  # building a command writes nothing


def test_spark_connect_command(ops, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(CONN, raising=False)
    op = _op(ops, tmp_path, master="sc://spark:15002", mode="reference")
    cmd = op.spark_submit_command("b-1")
    assert cmd[:4] == [packaging.python_for_spark(None), "-m", "spark_jobs.cli", "bootstrap"]
    assert cmd[-6:] == ["--engine", "spark", "--batch-id", "b-1", "--remote", "sc://spark:15002"]


def test_execute_submits_the_bootstrap_and_returns_the_summary(ops, tmp_path, job):  # type: ignore[no-untyped-def]
    ti = FakeTI()
    op = _op(ops, tmp_path, record_key=["tenant", "id"], partition_field="dt", master="local[2]")
    out = op.execute({"ti": ti})
    table, source = str(tmp_path / "lake" / "events"), str(tmp_path / "warehouse" / "events")
    assert job["calls"] == [("bootstrap", [table, source, "--record-key", "tenant,id", "--partition-field", "dt",
                                           "--index", "record", "--engine", "spark",
                                           "--batch-id", _batch(tmp_path)])]
    instant = Table.load(table).timeline.reload().last_completed([Action.BOOTSTRAP]).timestamp
    assert out == {"table_uri": table, "batch_id": _batch(tmp_path), "instant": instant, "noop": False, "mode": "reference",
                   "index_type": "record", "counts": COUNTS}
    assert len(json.dumps(out)) < 512


# -- refused in the task: no job, nothing written --------------------------------------------------


@pytest.mark.parametrize("kw,message", [
    (dict(index="simple"), "index must be one of record, bucket, global_simple"),
    (dict(index="Record"), "index must be one of record, bucket, global_simple"),
    (dict(index="global_simple", mode="reference"), "the global_simple index needs mode='rewrite'"),
    (dict(mode="copy"), "mode must be one of reference, rewrite"),
    (dict(index="bucket", mode="reference"), "the bucket index needs mode='rewrite'"),
    (dict(index="bucket", mode=" reference "), "the bucket index needs mode='rewrite'"),
    (dict(record_key=""), "record_key must name at least one field"),
    (dict(record_key=[]), "record_key must name at least one field"),
    (dict(record_key="id,,ts"), "no empty one"),
    (dict(num_buckets="many"), "num_buckets must be a whole number"),
    (dict(num_buckets=0), "num_buckets must be at least 1"),
    (dict(table_type="mor"), "table_type must be one of copy_on_write, merge_on_read"),
    (dict(heartbeat_timeout_s=0), "heartbeat_timeout_s must be positive"),
])
def test_a_bad_combination_fails_in_the_task_without_a_job(ops, tmp_path, no_spark, kw, message):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    before = tree_digest(tmp_path)
    with pytest.raises(AirflowFailException, match=message):
        _op(ops, tmp_path, **kw).execute({"ti": FakeTI()})
    assert tree_digest(tmp_path) == before


def test_a_batch_id_of_an_upsert_is_not_a_bootstrap(ops, tmp_path, no_spark):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    _bootstrapped(str(tmp_path / "lake" / "events"), _batch(tmp_path), action=Action.COMMIT)
    with pytest.raises(AirflowFailException, match="already holds data"):
        _op(ops, tmp_path).execute({"ti": FakeTI()})


# -- retries ----------------------------------------------------------------------------------------


def test_a_retry_after_the_bootstrap_completed_is_a_noop(ops, tmp_path, no_spark):  # type: ignore[no-untyped-def]
    table = str(tmp_path / "lake" / "events")
    instant = _bootstrapped(table, _batch(tmp_path))
    before = tree_digest(tmp_path)
    out = _op(ops, tmp_path).execute({"ti": FakeTI(try_number=2)})  # same batch id on every try
    assert out == {"table_uri": table, "batch_id": _batch(tmp_path), "instant": instant, "noop": True, "mode": "reference",
                   "index_type": "record", "counts": COUNTS}
    assert tree_digest(tmp_path) == before
    # an explicit batch id; an entry without the bootstrap summary: the table's config and the commit's counts tell
    _bootstrapped(table, "migration-1", mode=None)
    out = _op(ops, tmp_path, batch_id="migration-1").execute({"ti": FakeTI()})
    assert (out["batch_id"], out["noop"], out["mode"], out["counts"]) == ("migration-1", True, "rewrite",
                                                                          {"rows": COUNTS["rows"]})


def test_a_retry_rolls_back_what_its_killed_try_left_then_submits(ops, tmp_path, job):  # type: ignore[no-untyped-def]
    table = str(tmp_path / "lake" / "events")
    t = Table.open(table)
    t.create(TableConfig(record_key_fields=["id"]))
    left = t.timeline.transition_to_inflight(t.timeline.create_requested(Action.BOOTSTRAP, {"batch_id": _batch(tmp_path)}))
    other = t.timeline.transition_to_inflight(t.timeline.create_requested(Action.BOOTSTRAP, {"batch_id": "other"}))
    out = _op(ops, tmp_path).execute({"ti": FakeTI(try_number=2)})
    assert len(job["calls"]) == 1 and out["noop"] is False
    tl = Table.load(table).timeline.reload()
    assert left.timestamp in tl.aborted  # its own batch only: another writer's instant is not touched
    assert [i.timestamp for i in tl.pending()] == [other.timestamp]


def test_a_rewrite_reports_the_tables_rows(ops, tmp_path, job):  # type: ignore[no-untyped-def]
    out = _op(ops, tmp_path, index="bucket", num_buckets=4).execute({"ti": FakeTI()})
    assert job["calls"][0][1][-7:] == ["bucket", "--num-buckets", "4", "--engine", "spark", "--batch-id",
                                       _batch(tmp_path)]
    assert (out["mode"], out["index_type"]) == ("rewrite", "bucket")
    assert out["counts"] == {k: v for k, v in COUNTS.items() if k != "rows_dropped"}  # not in a rewrite's metadata


@pytest.mark.parametrize("rc,final", [(2, True), (3, False), (1, False), (137, False)])
def test_exit_status_maps_to_final_or_retryable_failure(ops, tmp_path, job, rc, final):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    reason = "bucketindex: error: 3 duplicate record keys in the source (e.g. 17, 42); pass --precombine-field"
    job.update(rc=rc, reason=reason)
    with pytest.raises(AirflowException) as info:
        _op(ops, tmp_path).execute({"ti": FakeTI()})
    assert isinstance(info.value, AirflowFailException) is final
    assert len(job["calls"]) == 1
    if final:
        assert reason in str(info.value) and "exit status 2" in str(info.value)


def test_exit_0_without_a_bootstrap_on_the_timeline_fails(ops, tmp_path, job):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    job["commit"] = False
    with pytest.raises(AirflowException, match="no bootstrap of .* carries batch id") as info:
        _op(ops, tmp_path).execute({"ti": FakeTI()})
    assert not isinstance(info.value, AirflowFailException)


# -- what it reports ------------------------------------------------------------------------------


def test_do_xcom_push_false_pushes_nothing(ops, tmp_path, job):  # type: ignore[no-untyped-def]
    for push in (True, False):
        ti = FakeTI()
        op = _op(ops, tmp_path, table_uri=str(tmp_path / f"t{push}"), do_xcom_push=push)
        out = op.execute({"ti": ti})
        assert set(ti.pushed) == ({"instant", "counts"} if push else set())
        assert out["counts"] == COUNTS


def test_lineage_and_the_tables_asset_event(ops, tmp_path, job):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.lineage import TABLE_UPDATES, table_asset

    table = str(tmp_path / "lake" / "events")
    op = _op(ops, tmp_path, source_uri="s3://warehouse/events", outlets=[table_asset(table)])
    assert op.outlets == [table_asset(table), TABLE_UPDATES]  # the user's own outlet is kept
    assert op.get_openlineage_facets_on_complete(None).outputs == []  # nothing ran yet
    events = FakeEvents()
    out = op.execute({"ti": FakeTI(), "outlet_events": events})

    lineage = op.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("s3://warehouse", "events")]
    (written,) = lineage.outputs
    assert (written.namespace, written.name) == ("file", table)
    assert written.facets["outputStatistics"].rowCount == COUNTS["rows"]

    extra = {"instant": out["instant"], "batch_id": default_batch_id("s3://warehouse/events"), "action": "bootstrap", "mode": "reference",
             "inserted": COUNTS["rows"], "updated": 0, "deleted": 0}
    assert events[TABLE_UPDATES].added == [(table_asset(table), extra)]
    assert events[table_asset(table)].extra == extra


def test_the_module_imports_no_pyspark():  # type: ignore[no-untyped-def]
    import subprocess

    code = ("import sys; from airflow_provider_bucketindex.demo import sandbox; sandbox.isolate_before_import(); "
            "import airflow_provider_bucketindex.operators.bootstrap; print('pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1:] == ["False"], out.stderr[-2000:]


# -- in the task: the Arrow engine, no Spark job ---------------------------------------------------


def _dataset(tmp_path):  # type: ignore[no-untyped-def]
    """A small Hive dataset at the operators' source: users' partition values and keys."""
    from tests.unit.test_bootstrap_arrow import write_dataset

    return write_dataset(tmp_path / "warehouse" / "events")


@pytest.mark.parametrize("mode", ["reference", "rewrite"])
def test_auto_bootstraps_a_small_dataset_in_the_task(ops, tmp_path, no_spark, monkeypatch, mode):  # type: ignore[no-untyped-def]
    from spark_jobs.table.reader import read_arrow
    from tests.unit.test_bootstrap_arrow import expected, snapshot

    monkeypatch.delenv(CONN, raising=False)
    rows = _dataset(tmp_path)
    op = _op(ops, tmp_path, engine=None, partition_field="region", precombine_field="ts", mode=mode)
    out = op.execute({"ti": FakeTI()})
    table = str(tmp_path / "lake" / "events")
    assert not out["noop"] and out["mode"] == mode and out["counts"]["rows"] == len(rows) - 4
    assert snapshot(table) == expected(rows) and read_arrow(table).num_rows == len(rows) - 4
    t = Table.load(table)
    meta = t.timeline.read_metadata(t.timeline.completed()[-1])
    assert meta["engine"]["name"] == "arrow" and "in the Airflow task" in meta["engine"]["reason"]
    again = op.execute({"ti": FakeTI(try_number=2)})  # a retry: a no-op
    assert again["noop"] and again["instant"] == out["instant"]


def test_global_simple_is_accepted_as_the_cli_accepts_it(ops, tmp_path, job, monkeypatch):  # type: ignore[no-untyped-def]
    """``index="global_simple"`` (the CLI's ``--index global_simple``, rewrite mode) bootstraps in
    the task and is submitted as such: the operator takes the index types from the options."""
    from spark_jobs.table.reader import read_arrow
    from tests.unit.test_bootstrap_arrow import expected, snapshot

    rows = _dataset(tmp_path)
    table = str(tmp_path / "lake" / "events")
    submitted = _op(ops, tmp_path, index="global_simple", partition_field="region", precombine_field="ts")
    assert submitted.build_args("b")[submitted.build_args("b").index("--index") + 1] == "global_simple"
    op = _op(ops, tmp_path, engine="arrow", index="global_simple", partition_field="region", precombine_field="ts")
    out = op.execute({"ti": FakeTI()})
    assert job["calls"] == []  # in the task
    assert out["mode"] == "rewrite" and out["index_type"] == "global_simple" and not out["noop"]
    assert Table.load(table).config.index_type == "global_simple"
    assert snapshot(table) == expected(rows) and read_arrow(table).num_rows == len(rows) - 4


def test_the_engine_choice_is_logged_once(ops, tmp_path, no_spark, monkeypatch, capfd):  # type: ignore[no-untyped-def]
    """A rewrite bootstrap in the task logs its engine choice and reason once (not again from the
    bootstrap's upsert, nor from the core's chooser)."""
    import logging

    monkeypatch.delenv(CONN, raising=False)
    _dataset(tmp_path)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    keep = Keep(level=logging.DEBUG)
    loggers = [logging.getLogger(n) for n in ("bucketindex", "airflow.task")]
    for lg in loggers:
        monkeypatch.setattr(lg, "level", logging.INFO)
        lg.addHandler(keep)
    try:
        _op(ops, tmp_path, engine=None, partition_field="region", precombine_field="ts", mode="rewrite",
            memory_budget="1g").execute({"ti": FakeTI()})
    finally:
        for lg in loggers:
            lg.removeHandler(keep)
    out = capfd.readouterr()
    text = "\n".join([*records, out.out, out.err])
    reason = "in memory, within the 1 GiB budget"
    assert "bootstrap: engine arrow (engine='auto': needs about" in text, text[-3000:]
    assert text.count(reason) == 1, [line for line in text.splitlines() if reason in line]


def test_auto_submits_a_dataset_over_the_budget(ops, tmp_path, job, monkeypatch):  # type: ignore[no-untyped-def]
    _dataset(tmp_path)
    out = _op(ops, tmp_path, engine="auto", memory_budget="1k").execute({"ti": FakeTI()})
    assert [verb for verb, _ in job["calls"]] == ["bootstrap"] and "--engine" in job["calls"][0][1]
    assert not out["noop"]


def test_engine_arrow_on_what_only_spark_defines_fails_without_retry_or_job(ops, tmp_path, no_spark):  # type: ignore[no-untyped-def]
    import pyarrow as pa
    import pyarrow.dataset as ds
    from airflow.sdk.exceptions import AirflowFailException

    root = tmp_path / "warehouse" / "events"
    root.mkdir(parents=True)
    ds.write_dataset(pa.table({"id": [1.5, 1.0e7], "v": [1, 2]}), root, format="parquet")
    before = tree_digest(tmp_path)
    with pytest.raises(AirflowFailException, match="engine='arrow' cannot run this bootstrap"):
        _op(ops, tmp_path, engine="arrow", mode="rewrite").execute({"ti": FakeTI()})
    assert tree_digest(tmp_path) == before
