"""``@task.bucketindex_upsert`` and ``BucketIndexHook.get_df`` / ``get_dataset`` through ``dag.test()``
(issue 40, item 4), against the oracle (``tests/oracle.py``), on the in-process Arrow engine.

Keys with spaces, ``/``, ``%`` and non-ASCII letters; null values; an in-batch duplicate, a stale
update and a delete. The DAGs are ``tests/airflow/dags/bucketindex_test_taskflow.py``.
"""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.oracle import reduce_batches

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]


def _row(key: str, ts: int, amount: float | None, *, name: str | None = "n", deleted: bool = False) -> dict:  # type: ignore[type-arg]
    return {"id": key, "name": name, "amount": amount, "ts": ts, "is_deleted": deleted}


BATCH1 = [_row("a b", 1, 1.0), _row("x/y", 1, None), _row("p%q", 1, 3.0), _row("ünï ✓", 1, 4.0, name=None),
          _row("plain", 1, 5.0)]
BATCH2 = [
    _row("a b", 3, 10.5), _row("a b", 2, 99.0),  # in-batch duplicate: ts 3 wins
    _row("p%q", 0, 77.0),  # stale: the stored row stays
    _row("plain", 2, None, deleted=True),  # deleted
    _row("new ü/1%", 2, None, name=None),  # inserted, nulls
]


def _expected(*batches: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    state = reduce_batches(batches, key="id", precombine="ts", delete_field="is_deleted")
    return [state[k] for k in sorted(state)]


@pytest.mark.parametrize("kind,df_type", [("arrow", "pandas"), ("pandas", "polars"), ("polars", "pandas"),
                                          ("path", "polars")])
def test_decorator_upserts_what_the_function_returns_and_get_df_reads_it(tmp_path, airflow_db, kind, df_type):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox

    dag = sandbox.load_dag("bucketindex_test_taskflow")
    assert type(dag.get_task("upsert")).__name__ == "_BucketIndexUpsertDecoratedOperator"
    table = str(tmp_path / "orders é 100%")
    conf = {"table_uri": table, "rows": BATCH1, "kind": kind, "df_type": df_type,
            "scratch": str(tmp_path / "scratch 1")}

    run1 = sandbox.run_dag(dag, conf=conf)

    assert run1.state == "success", run1
    summary = run1.xcom("upsert")
    # an in-memory batch has no location: its id is the run's alone; a returned path is named by its location
    source = str(tmp_path / "scratch 1" / "batch 1 é%.parquet") if kind == "path" else None
    assert summary["engine"] == "arrow" and summary["batch_id"] == run1.batch_id("upsert", source=source)
    assert ("/src-" in summary["batch_id"]) == (kind == "path")
    assert (summary["inserted"], summary["updated"], summary["deleted"]) == (len(BATCH1), 0, 0)
    read1 = run1.xcom("read")
    assert read1["latest"] == _expected(BATCH1)
    assert read1["dataset_rows"] == len(BATCH1) and read1["type"] == df_type

    run2 = sandbox.run_dag(dag, conf={**conf, "rows": BATCH2, "as_of": summary["instant"]})

    assert run2.state == "success", run2
    assert run2.xcom("upsert")["instant"] > summary["instant"]
    read2 = run2.xcom("read")
    expected = _expected(BATCH1, BATCH2)
    assert read2["latest"] == expected
    assert {r["id"]: r["amount"] for r in expected}["a b"] == 10.5 and "plain" not in {r["id"] for r in expected}
    assert read2["as_of"] == _expected(BATCH1), "as_of reads the first commit's snapshot"
    assert read2["dataset_rows"] == len(expected)
    if kind == "path":  # the function's own file is the source: left where it wrote it
        assert (tmp_path / "scratch 1" / "batch 1 é%.parquet").exists()


def test_a_null_key_fails_the_decorated_task_and_writes_nothing(tmp_path, airflow_db):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox

    table = tmp_path / "t"
    run = sandbox.run_dag(sandbox.load_dag("bucketindex_test_taskflow"),
                          conf={"table_uri": str(table), "rows": [_row("k", 1, 1.0), {**_row("x", 1, 2.0), "id": None}]})

    assert run.state == "failed" and run.task_state("upsert") == "failed", run
    assert run.tasks["upsert"]["try_number"] == 1, "bad input (a null key) must not be retried"
    assert run.task_state("read") == "upstream_failed"
    assert not (table / ".bucketindex").exists() or not any((table / ".bucketindex" / "timeline").glob("*.commit"))


def test_an_in_memory_batch_is_not_sent_to_a_cluster_that_cannot_read_it(tmp_path, airflow_db, monkeypatch):  # type: ignore[no-untyped-def]
    """engine='spark' with a cluster master: the worker's temporary file is out of the cluster's
    reach, so the task fails before submitting (the hook's ``submit`` is replaced by a recorder to
    prove nothing is submitted)."""
    from airflow_provider_bucketindex.demo import sandbox
    import airflow_provider_bucketindex.hooks.bucketindex as hookmod

    started = []
    monkeypatch.setattr(hookmod.BucketIndexHook, "submit", lambda self, *a, **k: started.append(a))
    run = sandbox.run_dag(sandbox.load_dag("bucketindex_test_taskflow_spark"),
                          conf={"table_uri": str(tmp_path / "t"), "rows": [_row("k", 1, 1.0)]})

    assert run.task_state("upsert_on_a_cluster") == "failed", run
    assert started == []
    assert not (tmp_path / "t" / ".bucketindex").exists()


AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE")


@pytest.mark.s3
def test_object_storage_path_source_on_s3_through_its_connection(airflow_db, bucket, s3_server, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    """The function returns ``ObjectStoragePath(s3://bucket/key, conn_id="lake_s3")``: the upsert reads
    ``s3://bucket/key`` (not ``lake_s3@bucket``) with that connection's keys and endpoint, and writes
    the table on the same store; ``get_df`` of an ``ObjectStoragePath`` table reads it back. Neither
    the environment nor the ``bucketindex`` connection leads to the store."""
    from airflow_provider_bucketindex.demo import sandbox
    from spark_jobs.api import Table

    name = bucket.split("://", 1)[1]
    schema = pa.schema([("id", pa.string()), ("name", pa.string()), ("amount", pa.float64()), ("ts", pa.int64()),
                        ("is_deleted", pa.bool_())])
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(BATCH1, schema=schema), buf)
    key = "landing/day 1 é/part%20 0.parquet"
    s3_server.client().put_object(Bucket=name, Key=key, Body=buf.getvalue())
    opts = s3_server.options()
    for var in AWS_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_S3", json.dumps({
        "conn_type": "aws", "login": opts["access_key_id"], "password": opts["secret_access_key"],
        "extra": {"endpoint_url": opts["endpoint_url"], "region_name": opts["region"]}}))
    monkeypatch.setenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", sandbox.connection_json("local[2]"))
    table_uri = f"{bucket}/tables/orders é"

    table2_uri = f"{bucket}/tables/classic"
    run = sandbox.run_dag(sandbox.load_dag("bucketindex_test_taskflow_s3"),
                          conf={"table_uri": table_uri, "table2_uri": table2_uri, "source_uri": f"{bucket}/{key}",
                                "conn_id": "lake_s3"})

    assert run.state == "success", run
    assert run.xcom("landed")["inserted"] == len(BATCH1)
    assert run.xcom("landed")["table_uri"] == table_uri
    assert run.xcom("read_back") == _expected(BATCH1)
    stored = Table(table_uri, storage_options=opts).read().to_pylist()  # read apart from the provider
    assert sorted((r["id"], r["amount"]) for r in stored) == sorted((r["id"], r["amount"]) for r in BATCH1)
    assert run.xcom("classic")["inserted"] == len(BATCH1)  # an ObjectStoragePath through XCom, same mapping
    stored2 = Table(table2_uri, storage_options=opts).read().to_pylist()
    assert sorted((r["id"], r["amount"]) for r in stored2) == sorted((r["id"], r["amount"]) for r in BATCH1)
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=name).get("Contents", [])]
    assert keys and all(k.startswith(("landing/day 1 é/", "tables/orders é/", "tables/classic/")) for k in keys), keys
