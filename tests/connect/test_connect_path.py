"""What only the Spark Connect path has: the package shipped as an artifact, facts a classic
session reads from its SparkContext, an unreachable server, and a client stopped by SIGTERM
(the Airflow hook's ``on_kill``) that leaves nothing running on the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import write_batch
from tests.spark.test_retry_and_crash import B1, B2, options

pytestmark = [pytest.mark.connect, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


def test_tasks_import_the_shipped_package_not_the_servers(spark):  # type: ignore[no-untyped-def]
    from spark_jobs.jobs.connect import _shipped

    def _module_file(batches):  # type: ignore[no-untyped-def]  # nested: pickled by value, not as tests.*
        import spark_jobs

        for b in batches:
            yield pa.RecordBatch.from_arrays([pa.array([spark_jobs.__file__] * b.num_rows)], names=["file"])

    files = {r["file"] for r in spark.range(4).mapInArrow(_module_file, "file string").collect()}
    assert len(files) == 1
    (where,) = files
    zip_name = os.path.basename(_shipped[spark.session_id])
    assert f"{zip_name}/spark_jobs/__init__.py" in where, where  # the artifact, inside the server's session dir
    assert not where.startswith(str(REPO)), where


def test_default_parallelism_without_a_spark_context(spark):  # type: ignore[no-untyped-def]
    from spark_jobs.jobs.session import default_parallelism

    assert default_parallelism(spark) == 2  # the server runs local[2]


def test_unreachable_server_is_a_retryable_failure(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    from spark_jobs import cli
    from spark_jobs.exceptions import RetryableError
    from spark_jobs.jobs import connect

    monkeypatch.setattr(connect, "CONNECT_RETRIES", 0)
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")  # restored after the test
    dead = f"sc://127.0.0.1:{connect.free_port()}"
    with pytest.raises(RetryableError, match="cannot reach the Spark Connect server"):
        connect.remote_session(dead)
    write_batch(tmp_path / "b.parquet", B1)
    assert cli.main(["upsert", str(tmp_path / "t"), str(tmp_path / "b.parquet"), "--record-key", "id",
                     "--remote", dead]) == 3  # nothing written: safe to retry
    assert not (tmp_path / "t").exists()
    assert cli.main(["validate", str(tmp_path / "t"), "--remote", dead, "--master", "local[2]"]) == 2


def test_sigterm_interrupts_the_servers_work_and_aborts_the_instant(spark, spark_cli_args, tmp_path):  # type: ignore[no-untyped-def]
    """A writer stopped by SIGTERM while its tasks run on the server: it interrupts them and
    aborts its instant; nothing of it appears afterwards, though the tasks were paused, not dead."""
    from spark_jobs.jobs.upsert import run_upsert

    uri = str(tmp_path / "t")
    run_upsert(spark, options(uri, write_batch(tmp_path / "b1.parquet", B1), "record", "batch-1"))
    before = read_arrow(uri).to_pylist()
    src2 = write_batch(tmp_path / "b2.parquet", B2)
    signals = tmp_path / "signals"
    pause_s = 6
    env = {**os.environ, "BUCKETINDEX_PAUSE": f"after_data_file={pause_s}", "BUCKETINDEX_PAUSE_SIGNAL": str(signals)}
    cmd = [sys.executable, "-m", "spark_jobs.cli", "upsert", uri, src2, "--record-key", "id", "--precombine-field", "ts",
           "--partition-field", "region", "--delete-field", "is_deleted", "--batch-id", "batch-2", *spark_cli_args]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (signals / "after_data_file").exists():  # a server task wrote a data file and sleeps
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.1)
        t = Table.load(uri)
        (pending,) = t.timeline.pending()
        assert t.marked_files(pending.timestamp)
        sent = time.monotonic()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + signal.SIGTERM, err[-2000:]
    t = Table.load(uri)
    assert t.timeline.pending() == [] and not t.marked_files(pending.timestamp)  # aborted by the client itself
    # had the server gone on, the paused tasks would have finished and the index stage written deltas
    time.sleep(max(0.0, pause_s + 3 - (time.monotonic() - sent)))
    leftovers = [str(f.relative_to(tmp_path / "t")) for f in (tmp_path / "t").rglob("*") if pending.timestamp in f.name]
    assert leftovers == []
    assert read_arrow(uri).to_pylist() == before
    # and the batch applies normally afterwards
    from spark_jobs.jobs.upsert import run_upsert as again

    assert not again(spark, options(uri, src2, "record", "batch-2"))["noop"]
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches([B1, B2])
