"""The Spark Connect path of the operators: which connection selects it, the exact client
command (``python -m spark_jobs.cli VERB ... --remote URL``, the URL as the Spark provider's
SparkConnectHook builds it, its token kept off the command line), and -- with the command
replaced by a stand-in process -- the exit status mapping and on_kill. Nothing reaches Spark."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest

from airflow_provider_bucketindex.demo import sandbox

pytestmark = pytest.mark.unit

PY = sys.executable
TOKEN = "t0ken-s3cret-4711"


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    return operators


def _spark_connect(monkeypatch, conn_id="spark_connect_lake", **body) -> None:  # type: ignore[no-untyped-def]
    body = {"conn_type": "spark_connect", "host": "connect.lake.internal", "port": 15002, **body}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(body))


def _upsert(ops, **kw):  # type: ignore[no-untyped-def]
    args = dict(task_id="upsert", table_uri="/lake/t", source_uri="/landing/2024-01-01", record_key="id")
    args.update(kw)
    return ops.UpsertWithIndexOperator(**args)


def test_a_spark_connect_connection_runs_the_cli_with_remote(ops, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    _spark_connect(monkeypatch, login="etl", password=TOKEN, extra={"use_ssl": True})
    op = _upsert(ops, table_uri=str(tmp_path / "t"), conn_id="spark_connect_lake", precombine_field="ts")
    cmd = op.spark_submit_command("b-1")
    assert cmd == [
        PY, "-m", "spark_jobs.cli",
        "upsert", str(tmp_path / "t"), "/landing/2024-01-01", "--record-key", "id", "--precombine-field", "ts",
        "--batch-id", "b-1", "--engine", "spark",
        "--remote", "sc://connect.lake.internal:15002/;user_id=etl;use_ssl=True",
    ]  # fmt: skip
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    provider_url = SparkConnectHook("spark_connect_lake").get_connection_url()
    assert provider_url == f"sc://connect.lake.internal:15002/;user_id=etl;token={TOKEN};use_ssl=True"
    assert TOKEN not in " ".join(cmd)  # the token travels in the environment, masked in logs
    env = op.hook.connect_env()
    assert env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] == TOKEN
    from airflow.sdk._shared.secrets_masker import redact

    assert TOKEN not in str(redact(f"token {TOKEN}"))


def test_validate_over_spark_connect_without_credentials(ops, monkeypatch):  # type: ignore[no-untyped-def]
    _spark_connect(monkeypatch, host="sc://127.0.0.1", port=15999)
    monkeypatch.delenv("SPARK_CONNECT_AUTHENTICATE_TOKEN", raising=False)
    op = ops.ValidateTableOperator(task_id="validate", table_uri="s3://b/t", conn_id="spark_connect_lake")
    assert op.spark_submit_command() == [PY, "-m", "spark_jobs.cli", "validate", "s3://b/t", "--remote", "sc://127.0.0.1:15999/"]
    assert "SPARK_CONNECT_AUTHENTICATE_TOKEN" not in op.hook.connect_env()


def test_a_bucketindex_connection_delegating_to_spark_connect_keeps_its_own_extras(ops, monkeypatch):  # type: ignore[no-untyped-def]
    _spark_connect(monkeypatch)
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps({
        "conn_type": "bucketindex",
        "extra": {"spark_conn_id": "spark_connect_lake", "python": "/opt/py/bin/python", "index": "bucket", "num-buckets": 4},
    }))  # fmt: skip
    op = _upsert(ops, conn_id="lake", table_uri="/nonexistent/lake/t")
    assert op.spark_submit_command("b") == [
        "/opt/py/bin/python", "-m", "spark_jobs.cli",
        "upsert", "/nonexistent/lake/t", "/landing/2024-01-01", "--record-key", "id", "--index", "bucket",
        "--num-buckets", "4", "--batch-id", "b", "--engine", "spark",
        "--remote", "sc://connect.lake.internal:15002/",
    ]  # fmt: skip


def test_an_sc_master_override_selects_spark_connect_and_classic_stays_classic(ops, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    op = ops.ValidateTableOperator(task_id="v", table_uri="/t", master=f"sc://10.0.0.5:15002/;token={TOKEN}")
    assert op.spark_submit_command() == [PY, "-m", "spark_jobs.cli", "validate", "/t", "--remote", "sc://10.0.0.5:15002/"]
    assert op.hook.connect_env()["SPARK_CONNECT_AUTHENTICATE_TOKEN"] == TOKEN
    classic = ops.ValidateTableOperator(task_id="v", table_uri="/t")
    assert os.path.basename(classic.spark_submit_command()[0]) == "spark-submit"


FAKE_CLIENT = """\
import os, signal, sys, time
print("2026-01-01 00:00:00,000 INFO bucketindex.upsert: phase validate 10 ms", flush=True)
if os.environ.get("FAKE_RC"):
    print("bucketindex: error: " + os.environ["FAKE_MSG"], file=sys.stderr, flush=True)
    sys.exit(int(os.environ["FAKE_RC"]))
def term(signum, frame):
    open(os.environ["FAKE_TERM"], "w").write("interrupted server work")
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
# Published whole (write, then rename): the test polls for the name and reads
# the pid at once, and an open-then-write could be seen empty in between.
open(os.environ["FAKE_TERM"] + ".starting", "w").write(str(os.getpid()))
os.replace(os.environ["FAKE_TERM"] + ".starting", os.environ["FAKE_TERM"] + ".started")
time.sleep(300)
"""


@pytest.fixture()
def fake_client(ops, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    """The Connect path with the client command replaced by a stand-in script."""
    from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook

    script = tmp_path / "client.py"
    script.write_text(FAKE_CLIENT)
    monkeypatch.setattr(BucketIndexHook, "connect_command", lambda self, verb, args: [PY, str(script), verb, *args])
    _spark_connect(monkeypatch)
    monkeypatch.setenv("FAKE_TERM", str(tmp_path / "term"))
    return tmp_path


@pytest.mark.parametrize("rc,final", [(2, True), (3, False), (1, False)])
def test_exit_status_maps_as_on_the_classic_path(ops, fake_client, monkeypatch, rc, final):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from airflow_provider_bucketindex.hooks.bucketindex import SparkJobFailed

    monkeypatch.setenv("FAKE_RC", str(rc))
    monkeypatch.setenv("FAKE_MSG", "source /s does not exist")
    op = _upsert(ops, table_uri=str(fake_client / "t"), conn_id="spark_connect_lake", engine="spark")
    with pytest.raises(SparkJobFailed) as failed:
        op.hook.submit("upsert", op.build_args("b", table_exists=False))
    assert failed.value.returncode == rc and failed.value.reason == "bucketindex: error: source /s does not exist"
    from tests.unit.test_provider_operators import FakeTI

    with pytest.raises(AirflowException) as info:
        op.execute({"ti": FakeTI()})
    assert isinstance(info.value, AirflowFailException) is final


def test_on_kill_terminates_the_client_which_cleans_up(ops, fake_client):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.hooks.bucketindex import SparkJobFailed

    op = _upsert(ops, table_uri=str(fake_client / "t"), conn_id="spark_connect_lake")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            op.hook.submit("upsert", op.build_args("b", table_exists=False))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    started = fake_client / "term.started"
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(started.read_text())
    assert os.getsid(pid) == pid != os.getsid(0), "the client runs in a session of its own"
    op.on_kill()
    th.join(20)
    assert not th.is_alive()
    assert (fake_client / "term").read_text() == "interrupted server work"  # SIGTERM first, not SIGKILL
    assert len(errors) == 1 and isinstance(errors[0], SparkJobFailed) and errors[0].returncode == 143


def test_local_connect_server_sizes_its_heap_to_the_machine() -> None:
    """A local server runs every task in its driver JVM: Spark's 1 GiB default would fail a
    10M-row upsert, so ``connect-server`` sizes it as the classic CLI does, unless told."""
    from spark_jobs.jobs.connect import server_command
    from spark_jobs.resources import local_driver_memory

    cmd = server_command(15002, master="local[*]")
    assert f"spark.driver.memory={local_driver_memory()}" in cmd
    told = server_command(15002, master="local[2]", conf={"spark.driver.memory": "3g"})
    assert "spark.driver.memory=3g" in told and f"spark.driver.memory={local_driver_memory()}" not in told
    cluster = server_command(15002, master="spark://head:7077")
    assert not any(c.startswith("spark.driver.memory=") for c in cluster)
