"""Standalone Spark cluster tier: a master and one worker on loopback, started from the
venv's pyspark (``spark-class``), plus the same private Airflow as the airflow tier."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_provider_bucketindex import packaging
from airflow_provider_bucketindex.demo import sandbox
from spark_jobs.processes import stop_with_parent

REPO = Path(__file__).resolve().parents[2]
sandbox.session_env_for_tests([str(REPO / "dags")])


@pytest.fixture(scope="session")
def airflow_db() -> str:
    sandbox.ensure_migrated()
    return os.environ["AIRFLOW_HOME"]


@dataclass
class Cluster:
    host: str
    port: int
    webui: int
    work_dir: Path
    logs: Path

    @property
    def url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://{self.host}:{self.webui}/json/", timeout=5) as r:
            return json.load(r)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)  # the process group this fixture started (start_new_session)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("spark-standalone")
    spark_home = packaging.package_dir("pyspark")
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    env = {
        **os.environ,
        "SPARK_HOME": spark_home,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(root / "logs"),
        "SPARK_NO_DAEMONIZE": "1",
    }
    mport, mweb, wport, wweb = (_free_port() for _ in range(4))
    cluster = Cluster("127.0.0.1", mport, mweb, root / "work", root / "logs")
    cluster.logs.mkdir()
    procs: list[subprocess.Popen] = []

    def start(name: str, args: list[str]) -> None:
        log = open(cluster.logs / f"{name}.out", "wb")
        procs.append(
            subprocess.Popen([spark_class, *args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=stop_with_parent())  # gone with pytest, even if it is killed
        )

    def wait_for(what: str, ok, timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited ({p.returncode}); see {cluster.logs}")
            try:
                if ok():
                    return
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"{what} not up after {timeout}s; see {cluster.logs}")

    try:
        start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                         "--port", str(mport), "--webui-port", str(mweb)])  # fmt: skip
        wait_for("master", lambda: cluster.state().get("status") == "ALIVE")
        start("worker", ["org.apache.spark.deploy.worker.Worker", cluster.url, "--host", "127.0.0.1",
                         "--port", str(wport), "--webui-port", str(wweb), "--cores", "2", "--memory", "1g",
                         "--work-dir", str(cluster.work_dir)])  # fmt: skip
        wait_for("worker", lambda: cluster.state().get("aliveworkers", 0) >= 1)
        yield cluster
    finally:
        for p in reversed(procs):
            _stop(p)


@pytest.fixture(scope="session")
def isolated_python(tmp_path_factory) -> str:  # type: ignore[no-untyped-def]
    """A Python for the Spark driver and executors that cannot import ``spark_jobs`` from the
    source tree: ``-S`` skips site-packages' ``.pth`` files (the editable install's import
    hook lives there) while the venv's site-packages stay importable through PYTHONPATH.
    So every ``spark_jobs`` import on the driver and on the executors comes from the
    ``--py-files`` zip."""
    path = tmp_path_factory.mktemp("python") / "python-no-pth"
    site = sysconfig.get_paths()["purelib"]
    path.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}" exec {sys.executable} -S "$@"\n'
    )
    path.chmod(0o755)
    return str(path)
