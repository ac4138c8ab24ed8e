"""The ingest DAG's upsert submitted to a standalone Spark cluster on loopback: executors in
a separate worker JVM import ``spark_jobs`` only from the ``--py-files`` zip, and the table
comes out equal to the oracle. Only the connection changes (DESIGN §1)."""

from __future__ import annotations

import glob
import os
import subprocess
from datetime import datetime, timezone

import pytest

from airflow_provider_bucketindex import packaging
from airflow_provider_bucketindex.demo import sample_data, sandbox

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def test_isolated_python_sees_spark_jobs_only_through_the_zip(isolated_python, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)  # not the repository root, where spark_jobs/ is a plain folder
    probe = ["-c", "import spark_jobs, pyarrow; print(spark_jobs.__file__)"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    without = subprocess.run([isolated_python, *probe], env=env, capture_output=True, text=True)
    assert without.returncode != 0 and "No module named 'spark_jobs'" in without.stderr
    zip_path = packaging.spark_jobs_zip()
    with_zip = subprocess.run([isolated_python, *probe], env={**env, "PYTHONPATH": zip_path}, capture_output=True, text=True)
    assert with_zip.returncode == 0, with_zip.stderr
    assert with_zip.stdout.strip().startswith(zip_path)


def test_ingest_dag_on_a_standalone_cluster(standalone_cluster, isolated_python, airflow_db, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    cluster = standalone_cluster
    # the cluster is shared by the module's tests (tests/cluster/test_durable_cluster.py runs its
    # job there too): this test's applications are the ones the master did not know before it
    known = {a["id"] for a in cluster.state()["completedapps"]}
    monkeypatch.chdir(tmp_path)  # the driver inherits the cwd: keep the source tree out of reach
    monkeypatch.setenv(
        "AIRFLOW_CONN_BUCKETINDEX_DEFAULT",
        sandbox.connection_json(
            "spark://127.0.0.1",
            port=cluster.port,
            python=isolated_python,
            conf={
                "spark.executor.memory": "512m",
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "4",
            },
        ),
    )
    batches = sample_data.make_batches(1, 200, seed=5)
    sample_data.write_batch(batches[0], str(tmp_path / "landing" / "2024-05-01"))
    table = str(tmp_path / "table")

    run = sandbox.run_dag(
        sandbox.load_dag("bucketindex_ingest"),
        datetime(2024, 5, 1, tzinfo=timezone.utc),
        # engine spark: the subject is the cluster (auto would run this small batch in the task)
        {"table_uri": table, "landing_uri": str(tmp_path / "landing"), "index": "record", "num_buckets": 4,
         "engine": "spark"},
    )

    assert run.state == "success", run
    assert run.task_state("upsert") == "success" and run.task_state("validate") == "success"
    assert sample_data.compare(table, batches) == []

    # both jobs ran as applications of the cluster (not in a local driver): upsert, then validate
    apps = sorted((a for a in cluster.state()["completedapps"] if a["id"] not in known), key=lambda a: a["starttime"])
    assert len(apps) == 2, apps
    assert all(a["state"] == "FINISHED" for a in apps), apps
    upsert_app = apps[0]["id"]
    fetched = glob.glob(str(cluster.work_dir / upsert_app / "*" / "spark_jobs-*.zip"))
    assert [os.path.basename(f) for f in fetched][:1] == [os.path.basename(packaging.spark_jobs_zip())], (
        "the executor fetched the spark_jobs zip shipped with --py-files"
    )
    executor_logs = "".join(open(f, errors="replace").read() for f in glob.glob(str(cluster.work_dir / upsert_app / "*" / "stderr")))
    assert "ModuleNotFoundError" not in executor_logs
