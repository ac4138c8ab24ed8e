"""``BucketIndexHook.test_connection`` (the connection form's Test button, ``airflow connections
test``) against connections stored in the private Airflow's metadata DB and run the way Airflow runs
the test (``Connection.test_connection()``: the hook class found through the provider registry):

* a standalone master and a Spark Connect server are TCP-checked (a listening socket on loopback
  stands in: nothing is submitted, no JVM starts) -- reachable, then closed;
* the storage side resolves the options (an ``aws`` connection with a ``role_arn``, assumed through
  the Amazon provider's hook on the moto server) and lists the connection's ``location`` -- an
  ``s3://`` prefix on the moto server and a local folder, with spaces, ``%``, ``+`` and non-ASCII in
  their names; a missing bucket or folder fails with a message naming it.
"""

from __future__ import annotations

import json
import socket
import uuid
from contextlib import closing

import pytest

pytestmark = [pytest.mark.airflow, pytest.mark.s3, pytest.mark.timeout(300)]

ROLE = "arn:aws:iam::123456789012:role/lake-reader"
AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN", "AWS_PROFILE")


@pytest.fixture()
def stored(airflow_db, monkeypatch):  # type: ignore[no-untyped-def]
    """Store connections in the metadata DB (removed after the test), read as the API server that
    runs the Test button reads them (its process context: the metadata DB is a secrets backend)."""
    from airflow.models import Connection
    from airflow.utils.session import create_session

    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")

    ids: list[str] = []

    def store(conn_id: str, conn_type: str, *, host: str | None = None, port: int | None = None,
              login: str | None = None, password: str | None = None, extra: dict | None = None) -> str:  # type: ignore[type-arg]
        with create_session() as session:
            session.merge(Connection(conn_id=conn_id, conn_type=conn_type, host=host, port=port, login=login,
                                     password=password, extra=json.dumps(extra or {})))
        ids.append(conn_id)
        return conn_id

    yield store
    from sqlalchemy import delete

    with create_session() as session:
        session.execute(delete(Connection).where(Connection.conn_id.in_(ids)))


def _test(conn_id: str) -> tuple[bool, str]:
    """What the Test button runs: the stored connection's ``test_connection()``."""
    from airflow.models import Connection

    conn = Connection.get_connection_from_secrets(conn_id)
    return conn.test_connection()


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def _no_aws_env(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    for var in AWS_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))


def test_a_standalone_master_and_an_s3_location_through_an_assumed_role(stored, s3_server, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook

    bucket = s3_server.create_bucket(f"conn-{uuid.uuid4().hex[:10]}")
    client = s3_server.client()
    for key in ("tables é/a+b 100%/x.parquet", "tables é/other/y", "elsewhere/z"):
        client.put_object(Bucket=bucket, Key=key, Body=b"1")
    _no_aws_env(monkeypatch, tmp_path)
    stored("lake_s3_role", "aws", login="AKIABASE", password="base-secret", extra={
        "endpoint_url": s3_server.endpoint, "region_name": s3_server.region, "role_arn": ROLE,
        "service_config": {"sts": {"endpoint_url": s3_server.endpoint}}})
    master = _listener()
    port = master.getsockname()[1]
    stored("bi_cluster", "bucketindex", host="spark://127.0.0.1", port=port, extra={
        "storage_conn_id": "lake_s3_role", "location": f"s3://{bucket}/tables é"})
    with closing(master):
        ok, message = _test("bi_cluster")
        assert ok, message
        assert f"Spark master spark://127.0.0.1:{port}: reachable (127.0.0.1:{port})" in message
        assert f"storage: listed s3://{bucket}/tables é (2 entries)" in message
        # the listing used the role's keys: the hook's options are the assumed role's
        assert BucketIndexHook("bi_cluster").storage_settings()["access_key_id"].startswith("ASIA")
    ok, message = _test("bi_cluster")  # the master is gone
    assert not ok and f"Spark master spark://127.0.0.1:{port}: not reachable (127.0.0.1:{port}:" in message
    assert "refused" in message.lower() and "\n" not in message

    stored("bi_no_bucket", "bucketindex", host="spark://127.0.0.1", port=port, extra={
        "storage_conn_id": "lake_s3_role", "location": f"s3://{bucket}-absent/t"})
    ok, message = _test("bi_no_bucket")
    assert not ok and f"{bucket}-absent" in message and "\n" not in message


def test_an_ha_master_list_needs_one_live_master_and_spark_connect_is_checked(stored):  # type: ignore[no-untyped-def]
    live = _listener()
    dead = _listener()
    dead_port = dead.getsockname()[1]
    dead.close()
    live_port = live.getsockname()[1]
    stored("bi_ha", "bucketindex", host=f"spark://127.0.0.1:{dead_port},127.0.0.1:{live_port}")
    stored("sc_lake", "spark_connect", host="127.0.0.1", port=live_port)
    stored("bi_via_sc", "bucketindex", extra={"spark_conn_id": "sc_lake"})
    with closing(live):
        ok, message = _test("bi_ha")
        assert ok and f"reachable (127.0.0.1:{live_port})" in message, message
        ok, message = _test("bi_via_sc")
        assert ok and f"Spark Connect sc://127.0.0.1:{live_port}/: reachable" in message, message
    ok, message = _test("bi_via_sc")
    assert not ok and f"Spark Connect sc://127.0.0.1:{live_port}/: not reachable" in message


def test_a_local_master_and_a_local_location(stored, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    folder = tmp_path / "lake é 50%" / "t+1"
    (folder / "a b").mkdir(parents=True)
    (folder / "ü.parquet").write_bytes(b"")
    stored("bi_local", "bucketindex", host="local[2]", extra={"location": str(folder)})
    ok, message = _test("bi_local")
    assert ok, message
    from airflow_provider_bucketindex import packaging

    assert f"Spark local[2]: {packaging.resolve_spark_binary()} (a local master runs in the worker)" in message
    assert f"storage: listed {folder} (2 entries)" in message
    stored("bi_local_missing", "bucketindex", host="local[2]", extra={"location": str(tmp_path / "absent dir")})
    ok, message = _test("bi_local_missing")
    assert not ok and f"storage: {tmp_path / 'absent dir'} does not exist" in message
    # yarn without the Hadoop configuration spark-submit needs
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    stored("bi_yarn", "bucketindex", host="yarn")
    ok, message = _test("bi_yarn")
    assert not ok and "HADOOP_CONF_DIR" in message
