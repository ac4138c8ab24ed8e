"""Helper servers die with their owner (spark_jobs.processes.stop_with_parent).

The Spark Connect server, the standalone master and worker and the S3 test server run in
sessions of their own; before this, a pytest (or benchmark) killed by SIGKILL left them
running, holding ports and memory. The owner here is a real process killed outright; its
child execs in place as ``spark-submit``/``spark-class`` exec the JVM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from spark_jobs.processes import is_running

pytestmark = pytest.mark.unit

OWNER = textwrap.dedent("""
    import subprocess, sys
    from spark_jobs.processes import stop_with_parent
    guard = stop_with_parent() if sys.argv[1] == "guarded" else None
    child = subprocess.Popen(["sh", "-c", "exec sleep 300"], start_new_session=True, preexec_fn=guard)
    print(child.pid, flush=True)
    sys.stdin.read()  # until killed
""")


def _child_after_owner_is_killed(mode: str, *, wait: float) -> tuple[int, bool]:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert owner.stdout is not None
    pid = int(owner.stdout.readline())
    assert is_running(pid)
    owner.kill()  # SIGKILL: no cleanup, no atexit, no finally
    owner.wait()
    deadline = time.monotonic() + wait
    while is_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid, is_running(pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_helper_started_with_stop_with_parent_dies_with_its_owner():
    _, alive = _child_after_owner_is_killed("guarded", wait=10)
    assert not alive


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_without_it_the_helper_outlives_its_owner():
    """The control: what the guard prevents does happen without it."""
    pid, alive = _child_after_owner_is_killed("plain", wait=1)
    try:
        assert alive
    finally:
        os.kill(pid, signal.SIGKILL)
