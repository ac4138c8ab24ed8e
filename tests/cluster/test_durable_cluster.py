"""Durable Spark work on a standalone cluster (issue 40 item 2's must-show, as close as this Spark
allows): the upsert's job is submitted through the operator to a real standalone master and
worker (tests/cluster/conftest.py), the task process is SIGKILLed while the job runs, and the
retry -- with the same task state store contents -- reattaches to the job, waits for it and reads
its commit from the timeline: one Spark application on the cluster, one commit of the batch, the
table equal to the oracle (the two batches reduced by key), ``validate`` clean.

Client deploy mode, not cluster deploy mode: the installed Spark refuses Python applications in
cluster deploy mode on a standalone master ("Cluster deploy mode is currently not supported for
python applications on standalone clusters"), so the driver runs in spark-submit's process
session on this host -- the identity kept is that session (``kind: process``), and the executors
run in the cluster's worker JVM. The standalone cluster-mode identity (``kind: standalone``, a
driver id polled and killed through the master) is asserted command by command in
tests/unit/test_provider_durable.py.

The "task process" is a Python process running the operator's ``execute`` with a real task state
store contract (a JSON file: the API server's store needs a running Airflow), as in
tests/spark/test_durable_submit.py (local mode); keys with spaces, ``/``, ``%``, ``+``, non-ASCII,
nulls and ``""`` in the batch, a key repeated within the batch and a delete. CI tier (tests/cluster/)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_bucketindex.demo import sandbox
from tests.oracle import reduce_batches

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900),
              pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")]

REPO = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("id", pa.string()), ("v", pa.int64()), ("note", pa.string()), ("ts", pa.int64()),
                    ("is_deleted", pa.bool_())])
KEYS = ["a b", "c/d", "e%f", "g+h", "ü-ß", "Zürich ☃", "plain"]

WORKER = """\
import os, sys
sys.path.insert(0, {root!r})
from airflow_provider_bucketindex.demo import sandbox
sandbox.isolate_before_import()
from pathlib import Path
from airflow_provider_bucketindex import operators
from tests.unit.test_provider_durable import TI, FileStore
op = operators.UpsertWithIndexOperator(task_id="upsert", table_uri={table!r}, source_uri={source!r}, record_key="id",
                                       precombine_field="ts", delete_field="is_deleted", engine="spark",
                                       job_poll_interval=0.5, env_vars={env!r})
op.execute({{"ti": TI(), "task_state_store": FileStore(Path({store!r}))}})
print("WORKER FINISHED")
"""


def _write(folder: Path, rows: list[dict[str, Any]]) -> str:
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), str(folder / "part 0.parquet"))
    return str(folder)


def _rows(table: str) -> dict[str, dict[str, Any]]:
    from spark_jobs.api import Table

    got = Table(table).read().to_pylist()
    assert len({r["id"] for r in got}) == len(got), "a key appears twice"
    return {r["id"]: {k: r[k] for k in ("id", "v", "note", "ts")} for r in got}


def _apps(cluster: Any) -> dict[str, str]:
    """``{application id: state}`` of every application the master knows (running or completed)."""
    state = cluster.state()
    return {a["id"]: a["state"] for a in [*state.get("activeapps", []), *state.get("completedapps", [])]}


def _wait_for(what: str, cond: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_task_killed_while_its_cluster_job_runs_is_reattached_by_the_retry(  # type: ignore[no-untyped-def]
        standalone_cluster, isolated_python, tmp_path, monkeypatch):
    from airflow_provider_bucketindex.batch import with_source
    from tests.unit.test_provider_durable import TI, FileStore, _commits_of, _session_alive

    cluster = standalone_cluster
    monkeypatch.chdir(tmp_path)  # the driver inherits the cwd: keep the source tree out of its reach
    monkeypatch.setenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", sandbox.connection_json(
        "spark://127.0.0.1", port=cluster.port, python=isolated_python, deploy_mode="client",
        conf={"spark.executor.memory": "512m", "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}))
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    first = [{"id": k, "v": i, "note": None if i % 2 else "", "ts": 1, "is_deleted": False}
             for i, k in enumerate(KEYS)]
    second = [{"id": k, "v": 100 + i, "note": f"upd {k}", "ts": 2, "is_deleted": False}
              for i, k in enumerate(KEYS[::2])]
    second += [{"id": "a b", "v": 999, "note": "newest of the batch", "ts": 3, "is_deleted": False},  # reduced by key
               {"id": "a b", "v": -1, "note": "older in the batch", "ts": 0, "is_deleted": False},
               {"id": "c/d", "v": None, "note": None, "ts": 2, "is_deleted": True},  # a delete
               *({"id": f"new/{i}%+ü", "v": 200 + i, "note": None, "ts": 2, "is_deleted": False} for i in range(3))]
    src1, src2 = _write(tmp_path / "landing 1", first), _write(tmp_path / "landing é 2", second)
    oracle = reduce_batches([first, second], key="id", precombine="ts", delete_field="is_deleted")
    table = str(tmp_path / "lake" / "t%1 ü")
    subprocess.run([sys.executable, "-m", "spark_jobs.cli", "upsert", table, src1, "--record-key", "id",
                    "--precombine-field", "ts", "--delete-field", "is_deleted", "--batch-id", "first",
                    "--engine", "arrow"], check=True, capture_output=True, cwd=REPO)
    before = _apps(cluster)

    signals, store_path = tmp_path / "signals", tmp_path / "state.json"
    signals.mkdir()
    # the driver pauses with its pending instant written and its heartbeat beating (the job is mid-commit)
    env = {"BUCKETINDEX_PAUSE": "after_requested=30", "BUCKETINDEX_PAUSE_SIGNAL": str(signals)}
    script = tmp_path / "task.py"
    script.write_text(WORKER.format(root=str(REPO), table=table, source=src2, env=env, store=str(store_path)))
    task = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for("the cluster job's pending instant", lambda: (signals / "after_requested").exists(), timeout=400)
        identity = FileStore(store_path).get("bucketindex_job")
        batch_id = with_source("d/manual__1/upsert", src2)  # TI's run (no data interval) and the source
        assert identity is not None, "the identity is kept before the task waits for the job"
        assert identity["kind"] == "process" and identity["batch_id"] == batch_id and identity["table_uri"] == table
        running = [a for a in _apps(cluster) if a not in before]
        assert len(running) == 1 and _apps(cluster)[running[0]] == "RUNNING", "the job is an application of the cluster"
        task.kill()  # SIGKILL: no on_kill, nothing cleaned up
        task.wait(10)
    finally:
        if task.poll() is None:
            task.kill()
    out = task.stdout.read().decode(errors="replace") if task.stdout else ""
    assert "WORKER FINISHED" not in out, out[-3000:]
    assert _session_alive(identity["sid"]), "spark-submit and its driver outlive the task process"
    assert _commits_of(table, batch_id) == []

    retry = operators.UpsertWithIndexOperator(task_id="upsert", table_uri=table, source_uri=src2, record_key="id",
                                              precombine_field="ts", delete_field="is_deleted", engine="spark",
                                              job_poll_interval=0.5, env_vars=env)
    waited: list[dict[str, Any]] = []
    wait_for_job = retry.wait_for_job
    retry.wait_for_job = lambda identity, context: (waited.append(identity), wait_for_job(identity, context))[1]
    started = time.monotonic()
    result = retry.execute({"ti": TI(), "task_state_store": FileStore(store_path)})

    assert waited == [identity] and time.monotonic() - started > 1.0, "the retry reattached and waited"
    assert not _session_alive(identity["sid"])
    assert _commits_of(table, batch_id) == [result["instant"]], "one commit of the batch"
    assert (result["batch_id"], result["engine"]) == (batch_id, "spark")
    new_apps = {a: s for a, s in _apps(cluster).items() if a not in before}
    assert list(new_apps.values()) == ["FINISHED"], f"one spark-submit start, finished: {new_apps}"
    want = {k: {c: r[c] for c in ("id", "v", "note", "ts")} for k, r in oracle.items()}
    assert _rows(table) == want
    assert "c/d" not in want and want["a b"]["v"] == 999
    from spark_jobs.api import Table
    from spark_jobs.table import Table as CoreTable

    assert Table(table).validate().ok
    assert CoreTable.load(table).timeline.reload().pending() == []
