"""The rollback branch through ``dag.test()`` without Spark: a stand-in writer leaves a
pending instant (as a killed spark-submit does) and fails; ``RollbackBatchOperator``
(trigger rule one_failed) must remove exactly that instant, and do nothing when the
failed writer left nothing behind."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.airflow

DAG_ID = "bucketindex_test_rollback"


def _other_pending(table_uri: str) -> str:
    """A pending instant of an unrelated batch: the rollback must not touch it."""
    from spark_jobs.table import Action, Table, TableConfig

    t = Table.open(table_uri)
    if not t.exists:
        t.create(TableConfig(record_key_fields=["id"]))
    return t.timeline.create_requested(Action.COMMIT, {"batch_id": "someone-else"}).timestamp


def test_rollback_branch_removes_the_failed_batchs_pending_instant(tmp_path, airflow_db):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox
    from spark_jobs.table import Action, Table

    table = str(tmp_path / "table")
    other = _other_pending(table)

    run = sandbox.run_dag(sandbox.load_dag(DAG_ID), conf={"table_uri": table, "leave_pending": True})

    assert run.state == "failed", run  # the failure stays visible although the rollback succeeded
    assert run.task_state("upsert") == "failed"
    assert run.task_state("rollback_failed_upsert") == "success"
    out = run.xcom("rollback_failed_upsert")
    assert out["batch_id"] == run.batch_id("upsert")
    assert out["rolled_back"] and out["rolled_back"] != other
    tl = Table.load(table).timeline.reload()
    assert [i.timestamp for i in tl.pending()] == [other]
    assert [tl.read_metadata(i)["rolled_back"] for i in tl.completed([Action.ROLLBACK])] == [out["rolled_back"]]
    assert not [f for f in os.listdir(table) if f.endswith(".parquet")], "the half-written file is deleted"


def test_rollback_branch_is_a_noop_when_nothing_is_pending(tmp_path, airflow_db):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox
    from spark_jobs.table import Table

    table = str(tmp_path / "table")
    run = sandbox.run_dag(sandbox.load_dag(DAG_ID), conf={"table_uri": table, "leave_pending": False})

    assert run.state == "failed", run
    assert run.task_state("rollback_failed_upsert") == "success"
    assert run.xcom("rollback_failed_upsert")["rolled_back"] is None
    assert Table.load(table).timeline.reload().instants == []
