"""Durable Spark work (issue 40 item 2): a submitted job's identity kept in the task's state
store survives the worker; the retry reattaches to the job or reads its outcome from the timeline
instead of failing "still writing", and a retry waits out a live writer's heartbeat.

Real parts: real Parquet, real tables, a real writer process (``python -m spark_jobs.cli upsert
--engine arrow``, paused mid-commit with the fault hooks' ``BUCKETINDEX_PAUSE``), a real worker
process running the operator that is SIGKILLed. spark-submit is a stand-in script that execs the
CLI with the arguments spark-submit would give ``submit.py`` (no JVM). The task state store is a
JSON file with the accessor's ``get``/``set``/``delete`` (the API server's store needs a running
Airflow); the retry reads the same contents the killed try wrote.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_bucketindex.demo import sandbox

pytestmark = [pytest.mark.unit, pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")]

PY = sys.executable
#: keys that break naive path and URL handling
KEYS = ["a b", "c/d", "e%f", "g+h", "ü-ß", "plain"]


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    return operators


class FileStore:
    """``task_state_store`` with the accessor's contract, kept in a JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def get(self, key: str, default: Any = None) -> Any:
        return self._read().get(key, default)

    def set(self, key: str, value: Any) -> None:
        data = self._read()
        data[key] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)

    def delete(self, key: str) -> None:
        data = self._read()
        data.pop(key, None)
        self.set_all(data)

    def set_all(self, data: dict[str, Any]) -> None:
        self.path.write_text(json.dumps(data))


class TI:
    dag_id, run_id, task_id, map_index, try_number = "d", "manual__1", "upsert", -1, 1
    stats_tags: dict[str, str] = {}

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def _source(path: Path, rows: list[dict[str, Any]]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.string()), ("v", pa.int64()),
                                                               ("note", pa.string())])), path / "part 0.parquet")
    return str(path)


def _batches(tmp_path: Path) -> tuple[str, str, dict[str, dict[str, Any]]]:
    """A first batch (committed up front) and a second (the one under test) and the oracle."""
    first = [{"id": k, "v": i, "note": None if i % 2 else ""} for i, k in enumerate(KEYS)]
    second = [{"id": k, "v": 100 + i, "note": f"upd {k}"} for i, k in enumerate(KEYS[::2])]
    second += [{"id": f"new/{i}%", "v": 200 + i, "note": None} for i in range(3)]
    oracle = {r["id"]: r for r in first}
    oracle.update({r["id"]: r for r in second})
    return _source(tmp_path / "src 1", first), _source(tmp_path / "src 2", second), oracle


def _rows(table_uri: str) -> dict[str, dict[str, Any]]:
    from spark_jobs.api import Table as ApiTable

    return {r["id"]: {k: r[k] for k in ("id", "v", "note")} for r in ApiTable(table_uri).read().to_pylist()}


def _commits_of(table_uri: str, batch_id: str) -> list[str]:
    from spark_jobs.table import Action, Table

    tl = Table.load(table_uri).timeline.reload()
    return [i.timestamp for i in tl.completed([Action.COMMIT])
            if tl.read_commit(i).batch_id == batch_id]


def _first_batch(table_uri: str, source: str) -> None:
    subprocess.run([PY, "-m", "spark_jobs.cli", "upsert", table_uri, source, "--record-key", "id",
                    "--batch-id", "first", "--engine", "arrow"], check=True, capture_output=True)


def _wait_for(what: str, cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _session_alive(sid: int) -> bool:
    from spark_jobs.processes import is_running, session_pids

    return any(is_running(p) for p in session_pids(sid) or [])


# -- the stand-in spark-submit: execs the CLI (Arrow engine) with submit.py's arguments --------------

STAND_IN = """\
#!{python}
import os, sys
argv = sys.argv[1:]
app = next(i for i, a in enumerate(argv) if a.endswith("submit.py"))
args = argv[app + 1:]
args[args.index("--engine") + 1] = "arrow"
with open(os.environ["STARTS"], "a") as f:
    f.write(f"{{os.getpid()}}\\n")
os.execv(sys.executable, [sys.executable, "-m", "spark_jobs.cli", *args])
"""

WORKER = """\
import json, os, sys
sys.path.insert(0, {root!r})
os.environ.pop("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", None)
from airflow_provider_bucketindex.demo import sandbox
sandbox.isolate_before_import()
from airflow_provider_bucketindex import operators, packaging
from tests.unit.test_provider_durable import TI, FileStore
from pathlib import Path
if {stand_in!r} is not None:
    packaging.resolve_spark_binary = lambda binary="spark-submit", **k: {stand_in!r}
op = operators.UpsertWithIndexOperator(task_id="upsert", table_uri={table!r}, source_uri={source!r}, record_key="id",
                                       batch_id="second", engine="spark", job_poll_interval=0.2, env_vars={env!r})
op.execute({{"ti": TI(), "task_state_store": FileStore(Path({store!r}))}})
print("WORKER FINISHED")
"""


def test_a_retry_after_the_worker_died_reattaches_and_commits_the_batch_once(ops, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The worker running the upsert is SIGKILLed while its spark-submit job is mid-commit (its
    pending instant written, its writer heartbeating). The job runs on in its own session; the
    retry, with the same task_state_store contents, finds the job's identity, waits for it,
    reads the commit carrying the batch id from the timeline and publishes it -- no second job,
    no "still writing", the table equals the oracle."""
    from airflow_provider_bucketindex import packaging

    table = str(tmp_path / "lake" / "t%1 ü")
    src1, src2, oracle = _batches(tmp_path)
    _first_batch(table, src1)
    stand_in = tmp_path / "spark-submit"
    stand_in.write_text(STAND_IN.format(python=PY))
    stand_in.chmod(0o755)
    starts, signals, store_path = tmp_path / "starts", tmp_path / "signals", tmp_path / "state.json"
    signals.mkdir()
    env = {"STARTS": str(starts), "BUCKETINDEX_PAUSE": "after_requested=6", "BUCKETINDEX_PAUSE_SIGNAL": str(signals)}
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=os.getcwd(), stand_in=str(stand_in), table=table, source=src2, env=env,
                                    store=str(store_path)))
    worker = subprocess.Popen([PY, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for("the job to reach its pending instant", lambda: (signals / "after_requested").exists())
        store = FileStore(store_path)
        identity = store.get("bucketindex_job")
        assert identity is not None, "the identity is kept before the task waits for the job"
        assert identity["kind"] == "process" and identity["batch_id"] == "second" and identity["table_uri"] == table
        assert identity["pid"] == int(starts.read_text().split()[0]) == identity["sid"]
        worker.kill()  # the worker dies: no on_kill, nothing cleaned up
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    out = worker.stdout.read().decode() if worker.stdout else ""
    assert "WORKER FINISHED" not in out
    assert _session_alive(identity["sid"]), "the job outlives the worker"
    assert _commits_of(table, "second") == []

    monkeypatch.setattr(packaging, "resolve_spark_binary", lambda binary="spark-submit", **k: str(stand_in))
    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    retry = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=table, source_uri=src2, record_key="id",
                                        batch_id="second", engine="spark", job_poll_interval=0.2, env_vars=env)
    waited: list[dict[str, Any]] = []
    wait_for_job = retry.wait_for_job
    retry.wait_for_job = lambda identity, context: (waited.append(identity), wait_for_job(identity, context))[1]
    started = time.monotonic()
    result = retry.execute({"ti": TI(), "task_state_store": FileStore(store_path)})
    assert time.monotonic() - started > 1.0, "the retry waited for the running job"
    assert waited == [identity], "it reattached to the job its state store names"
    assert not _session_alive(identity["sid"])
    commits = _commits_of(table, "second")
    assert len(commits) == 1 and result["instant"] == commits[0] and result["batch_id"] == "second"
    assert (result["inserted"], result["updated"]) == (3, 3)
    assert len(starts.read_text().split()) == 1, "the retry submitted no second job"
    assert _rows(table) == oracle
    from spark_jobs.table import Table

    assert Table.load(table).timeline.reload().pending() == []


def test_a_retry_after_a_job_that_ended_reads_its_outcome_and_submits_nothing(ops, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The stored job ended (committed) before the retry starts: the retry finds the commit of
    its batch on the timeline and publishes it without starting spark-submit."""
    from airflow_provider_bucketindex import packaging

    table = str(tmp_path / "t")
    src1, src2, oracle = _batches(tmp_path)
    _first_batch(table, src1)
    subprocess.run([PY, "-m", "spark_jobs.cli", "upsert", table, src2, "--record-key", "id", "--batch-id", "second",
                    "--engine", "arrow"], check=True, capture_output=True)
    store = FileStore(tmp_path / "state.json")
    dead = subprocess.Popen([PY, "-c", "pass"], start_new_session=True)
    dead.wait()
    store.set("bucketindex_job", {"kind": "process", "host": os.uname().nodename, "pid": dead.pid, "sid": dead.pid,
                                  "verb": "upsert", "table_uri": table, "batch_id": "second"})
    monkeypatch.setattr(packaging, "resolve_spark_binary",
                        lambda *a, **k: pytest.fail("spark-submit started although the batch is committed"))
    op = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=table, source_uri=src2, record_key="id",
                                     batch_id="second", engine="spark", job_poll_interval=0.2)
    assert op.get_job_status(store.get("bucketindex_job"), {}) == "SUCCEEDED"
    result = op.execute({"ti": TI(), "task_state_store": store})
    assert [result["instant"]] == _commits_of(table, "second")
    assert _rows(table) == oracle


def _paused_writer(table: str, source: str, signals: Path, seconds: float) -> subprocess.Popen:
    env = {**os.environ, "BUCKETINDEX_PAUSE": f"after_requested={seconds}", "BUCKETINDEX_PAUSE_SIGNAL": str(signals)}
    return subprocess.Popen([PY, "-m", "spark_jobs.cli", "upsert", table, source, "--record-key", "id",
                             "--batch-id", "second", "--engine", "arrow"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_a_retry_while_a_live_writer_heartbeats_waits_and_then_succeeds(ops, tmp_path):  # type: ignore[no-untyped-def]
    """A writer of the batch that no kept identity names (an earlier try on another worker, an
    in-task attempt) heartbeats mid-commit. The retry does not fail "still writing": it waits
    until the writer commits, then publishes that commit; the batch is applied once."""
    from spark_jobs.table import Table

    table = str(tmp_path / "t")
    src1, src2, oracle = _batches(tmp_path)
    _first_batch(table, src1)
    signals = tmp_path / "signals"
    signals.mkdir()
    writer = _paused_writer(table, src2, signals, 4)
    try:
        _wait_for("the writer's pending instant", lambda: (signals / "after_requested").exists())
        pending = [i.timestamp for i in Table.load(table).timeline.reload().pending()]
        assert len(pending) == 1
        op = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=table, source_uri=src2, record_key="id",
                                         batch_id="second", engine="arrow", job_poll_interval=0.2,
                                         writer_wait_timeout=120)
        writers = op.hook.batch_writers(table, "second")
        assert [(w["pid"], w["instant"]) for w in writers] == [(writer.pid, pending[0])]
        result = op.execute({"ti": TI(), "task_state_store": FileStore(tmp_path / "state.json")})
        assert writer.wait(30) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
    assert _commits_of(table, "second") == [result["instant"]] == pending, "the writer's commit, not a second one"
    assert _rows(table) == oracle


def test_without_waiting_a_live_writer_is_still_a_retryable_failure(ops, tmp_path):  # type: ignore[no-untyped-def]
    """``writer_wait_timeout=0`` keeps the old behaviour: an ordinary (retryable) failure naming the writer."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    table = str(tmp_path / "t")
    src1, src2, _ = _batches(tmp_path)
    _first_batch(table, src1)
    signals = tmp_path / "signals"
    signals.mkdir()
    writer = _paused_writer(table, src2, signals, 30)
    try:
        _wait_for("the writer's pending instant", lambda: (signals / "after_requested").exists())
        op = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=table, source_uri=src2, record_key="id",
                                         batch_id="second", engine="arrow", job_poll_interval=0.2,
                                         writer_wait_timeout=0)
        with pytest.raises(AirflowException, match="still writing") as info:
            op.execute({"ti": TI()})
        assert not isinstance(info.value, AirflowFailException)
    finally:
        os.killpg(writer.pid, signal.SIGKILL)
        writer.wait(10)
    assert _commits_of(table, "second") == []


def test_on_kill_while_reattached_stops_the_earlier_job_and_the_wait(ops, tmp_path):  # type: ignore[no-untyped-def]
    """Cooperative cancel: on_kill during the wait for an earlier try's job stops that job (its
    whole process session) and ends the wait with an ordinary failure."""
    from airflow.sdk.exceptions import AirflowException

    table = str(tmp_path / "t")
    src1, src2, _ = _batches(tmp_path)
    _first_batch(table, src1)
    job = subprocess.Popen([PY, "-c", "import time; time.sleep(300)"], start_new_session=True)
    store = FileStore(tmp_path / "state.json")
    store.set("bucketindex_job", {"kind": "process", "host": os.uname().nodename, "pid": job.pid, "sid": job.pid,
                                  "verb": "upsert", "table_uri": table, "batch_id": "second"})
    op = ops.UpsertWithIndexOperator(task_id="upsert", table_uri=table, source_uri=src2, record_key="id",
                                     batch_id="second", engine="spark", job_poll_interval=0.2)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            op.execute({"ti": TI(), "task_state_store": store})
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    try:
        _wait_for("the reattach", lambda: op.hook._attached is not None)
        op.on_kill()
        th.join(30)
        assert not th.is_alive()
        assert job.wait(10) is not None
        assert len(errors) == 1 and isinstance(errors[0], AirflowException) and "killed" in str(errors[0])
        assert _commits_of(table, "second") == []
    finally:
        if job.poll() is None:
            job.kill()


def test_a_standalone_driver_is_looked_at_and_killed_through_spark_submit(ops, monkeypatch):  # type: ignore[no-untyped-def]
    """The identity of a standalone cluster-mode job is its driver id: a retry's one look at it is
    ``spark-submit --master <master> --status <driver>`` (the provider's command), and on_kill of a
    reattached driver is ``--kill``. Only the commands are asserted: nothing runs."""
    from airflow_provider_bucketindex import packaging

    monkeypatch.setattr(packaging, "resolve_spark_binary", lambda binary="spark-submit", **k: "/opt/spark/bin/" + binary)
    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    op = ops.UpsertWithIndexOperator(task_id="upsert", table_uri="/t", source_uri="/s", record_key="id")
    identity = {"kind": "standalone", "verb": "upsert", "driver_id": "driver-20240101000000-0007",
                "master": "spark://m1:7077"}
    hook = op.hook._status_hook(identity)
    assert hook.tracks_driver and hook.driver_id == "driver-20240101000000-0007"
    assert hook.status_command() == ["/opt/spark/bin/spark-submit", "--master", "spark://m1:7077", "--status",
                                     "driver-20240101000000-0007"]
    assert hook._build_spark_driver_kill_command() == ["/opt/spark/bin/spark-submit", "--master", "spark://m1:7077",
                                                       "--kill", "driver-20240101000000-0007"]
