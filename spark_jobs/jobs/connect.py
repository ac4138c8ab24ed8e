"""Spark Connect: run the same jobs against a running Spark Connect server, no JVM of our own.

The jobs are written against the DataFrame API only, so one code path serves a classic
session (``local[*]``, spark-submit) and a Spark Connect session (:func:`remote_session`).
What differs lives here:

* **Opening a session** (:func:`remote_session`): the runtime SQL settings a classic
  session gets (``session.SESSION_CONF``'s ``spark.sql.*``), then the ``spark_jobs``
  package shipped to the server as a Python artifact (``addArtifacts(zip, pyfile=True)``),
  so the UDFs running in the server's Python workers import the client's code, not
  whatever the server has.
  Those workers need pyarrow, numpy and xxhash in the server's interpreter.
* **Facts a classic session reads from its SparkContext** (:func:`default_parallelism`).
* **Releasing the session** (:func:`release_on_exit`): a Connect session lives on the
  server until released; the CLI releases it at exit and, on SIGTERM, first interrupts
  what the session still runs there, so a stopped writer leaves no task writing. (A
  client killed outright cannot: the server finishes the Spark action it was running, and
  the files that action writes after the instant is rolled back stay behind as garbage that
  no reader sees, since their instant never completes.)
* **A local server** (:func:`start_server`, ``bucketindex connect-server``): the pyspark
  wheel carries ``spark-connect_*.jar``; ``spark-submit --class
  org.apache.spark.sql.connect.service.SparkConnectServer`` with that jar starts it.

The client and the server must see the table and the source at the same URIs (a shared
file system or an object store): the client reads and writes the timeline and index
metadata itself, the server's tasks read and write the data and index files.
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Sequence

from spark_jobs.io.storage import redact_uri
from spark_jobs.jobs.settings import SESSION_CONF as CLASSIC_CONF, VERIFY_CHECKSUMS
from spark_jobs.processes import stop_with_parent
from spark_jobs.resources import is_local_master, local_driver_memory

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DEFAULT_PORT",
    "SESSION_CONF",
    "ConnectServer",
    "default_parallelism",
    "is_connection_error",
    "is_remote",
    "release_on_exit",
    "remote_session",
    "ship_package",
    "start_server",
]

log = logging.getLogger("bucketindex.connect")

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002
#: extra settings for a Connect session, over the runtime (``spark.sql.*``) part of
#: ``session.SESSION_CONF`` that a classic session gets; static settings (memory, UI,
#: Python worker reuse) belong to the server
SESSION_CONF: dict[str, str] = {}
#: retries of the first round trip (backoff 50 ms x4 each time: about 4 s in all)
CONNECT_RETRIES = 4
#: seconds a SIGTERMed client waits, after interrupting its server work, for running tasks to die
INTERRUPT_GRACE_S = 5.0
#: per session id: the zip shipped to it, and its default parallelism
_shipped: dict[str, str] = {}
_parallelism: dict[str, int] = {}


def is_remote(spark: Any) -> bool:
    """True for a Spark Connect session (``pyspark.sql.connect.session.SparkSession``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def remote_session(url: str, *, app_name: str = "bucketindex", conf: dict[str, str] | None = None,
                   ship: bool = True) -> "SparkSession":
    """A new Spark Connect session at ``url`` (``sc://host:port[/;param=value...]``), set up
    like a classic one, with the ``spark_jobs`` package shipped to it.

    A token may be given in the URL (``;token=...``) or, to keep it off command lines, in
    ``SPARK_CONNECT_AUTHENTICATE_TOKEN``. Raises :class:`~spark_jobs.exceptions.RetryableError`
    when the server cannot be reached (nothing was done; try again later).
    """
    if not url.startswith("sc://"):
        from spark_jobs.exceptions import BadInputError

        raise BadInputError(f"--remote must be a Spark Connect URL sc://HOST:PORT, got {url!r}")
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    # pyspark.sql.functions build Connect columns only in a process marked as a Connect client
    # (PySpark's own builder sets this too, but refuses to run beside a classic SparkContext).
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    runtime = {k: v for k, v in CLASSIC_CONF.items() if k.startswith("spark.sql.")}
    settings = {**runtime, **SESSION_CONF, "spark.app.name": app_name, **(conf or {})}
    try:
        spark = RemoteSparkSession.builder.remote(url).create()
        _probe(spark)
        spark.conf._set_all(configs=settings, silent=True)  # as the builder does: static keys are the server's
        if ship:
            ship_package(spark)
    except Exception as e:
        if is_connection_error(e):
            from spark_jobs.exceptions import RetryableError

            raise RetryableError(f"cannot reach the Spark Connect server at {redact_uri(url)}: {_first_line(e)}") from e
        raise
    log.debug("Spark Connect session %s at %s", spark.session_id, redact_uri(url))
    return spark


def _short_retries(spark: "SparkSession") -> None:
    from pyspark.sql.connect.client.retries import DefaultPolicy

    spark.client.set_retry_policies([DefaultPolicy(max_retries=CONNECT_RETRIES)])


def _probe(spark: "SparkSession") -> None:
    """One round trip, retried for a few seconds only: PySpark's own policy waits out a server
    restart for 10+ minutes, which is right inside a job but not for a wrong address. The
    session keeps the default policy afterwards."""
    client = spark.client
    policies = client.get_retry_policies()
    _short_retries(spark)
    try:
        import warnings

        with warnings.catch_warnings():  # PySpark warns RETRIES_EXCEEDED before raising: one message is enough
            warnings.simplefilter("ignore")
            spark.conf.get("spark.sql.session.timeZone")
    finally:
        client.set_retry_policies(policies)


def ship_package(spark: "SparkSession") -> str:
    """Add the running ``spark_jobs`` package to the session as a Python artifact; returns the zip.

    The zip is built from the package this process imported (so the server's tasks run the
    very code the client plans with), cached by content hash: an unchanged package costs a
    hash of its files and one small upload per session.
    """
    import spark_jobs
    from spark_jobs.shipping import zip_package

    sid = spark.session_id
    if sid in _shipped:
        return _shipped[sid]
    root = os.path.dirname(os.path.abspath(spark_jobs.__file__))
    if not os.path.isdir(root) or not os.path.isfile(os.path.join(root, "__init__.py")):
        raise RuntimeError(f"spark_jobs was not imported from a directory ({root}); cannot ship it")
    path = zip_package(root)
    spark.addArtifacts(path, pyfile=True)
    _shipped[sid] = path
    return path


def default_parallelism(spark: "SparkSession") -> int:
    """The cores Spark schedules tasks on, as ``sparkContext.defaultParallelism`` says on a classic session.

    A Connect session has no SparkContext: ``spark.default.parallelism`` if the server sets
    it, else the split count Spark plans for a range (that same default), read from the plan
    without running a job.
    """
    sid = spark.session_id
    if sid in _parallelism:
        return _parallelism[sid]
    n: int | None = None
    try:
        value = spark.conf.get("spark.default.parallelism", None)
        n = int(value) if value else None
    except Exception:  # noqa: BLE001 - not set on the server
        n = None
    if n is None:
        import re

        try:
            plan = spark.range(1)._explain_string("simple")  # type: ignore[attr-defined]
            m = re.search(r"splits=(\d+)", plan)
            n = int(m.group(1)) if m else None
        except Exception:  # noqa: BLE001 - a client without the plan string
            n = None
    if n is None:  # one tiny job: the partitions of a range
        from pyspark.sql import functions as F

        n = int(spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).agg(F.max("p")).first()[0]) + 1
    _parallelism[sid] = max(1, n)
    return _parallelism[sid]


def is_connection_error(e: BaseException) -> bool:
    """The Connect server could not be reached or went away (not a problem of the job's input)."""
    try:
        import grpc
    except ImportError:  # pragma: no cover - pyspark[connect] always has grpc
        return False
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        code = None
        if isinstance(cur, grpc.RpcError) and callable(getattr(cur, "code", None)):
            code = cur.code()
        elif callable(getattr(cur, "getGrpcStatusCode", None)):  # SparkConnectGrpcException
            code = cur.getGrpcStatusCode()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or "StatusCode.UNAVAILABLE" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def release_on_exit(spark: "SparkSession") -> None:
    """Release the server-side session when this process exits; on SIGTERM, first interrupt
    every operation the session still runs on the server, then exit (status 143) through
    the job's own cleanup (a writer aborts its pending instant)."""

    def _release() -> None:
        if not spark.is_stopped:
            _short_retries(spark)  # a server that went away must not hold the exit for minutes
            try:
                spark.stop()
            except Exception:  # noqa: BLE001 - the server may be gone
                pass

    atexit.register(_release)

    def _on_term(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM ends the process at once
        try:
            interrupted = spark.interruptAll()
        except Exception:  # noqa: BLE001
            interrupted = []
        if interrupted:
            # The job is cancelled at once, but a Python task already running is killed only
            # after the executor notices (spark.python.task.killTimeout, 2 s, after a check every
            # 2 s): give it that long before the job's cleanup deletes what the instant wrote,
            # or a late task could write a file nobody deletes.
            time.sleep(INTERRUPT_GRACE_S)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _on_term)


def _first_line(e: BaseException) -> str:
    import re

    m = re.search(r'details = "([^"]*)"', str(e))  # a gRPC error: its status text, not its repr
    if m:
        return m.group(1)[:300]
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else type(e).__name__


# -- a local Spark Connect server -----------------------------------------------------------


class ConnectServer:
    """A Spark Connect server this process started (``spark-submit`` in a session of its own)."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, log_path: str) -> None:
        self.proc, self.host, self.port, self.log_path = proc, host, port, log_path

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's whole session (JVM and its Python workers), SIGKILL what remains."""
        from spark_jobs.processes import session_pids

        if self.proc.poll() is None:
            _signal_session(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (session_pids(self.proc.pid) or []):
            _signal_session(self.proc.pid, signal.SIGKILL)
            time.sleep(0.2)
        if self.proc.poll() is None:
            self.proc.wait(5)

    def __enter__(self) -> "ConnectServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ConnectServer({self.url}, pid={self.pid}, log={self.log_path})"


def _signal_session(sid: int, sig: int) -> None:
    from spark_jobs.processes import session_pids

    pids = session_pids(sid)
    if pids is None:
        try:
            os.killpg(sid, sig)
        except ProcessLookupError:
            pass
        return
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _pyspark_home() -> str:
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pyspark is not installed: a Spark Connect server needs the full pyspark package")
    return os.path.realpath(list(spec.submodule_search_locations)[0])


def connect_jar(spark_home: str | None = None) -> str:
    """The Spark Connect server jar the pyspark wheel carries (``jars/spark-connect_*.jar``)."""
    home = spark_home or _pyspark_home()
    jars = sorted(glob.glob(os.path.join(home, "jars", "spark-connect_*.jar")))
    if not jars:
        raise RuntimeError(f"no spark-connect_*.jar in {home}/jars: this pyspark cannot run a Spark Connect server")
    return jars[-1]


def server_command(port: int, *, host: str = "127.0.0.1", master: str = "local[*]",
                   conf: dict[str, str] | None = None, spark_home: str | None = None) -> list[str]:
    """The ``spark-submit`` command that runs a Spark Connect server on ``host:port``."""
    home = spark_home or _pyspark_home()
    cmd = [os.path.join(home, "bin", "spark-submit"), "--class", SERVER_CLASS, "--master", master,
           "--name", "bucketindex-connect",
           "--conf", f"spark.connect.grpc.binding.address={host}",
           "--conf", f"spark.connect.grpc.binding.port={port}"]
    conf = {**VERIFY_CHECKSUMS, **(conf or {})}  # a static setting: the server's, for every session
    if is_local_master(master) and "spark.driver.memory" not in conf:
        # local mode runs every task in the driver's JVM: size it to the machine, as the
        # classic CLI does, rather than Spark's 1 GiB default
        conf["spark.driver.memory"] = local_driver_memory()
    for k, v in sorted(conf.items()):
        cmd += ["--conf", f"{k}={v}"]
    return [*cmd, connect_jar(home)]


def start_server(port: int = DEFAULT_PORT, *, host: str = "127.0.0.1", master: str = "local[*]",
                 conf: dict[str, str] | None = None, log_path: str | None = None,
                 python: str | None = None, timeout: float = 120.0) -> ConnectServer:
    """Start a Spark Connect server and wait until it accepts connections (``port=0``: a free one).

    Its Python workers run ``python`` (default: this interpreter, which has pyarrow, numpy
    and xxhash); the jobs' own code arrives per session as an artifact. The server's output
    goes to ``log_path`` (default ``$BUCKETINDEX_HOME/logs/connect-<port>.log``, :mod:`spark_jobs.home`).
    The server is this process's: it gets SIGTERM when this process dies, even by SIGKILL
    (:func:`spark_jobs.processes.stop_with_parent`).
    """
    if port == 0:
        port = free_port(host)
    if not log_path:
        from spark_jobs.home import logs_dir

        os.makedirs(logs_dir(), exist_ok=True)
        log_path = os.path.join(logs_dir(), f"connect-{port}.log")
    home = _pyspark_home()
    env = {**os.environ, "SPARK_HOME": home, "PYSPARK_PYTHON": python or sys.executable}
    for k in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH"):
        env.pop(k, None)  # the server is classic Spark; its workers get the jobs as artifacts only
    cmd = server_command(port, host=host, master=master, conf=conf, spark_home=home)
    out = open(log_path, "ab")
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=tempfile.gettempdir(), preexec_fn=stop_with_parent())
    finally:
        out.close()
    server = ConnectServer(proc, host, port, log_path)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the Spark Connect server exited with status {proc.returncode} while starting; "
                               f"see {log_path}:\n{_tail(log_path)}")
        if _accepts(host, port) and _started(log_path):
            return server
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"the Spark Connect server did not start within {timeout:.0f} s; see {log_path}")
        time.sleep(0.25)


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _started(log_path: str) -> bool:
    try:
        with open(log_path, "rb") as f:
            return b"Spark Connect server started" in f.read()
    except OSError:
        return False


def _tail(path: str, n: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-n:]).decode(errors="replace")
    except OSError:
        return ""


def serve(argv: Sequence[str] | None = None) -> int:
    """``bucketindex connect-server``: run a local Spark Connect server until interrupted."""
    import argparse

    p = argparse.ArgumentParser(prog="bucketindex connect-server",
                                description="Run a local Spark Connect server for `--remote` jobs; "
                                            "prints its sc:// URL, stops on Ctrl-C or SIGTERM.")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"gRPC port (default {DEFAULT_PORT}; 0: a free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--master", default="local[*]", help="the server's Spark master (default local[*])")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark property for the server (repeatable), e.g. spark.driver.memory=4g")
    p.add_argument("--log", help="server log file (default $BUCKETINDEX_HOME/logs/connect-<port>.log, "
                                 "~/.cache/bucketindex/logs/... unless set)")
    args = p.parse_args(argv)
    conf = {}
    for item in args.conf:
        k, sep, v = item.partition("=")
        if not sep or not k:
            p.error(f"--conf takes KEY=VALUE, got {item!r}")
        conf[k] = v
    try:
        server = start_server(args.port, host=args.host, master=args.master, conf=conf, log_path=args.log)
    except RuntimeError as e:
        print(f"bucketindex: error: {e}", file=sys.stderr)
        return 1
    print(server.url, flush=True)
    print(f"Spark Connect server pid {server.pid}, log {server.log_path}; run jobs with --remote {server.url} "
          f"(Ctrl-C stops it)", file=sys.stderr, flush=True)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    died = False
    try:
        while not stopping:
            if not server.running():
                died = True
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    if died:
        print(f"bucketindex: the Spark Connect server exited with status {server.proc.returncode}; "
              f"see {server.log_path}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(serve())
