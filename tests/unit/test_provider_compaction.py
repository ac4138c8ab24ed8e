"""AsyncIndexCompactionOperator: conventions, the schedule step on real tables (pure Python,
no Spark), nothing due -> skipped, and the execute step's command and failure mapping."""

from __future__ import annotations

import time

import pytest

from airflow_provider_bucketindex.demo import sandbox
from spark_jobs.table import Action, Table, TableConfig
from tests.unit.test_table_format import write_commit

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    return operators


def _table(tmp_path, commits: int) -> Table:  # type: ignore[no-untyped-def]
    """A record-index table whose bucket 0 has ``commits`` deltas (hand-made commits, as a job writes them)."""
    t = Table.open(str(tmp_path / "lake" / "ventes été"))
    t.create(TableConfig(record_key_fields=["id"], num_buckets=2))
    for i in range(commits):
        write_commit(t, [(f"clé {i}/%+", i)], file_id=f"fg{i}")
    return t


def test_conventions(ops):  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError):
        ops.AsyncIndexCompactionOperator("c", "/t")  # type: ignore[misc]
    with pytest.raises(ValueError, match="mode must be one of schedule, execute, both"):
        ops.AsyncIndexCompactionOperator(task_id="c", table_uri="/t", mode="later")
    kw = dict(table_uri="{{ params.t }}", instant="{{ ti.xcom_pull(task_ids='s')['instant'] }}",
              min_deltas="{{ params.n }}", delta_ratio=0.25, min_logs=3, log_ratio=0.1, master="local[2]",
              conf={"k": "{{ ds }}"}, name="n", env_vars={"E": "1"}, storage_conn_id="{{ params.store }}",
              storage_options={"region": "{{ params.region }}"}, engine="{{ params.engine }}",
              memory_budget="{{ params.budget }}")
    op = ops.AsyncIndexCompactionOperator(task_id="c", mode="execute", **kw)
    assert set(op.template_fields) == set(kw)
    assert all(getattr(op, f) == kw[f] for f in op.template_fields)
    assert "hook" not in vars(op)  # nothing built in __init__
    assert "**not** Airflow's older ``*Async`` naming" in " ".join(ops.AsyncIndexCompactionOperator.__doc__.split())


def test_schedule_plans_due_buckets_without_spark(ops, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.hooks import bucketindex

    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit", lambda *a, **k: pytest.fail("no Spark job to schedule"))
    t = _table(tmp_path, 3)
    op = ops.AsyncIndexCompactionOperator(task_id="s", table_uri=t.uri, mode="schedule", min_deltas=2)
    out = op.execute({})
    assert out["table_uri"] == t.uri and out["index_buckets"] >= 1 and out["deltas"] >= 2 and out["file_groups"] == 0
    (pending,) = t.timeline.reload().pending()
    assert pending.timestamp == out["instant"] and pending.action == Action.COMPACTION
    plan = t.timeline.read_plan(pending)
    assert sum(b["deltas"] for b in plan["index_buckets"]) == out["deltas"]
    # the same buckets are not planned twice: the next schedule has nothing due, and skips
    from airflow.sdk.exceptions import AirflowSkipException

    with pytest.raises(AirflowSkipException, match="nothing is due"):
        op.execute({})
    assert [i.timestamp for i in t.timeline.reload().pending()] == [out["instant"]]


def test_nothing_due_skips_and_writes_nothing(ops, tmp_path):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowSkipException

    t = _table(tmp_path, 2)
    before = sorted(p.name for p in (tmp_path / "lake" / "ventes été" / ".bucketindex" / "timeline").iterdir())
    with pytest.raises(AirflowSkipException):
        ops.AsyncIndexCompactionOperator(task_id="s", table_uri=t.uri, mode="both").execute({})  # min_deltas 10
    after = sorted(p.name for p in (tmp_path / "lake" / "ventes été" / ".bucketindex" / "timeline").iterdir())
    assert before == after


def test_bad_input_fails_without_retry(ops, tmp_path):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match="no bucketindex table|does not exist|no table"):
        ops.AsyncIndexCompactionOperator(task_id="s", table_uri=str(tmp_path / "none"), mode="schedule").execute({})
    t = _table(tmp_path, 1)
    with pytest.raises(AirflowFailException, match="--min-deltas must be at least 1"):
        ops.AsyncIndexCompactionOperator(task_id="s", table_uri=t.uri, mode="schedule", min_deltas=0).execute({})
    with pytest.raises(AirflowFailException, match="needs the instant"):
        ops.AsyncIndexCompactionOperator(task_id="e", table_uri=t.uri, mode="execute", instant="").execute({})


@pytest.mark.parametrize("rc,final", [(2, True), (1, False), (3, False)])
def test_execute_submits_the_plan_and_maps_failures(ops, tmp_path, monkeypatch, rc, final):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from airflow_provider_bucketindex.hooks import bucketindex

    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    t = _table(tmp_path, 3)
    planned = ops.AsyncIndexCompactionOperator(task_id="s", table_uri=t.uri, mode="schedule",
                                               min_deltas=2).execute({})["instant"]
    calls = []

    def fail(self, verb, args, **kw):  # type: ignore[no-untyped-def]
        calls.append((verb, list(args)))
        raise bucketindex.SparkJobFailed(verb, rc, "compaction failed")

    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit", fail)
    op = ops.AsyncIndexCompactionOperator(task_id="e", table_uri=t.uri, mode="execute", instant=planned,
                                          master="local[2]", engine="spark")
    cmd = op.spark_submit_command(planned)
    assert cmd[-4:] == ["compact", t.uri, "--execute", planned]
    with pytest.raises(AirflowException) as info:
        op.execute({})
    assert calls == [("compact", [t.uri, "--execute", planned])]
    assert isinstance(info.value, AirflowFailException) is final


def test_index_plan_folds_a_prefix_older_than_the_oldest_live_writer(tmp_path):
    """A live writer that started before the newest deltas holds them back (its own delta must
    stay newer than what is folded below it); a dead writer does not."""
    from spark_jobs.table.action.compact import CompactionPolicy, plan_compaction
    from spark_jobs.table.heartbeat import Heartbeat, owner_info

    t = _table(tmp_path, 2)
    old = list(t.view().index_files[0])
    live = t.timeline.create_requested(Action.COMMIT, {"batch_id": "late writer", "owner": owner_info()})
    for i in range(2, 4):
        write_commit(t, [(f"clé {i}/%+", i)], file_id=f"fg{i}")
    assert len(t.view().index_files[0]) == 4
    policy = CompactionPolicy(min_deltas=1, data=False)
    hb = Heartbeat(t.io, t.layout, live.timestamp).start()
    try:
        plan = plan_compaction(t, t.view(), policy)
        assert plan is not None and [b["files"] for b in plan["index_buckets"] if b["bucket"] == 0] == [old]
    finally:
        hb.stop()
    time.sleep(0.05)  # its last beat older than the 10 ms timeout below (a fast machine got here within it)
    plan = plan_compaction(t, t.view(), policy, heartbeat_timeout_s=0.01)  # the writer is gone: all four
    assert [b["files"] for b in plan["index_buckets"] if b["bucket"] == 0] == [t.view().index_files[0]]


def test_auto_executes_the_plan_in_the_task_without_spark(ops, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """``engine`` auto (the default): a plan that fits the memory budget is executed in the task
    on the Arrow engine -- no spark-submit, even with a master on the operator -- and commits."""
    from airflow_provider_bucketindex.hooks import bucketindex
    from spark_jobs.table.reader import read_arrow

    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit",
                        lambda *a, **k: pytest.fail("the plan was submitted to Spark"))
    t = _table(tmp_path, 3)
    rows = sorted(read_arrow(t.uri).to_pylist(), key=repr)
    planned = ops.AsyncIndexCompactionOperator(task_id="s", table_uri=t.uri, mode="schedule",
                                               min_deltas=2).execute({})["instant"]
    out = ops.AsyncIndexCompactionOperator(task_id="e", table_uri=t.uri, mode="execute", instant=planned,
                                           master="local[2]").execute({})
    assert out["engine"] == "arrow" and out["counts"]["index_buckets"] == 1, out
    tl = Table.load(t.uri).timeline.reload()
    done = tl.find(planned)
    assert done is not None and done.is_completed and tl.pending() == []
    engine = tl.read_metadata(done)["engine"]
    assert engine["name"] == "arrow" and "in the Airflow task" in engine["reason"], engine
    assert sorted(read_arrow(t.uri).to_pylist(), key=repr) == rows
    assert [f for f in tl.read_metadata(done)["index"]["added"]]  # a new base written for bucket 0
