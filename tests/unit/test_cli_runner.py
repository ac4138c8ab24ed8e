"""The in-process CLI runner (:mod:`tests.harness.cli`): the unit tests that call the CLI rely
on it leaving this process as it found it, and on it telling them what a user's process
would: the same exit status, output and error line."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.io import storage
from tests.harness.cli import in_process, run_cli
from tests.unit.test_arrow_concurrent_writers import write_batch
from tests.unit.test_arrow_retry_and_crash import B1, B2, options
from tests.unit.test_cli_newcomer import tree_digest

pytestmark = pytest.mark.unit

BAD_UPSERT = ("--record-key", "no such column", "--engine", "arrow", "--batch-id", "b/2 é")


@pytest.fixture
def table(tmp_path: Path) -> str:
    uri = str(tmp_path / "lake" / "orders 2024%/t")
    arrow_upsert(options(uri, write_batch(tmp_path / "b1.parquet", B1), "record", "batch-1"))
    return uri


def _state() -> dict:
    root = logging.getLogger()
    loggers = logging.Logger.manager.loggerDict
    return {
        "environ": dict(os.environ),
        "cwd": os.getcwd(),
        "root": (list(root.handlers), root.level),
        "loggers": {n: (lg.level, list(lg.handlers), lg.propagate) for n, lg in loggers.items()
                    if isinstance(lg, logging.Logger)},
        "signals": {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)},
        "storage": storage.configured(),
        "threads": set(threading.enumerate()),  # a heartbeat left beating would outlive the command
    }


GOOD_UPSERT = ("--record-key", "id", "--precombine-field", "ts", "--partition-field", "region",
               "--delete-field", "is_deleted", "--engine", "arrow", "--batch-id", "b/2 é")


@pytest.mark.parametrize("case", ["exit 2", "a commit that logs"])
def test_a_command_leaves_environ_cwd_logging_signals_and_storage_as_they_were(table, tmp_path, case):
    def on_term(signum, frame):  # type: ignore[no-untyped-def]  # pragma: no cover - never delivered
        pass

    src = write_batch(tmp_path / "b2.parquet", B2)
    old_term = signal.signal(signal.SIGTERM, on_term)
    ours = logging.StreamHandler()
    logging.getLogger().addHandler(ours)
    try:
        before = _state()
        digest = tree_digest(Path(table))
        elsewhere = tmp_path / "somewhere else"
        elsewhere.mkdir()
        # -v sets DEBUG, basicConfig adds a handler, --storage-option configures the store,
        # the env replaces this one's and cwd moves the process: all of it must be undone
        p = run_cli("-v", "upsert", table, src, *(BAD_UPSERT if case == "exit 2" else GOOD_UPSERT),
                    "--storage-option", "region=eu-west-1",
                    env={**os.environ, "BUCKETINDEX_RUNNER_PROBE": "x y/ü"}, cwd=str(elsewhere))
        if case == "exit 2":
            assert p.returncode == 2, p.stderr
            assert p.stderr.strip().splitlines() == [p.stderr.strip()] and p.stderr.startswith("bucketindex: ")
            assert tree_digest(Path(table)) == digest
        else:  # the CLI's log handler wrote to the captured stderr, not to the test runner's
            assert p.returncode == 0, p.stderr
            assert " INFO bucketindex.upsert: committed " in p.stderr, p.stderr
            assert " DEBUG " in p.stderr, "-v reached the CLI's logging"
        after = _state()
        for key in before:
            if key == "loggers":  # loggers the command made are left as a new one is: no level, no handler
                new = {n: v for n, v in after[key].items() if n not in before[key]}
                assert all(v == (logging.NOTSET, [], True) for v in new.values()), new
                after[key] = {n: v for n, v in after[key].items() if n in before[key]}
            assert after[key] == before[key], key
        assert "BUCKETINDEX_RUNNER_PROBE" not in os.environ
    finally:
        logging.getLogger().removeHandler(ours)
        signal.signal(signal.SIGTERM, old_term)


@pytest.mark.parametrize("case", ["bad input", "show"])
def test_the_result_equals_a_real_process(table, tmp_path, case):
    argv = (("upsert", table, str(tmp_path / "b1.parquet"), *BAD_UPSERT) if case == "bad input"
            else ("show", table))
    digest = tree_digest(Path(table))
    here = run_cli(*argv)
    cold = run_cli(*argv, cold=True)
    assert tree_digest(Path(table)) == digest
    assert here.returncode == cold.returncode == (2 if case == "bad input" else 0), (here.stderr, cold.stderr)
    assert here.stdout == cold.stdout
    last = [s.strip().splitlines()[-1] if s.strip() else "" for s in (here.stderr, cold.stderr)]
    assert last[0] == last[1]


@pytest.mark.parametrize(("argv", "env"), [
    (("upsert", "t", "s", "--engine", "spark"), None),
    (("upsert", "t", "s", "--engine=spark"), None),
    (("compact", "t", "--master", "local[1]"), None),
    (("show", "t", "--remote=sc://localhost"), None),
    (("upsert", "t", "s", "--driver-memory", "1g"), None),
    (("demo",), None),
    (("-v", "connect-server"), None),
    (("rollback", "t"), {"BUCKETINDEX_FAULT": "rollback_after_delete"}),
    (("upsert", "t", "s"), {"BUCKETINDEX_PAUSE": "before_complete=1"}),
    (("upsert", "t", "s"), {"BUCKETINDEX_ARROW_MEMORY_BUDGET": "1m"}),
    (("upsert", "t", "s"), {"JAVA_HOME": "/nonexistent-java"}),
    (("show", "t"), {"SPARK_REMOTE": "sc://localhost"}),
])
def test_what_must_run_in_a_process_of_its_own_does(argv, env):
    plain = {k: v for k, v in os.environ.items() if not k.startswith("BUCKETINDEX_") and k != "SPARK_REMOTE"}
    assert in_process(("show", "t"), plain)
    assert not in_process(argv, None if env is None else {**os.environ, **env})
