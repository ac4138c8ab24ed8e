"""The example ingest DAG through ``dag.test()`` with its Spark tasks on a Spark Connect
server: the operators pick the path from the connection (the Spark provider's
``spark_connect`` type), run ``spark_jobs.cli ... --remote`` as a local process -- no
spark-submit, no JVM in the task -- and the batch lands as the oracle says. (One run: the
job-level tests over Connect are in tests/connect.)"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

pytestmark = [pytest.mark.airflow, pytest.mark.connect, pytest.mark.timeout(600)]


def test_ingest_dag_over_spark_connect(connect_server, airflow_db, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sample_data, sandbox
    from airflow_provider_bucketindex.hooks import bucketindex
    from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook

    batches = sample_data.make_batches(1, 200, seed=23)
    landing = tmp_path / "landing"
    sample_data.write_batch(batches[0], str(landing / "2024-03-01"))
    table = str(tmp_path / "table")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_LAKE", json.dumps(
        {"conn_type": "spark_connect", "host": "127.0.0.1", "port": connect_server.port}))
    ran: list[list[str]] = []
    real_run = BucketIndexHook._run_connect

    def recording(self, verb, args):  # type: ignore[no-untyped-def]
        ran.append(self.connect_command(verb, args))
        return real_run(self, verb, args)

    monkeypatch.setattr(BucketIndexHook, "_run_connect", recording)
    monkeypatch.setattr(bucketindex.BucketIndexSparkSubmitHook, "submit",
                        lambda *a, **k: pytest.fail("spark-submit must not run on the Spark Connect path"))

    dag = sandbox.load_dag("bucketindex_ingest")
    for task_id in ("upsert", "validate"):
        dag.get_task(task_id).conn_id = "spark_connect_lake"
        dag.get_task(task_id).engine = "spark"  # the subject is Connect: auto would run this small batch in the task
    run = sandbox.run_dag(dag, datetime(2024, 3, 1, tzinfo=timezone.utc), {"table_uri": table, "landing_uri": str(landing)})
    assert run.state == "success", run
    assert run.task_state("upsert") == "success" and run.task_state("validate") == "success"
    assert run.task_state("rollback_failed_upsert") == "skipped"
    assert sample_data.compare(table, batches) == []
    assert run.xcom("upsert", "counts") == {"inserted": len(sample_data.expected_rows(batches)), "updated": 0, "deleted": 0}
    assert [c[3] for c in ran] == ["upsert", "validate"]
    assert all(c[-2:] == ["--remote", f"sc://127.0.0.1:{connect_server.port}/"] for c in ran)
