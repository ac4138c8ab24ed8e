"""Operator conventions (keyword-only, templates assigned verbatim, nothing done in __init__,
lazy hook), default batch ids, on_kill, and the paths of ``execute`` that need no Spark."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from airflow_provider_bucketindex import packaging
from airflow_provider_bucketindex.demo import sandbox
from airflow_provider_bucketindex.batch import batch_id_from_context, default_batch_id
from spark_jobs.processes import is_running

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    return operators


class FakeTI:
    #: the real task instance's metric tags (ResumableJobMixin reads them)
    stats_tags: dict[str, str] = {}

    def __init__(self, dag_id="d", run_id="scheduled__2024-01-01T00:00:00+00:00", task_id="upsert", map_index=-1, try_number=1):  # type: ignore[no-untyped-def]
        self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number = dag_id, run_id, task_id, map_index, try_number
        self.pushed: dict[str, object] = {}

    def xcom_push(self, key, value):  # type: ignore[no-untyped-def]
        self.pushed[key] = value


# -- batch ids ----------------------------------------------------------------------------


def test_default_batch_id_has_no_try_number():
    assert default_batch_id("ingest", "scheduled__2024-01-01T00:00:00+00:00", "upsert") == (
        "ingest/scheduled__2024-01-01T00:00:00+00:00/upsert"
    )
    assert default_batch_id("ingest", "r", "upsert", 3) == "ingest/r/upsert/3"
    first, retry = FakeTI(try_number=1), FakeTI(try_number=2)
    assert batch_id_from_context({"ti": first}) == batch_id_from_context({"ti": retry})
    assert batch_id_from_context({"ti": FakeTI(task_id="rollback")}, "upsert") == batch_id_from_context({"ti": first})


def test_a_run_with_a_data_interval_names_its_batch_after_the_interval_not_the_run(ops):  # type: ignore[no-untyped-def]
    """Every run of one data interval (a retry, a re-run of the date under another run id) has one
    batch id; another interval, another id; ``replay`` adds the run's id on purpose; a rollback in
    a mapped group and an unmapped one after a mapped upsert find the replayed batches too."""
    from datetime import datetime, timedelta, timezone

    from airflow_provider_bucketindex.batch import interval_batch_id, replay_suffix, upstream_batches

    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    day = {"data_interval_start": start, "data_interval_end": start + timedelta(days=1)}
    first = {"ti": FakeTI(run_id="scheduled__2024-01-01T00:00:00+00:00"), **day}
    rerun = {"ti": FakeTI(run_id="manual__2024-01-05T10:11:12+00:00", try_number=3), **day}
    expected = "d/upsert/2024-01-01T00:00:00+00:00--2024-01-02T00:00:00+00:00"
    assert batch_id_from_context(first) == batch_id_from_context(rerun) == expected
    nxt = {"ti": FakeTI(), "data_interval_start": start + timedelta(days=1),
           "data_interval_end": start + timedelta(days=2)}
    assert batch_id_from_context(nxt) != expected
    # a naive bound is UTC (as Airflow stores it); another zone names the same instant
    naive = datetime(2024, 1, 1, 1, 0)
    cet = timezone(timedelta(hours=2))
    assert interval_batch_id("d", "t", naive, naive) == interval_batch_id("d", "t", naive.replace(tzinfo=cet)
                                                                           + timedelta(hours=2), naive) \
        == "d/t/2024-01-01T01:00:00+00:00"  # a point interval (@daily's cron-trigger timetable): its start
    assert interval_batch_id("d", "t", start, start, 4).endswith("/4")
    # no interval (a manual run without a logical date): the run id, as before
    assert batch_id_from_context({"ti": FakeTI(run_id="manual__x"), "data_interval_start": None,
                                  "data_interval_end": None}) == "d/manual__x/upsert"
    assert replay_suffix(rerun) == "/replay/manual__2024-01-05T10:11:12+00:00"

    dag = _mapped_dag(ops)
    ctx = {"ti": FakeTI(dag_id="m", run_id="r1", task_id="rollback_all"), "task": dag.get_task("rollback_all"), **day}
    every = upstream_batches(ctx, "g.upsert")
    base = "m/g.upsert/2024-01-01T00:00:00+00:00--2024-01-02T00:00:00+00:00"
    src = "/src-0123456789ab"  # the upsert's source part, which the rollback cannot know
    assert every.matches(f"{base}/3") and every.matches(f"{base}/3/replay/r1")
    assert every.matches(f"{base}/3{src}") and every.matches(f"{base}/3{src}/replay/r1")
    assert not every.matches(f"{base}/3/replay/r2") and not every.matches(base)
    assert not every.matches(f"{base}/3{src}/replay/r2") and not every.matches(f"{base}{src}")
    assert not every.matches(f"{base}/3/src-0123") and not every.matches(f"{base}/3/src-0123456789AB")


def test_replay_makes_a_new_batch_id_per_run_and_the_rollback_finds_it(ops, tmp_path):  # type: ignore[no-untyped-def]
    """A committed interval batch makes the upsert a no-op; ``replay="True"`` (a rendered param)
    commits under ``<interval id>/replay/<run id>``; the rollback task of that run finds a pending
    write left under the replayed id."""
    from datetime import datetime, timedelta, timezone

    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_jobs.table import Action, Table

    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    day = {"data_interval_start": start, "data_interval_end": start + timedelta(days=1)}
    src = tmp_path / "in é"
    src.mkdir()
    pq.write_table(pa.table({"id": ["a b", "x/y"], "v": [1, None]}), str(src / "p.parquet"))
    table = str(tmp_path / "t 1%")

    def upsert(run_id, **kw):  # type: ignore[no-untyped-def]
        op = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=table, source_uri=str(src), record_key="id",
                                         engine="arrow", **kw)
        return op.execute({"ti": FakeTI(run_id=run_id), **day})

    one = upsert("r1")
    assert upsert("r2")["instant"] == one["instant"]  # a re-run of the interval: nothing committed
    again = upsert("r3", replay="True")
    assert again["batch_id"] == one["batch_id"] + "/replay/r3" and again["instant"] != one["instant"]
    assert upsert("r3", replay="True")["instant"] == again["instant"]  # that run's retry: one commit
    t = Table.load(table)
    assert [t.timeline.read_metadata(i)["batch_id"] for i in t.timeline.reload().completed([Action.COMMIT])] == [
        one["batch_id"], again["batch_id"]]
    # a pending write of a replayed batch (a killed attempt of run r4): the rollback of r4 finds it
    tl = t.timeline
    pending = tl.transition_to_inflight(tl.create_requested(Action.COMMIT, {
        "batch_id": one["batch_id"] + "/replay/r4", "operation": "upsert", "owner": {"host": "gone", "pid": 1, "at": 0}}))
    rb = ops.RollbackBatchOperator(task_id="rollback", table_uri=table, upsert_task_id="upsert", force=True)
    out = rb.execute({"ti": FakeTI(run_id="r4", task_id="rollback"), **day})
    assert out == {"batch_id": one["batch_id"] + "/replay/r4", "rolled_back": pending.timestamp}


def test_a_batch_ids_source_part_names_the_location_whatever_its_spelling(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The source part of a default batch id is a digest of the source's normalised location: the
    spellings of one location give one id (s3a/s3, a trailing ``/``, storage options in the query,
    an ``ObjectStoragePath``'s connection, a relative path and its absolute form, a list in any
    order), another location another id; no location (an in-memory frame) adds nothing."""
    from airflow.sdk import ObjectStoragePath

    from airflow_provider_bucketindex.batch import legacy_batch_id, source_identity, source_suffix, with_source

    day1 = source_identity("s3://lake/landing/2024-01-01")
    assert day1 is not None and len(day1) == 12 and int(day1, 16) >= 0
    for spelling in ("s3a://lake/landing/2024-01-01", "s3n://lake/landing/2024-01-01/",
                     "s3://lake/landing/2024-01-01?endpoint_override=http%3A%2F%2Fminio&access_key=SECRET",
                     "s3://conn@lake/landing/2024-01-01",
                     ObjectStoragePath("s3://lake/landing/2024-01-01", conn_id="lake_conn")):
        assert source_identity(spelling) == day1, spelling
    assert source_identity("s3://lake/landing/2024-01-02") != day1
    assert source_identity("s3://other/landing/2024-01-01") != day1
    # a local path with a space, %, +, non-ASCII: relative, absolute, file:// percent-encoded, PathLike
    local = tmp_path / "land é" / "50%+1 Zürich"
    monkeypatch.chdir(tmp_path)
    same = {source_identity(str(local)), source_identity(local), source_identity("land é/50%+1 Zürich"),
            source_identity(str(local) + "/"),
            source_identity("file://" + __import__("urllib.parse").parse.quote(str(local)))}
    assert len(same) == 1 and None not in same
    assert source_identity(str(local) + "x") not in same
    # a list: each location normalised; order and repeats do not matter
    assert source_identity(["s3a://b/x", "s3://b/y"]) == source_identity(["s3://b/y", "s3://b/x/", "s3://b/y"])
    assert source_identity(["s3://b/x", "s3://b/y"]) != source_identity(["s3://b/x"])
    # no location
    for nothing in (None, "", "  ", []):
        assert source_identity(nothing) is None and source_suffix(nothing) == ""
    base = "d/upsert/2024-01-01T00:00:00+00:00"
    assert with_source(base, None) == base
    new = with_source(base, "s3://lake/landing/2024-01-01")
    assert new == f"{base}/src-{day1}" and legacy_batch_id(new) == base
    assert legacy_batch_id(base) is None and legacy_batch_id(new + "/replay/r1") is None  # a replay is no legacy


def _kept_log(monkeypatch):  # type: ignore[no-untyped-def]
    """The messages the operators log (``airflow.task`` and below), kept in a list."""
    import logging

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    keep = Keep(level=logging.DEBUG)
    for name in ("airflow.task", "airflow"):
        lg = logging.getLogger(name)
        monkeypatch.setattr(lg, "level", logging.INFO)
        lg.addHandler(keep)
        monkeypatch.setattr(lg, "handlers", [*lg.handlers])  # restored (without keep) after the test
    return records


def test_a_rerun_from_the_same_source_is_a_noop_another_source_is_applied(ops, tmp_path, monkeypatch, capfd):  # type: ignore[no-untyped-def]
    """Through the operator on the in-task engine (real Parquet): the same interval from the same
    source (spelled with a trailing ``/``) is a no-op that says so in the log; the same interval
    from another landing folder is another batch and is applied; ``replay=True`` applies it again;
    a table whose commit carries the earlier form of the id (no source part) sees the re-run as a
    no-op too, and says which id it found; the rollback finds a pending write under either form.
    Table == the oracle (the applied batches reduced by key) after every step."""
    from datetime import datetime, timedelta, timezone

    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_bucketindex.batch import with_source
    from spark_jobs.api import Table as ApiTable
    from spark_jobs.table import Action, Table
    from tests.oracle import reduce_batches

    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    day = {"data_interval_start": start, "data_interval_end": start + timedelta(days=1)}
    schema = pa.schema([("id", pa.string()), ("v", pa.float64()), ("ts", pa.int64())])
    landing_a = [{"id": k, "v": float(i), "ts": 1} for i, k in enumerate(["a b", "x/y", "50%", "1+1", "Zürich ☃"])]
    landing_a.append({"id": "null v", "v": None, "ts": 1})
    landing_b = [{"id": "a b", "v": 10.0, "ts": 2}, {"id": "neu é", "v": None, "ts": 2}]

    def folder(name: str, rows: list) -> str:  # type: ignore[type-arg]
        path = tmp_path / name / "2024-01-01"
        path.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(path / "part 0.parquet"))
        return str(path)

    src_a, src_b = folder("landing A é", landing_a), folder("landing+B 50%", landing_b)
    table = str(tmp_path / "t 1%")
    base = "d/upsert/2024-01-01T00:00:00+00:00--2024-01-02T00:00:00+00:00"
    log = _kept_log(monkeypatch)

    def upsert(run_id: str, source: str, tbl: str = table, **kw):  # type: ignore[no-untyped-def]
        op = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=tbl, source_uri=source, record_key="id",
                                         precombine_field="ts", engine="arrow", **kw)
        return op.execute({"ti": FakeTI(run_id=run_id), **day})

    def commits(tbl: str = table) -> list:  # type: ignore[type-arg]
        tl = Table.load(tbl).timeline.reload()
        return [tl.read_metadata(i)["batch_id"] for i in tl.completed([Action.COMMIT])]

    def rows(tbl: str = table) -> dict:  # type: ignore[type-arg]
        return {r["id"]: r for r in ApiTable(tbl).read().to_pylist()}

    def said() -> str:
        out = capfd.readouterr()
        return "\n".join([*log, out.out, out.err])

    one = upsert("scheduled__2024-01-01T00:00:00+00:00", src_a)
    assert one["batch_id"] == with_source(base, src_a) != with_source(base, src_b)
    assert rows() == reduce_batches([landing_a], delete_field=None)

    # the same interval from the same source, another run (a re-run of the date): a no-op, logged
    log.clear(), capfd.readouterr()
    again = upsert("manual__2024-01-05T10:11:12+00:00", src_a + "/")
    assert again["instant"] == one["instant"] and again["batch_id"] == one["batch_id"]
    assert commits() == [one["batch_id"]]
    text = said()
    assert f"Batch {one['batch_id']} is already committed at {one['instant']}" in text, text[-3000:]
    assert "from the same source): nothing to do; replay=True applies it again" in text

    # the same interval from another source: another batch, applied
    other = upsert("manual__2024-01-06T00:00:00+00:00", src_b)
    assert other["batch_id"] == with_source(base, src_b) and other["instant"] != one["instant"]
    assert commits() == [one["batch_id"], other["batch_id"]]
    assert rows() == reduce_batches([landing_a, landing_b], delete_field=None)

    # replay=True: applied again on purpose, under the run's replay id
    replayed = upsert("manual__r9", src_a, replay="True")
    assert replayed["batch_id"] == one["batch_id"] + "/replay/manual__r9" and replayed["instant"] != one["instant"]
    assert commits() == [one["batch_id"], other["batch_id"], replayed["batch_id"]]
    assert rows() == reduce_batches([landing_a, landing_b, landing_a], delete_field=None)

    # a table written before ids named their source: its commit carries the interval's id alone
    old_table = str(tmp_path / "old/table ü")
    legacy = upsert("scheduled__2024-01-01T00:00:00+00:00", src_a, tbl=old_table, batch_id=base)
    assert legacy["batch_id"] == base
    log.clear(), capfd.readouterr()
    rerun = upsert("manual__2024-02-01T00:00:00+00:00", src_a, tbl=old_table)
    assert rerun["instant"] == legacy["instant"] and commits(old_table) == [base]
    text = said()
    assert (f"Batch {with_source(base, src_a)} is already committed at {legacy['instant']} under the earlier form "
            f"of its id, {base}") in text, text[-3000:]
    assert "replay=True applies it again" in text
    # ... also with skip_committed_batches=False (the job would know the new form only)
    assert upsert("manual__x", src_a, tbl=old_table, skip_committed_batches=False)["instant"] == legacy["instant"]
    assert commits(old_table) == [base] and rows(old_table) == reduce_batches([landing_a], delete_field=None)
    assert upsert("manual__r10", src_a, tbl=old_table, replay=True)["batch_id"] == \
        with_source(base, src_a) + "/replay/manual__r10"
    assert len(commits(old_table)) == 2

    # the rollback of a run finds the upsert's pending write under the new form and under the old one
    tl = Table.load(table).timeline
    for left in (with_source(base, src_b), base):
        pending = tl.transition_to_inflight(tl.create_requested(Action.COMMIT, {
            "batch_id": left, "operation": "upsert", "owner": {"host": "gone", "pid": 1, "at": 0}}))
        rb = ops.RollbackBatchOperator(task_id="rollback", table_uri=table, upsert_task_id="upsert", force=True)
        out = rb.execute({"ti": FakeTI(run_id="r5", task_id="rollback"), **day})
        assert out == {"batch_id": left, "rolled_back": pending.timestamp}
    assert Table.load(table).timeline.reload().pending() == []
    assert rows() == reduce_batches([landing_a, landing_b, landing_a], delete_field=None)


# -- construction -------------------------------------------------------------------------


def test_constructors_are_keyword_only(ops):  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError):
        ops.UpsertWithIndexOperator("upsert", "/t", "/s", "id")  # type: ignore[misc]
    with pytest.raises(TypeError):
        ops.ValidateTableOperator("validate", "/t")  # type: ignore[misc]
    with pytest.raises(TypeError):
        ops.RollbackBatchOperator("rb", "/t")  # type: ignore[misc]


def test_init_does_no_work(ops, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.hooks import bucketindex

    def boom(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("work done in __init__")

    monkeypatch.setattr(bucketindex.BucketIndexHook, "__init__", boom)
    monkeypatch.setattr(packaging, "spark_jobs_zip", boom)
    monkeypatch.setattr(packaging, "resolve_spark_binary", boom)
    made = [
        ops.UpsertWithIndexOperator(
            task_id="u", table_uri="s3://nowhere/t", source_uri="/x", record_key="id", conn_id="not_defined_anywhere"
        ),
        ops.ValidateTableOperator(task_id="v", table_uri="/nowhere", conn_id="not_defined_anywhere"),
        ops.RollbackBatchOperator(task_id="r", table_uri="/nowhere", upsert_task_id="u"),
    ]
    for op in made:
        assert "hook" not in vars(op)
        op.on_kill()  # nothing started: nothing to stop, and no hook built for it
        assert "hook" not in vars(op)


def test_template_fields_are_the_constructor_arguments_verbatim(ops):  # type: ignore[no-untyped-def]
    kw = dict(
        table_uri="{{ params.t }}", source_uri="{{ ds }}", record_key=["a", "b"], precombine_field="ts",
        partition_field="p", index="bucket", num_buckets="{{ params.n }}", table_type="merge_on_read",
        source_format="json",
        delete_field="del", batch_id="{{ run_id }}", replay="{{ params.replay }}", master="spark://m:7077", conf={"k": "{{ ds }}"},
        name="n", env_vars={"E": "1"}, engine="{{ params.engine }}", memory_budget="{{ params.budget }}",
        storage_conn_id="{{ params.store }}", storage_options={"region": "{{ params.region }}"},
    )  # fmt: skip
    op = ops.UpsertWithIndexOperator(task_id="u", **kw)
    assert set(op.template_fields) == set(kw)
    for field in op.template_fields:
        assert getattr(op, field) == kw[field], field
    v = ops.ValidateTableOperator(task_id="v", table_uri="{{ params.t }}", engine="{{ params.e }}")
    assert set(v.template_fields) == {"table_uri", "engine", "memory_budget", "master", "conf", "name", "env_vars",
                                      "storage_conn_id", "storage_options"}
    assert v.engine == "{{ params.e }}" and v.memory_budget is None
    r = ops.RollbackBatchOperator(task_id="r", table_uri="{{ params.t }}", batch_id="{{ run_id }}")
    assert set(r.template_fields) == {"table_uri", "batch_id", "upsert_task_id", "instant", "storage_conn_id",
                                      "storage_options"}


def test_templates_render(ops):  # type: ignore[no-untyped-def]
    op = ops.UpsertWithIndexOperator(
        task_id="u", table_uri="{{ params.t }}", source_uri="/landing/{{ ds }}", record_key="id", conf={"x": "{{ ds }}"}
    )
    op.render_template_fields({"params": {"t": "/lake/t"}, "ds": "2024-01-02"})
    assert (op.table_uri, op.source_uri, op.conf) == ("/lake/t", "/landing/2024-01-02", {"x": "2024-01-02"})


def test_rollback_operator_defaults_to_one_failed(ops):  # type: ignore[no-untyped-def]
    assert ops.RollbackBatchOperator(task_id="r", table_uri="/t", upsert_task_id="u").trigger_rule == "one_failed"
    assert ops.RollbackBatchOperator(task_id="r", table_uri="/t", batch_id="b", trigger_rule="all_done").trigger_rule == "all_done"


# -- execute without Spark ----------------------------------------------------------------


def _committed_table(path: str, batch_id: str) -> str:
    """A table whose timeline holds a completed commit of ``batch_id`` (written with the core)."""
    from spark_jobs.table import Action, Table, TableConfig

    t = Table.open(path)
    t.create(TableConfig(record_key_fields=["id"]))
    inst = t.timeline.create_requested(Action.COMMIT, {"batch_id": batch_id})
    inst = t.timeline.transition_to_inflight(inst)
    t.timeline.complete(inst, {"batch_id": batch_id, "counts": {"inserted": 7, "updated": 2, "deleted": 1}})
    return inst.timestamp


def test_committed_batch_is_not_resubmitted(ops, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.hooks import bucketindex

    ti = FakeTI(try_number=2)
    batch = batch_id_from_context({"ti": ti})
    instant = _committed_table(str(tmp_path / "t"), batch)
    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit", lambda *a, **k: pytest.fail("resubmitted"))
    op = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=str(tmp_path / "t"), source_uri="/s", record_key="id")

    out = op.execute({"ti": ti})

    assert out == {"table_uri": str(tmp_path / "t"), "batch_id": batch, "instant": instant,
                   "inserted": 7, "updated": 2, "deleted": 1, "engine": None}  # fmt: skip
    assert ti.pushed == {"instant": instant, "counts": {"inserted": 7, "updated": 2, "deleted": 1}}


def test_rollback_operator_without_a_table_or_pending_instant_is_a_noop(ops, tmp_path):  # type: ignore[no-untyped-def]
    op = ops.RollbackBatchOperator(task_id="rollback", table_uri=str(tmp_path / "none"), upsert_task_id="upsert")
    assert op.execute({"ti": FakeTI(task_id="rollback")}) == {
        "batch_id": "d/scheduled__2024-01-01T00:00:00+00:00/upsert",
        "rolled_back": None,
    }
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("rc,retryable", [(3, True), (2, False), (1, True)])
def test_upsert_exit_status_maps_to_retryable_or_final_failure(ops, tmp_path, monkeypatch, rc, retryable):  # type: ignore[no-untyped-def]
    """Exit 3 (conflict, busy table) is an ordinary retryable failure; only exit 2 (bad input) is final."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from airflow_provider_bucketindex.hooks import bucketindex

    def fail(self, verb, args, **kw):  # type: ignore[no-untyped-def]
        raise bucketindex.SparkJobFailed(verb, rc, "conflict: 3 record key(s) written by both")

    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit", fail)
    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    op = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=str(tmp_path / "t"), source_uri="/s", record_key="id",
                                     engine="spark")
    with pytest.raises(AirflowException) as info:
        op.execute({"ti": FakeTI()})
    assert isinstance(info.value, AirflowFailException) is not retryable
    if rc == 3:
        assert "same batch id" in str(info.value)


def test_rollback_operator_leaves_a_live_writer_and_fails_retryably(ops, tmp_path):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from spark_jobs.table import Action, Table, TableConfig
    from spark_jobs.table.heartbeat import Heartbeat, owner_info

    t = Table.open(str(tmp_path / "t"))
    t.create(TableConfig(record_key_fields=["id"]))
    batch = batch_id_from_context({"ti": FakeTI()})
    inst = t.timeline.create_requested(Action.COMMIT, {"batch_id": batch, "owner": owner_info()})
    hb = Heartbeat(t.io, t.layout, inst.timestamp).start()
    try:
        op = ops.RollbackBatchOperator(task_id="rollback", table_uri=str(tmp_path / "t"), upsert_task_id="upsert")
        assert op.force is False
        with pytest.raises(AirflowException, match="live writer") as info:
            op.execute({"ti": FakeTI(task_id="rollback")})
        assert not isinstance(info.value, AirflowFailException)
        assert [i.timestamp for i in t.timeline.reload().pending()] == [inst.timestamp]
    finally:
        hb.stop()
    # force=True aborts it although its owner (this process) is alive
    forced = ops.RollbackBatchOperator(task_id="rollback", table_uri=str(tmp_path / "t"), upsert_task_id="upsert",
                                       force=True)
    assert forced.execute({"ti": FakeTI(task_id="rollback")})["rolled_back"] == inst.timestamp
    assert t.timeline.reload().pending() == []


def test_rollback_operator_needs_a_batch(ops, tmp_path):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException):
        ops.RollbackBatchOperator(task_id="r", table_uri=str(tmp_path)).execute({"ti": FakeTI()})


# -- on_kill ------------------------------------------------------------------------------

FAKE_SPARK_SUBMIT = """\
#!{python}
# Stands in for spark-submit: starts a "Python worker" in a process group of its own (as
# PySpark does) and records both pids, then waits to be killed.
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import os, time; os.setpgid(0, 0); time.sleep(300)"])
with open(os.environ["FAKE_PIDS"], "w") as f:
    f.write(f"{{os.getpid()}} {{child.pid}}")
time.sleep(300)
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_on_kill_stops_spark_submit_and_its_workers_and_leaves_the_pending_instant(ops, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.hooks.bucketindex import SparkJobFailed
    from spark_jobs.table import Action, Table, TableConfig

    table = Table.open(str(tmp_path / "t"))
    table.create(TableConfig(record_key_fields=["id"]))
    pending = table.timeline.create_requested(Action.COMMIT, {"batch_id": "b"})
    fake = tmp_path / "spark-submit"
    fake.write_text(FAKE_SPARK_SUBMIT.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setattr(packaging, "resolve_spark_binary", lambda binary="spark-submit", **k: str(fake))
    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    pids_file = tmp_path / "pids"
    op = ops.UpsertWithIndexOperator(
        task_id="upsert", table_uri=str(tmp_path / "t"), source_uri="/s", record_key="id",
        env_vars={"FAKE_PIDS": str(pids_file)},
    )  # fmt: skip
    errors: list[BaseException] = []

    def run() -> None:
        try:
            op.hook.submit("upsert", op.build_args("b", table_exists=True))
        except BaseException as e:  # noqa: BLE001 - collected for the assertion below
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    deadline = time.monotonic() + 30
    while not (pids_file.exists() and pids_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    submit_pid, worker_pid = map(int, pids_file.read_text().split())
    assert os.getsid(submit_pid) == submit_pid != os.getsid(0), "spark-submit runs in a session of its own"

    op.on_kill()
    th.join(15)

    assert not th.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], SparkJobFailed) and errors[0].returncode != 0
    deadline = time.monotonic() + 10
    while is_running(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not is_running(submit_pid) and not is_running(worker_pid)
    assert [i.timestamp for i in table.timeline.reload().pending()] == [pending.timestamp]


# -- XCom: do_xcom_push respected, values small -------------------------------------------


def test_upsert_pushes_no_xcom_when_do_xcom_push_is_false(ops, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    import json

    from airflow_provider_bucketindex.hooks import bucketindex

    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit", lambda *a, **k: pytest.fail("resubmitted"))
    for push in (True, False):
        ti = FakeTI()
        _committed_table(str(tmp_path / f"t{push}"), batch_id_from_context({"ti": ti}))
        op = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=str(tmp_path / f"t{push}"), source_uri="/s",
                                         record_key="id", do_xcom_push=push)
        out = op.execute({"ti": ti})
        assert set(ti.pushed) == ({"instant", "counts"} if push else set())
        assert len(json.dumps(out)) < 512 and all(not isinstance(v, (list, dict)) for v in out.values())


# -- mapped upserts: which batch a rollback acts on ---------------------------------------


def _mapped_dag(ops):  # type: ignore[no-untyped-def]
    import pendulum
    from airflow.sdk import DAG, task_group

    with DAG("m", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")) as dag:
        @task_group(group_id="g")
        def per_file(source_uri: str) -> None:
            up = ops.UpsertWithIndexOperator(task_id="upsert", table_uri="/t", source_uri=source_uri, record_key="id")
            up >> ops.RollbackBatchOperator(task_id="rollback", table_uri="/t", upsert_task_id="g.upsert")

        per_file.expand(source_uri=["/a", "/b", "/c"])
        plain = ops.UpsertWithIndexOperator(task_id="plain", table_uri="/t", source_uri="/s", record_key="id")
        plain >> ops.RollbackBatchOperator(task_id="rollback_plain", table_uri="/t", upsert_task_id="plain")
        ops.RollbackBatchOperator(task_id="rollback_all", table_uri="/t", upsert_task_id="g.upsert")
    return dag


def test_rollback_in_a_mapped_group_targets_its_own_map_index(ops):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.batch import upstream_batches

    dag = _mapped_dag(ops)
    run = "manual__1"
    ctx = {"ti": FakeTI(dag_id="m", run_id=run, task_id="g.rollback", map_index=1), "task": dag.get_task("g.rollback")}
    assert batch_id_from_context(ctx, "g.upsert") == "m/manual__1/g.upsert/1"
    # the upsert instance itself derives the same id
    assert batch_id_from_context({"ti": FakeTI(dag_id="m", run_id=run, task_id="g.upsert", map_index=1)}) == \
        "m/manual__1/g.upsert/1"
    ctx = {"ti": FakeTI(dag_id="m", run_id=run, task_id="rollback_plain"), "task": dag.get_task("rollback_plain")}
    assert batch_id_from_context(ctx, "plain") == "m/manual__1/plain"
    ctx = {"ti": FakeTI(dag_id="m", run_id=run, task_id="rollback_all"), "task": dag.get_task("rollback_all")}
    every = upstream_batches(ctx, "g.upsert")
    assert every.batch_id is None
    assert every.matches("m/manual__1/g.upsert/0") and every.matches("m/manual__1/g.upsert/12")
    assert not every.matches("m/manual__1/g.upsert") and not every.matches("m/manual__2/g.upsert/0")
    with pytest.raises(ValueError, match="mapped"):
        batch_id_from_context(ctx, "g.upsert")


def test_unmapped_rollback_after_a_mapped_upsert_rolls_back_every_failed_instance(ops, tmp_path):  # type: ignore[no-untyped-def]
    from spark_jobs.table import Action, Table, TableConfig

    dag = _mapped_dag(ops)
    table = str(tmp_path / "t")
    t = Table.open(table)
    t.create(TableConfig(record_key_fields=["id"]))
    pending = {}
    for batch in ("m/r/g.upsert/0", "m/r/g.upsert/2", "m/r/plain", "m/other/g.upsert/1"):
        inst = t.timeline.create_requested(Action.COMMIT, {"batch_id": batch})
        pending[batch] = t.timeline.transition_to_inflight(inst).timestamp
    op = dag.get_task("rollback_all")
    op.table_uri = table

    out = op.execute({"ti": FakeTI(dag_id="m", run_id="r", task_id="rollback_all"), "task": op})

    assert out["batches"] == ["m/r/g.upsert/0", "m/r/g.upsert/2"]
    assert sorted(out["rolled_back"]) == sorted([pending["m/r/g.upsert/0"], pending["m/r/g.upsert/2"]])
    left = {i.timestamp for i in Table.load(table).timeline.reload().pending()}
    assert left == {pending["m/r/plain"], pending["m/other/g.upsert/1"]}


# -- OpenLineage facets (the OpenLineage provider is in the test extra) ---------------------


def test_openlineage_facets_name_source_and_table_with_the_commits_rows(ops, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.hooks import bucketindex
    from airflow_provider_bucketindex.lineage import openlineage_dataset

    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit", lambda *a, **k: pytest.fail("resubmitted"))
    ti = FakeTI()
    table = str(tmp_path / "t")
    _committed_table(table, batch_id_from_context({"ti": ti}))
    op = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=table, source_uri="/landing/2024-01-01",
                                     record_key="id")
    assert op.get_openlineage_facets_on_complete(None).outputs == []  # nothing ran yet
    op.execute({"ti": ti})

    lineage = op.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("file", "/landing/2024-01-01")]
    (out,) = lineage.outputs
    assert (out.namespace, out.name) == ("file", table)
    assert out.facets["outputStatistics"].rowCount == 7 + 2 + 1

    clean = ops.CleanTableOperator(task_id="clean", table_uri=table, dry_run=True)
    clean.execute({"ti": FakeTI(task_id="clean")})
    lineage = clean.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("file", table)] and lineage.outputs == []

    assert openlineage_dataset("s3://bucket/lake/events/") == ("s3://bucket", "lake/events")
    assert openlineage_dataset("s3a://bucket/lake/events") == ("s3://bucket", "lake/events")
    assert openlineage_dataset("hdfs://nn:8020/lake/events") == ("hdfs://nn:8020", "/lake/events")
    assert openlineage_dataset("file:///lake/events") == ("file", "/lake/events")


def test_rollback_reports_the_table_it_changed(ops, tmp_path):  # type: ignore[no-untyped-def]
    from spark_jobs.table import Action, Table, TableConfig

    table = str(tmp_path / "t")
    t = Table.open(table)
    t.create(TableConfig(record_key_fields=["id"]))
    t.timeline.transition_to_inflight(t.timeline.create_requested(Action.COMMIT, {"batch_id": "b"}))
    op = ops.RollbackBatchOperator(task_id="rollback", table_uri=table, batch_id="b")
    assert op.execute({"ti": FakeTI(task_id="rollback")})["rolled_back"]
    assert [(d.namespace, d.name) for d in op.get_openlineage_facets_on_complete(None).outputs] == [("file", table)]


def test_table_asset_uris(ops):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.lineage import TABLE_UPDATES, table_asset, table_asset_uri

    # the registered bucketindex scheme (tests/unit/test_provider_assets.py has its rules)
    assert table_asset_uri("/lake/events") == "bucketindex:file:///lake/events"
    assert table_asset_uri("file:///lake/events") == "bucketindex:file:///lake/events"
    assert table_asset_uri("s3://b/lake/events/") == table_asset_uri("s3a://b/lake/events") == "bucketindex:s3://b/lake/events"
    assert table_asset("/lake/events").uri == "bucketindex:file:///lake/events"
    up = ops.UpsertWithIndexOperator(task_id="u", table_uri="/t", source_uri="/s", record_key="id",
                                     outlets=[table_asset("/t")])
    assert up.outlets == [table_asset("/t"), TABLE_UPDATES]  # the user's own outlet is kept
    assert ops.ValidateTableOperator(task_id="v", table_uri="/t").outlets == []  # reads only
