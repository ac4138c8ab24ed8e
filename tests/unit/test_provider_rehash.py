"""RehashOperator: conventions, the checks it makes in the task before anything is submitted
(real tables, pure Python), the command it submits, and how job failures map to retries."""

from __future__ import annotations

import pytest

from airflow_provider_bucketindex.demo import sandbox
from spark_jobs.table import Action, Table, TableConfig
from tests.spark.conftest import tree_digest
from tests.unit.test_table_format import write_commit

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    return operators


def _table(tmp_path, index: str = "record", buckets: int = 4) -> Table:  # type: ignore[no-untyped-def]
    t = Table.open(str(tmp_path / "lake" / "ventes été %+"))
    t.create(TableConfig(record_key_fields=["id"], index_type=index, num_buckets=buckets))
    write_commit(t, [("clé 1/%+", 1), ("k2", 2)], file_id="fg1")
    return t


@pytest.fixture
def no_spark(monkeypatch):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.hooks import bucketindex

    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit",
                        lambda *a, **k: pytest.fail("no Spark job may be submitted for a refused rehash"))


def test_conventions(ops):  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError):
        ops.RehashOperator("r", "/t", 8)  # type: ignore[misc]
    kw = dict(table_uri="{{ params.table_uri }}", num_buckets="{{ params.num_buckets }}", master="local[2]",
              conf={"k": "{{ ds }}"}, name="n", env_vars={"E": "1"}, storage_conn_id="{{ params.store }}",
              storage_options={"region": "{{ params.region }}"}, engine="{{ params.engine }}",
              memory_budget="{{ params.budget }}")
    op = ops.RehashOperator(task_id="r", **kw)
    assert set(op.template_fields) == set(kw)
    assert all(getattr(op, f) == kw[f] for f in op.template_fields)  # assigned verbatim
    assert "hook" not in vars(op)  # nothing built in __init__


@pytest.mark.parametrize("count,index,message", [
    (6, "record", "neither a multiple nor a divisor of the table's 4 buckets"),
    (0, "record", "at least 1"),
    (131072, "record", "above the maximum of 65536"),
    ("twelve", "record", "num_buckets must be a whole number"),
    (8, "global_simple", "global_simple index, which has no buckets"),
])
def test_a_wrong_count_fails_in_the_task_without_a_job(ops, tmp_path, no_spark, count, index, message):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    t = _table(tmp_path, index)
    before = tree_digest(tmp_path)
    with pytest.raises(AirflowFailException, match=message):
        ops.RehashOperator(task_id="r", table_uri=t.uri, num_buckets=count).execute({})
    assert tree_digest(tmp_path) == before


def test_missing_table_and_running_rehash_fail_without_a_job(ops, tmp_path, no_spark):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    from spark_jobs.table.action import Transaction

    with pytest.raises(AirflowFailException, match="refused"):
        ops.RehashOperator(task_id="r", table_uri=str(tmp_path / "none"), num_buckets=8).execute({})
    t = _table(tmp_path)
    running = Transaction(t, Action.REHASH, {"num_buckets": 8}).begin()
    try:
        with pytest.raises(AirflowFailException, match=f"a rehash is already running .*{running.ts}"):
            ops.RehashOperator(task_id="r", table_uri=t.uri, num_buckets="8").execute({})
    finally:
        running.abort()


def test_the_count_in_force_is_a_noop(ops, tmp_path, no_spark):  # type: ignore[no-untyped-def]
    t = _table(tmp_path, "bucket", 4)
    op = ops.RehashOperator(task_id="r", table_uri=t.uri, num_buckets=" 4 ")
    out = op.execute({})
    assert out["noop"] is True and out["instant"] is None and out["previous_num_buckets"] == 4
    lineage = op.get_openlineage_facets_on_complete(None)  # read the table, wrote nothing
    assert [d.name for d in lineage.inputs] == [t.uri] and lineage.outputs == []


@pytest.mark.parametrize("rc,final", [(2, True), (1, False), (3, False)])
def test_submits_the_rehash_and_maps_failures(ops, tmp_path, monkeypatch, rc, final):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from airflow_provider_bucketindex.hooks import bucketindex

    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    t = _table(tmp_path)
    calls = []

    def fail(self, verb, args, **kw):  # type: ignore[no-untyped-def]
        calls.append((verb, list(args)))
        raise bucketindex.SparkJobFailed(verb, rc, "rehash failed")

    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit", fail)
    op = ops.RehashOperator(task_id="r", table_uri=t.uri, num_buckets="16", master="local[2]", heartbeat_timeout_s=5,
                            engine="spark")
    assert op.spark_submit_command()[-6:] == ["rehash", t.uri, "--num-buckets", "16", "--heartbeat-timeout", "5"]
    with pytest.raises(AirflowException) as info:
        op.execute({})
    assert calls == [("rehash", [t.uri, "--num-buckets", "16", "--heartbeat-timeout", "5"])]
    assert isinstance(info.value, AirflowFailException) is final


def test_auto_rehashes_in_the_task_without_spark(ops, tmp_path, monkeypatch, no_spark):  # type: ignore[no-untyped-def]
    """``engine`` auto (the default): a rehash that fits the memory budget runs in the task on the
    Arrow engine -- no spark-submit -- and its commit records the engine and why."""
    from spark_jobs.arrow_engine.validate import run_validate
    from spark_jobs.table.reader import read_arrow
    from tests.unit.test_arrow_oracle_rehash import _batches, _upsert

    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    uri = str(tmp_path / "lake" / "ventes été %+")
    _upsert(uri, tmp_path, _batches(seed=2, per_partition=False), 0, index="record", num_buckets=4)
    t = Table.load(uri)
    rows = sorted(read_arrow(t.uri).to_pylist(), key=repr)
    out = ops.RehashOperator(task_id="r", table_uri=t.uri, num_buckets="16").execute({})
    assert out["engine"] == "arrow" and out["noop"] is False and out["num_buckets"] == 16, out
    t = Table.load(t.uri)
    done = t.timeline.find(str(out["instant"]))
    assert done is not None and done.is_completed and t.num_buckets() == 16
    engine = t.timeline.read_metadata(done)["engine"]
    assert engine["name"] == "arrow" and "engine='auto'" in engine["reason"] and "in the Airflow task" in engine["reason"]
    assert out["counts"]["index_buckets"] and sorted(read_arrow(t.uri).to_pylist(), key=repr) == rows
    assert run_validate(t.uri)["ok"]
