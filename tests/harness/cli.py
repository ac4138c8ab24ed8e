"""Run the ``bucketindex`` CLI from a test, in this process when that tests the same thing.

A cold ``bucketindex`` process costs 0.6-1.5 s (the interpreter's start, then pyarrow's and the
table code's imports) before it does any work; a unit test that checks what a command does --
its output, its exit status, the table it leaves -- pays that on every call, and the default
test run makes hundreds of them. :func:`run_cli` calls
:func:`airflow_provider_bucketindex.cli.main` (the console script's function) here instead,
with the process-wide state a fresh process would have, and puts that state back afterwards,
so the next test sees nothing of the command.

It falls back to a real process (same arguments, same :class:`subprocess.CompletedProcess`)
whenever running here would be unsafe or would change what is tested:

* a fault or pause in the environment (``BUCKETINDEX_FAULT*``, ``BUCKETINDEX_PAUSE*``): a
  fault kills the whole process (:mod:`spark_jobs.table.faults`) -- here, the test runner;
* Spark: ``--engine spark``, ``--master``, ``--remote``, ``--driver-memory``, ``$SPARK_REMOTE``,
  ``demo`` (Airflow
  and Spark), ``connect-server`` (a server that runs until killed): a JVM or a Spark session
  started here would outlive the command and be shared by the next test;
* an environment that hides Java (``JAVA_HOME`` or ``PATH`` other than this process's) or
  limits memory (``BUCKETINDEX_ARROW_MEMORY_BUDGET``, ``BUCKETINDEX_DRIVER_MEMORY``): what such a
  test checks is how a process with that environment behaves, from its start;
* ``cold=True``: the test is about the process itself (what a cold start imports, how long it
  takes, signals, address-space limits, several processes at once).

In process, ``timeout`` is not enforced (a command that hangs hangs the test, as a subprocess
without a timeout would), and output written to file descriptors 1 and 2 directly, below
``sys.stdout``/``sys.stderr`` (a C library's), is not captured.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from airflow_provider_bucketindex.cli import main
from spark_jobs.io import filesystem, storage

__all__ = ["run_cli", "in_process"]

#: environment variables whose presence means the command must run in its own process
_FAULT_PREFIXES = ("BUCKETINDEX_FAULT", "BUCKETINDEX_PAUSE")
_MEMORY_ENV = ("BUCKETINDEX_ARROW_MEMORY_BUDGET", "BUCKETINDEX_DRIVER_MEMORY")
#: options that start (or reach) Spark; the ``--opt=value`` forms are matched too
_SPARK_OPTIONS = ("--master", "--remote", "--driver-memory")
_COLD_VERBS = ("demo", "connect-server")
#: signals whose handlers a command may set (``connect-server``, Spark's gateway) and we put back
_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGTERM", "SIGINT", "SIGHUP", "SIGPIPE"))
                 if s is not None)
#: a fresh interpreter's warning filters (``python -W`` unset): pytest's are not the user's
_DEFAULT_FILTERS = (("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, None),
                    ("ignore", PendingDeprecationWarning, None), ("ignore", ImportWarning, None),
                    ("ignore", ResourceWarning, None))


def in_process(args: tuple[str, ...] | list[str], env: Mapping[str, str] | None = None) -> bool:
    """Whether ``bucketindex *args`` under ``env`` (None: this process's) may run here; the
    module doc says why each case may not."""
    effective = os.environ if env is None else env
    if any(k.startswith(_FAULT_PREFIXES) for k in effective):
        return False
    if any(k in effective for k in _MEMORY_ENV) or effective.get("SPARK_REMOTE"):
        return False
    if env is not None and any(env.get(k) != os.environ.get(k) for k in ("JAVA_HOME", "PATH")):
        return False
    verbs = [a for a in args if not a.startswith("-")]
    if verbs and verbs[0] in _COLD_VERBS:
        return False
    for i, a in enumerate(args):
        if a in _SPARK_OPTIONS or a.startswith(tuple(o + "=" for o in _SPARK_OPTIONS)):
            return False
        if a == "--engine=spark" or (a == "--engine" and i + 1 < len(args) and args[i + 1] == "spark"):
            return False
    return True


def run_cli(*args: str, env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
            input: str | None = None, timeout: float | None = None,  # noqa: A002 - subprocess.run's name
            cold: bool = False) -> subprocess.CompletedProcess[str]:
    """``bucketindex *args`` as ``subprocess.run(..., capture_output=True, text=True)`` would run
    it, ``env`` replacing the environment as there; in this process unless the module doc's
    cases (or ``cold``) ask for a real one. A real one runs in a session of its own: a fault
    (:mod:`spark_jobs.table.faults`) kills every process of its session."""
    argv = [str(a) for a in args]
    if cold or not in_process(argv, env):
        return subprocess.run([sys.executable, "-m", "airflow_provider_bucketindex.cli", *argv],
                              capture_output=True, text=True, env=None if env is None else dict(env),
                              cwd=cwd, input=input, timeout=timeout, check=False,
                              start_new_session=True)  # a fault kills its session: not the test runner's
    out, err = _Capture(), _Capture()
    with _isolated(env=env, cwd=cwd, stdin=io.StringIO(input or ""), stdout=out, stderr=err):
        try:
            status = main(argv)
        except SystemExit as e:  # argparse, --help, sys.exit: the status the interpreter would exit with
            status = _exit_status(e.code, err)
        except KeyboardInterrupt:
            traceback.print_exc(file=err)
            status = 128 + signal.SIGINT
        except BaseException:  # noqa: BLE001 - an uncaught error: the traceback and exit 1, as python does
            traceback.print_exc(file=err)
            status = 1
        else:
            status = 0 if status is None else int(status)
        with contextlib.suppress(Exception):
            out.flush()
            err.flush()
    return subprocess.CompletedProcess([sys.executable, "-m", "airflow_provider_bucketindex.cli", *argv],
                                       status, out.text(), err.text())


class _Capture(io.TextIOWrapper):
    """A text stream with a binary ``buffer`` (as ``sys.stdout`` has) and no file descriptor
    (``fileno`` raises, so the CLI's own "reader went away" path leaves real descriptors alone)."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors="backslashreplace", newline=None,
                         write_through=True)

    def text(self) -> str:
        self.flush()
        raw = self.buffer.getvalue().decode("utf-8", "replace")  # type: ignore[attr-defined]
        return raw.replace("\r\n", "\n")

    def close(self) -> None:  # a command closing its stdout must not lose what it wrote
        self.flush()


def _exit_status(code: Any, err: io.TextIOBase) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=err)  # sys.exit("message"): printed, exit 1
    return 1


@contextlib.contextmanager
def _isolated(*, env: Mapping[str, str] | None, cwd: str | os.PathLike[str] | None, stdin: io.TextIOBase,
              stdout: io.TextIOBase, stderr: io.TextIOBase) -> Iterator[None]:
    """A fresh process's global state for one command, and this process's back afterwards:
    the environment, the working directory, the standard streams, logging (the root logger's
    handlers and level, every logger's level, handlers and propagation), signal handlers,
    warning filters, the run's storage options and the caches built from them."""
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_streams = (sys.stdin, sys.stdout, sys.stderr)
    saved_argv = list(sys.argv)
    saved_signals = {s: signal.getsignal(s) for s in _SIGNALS}
    saved_storage = storage._configured  # noqa: SLF001 - None and {} differ: put back exactly this
    manager = logging.Logger.manager
    root = logging.getLogger()
    saved_root = (list(root.handlers), root.level)
    saved_loggers = {name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled)
                     for name, lg in manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    saved_disable = logging.root.manager.disable
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
        sys.argv = [sys.argv[0]]
        root.handlers = []  # basicConfig adds the CLI's handler only to a root that has none, as in a new process
        root.setLevel(logging.WARNING)
        logging.disable(logging.NOTSET)
        _forget_caches()
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in reversed(_DEFAULT_FILTERS):
                warnings.filterwarnings(action, category=category, module=module or "")
            warnings.showwarning = _show_on(stderr)
            yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        sys.argv = saved_argv
        root.handlers = saved_root[0]
        root.setLevel(saved_root[1])
        for name, lg in list(manager.loggerDict.items()):
            if not isinstance(lg, logging.Logger):
                continue
            level, handlers, propagate, disabled = saved_loggers.get(name, (logging.NOTSET, [], True, False))
            lg.setLevel(level)
            lg.handlers = handlers
            lg.propagate = propagate
            lg.disabled = disabled
        logging.disable(saved_disable)
        for s, handler in saved_signals.items():
            if handler is not None:
                signal.signal(s, handler)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        storage.configure(saved_storage)
        _forget_caches()


def _show_on(stream: io.TextIOBase):  # type: ignore[no-untyped-def]
    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        stream.write(warnings.formatwarning(message, category, filename, lineno, line))
    return show


def _forget_caches() -> None:
    """Module-level caches the CLI fills, keyed by what a new process would rebuild: the FileIOs
    (:func:`spark_jobs.io.filesystem.clear_cache`, called by ``storage.configure``) and the
    table handles a task opens (:func:`spark_jobs.kernels.tasks._open_table`)."""
    filesystem.clear_cache()
    tasks = sys.modules.get("spark_jobs.kernels.tasks")
    if tasks is not None:
        tasks._open_table.cache_clear()  # noqa: SLF001
