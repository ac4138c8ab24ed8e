"""OpenLineage through ``dag.test()`` (the OpenLineage provider is in the ``test`` extra):

* parent-job injection: the spark-submit command of a bucketindex job carries this task's
  OpenLineage job and run (``spark.openlineage.parent*``), as ``SparkSubmitOperator``'s does,
  so the OpenLineage Spark listener nests the Spark job under the Airflow task.
"""

from __future__ import annotations

import uuid
from urllib.parse import quote

import pytest

pytestmark = pytest.mark.airflow


def _conf_of(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--conf")


def test_spark_submit_carries_the_tasks_openlineage_parent_job(tmp_path, airflow_db, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox

    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO", "true")
    dag_id = "bucketindex_test_lineage_injection"
    run = sandbox.run_dag(sandbox.load_dag(dag_id), conf={"table_uri": str(tmp_path / "t")})
    assert run.state == "success", run

    run_ids = set()
    for task_id in ("explicit", "from_config"):
        conf = _conf_of(run.xcom(task_id))
        assert conf["spark.openlineage.parentJobName"] == f"{dag_id}.{task_id}"
        assert conf["spark.openlineage.parentJobNamespace"] == "default"
        assert conf["spark.openlineage.rootParentJobName"] == dag_id
        run_ids.add(str(uuid.UUID(conf["spark.openlineage.parentRunId"])))
        uuid.UUID(conf["spark.openlineage.rootParentRunId"])
    assert len(run_ids) == 2, "each task is its own OpenLineage run"

    user = _conf_of(run.xcom("user_set"))
    assert user["spark.openlineage.parentJobName"] == "mine"
    assert "spark.openlineage.parentRunId" not in user, "properties the user set are never mixed with injected ones"
    assert not [k for k in _conf_of(run.xcom("off")) if k.startswith("spark.openlineage.")]


def _committed(table_uri: str, batch_id: str) -> str:
    from spark_jobs.table import Action, Table, TableConfig

    t = Table.open(table_uri)
    t.create(TableConfig(record_key_fields=["id"]))
    inst = t.timeline.transition_to_inflight(t.timeline.create_requested(Action.COMMIT, {"batch_id": batch_id}))
    t.timeline.complete(inst, {"batch_id": batch_id, "counts": {"inserted": 7, "updated": 2, "deleted": 1}})
    return inst.timestamp


@pytest.mark.parametrize("spelling", ["{table}", "file://{quoted}/"], ids=["same-spelling", "file-uri-quoted-trailing-slash"])
def test_upsert_asset_event_triggers_the_table_updated_dag(tmp_path, airflow_db, monkeypatch, spelling):  # type: ignore[no-untyped-def]
    """The upsert's Asset event (through its default alias outlet) carries instant and batch id
    and queues the example DAG scheduled on the table's Asset, which then reads that event. The
    producer may spell the table otherwise than the consumer's ``table_asset`` (a percent-encoded
    ``file://`` URI with a trailing ``/`` against a plain path with a space): the ``bucketindex``
    scheme makes them one Asset (before it, ``file:///.../my%20events`` and ``file:///.../my events``
    were two)."""
    from airflow.models.asset import AssetDagRunQueue, AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_provider_bucketindex.demo import sandbox
    from airflow_provider_bucketindex.lineage import TABLE_UPDATES_ALIAS, table_asset_uri

    table = str(tmp_path / "my events")
    monkeypatch.setenv("BUCKETINDEX_TABLE_URI", table)  # the example consumer's Asset, read at parse
    instant = _committed(table, "batch-7")
    sandbox.unpause("bucketindex_table_updated")  # paused DAGs are not queued
    producer = sandbox.load_dag("bucketindex_test_asset_producer")
    assert [o.name for o in producer.get_task("upsert").outlets] == [TABLE_UPDATES_ALIAS]

    producer_table = spelling.format(table=table, quoted=quote(table))
    run = sandbox.run_dag(producer, conf={"table_uri": producer_table, "batch_id": "batch-7"})

    assert run.state == "success", run
    extra = {"instant": instant, "batch_id": "batch-7", "inserted": 7, "updated": 2, "deleted": 1}
    with create_session() as session:
        asset = session.scalars(select(AssetModel).where(AssetModel.uri == table_asset_uri(table))).one()
        assert asset.uri == asset.name == "bucketindex:file://" + quote(table)
        assert not session.scalars(select(AssetModel).where(AssetModel.uri.contains(str(tmp_path)),
                                                            AssetModel.id != asset.id)).all(), "one Asset"
        events = session.scalars(select(AssetEvent).where(AssetEvent.asset_id == asset.id)).all()
        assert [e.extra for e in events] == [extra]
        assert events[0].source_dag_id == producer.dag_id and events[0].source_task_id == "upsert"
        queued = session.scalars(select(AssetDagRunQueue.target_dag_id).where(
            AssetDagRunQueue.asset_id == asset.id)).all()
    assert queued == ["bucketindex_table_updated"], "the scheduler would now start the consumer"

    consumer = sandbox.run_dag(sandbox.load_dag("bucketindex_table_updated"))
    assert consumer.state == "success", consumer
    assert consumer.xcom("describe_commit") == {
        "table_uri": table,
        "commits": [{"instant": instant, "batch_id": "batch-7", "inserted": 7, "updated": 2, "deleted": 1}],
    }
