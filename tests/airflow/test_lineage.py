"""OpenLineage through ``dag.test()`` (the OpenLineage provider is in the ``test`` extra):

* parent-job injection: the spark-submit command of a bucketindex job carries this task's
  OpenLineage job and run (``spark.openlineage.parent*``), as ``SparkSubmitOperator``'s does,
  so the OpenLineage Spark listener nests the Spark job under the Airflow task.
"""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.airflow


def _conf_of(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--conf")


def test_spark_submit_carries_the_tasks_openlineage_parent_job(tmp_path, airflow_db, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex import sandbox

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
