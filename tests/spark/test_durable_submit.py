"""Durable Spark work with a real spark-submit (CI tier: tests/spark/): the worker running an
upsert is SIGKILLed while its local-mode spark-submit job is mid-commit; the job (spark-submit,
its JVM and the Python driver, in a session of their own) runs on, and the retry -- with the same
task state store contents -- reattaches, waits for it, reads the commit from the timeline and
publishes it: one job, one commit, the table equals the oracle. The default run keeps the same
path with a stand-in spark-submit (tests/unit/test_provider_durable.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

from airflow_provider_bucketindex.demo import sandbox
from tests.unit.test_provider_durable import (
    TI,
    WORKER,
    FileStore,
    _batches,
    _commits_of,
    _first_batch,
    _rows,
    _session_alive,
    _wait_for,
)

pytestmark = [pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc"), pytest.mark.timeout(600)]


def test_real_spark_submit_survives_the_worker_and_the_retry_commits_once(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    table = str(tmp_path / "lake" / "t%1 ü")
    src1, src2, oracle = _batches(tmp_path)
    _first_batch(table, src1)
    signals, store_path = tmp_path / "signals", tmp_path / "state.json"
    signals.mkdir()
    # the driver pauses with its pending instant written and its heartbeat beating
    env = {"BUCKETINDEX_PAUSE": "after_requested=15", "BUCKETINDEX_PAUSE_SIGNAL": str(signals)}
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=os.getcwd(), stand_in=None, table=table, source=src2, env=env,
                                    store=str(store_path)))
    worker = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for("the Spark job's pending instant", lambda: (signals / "after_requested").exists(), timeout=300)
        identity = FileStore(store_path).get("bucketindex_job")
        assert identity is not None and identity["kind"] == "process" and identity["batch_id"] == "second"
        worker.kill()
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert _session_alive(identity["sid"]), "spark-submit and its driver outlive the worker"
    assert _commits_of(table, "second") == []

    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    retry = operators.UpsertWithIndexOperator(task_id="upsert", table_uri=table, source_uri=src2, record_key="id",
                                              batch_id="second", engine="spark", job_poll_interval=0.5,
                                              env_vars=env)
    waited: list[dict[str, Any]] = []
    wait_for_job = retry.wait_for_job
    retry.wait_for_job = lambda identity, context: (waited.append(identity), wait_for_job(identity, context))[1]
    started = time.monotonic()
    result = retry.execute({"ti": TI(), "task_state_store": FileStore(store_path)})
    assert waited == [identity] and time.monotonic() - started > 1.0
    assert not _session_alive(identity["sid"])
    assert _commits_of(table, "second") == [result["instant"]]
    assert (result["inserted"], result["updated"], result["engine"]) == (3, 3, "spark")
    assert _rows(table) == oracle
