"""Spark Connect tier: the same jobs over one local Spark Connect server per run
(``connect_server`` in tests/conftest.py), no JVM in the test process for them.

``spark`` is a Connect session here, so test bodies written for the classic tier
(tests/spark) run unchanged; CLI subprocesses get ``--remote`` (``spark_cli_args``).

PySpark decides per call whether ``pyspark.sql.functions`` build Connect or classic columns,
from one process-wide environment variable. A full run also holds the classic tier's
session in this process, so the variable is set only while a test of this tier runs.
"""

from __future__ import annotations

import os

import pytest

MODE = "SPARK_CONNECT_MODE_ENABLED"


def _restore(previous: str | None) -> None:
    if previous is None:
        os.environ.pop(MODE, None)
    else:
        os.environ[MODE] = previous


@pytest.fixture(scope="session")
def connect_session(connect_server):  # type: ignore[no-untyped-def]
    from spark_jobs.jobs.connect import remote_session

    previous = os.environ.get(MODE)
    s = remote_session(connect_server.url, app_name="bucketindex-connect-tests")
    _restore(previous)
    yield s
    s.stop()


@pytest.fixture()
def spark(connect_session):  # type: ignore[no-untyped-def]
    previous = os.environ.get(MODE)
    os.environ[MODE] = "1"
    yield connect_session
    _restore(previous)


@pytest.fixture(scope="session")
def spark_cli_args(connect_server) -> list[str]:  # type: ignore[no-untyped-def]
    return ["--remote", connect_server.url]
