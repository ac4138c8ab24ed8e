"""End to end on object storage: the example ingest DAG through ``dag.test()`` with its table and its
landing folder on the S3-compatible test server (moto, loopback), the store reached ONLY through
Airflow connections -- ``bucketindex_default``'s ``storage_conn_id`` extra naming an ``aws``
connection (login/password = keys, extras ``endpoint_url``/``region_name``) -- with no ``AWS_*``
variable and no AWS config file in the environment of the Airflow part.

Two scheduled runs on the in-process Arrow engine (``engine="arrow"``: no spark-submit), each
checked against the oracle (``tests/oracle.py``) and with ``validate``; keys and partition
values with spaces, ``/``, ``%``, ``+``, non-ASCII letters; nulls; in-batch duplicates; a stale
update; a delete.
"""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.oracle import reduce_batches, rows_by_identity

pytestmark = [pytest.mark.airflow, pytest.mark.s3, pytest.mark.timeout(300)]

INGEST = "bucketindex_ingest"
D1, D2 = (datetime(2024, 3, d, tzinfo=timezone.utc) for d in (1, 2))
SCHEMA = pa.schema([("id", pa.string()), ("name", pa.string()), ("amount", pa.float64()), ("region", pa.string()),
                    ("ts", pa.int64()), ("is_deleted", pa.bool_())])


def _row(key: str, region: str, ts: int, amount: float | None, *, name: str | None = "n",
         deleted: bool = False) -> dict:  # type: ignore[type-arg]
    return {"id": key, "name": name, "amount": amount, "region": region, "ts": ts, "is_deleted": deleted}


BATCH1 = [
    _row("a b", "são paulo", 1, 1.0), _row("x/y", "a/b c", 1, None), _row("p%q", "50%", 1, 3.0),
    _row("m+n", "x+y", 1, 4.0, name=None), _row("ünï ✓", "são paulo", 1, 5.0), _row("plain", "a/b c", 1, 6.0),
]
BATCH2 = [
    _row("a b", "são paulo", 3, 10.5), _row("a b", "são paulo", 2, 99.0),  # in-batch duplicate: ts 3 wins
    _row("p%q", "50%", 0, 77.0),  # stale (ts 0 < 1): the stored row stays
    _row("m+n", "x+y", 2, None, deleted=True),  # deleted
    _row("new ü/1", "x+y", 2, None, name=None),  # inserted, nulls
]
AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE")


def _upload(s3_server, bucket: str, key: str, rows: list[dict]) -> None:  # type: ignore[no-untyped-def, type-arg]
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), buf)
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=buf.getvalue())


def _table_rows(table_uri: str, options: dict[str, str]) -> list[dict]:  # type: ignore[type-arg]
    """The latest snapshot's rows, read by this test with explicit options (its env has no AWS_*)."""
    from spark_jobs.io import storage
    from spark_jobs.table import Table

    storage.configure(options)
    try:
        t = Table.load(table_uri)
        parts = [pq.read_table(t.abs(s.path), filesystem=t.io.fs) for s in t.view().slices()]
    finally:
        storage.configure(None)
    rows = pa.concat_tables(parts, promote_options="permissive").to_pylist() if parts else []
    return [{k: v for k, v in r.items() if not k.startswith("_bi_") and k != "is_deleted"} for r in rows]


def _validate(table_uri: str, options: dict[str, str]) -> dict:  # type: ignore[type-arg]
    from spark_jobs.arrow_engine.validate import run_validate
    from spark_jobs.io import storage

    storage.configure(options)
    try:
        return run_validate(table_uri)
    finally:
        storage.configure(None)


def _expected(*batches: list[dict]) -> dict:  # type: ignore[type-arg]
    return reduce_batches(batches, key="id", precombine="ts", delete_field="is_deleted")


def test_ingest_dag_on_s3_through_the_airflow_connection(airflow_db, bucket, s3_server, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox
    from spark_jobs.io import storage

    name = bucket.split("://", 1)[1]
    _upload(s3_server, name, "landing/events été/2024-03-01/part 0.parquet", BATCH1)
    _upload(s3_server, name, "landing/events été/2024-03-02/part 0.parquet", BATCH2)
    table_uri = f"{bucket}/tables/orders été"
    conf = {"table_uri": table_uri, "landing_uri": f"{bucket}/landing/events été", "engine": "arrow",
            "partition_field": "region"}

    # the Airflow part: no AWS_* and no AWS config files -- only the connections lead to the store
    for var in AWS_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    opts = s3_server.options()
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_S3", json.dumps({
        "conn_type": "aws", "login": opts["access_key_id"], "password": opts["secret_access_key"],
        "extra": {"endpoint_url": opts["endpoint_url"], "region_name": opts["region"]}}))
    monkeypatch.setenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", sandbox.connection_json(
        "local[2]", conf=sandbox.LOCAL_TEST_CONF, storage_conn_id="lake_s3"))

    run1 = sandbox.run_dag(sandbox.load_dag(INGEST), D1, conf)

    assert run1.state == "success", run1
    assert (run1.task_state("upsert"), run1.task_state("validate"),
            run1.task_state("rollback_failed_upsert")) == ("success", "success", "skipped")
    summary = run1.xcom("upsert")
    assert summary["engine"] == "arrow" and summary["batch_id"] == run1.batch_id(
        "upsert", source=f"{conf['landing_uri']}/2024-03-01")
    assert run1.xcom("upsert", "counts") == {"inserted": len(BATCH1), "updated": 0, "deleted": 0}
    assert run1.xcom("validate")["valid"] is True and run1.xcom("validate")["engine"] == "arrow"
    assert storage.configured() == {}  # the tasks' options did not outlive them
    assert rows_by_identity(_table_rows(table_uri, opts)) == _expected(BATCH1)

    run2 = sandbox.run_dag(sandbox.load_dag(INGEST), D2, conf)

    assert run2.state == "success", run2
    assert run2.task_state("validate") == "success"
    # a b updated (ts 3 wins over its own duplicate), p%q stale (kept), m+n deleted, new ü/1 inserted.
    # The DAG's table has the default type, merge-on-read: its write did not read p%q's stored row,
    # so the stale row is counted as updated (README, "Table types"); the rows below show it lost
    assert run2.xcom("upsert", "counts") == {"inserted": 1, "updated": 2, "deleted": 1}
    expected = _expected(BATCH1, BATCH2)
    assert rows_by_identity(_table_rows(table_uri, opts)) == expected
    assert expected["a b"]["amount"] == 10.5 and expected["p%q"]["amount"] == 3.0 and "m+n" not in expected
    report = _validate(table_uri, opts)
    assert report["ok"] is True and report["rows"] == len(expected)
    # the landing batches and the table are all there is in the bucket: nothing written elsewhere
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=name).get("Contents", [])]
    assert keys and all(k.startswith(("landing/events été/", "tables/orders été/")) for k in keys), keys
