"""Test-wide environment: executors must run this interpreter (it has pyarrow); one local
Spark Connect server per run, started only if a test asks for it."""

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# spark-submit from a pip-installed pyspark lives beside this interpreter
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A Spark Connect server on a free loopback port (``local[2]``: this machine has 2 cores).

    Its Python workers get ``spark_jobs`` only as each session's artifact: the server's
    environment has no PYTHONPATH pointing at this checkout.
    """
    from spark_jobs.jobs.connect import start_server

    log = tmp_path_factory.mktemp("connect-server") / "server.log"
    server = start_server(0, master="local[2]", conf={"spark.ui.enabled": "false"}, log_path=str(log))
    yield server
    server.stop()
