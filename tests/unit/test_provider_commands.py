"""The exact spark-submit command each operator builds: embedded default, connection master,
cluster master, master override, extra Spark conf, a delegated Spark connection, cluster
deploy mode, and connection defaults for new tables. Argument building only: nothing runs."""

from __future__ import annotations

import json
import os
import sys

import pytest

from airflow_provider_bucketindex import packaging
from airflow_provider_bucketindex.demo import sandbox
from spark_jobs.resources import local_driver_memory

pytestmark = pytest.mark.unit

SUBMIT = packaging.submit_script()
PY = sys.executable
CONN = "AIRFLOW_CONN_BUCKETINDEX_DEFAULT"


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()  # before the first airflow import (no-op if a tier set it up)
    from airflow_provider_bucketindex import operators

    return operators


@pytest.fixture()
def zip_path() -> str:
    return packaging.spark_jobs_zip()


@pytest.fixture()
def spark_submit() -> str:
    return packaging.resolve_spark_binary("spark-submit")


#: a local master runs the executors inside the driver JVM: its heap is sized to the machine
LOCAL_HEAP = local_driver_memory()


def _conn(monkeypatch, conn_id="bucketindex_default", **body) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "bucketindex", **body}))


def _upsert(ops, **kw):  # type: ignore[no-untyped-def]
    args = dict(task_id="upsert", table_uri="/lake/t", source_uri="/landing/2024-01-01", record_key="id")
    args.update(kw)
    return ops.UpsertWithIndexOperator(**args)


def test_spark_submit_is_found_in_the_environment_bin(spark_submit):  # type: ignore[no-untyped-def]
    assert spark_submit == os.path.join(os.path.dirname(PY), "spark-submit")


def test_embedded_default_without_a_connection(ops, monkeypatch, zip_path, spark_submit, tmp_path):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(CONN, raising=False)
    op = _upsert(ops, table_uri=str(tmp_path / "t"))
    assert op.spark_submit_command("b-1") == [
        spark_submit,
        "--master", "local[*]",
        "--py-files", zip_path,
        "--driver-memory", LOCAL_HEAP,
        "--name", "bucketindex-upsert",
        SUBMIT,
        "upsert", str(tmp_path / "t"), "/landing/2024-01-01", "--record-key", "id", "--batch-id", "b-1",
        "--engine", "spark",  # the operator decided: the job does not decide again
    ]  # fmt: skip
    sub = op.hook.spark_submit_hook("upsert", [])
    sub.command(SUBMIT)  # the Spark hook decides the process env while building
    assert sub.process_env == {"PYSPARK_PYTHON": PY, "PYSPARK_DRIVER_PYTHON": PY}


def test_all_upsert_options_in_cli_order(ops, monkeypatch, zip_path, spark_submit, tmp_path):  # type: ignore[no-untyped-def]
    _conn(monkeypatch, host="local[2]")
    op = _upsert(
        ops,
        table_uri=str(tmp_path / "t"),
        record_key=["region", "id"],
        precombine_field="ts",
        partition_field="region",
        index="bucket",
        num_buckets=8,
        source_format="json",
        delete_field="is_deleted",
        batch_id="explicit",
    )
    assert op.spark_submit_command("explicit") == [
        spark_submit,
        "--master", "local[2]",
        "--py-files", zip_path,
        "--driver-memory", LOCAL_HEAP,
        "--name", "bucketindex-upsert",
        SUBMIT,
        "upsert", str(tmp_path / "t"), "/landing/2024-01-01",
        "--record-key", "region,id",
        "--precombine-field", "ts",
        "--partition-field", "region",
        "--index", "bucket",
        "--num-buckets", "8",
        "--source-format", "json",
        "--delete-field", "is_deleted",
        "--batch-id", "explicit",
        "--engine", "spark",
    ]  # fmt: skip


def test_cluster_master_from_the_connection_with_extra_conf(ops, monkeypatch, zip_path, spark_submit, tmp_path):  # type: ignore[no-untyped-def]
    _conn(
        monkeypatch,
        host="spark://10.0.0.5",
        port=7077,
        extra={"conf": {"spark.executor.memory": "2g", "spark.sql.shuffle.partitions": "64"}},
    )
    op = _upsert(
        ops,
        table_uri=str(tmp_path / "t"),
        conf={"spark.sql.shuffle.partitions": "8", "spark.eventLog.enabled": "true"},
        executor_memory="3g",
        total_executor_cores=4,
        name="nightly-ingest",
    )
    assert op.spark_submit_command("b") == [
        spark_submit,
        "--master", "spark://10.0.0.5:7077",
        "--conf", "spark.executor.memory=2g",
        "--conf", "spark.sql.shuffle.partitions=8",  # the task's conf wins over the connection's
        "--conf", "spark.eventLog.enabled=true",
        "--py-files", zip_path,
        "--total-executor-cores", "4",
        "--executor-memory", "3g",
        "--name", "nightly-ingest",
        SUBMIT,
        "upsert", str(tmp_path / "t"), "/landing/2024-01-01", "--record-key", "id", "--batch-id", "b",
        "--engine", "spark",
    ]  # fmt: skip


def test_master_override_beats_the_connection(ops, monkeypatch, zip_path, spark_submit, tmp_path):  # type: ignore[no-untyped-def]
    _conn(monkeypatch, host="local[2]")
    op = _upsert(ops, table_uri=str(tmp_path / "t"), master="spark://127.0.0.1:7078")
    assert op.spark_submit_command("b")[:3] == [spark_submit, "--master", "spark://127.0.0.1:7078"]


def test_bare_host_means_a_standalone_master(ops, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    _conn(monkeypatch, host="sparkmaster", port=7077)
    assert _upsert(ops, table_uri=str(tmp_path / "t")).spark_submit_command("b")[1:3] == [
        "--master",
        "spark://sparkmaster:7077",
    ]


def test_standalone_cluster_deploy_mode_sets_python_as_spark_conf(ops, monkeypatch, zip_path, spark_submit):  # type: ignore[no-untyped-def]
    _conn(monkeypatch, host="spark://10.0.0.5:7077", extra={"deploy-mode": "cluster", "python": "/opt/py/bin/python"})
    op = ops.ValidateTableOperator(task_id="validate", table_uri="s3://bucket/t")
    assert op.spark_submit_command() == [
        spark_submit,
        "--master", "spark://10.0.0.5:7077",
        "--conf", "spark.pyspark.python=/opt/py/bin/python",
        "--conf", "spark.pyspark.driver.python=/opt/py/bin/python",
        "--py-files", zip_path,
        "--name", "bucketindex-validate",
        "--deploy-mode", "cluster",
        SUBMIT,
        "validate", "s3://bucket/t",
    ]  # fmt: skip
    sub = op.hook.spark_submit_hook("validate", [])
    sub.command(SUBMIT)
    assert sub.process_env is None  # the Spark provider refuses env vars there


def test_validate_command(ops, monkeypatch, zip_path, spark_submit):  # type: ignore[no-untyped-def]
    _conn(monkeypatch, host="local[2]", extra={"conf": '{"spark.ui.enabled": "false"}'})
    op = ops.ValidateTableOperator(task_id="validate", table_uri="/lake/t")
    assert op.spark_submit_command() == [
        spark_submit,
        "--master", "local[2]",
        "--conf", "spark.ui.enabled=false",
        "--py-files", zip_path,
        "--driver-memory", LOCAL_HEAP,
        "--name", "bucketindex-validate",
        SUBMIT,
        "validate", "/lake/t",
    ]  # fmt: skip


def test_delegating_to_a_spark_connection(ops, monkeypatch, zip_path, spark_submit):  # type: ignore[no-untyped-def]
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_YARN",
        json.dumps({"conn_type": "spark", "host": "yarn", "extra": {"queue": "etl", "deploy-mode": "client"}}),
    )
    _conn(monkeypatch, "lake", extra={"spark_conn_id": "spark_yarn", "python": "/opt/py/bin/python"})
    op = ops.ValidateTableOperator(task_id="validate", table_uri="hdfs:///lake/t", conn_id="lake")
    assert op.spark_submit_command() == [
        spark_submit,
        "--master", "yarn",
        "--conf", "spark.yarn.appMasterEnv.PYSPARK_PYTHON=/opt/py/bin/python",
        "--conf", "spark.yarn.appMasterEnv.PYSPARK_DRIVER_PYTHON=/opt/py/bin/python",
        "--py-files", zip_path,
        "--driver-memory", LOCAL_HEAP,
        "--name", "bucketindex-validate",
        "--queue", "etl",
        "--deploy-mode", "client",
        SUBMIT,
        "validate", "hdfs:///lake/t",
    ]  # fmt: skip


def test_connection_table_defaults_apply_only_to_new_tables(ops, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    from spark_jobs.table import Table, TableConfig

    _conn(monkeypatch, host="local[2]", extra={"index": "bucket", "num-buckets": 4, "source-format": "json",
                                               "table-type": "merge_on_read"})
    table = str(tmp_path / "t")
    op = _upsert(ops, table_uri=table)
    cmd = op.spark_submit_command("b")
    assert cmd[cmd.index("upsert") :] == [
        "upsert", table, "/landing/2024-01-01", "--record-key", "id",
        "--index", "bucket", "--num-buckets", "4", "--table-type", "merge_on_read", "--source-format", "json",
        "--batch-id", "b", "--engine", "spark",
    ]  # fmt: skip
    Table.open(table).create(TableConfig(record_key_fields=["id"], index_type="record"))
    cmd = op.spark_submit_command("b")
    assert cmd[cmd.index("upsert") :] == [
        "upsert", table, "/landing/2024-01-01", "--record-key", "id", "--source-format", "json", "--batch-id", "b",
        "--engine", "spark",
    ]  # fmt: skip
    explicit = _upsert(ops, table_uri=table, source_format="parquet")
    assert "parquet" in explicit.spark_submit_command("b")


def test_secret_conf_values_are_masked(ops, monkeypatch):  # type: ignore[no-untyped-def]
    _conn(monkeypatch, host="local[2]", extra={"conf": {"spark.hadoop.fs.s3a.secret.key": "s3cr3t-value-123"}})
    op = ops.ValidateTableOperator(task_id="validate", table_uri="s3://b/t")
    cmd = op.spark_submit_command()
    assert "--conf" in cmd and "spark.hadoop.fs.s3a.secret.key=s3cr3t-value-123" in cmd  # the real value runs
    sub = op.hook.spark_submit_hook("validate", ["s3://b/t"])
    logged = sub.mask(" ".join(cmd))
    assert "s3cr3t-value-123" not in logged and "******" in logged
    from airflow.sdk._shared.secrets_masker import redact

    assert "s3cr3t-value-123" not in str(redact("conf value s3cr3t-value-123"))


def test_unknown_connection_is_an_error_but_missing_default_is_not(ops, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowNotFoundException

    monkeypatch.delenv(CONN, raising=False)
    op = ops.ValidateTableOperator(task_id="v", table_uri="/t", conn_id="no_such_connection")
    with pytest.raises(AirflowNotFoundException):
        op.spark_submit_command()


def test_disallowed_spark_binary_is_refused(ops, monkeypatch):  # type: ignore[no-untyped-def]
    _conn(monkeypatch, host="local[2]", extra={"spark-binary": "/bin/sh"})
    op = ops.ValidateTableOperator(task_id="v", table_uri="/t")
    with pytest.raises(ValueError, match="spark binary must be one of"):
        op.spark_submit_command()
