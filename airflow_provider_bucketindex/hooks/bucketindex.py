"""BucketIndexHook: submit bucketindex Spark jobs, and read table state without Spark.

Submitting goes through the Apache Spark provider's :class:`SparkSubmitHook` (its command
building, log streaming, secret masking, YARN/Kubernetes tracking and ``on_kill``), with three
changes a bucketindex job needs, made in :mod:`.spark_submit_adapter` -- the only module that
touches the provider's internals, checked against the installed release on first use:

* the Spark master and options come from a ``bucketindex`` connection (or, through its
  ``spark_conn_id`` extra, from an ordinary ``spark`` connection), overridable per task;
* ``spark-submit`` is found in the worker's own environment ``bin/`` even when that is
  not on PATH;
* the ``spark_jobs`` package is shipped as a zip via ``--py-files`` and the entry point is
  the installed ``spark_jobs/submit.py``; ``PYSPARK_PYTHON`` is the worker's interpreter.

Extra Spark properties for one submission (``extra_conf``: the OpenLineage parent-job
properties an operator injects, as ``SparkSubmitOperator`` does) go on the spark-submit
command only; a Spark Connect server has its own configuration.

**Spark Connect** (the warm path): when the task's connection -- or the connection a
``bucketindex`` connection names in its ``spark_conn_id`` extra -- is of the Spark
provider's ``spark_connect`` type (or ``master`` is an ``sc://`` URL), no spark-submit and
no JVM run on the worker: the job is a local subprocess ``python -m spark_jobs.cli VERB
ARGS --remote sc://HOST:PORT`` that ships ``spark_jobs`` to the server itself. The URL is
built as the Spark provider's :class:`SparkConnectHook` builds it; its token travels in
the subprocess's environment (``SPARK_CONNECT_AUTHENTICATE_TOKEN``), never on the command
line, and is masked in logs. Exit statuses and failures are the same on both paths.

Reading table state (timeline, pending instants, the commit of a batch) uses the
pure-Python core, :class:`spark_jobs.table.Table`: no Spark, no ``pyspark`` import. Reading a
snapshot's rows (:meth:`BucketIndexHook.get_dataset`, :meth:`BucketIndexHook.get_df`) goes
through the Python API (:class:`spark_jobs.api.Table`), imported by the call, and reports the
table to Airflow's hook lineage.

**Storage options** (endpoint, region, credentials of an object store;
:mod:`airflow_provider_bucketindex.storage`): the hook's ``storage_options`` over the
connection's ``storage_options`` extra over the storage connection (``storage_conn_id``, an
``aws``-style connection). The hook's own table reads run with them
(:meth:`BucketIndexHook.storage_scope`); a spark-submit or Spark Connect child gets them as
JSON in ``$BUCKETINDEX_STORAGE_OPTIONS`` of its environment, never on its command line (the
Spark provider turns ``env_vars`` into ``--conf`` on YARN and Kubernetes, so they do not go
through ``env_vars``); their secrets are registered with Airflow's secrets masker.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException

from airflow_provider_bucketindex import CONN_TYPE, DEFAULT_CONN_ID
from airflow_provider_bucketindex import packaging
from airflow_provider_bucketindex import storage as task_storage
from airflow_provider_bucketindex.hooks.spark_submit_adapter import SparkSubmitAdapter
from spark_jobs.exceptions import BadInputError, RetryableError, TableCorruptError

if TYPE_CHECKING:
    from spark_jobs.table import Instant, Table, Timeline

__all__ = [
    "BucketIndexHook",
    "BucketIndexSparkSubmitHook",
    "ConnectionSettings",
    "SparkJobFailed",
    "DEFAULT_MASTER",
    "CONNECT_CONN_TYPE",
    "upsert_args",
    "record_key_fields",
    "whole_number",
    "EXIT_CHECK_FAILED",
    "EXIT_BAD_INPUT",
    "EXIT_RETRYABLE",
]

#: The embedded default when no connection says otherwise: Spark in the worker process.
DEFAULT_MASTER = "local[*]"
#: the job's exit statuses, as the CLI gives them: each error class carries its own
#: (``spark_jobs.exceptions``, the README's exit-status table). 1: a check found a problem or the
#: table is damaged
EXIT_CHECK_FAILED = TableCorruptError.exit_code
#: bad input: nothing was written, a retry cannot help
EXIT_BAD_INPUT = BadInputError.exit_code
#: a concurrent write conflicted, the table was busy, or a rollback aborted the write:
#: nothing was written and the same batch id may be retried
EXIT_RETRYABLE = RetryableError.exit_code
_SENSITIVE_CONF = re.compile(r"secret|password|token|credential|passwd", re.IGNORECASE)
_LOG_LINE = re.compile(r"^(\d{2}/\d{2}/\d{2} |\d{4}-\d{2}-\d{2}[ T]|\s+at |Exception in thread|WARNING: )")
_PORT_SUFFIX = re.compile(r":\d+$")
#: the Spark provider's Spark Connect connection type (``SparkConnectHook.conn_type``)
CONNECT_CONN_TYPE = "spark_connect"
#: where pyspark's Connect client reads a token that is not in the URL
CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
_TOKEN_PARAM = re.compile(r"(?:^|;)token=([^;]*)")


#: seconds :meth:`BucketIndexHook.test_connection` waits for a TCP connection to a Spark master or
#: Connect server (a firewall that drops packets would otherwise hold the connection form)
TEST_CONNECT_TIMEOUT_S = 5.0

#: seconds a Spark Connect client has, after SIGTERM, to interrupt its server work and clean up
CONNECT_KILL_GRACE_S = 15.0


class SparkJobFailed(AirflowException):
    """spark-submit of a bucketindex job exited non-zero.

    ``returncode`` follows the CLI contract: 1 a check found a problem, 2 bad input
    (nothing written), 3 a conflict or a busy table (nothing written, retry), anything else
    a failure of the job or of Spark itself.
    """

    def __init__(self, verb: str, returncode: int | None, reason: str, detail: str = "") -> None:
        self.verb, self.returncode, self.reason = verb, returncode, reason
        super().__init__(f"bucketindex {verb} failed (exit status {returncode}): {reason}{detail}")


@dataclass(frozen=True)
class ConnectionSettings:
    """What a ``bucketindex`` connection says about how to run Spark jobs."""

    conn_id: str
    master: str = DEFAULT_MASTER
    deploy_mode: str | None = None
    spark_binary: str = "spark-submit"
    spark_conn_id: str | None = None
    python: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    #: options an upsert uses when it *creates* a table (index, num_buckets, table_type, source_format)
    table_defaults: dict[str, Any] = field(default_factory=dict)
    #: where the operators run their work by default (``engine`` extra): ``auto`` (None), ``spark``
    #: or ``arrow``; and the in-task engine's memory budget (``memory_budget`` extra, e.g. ``4g``)
    engine: str | None = None
    memory_budget: str | None = None
    #: a Spark Connect server, ``sc://host:port[/;param=value]`` without its token: jobs run
    #: as local ``spark_jobs.cli ... --remote`` processes instead of spark-submit
    remote: str | None = None
    remote_token: str | None = field(default=None, repr=False)
    #: the ``storage_options`` extra as stored (a dict or its JSON text; parsed and checked by the
    #: hook, so a bad key fails the task that uses it, not every read of the connection)
    storage_options: Any = field(default=None, repr=False)
    #: the ``storage_conn_id`` extra: an ``aws``-style connection with the store's keys and endpoint
    storage_conn_id: str | None = None
    #: the ``location`` extra: a folder or table :meth:`BucketIndexHook.test_connection` lists
    location: str | None = None

    @classmethod
    def for_spark_connect(cls, conn_id: str, *, base: "ConnectionSettings | None" = None) -> "ConnectionSettings":
        """Settings that run jobs on the Spark Connect server of ``spark_connect`` connection ``conn_id``
        (python, table defaults and the rest from ``base``, a ``bucketindex`` connection, if given)."""
        url, token = spark_connect_url(conn_id)
        return replace(base or cls(conn_id=conn_id), remote=url, remote_token=token)

    @classmethod
    def from_connection(cls, conn: Any) -> "ConnectionSettings":
        extra = canonical_extras(conn)
        host = (conn.host or "").strip()
        if not host:
            master = DEFAULT_MASTER
        else:
            master = host
            if "://" not in master and master != "yarn" and not master.startswith("local"):
                master = f"spark://{master}"  # a bare host name means a standalone master
            if conn.port and not _PORT_SUFFIX.search(master):
                master = f"{master}:{conn.port}"
        conf = extra.get("conf") or {}
        if isinstance(conf, str):
            try:
                conf = json.loads(conf)
            except ValueError as e:
                raise ValueError(f"connection {conn.conn_id!r}: extra 'conf' is not a JSON object: {e}") from e
        if not isinstance(conf, dict):
            raise ValueError(f"connection {conn.conn_id!r}: extra 'conf' must be a JSON object of Spark properties")
        defaults = {}
        for opt in ("index", "num_buckets", "table_type", "source_format"):
            if extra.get(opt) not in (None, ""):
                defaults[opt] = extra[opt]
        return cls(
            conn_id=conn.conn_id,
            master=master,
            deploy_mode=extra.get("deploy_mode") or None,
            spark_binary=extra.get("spark_binary") or "spark-submit",
            spark_conn_id=extra.get("spark_conn_id") or None,
            python=extra.get("python") or None,
            conf={str(k): str(v) for k, v in conf.items()},
            table_defaults=defaults,
            engine=str(extra["engine"]).strip() if extra.get("engine") not in (None, "") else None,
            memory_budget=(str(extra["memory_budget"]).strip()
                           if extra.get("memory_budget") not in (None, "") else None),
            storage_options=extra.get("storage_options") or None,
            storage_conn_id=str(extra["storage_conn_id"]).strip() or None if extra.get("storage_conn_id") else None,
            location=str(extra["location"]).strip() or None if extra.get("location") else None,
        )


#: the connection extras, each spelled one way (``snake_case``, as the operators' arguments and the
#: other extras are); the hyphenated spellings of earlier releases are still read
EXTRA_ALIASES = {"deploy-mode": "deploy_mode", "spark-binary": "spark_binary", "num-buckets": "num_buckets",
                 "table-type": "table_type", "source-format": "source_format", "memory-budget": "memory_budget"}


def canonical_extras(conn: Any) -> dict[str, Any]:
    """A ``bucketindex`` connection's extras with each key in its one spelling (:data:`EXTRA_ALIASES`):
    a connection saved with ``num-buckets`` keeps working. Both spellings with different values are
    bad input (ValueError naming the connection and both keys): which one was meant is unknown."""
    extra = dict(conn.extra_dejson or {})
    for old, new in EXTRA_ALIASES.items():
        if old not in extra:
            continue
        value = extra.pop(old)
        if extra.get(new) not in (None, "") and value not in (None, "") and str(extra[new]) != str(value):
            raise ValueError(f"connection {conn.conn_id!r}: extras {new!r} ({extra[new]!r}) and {old!r} ({value!r}) "
                             f"disagree; keep {new!r}")
        if extra.get(new) in (None, ""):
            extra[new] = value
    return extra


def spark_connect_url(conn_id: str) -> tuple[str, str | None]:
    """``(url, token)`` of a ``spark_connect`` connection: the URL exactly as the Spark provider's
    :class:`SparkConnectHook` builds it, minus the ``token`` parameter (returned apart)."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    return split_token(SparkConnectHook(conn_id).get_connection_url())


def split_token(url: str) -> tuple[str, str | None]:
    """``sc://h:p/;user_id=a;token=t`` -> (``sc://h:p/;user_id=a``, ``t``)."""
    from urllib.parse import unquote

    head, sep, params = url.partition("/;")
    if not sep:
        return url, None
    token = None
    kept = []
    for p in params.split(";"):
        if p.startswith("token="):
            token = unquote(p[len("token="):]) or None
        elif p:
            kept.append(p)
    return (f"{head}/;{';'.join(kept)}" if kept else f"{head}/"), token


def upsert_args(
    table_uri: str,
    source_uri: str,
    *,
    record_key: str | Sequence[str] | None = None,
    precombine_field: str | None = None,
    partition_field: str | None = None,
    index: str | None = None,
    num_buckets: int | str | None = None,
    table_type: str | None = None,
    source_format: str | None = None,
    delete_field: str | None = None,
    batch_id: str | None = None,
    engine: str | None = None,
    partial_update: bool = False,
    schema_evolution: str | None = None,
) -> list[str]:
    """The arguments of ``bucketindex upsert``, exactly as the CLI takes them: built by
    :meth:`UpsertOptions.to_argv <spark_jobs.table.action.upsert.UpsertOptions>` -- the options the
    CLI parses them back into -- so a bad value fails here, in the task, as the job would refuse it
    (BadInputError). ``engine``: the submitted job's ``--engine`` (the operators pass ``spark`` so
    the job does not decide again); ``record_key`` None or empty: the table's; ``source_format``
    given is written even when it is the default (it overrides a connection default)."""
    from spark_jobs.table.action.upsert import UpsertOptions

    def text(value: Any) -> str | None:
        return None if value is None or value == "" else str(value)

    opts = UpsertOptions(
        table=str(table_uri), source=str(source_uri), record_key=record_key_fields(record_key),
        precombine_field=text(precombine_field), partition_field=text(partition_field), index=text(index),
        num_buckets=whole_number("num_buckets", num_buckets), table_type=text(table_type),
        source_format=text(source_format) or "parquet", delete_field=text(delete_field), batch_id=text(batch_id),
        engine=text(engine), partial_update=bool(partial_update), schema_evolution=text(schema_evolution),
    )
    return opts.to_argv(given=("source_format",) if text(source_format) else ())


def record_key_fields(record_key: str | Sequence[str] | None) -> list[str] | None:
    """A task's ``record_key`` (``"region,id"`` or a list) as the options' field list; None (or
    empty): the table's key. BadInputError when it names no field."""
    from spark_jobs.exceptions import BadInputError

    if record_key is None or record_key == "" or (not isinstance(record_key, str) and not list(record_key)):
        return None
    key = record_key if isinstance(record_key, str) else ",".join(str(k) for k in record_key)
    keys = [k.strip() for k in str(key).split(",") if k.strip()]
    if not keys:
        raise BadInputError(f"record_key names no field: {record_key!r}")
    return keys


def whole_number(name: str, value: int | str | None) -> int | None:
    """A templated count (``"8"`` renders as text) as an int; None (or ``""``): not given.
    BadInputError for anything else."""
    from spark_jobs.exceptions import BadInputError

    if value is None or value == "":
        return None
    try:
        return int(str(value))
    except ValueError:
        raise BadInputError(f"{name} must be a whole number, got {value!r}") from None


class BucketIndexSparkSubmitHook(SparkSubmitAdapter):
    """The Spark provider's SparkSubmitHook (through :class:`SparkSubmitAdapter`, the one place
    that touches its internals) with the master and options of a :class:`ConnectionSettings`,
    ``spark-submit`` resolved to an absolute path (PATH, or the environment's bin/), and an
    ``on_kill`` that stops the whole process session spark-submit started."""

    def __init__(self, *, settings: ConnectionSettings, master: str | None = None,
                 private_env: dict[str, str] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("deploy_mode", settings.deploy_mode)
        if not settings.spark_conn_id:
            kwargs.setdefault("spark_binary", settings.spark_binary)
            kwargs["conn_id"] = settings.conn_id
        super().__init__(
            master=master if settings.spark_conn_id else (master or settings.master),
            spark_conn_id=settings.spark_conn_id,
            spark_binary_resolver=packaging.resolve_spark_binary,
            allowed_binaries=packaging.ALLOWED_SPARK_BINARIES,
            private_env=private_env,
            **kwargs,
        )

    def run(self, application: str, **popen_kwargs: Any) -> None:
        # Own session (as Airflow's SubprocessHook does): on_kill can stop spark-submit
        # together with the Python driver and workers it started, and nothing the job
        # does to its own session (the fault-injection hook kills it) reaches the Airflow task.
        popen_kwargs.setdefault("start_new_session", True)
        super().run(application, **popen_kwargs)

    def on_kill(self) -> None:
        """Stop the job: the Spark provider's kill (cluster driver, YARN app, spark-submit),
        then every other process of spark-submit's session -- the local Python driver and
        the PySpark workers, which sit in process groups of their own -- so the writer's
        heartbeat stops and its pending instant is seen as abandoned at once."""
        proc = self.process
        sid = None
        if proc is not None and proc.poll() is None:
            try:
                sid = os.getsid(proc.pid)
            except ProcessLookupError:
                sid = None
        super().on_kill()
        if sid is not None and sid == proc.pid and sid != os.getsid(0):  # our own session only
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if not _signal_session(sid, sig):
                    break
                time.sleep(0.5 if sig == signal.SIGTERM else 0)


def _session_alive(sid: int) -> bool:
    """Whether a live (not zombie) process of session ``sid`` is left on this host."""
    from spark_jobs.processes import is_running, session_pids  # pure Python, no pyspark

    pids = session_pids(sid)
    if pids is None:  # no /proc: the session leader is the best we can see
        try:
            os.kill(sid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    return any(is_running(pid) for pid in pids)


def _signal_session(sid: int, sig: int) -> bool:
    """Send ``sig`` to every process of session ``sid``; False when none is left."""
    from spark_jobs.processes import session_pids  # pure Python, no pyspark

    pids = session_pids(sid)
    if pids is None:  # no /proc: the session leader's process group is the best we can reach
        try:
            os.killpg(sid, sig)
            return True
        except ProcessLookupError:
            return False
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return bool(pids)


class BucketIndexHook(BaseHook):
    """Run bucketindex jobs with spark-submit, and read bucketindex table state.

    :param conn_id: a ``bucketindex`` connection. When ``bucketindex_default`` is not
        defined, the embedded default applies: Spark ``local[*]``, ``spark-submit`` from
        the worker's environment. Any other missing connection is an error.
    :param master: Spark master URL; overrides the connection's.
    :param conf: Spark properties, merged over the connection's ``conf`` extra.
    :param name: Spark application name (default ``bucketindex-<verb>``).
    :param env_vars: extra environment variables for spark-submit.
    :param driver_memory, executor_memory, executor_cores, total_executor_cores,
        num_executors, verbose: passed to spark-submit as the Spark provider does.
    :param storage_conn_id: an ``aws``-style connection (login/password: access key id and
        secret; extras ``endpoint_url``, ``region_name`` ...) for the tables' object store;
        default: the connection's ``storage_conn_id`` extra.
    :param storage_options: storage options (:data:`spark_jobs.io.storage.KNOWN_OPTIONS`) over
        the connection's ``storage_options`` extra and the storage connection.
    """

    conn_name_attr = "conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "Bucket Index (Spark)"

    def __init__(
        self,
        conn_id: str = DEFAULT_CONN_ID,
        *,
        master: str | None = None,
        conf: dict[str, Any] | None = None,
        name: str | None = None,
        env_vars: dict[str, Any] | None = None,
        driver_memory: str | None = None,
        executor_memory: str | None = None,
        executor_cores: int | None = None,
        total_executor_cores: int | None = None,
        num_executors: int | None = None,
        verbose: bool = False,
        storage_conn_id: str | None = None,
        storage_options: dict[str, Any] | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.master = master
        self.conf = conf
        self.name = name
        self.env_vars = env_vars
        self.driver_memory = driver_memory
        self.executor_memory = executor_memory
        self.executor_cores = executor_cores
        self.total_executor_cores = total_executor_cores
        self.num_executors = num_executors
        self.verbose = verbose
        self.storage_conn_id = storage_conn_id or None
        self.task_storage_options = storage_options
        self._submit_hook: BucketIndexSparkSubmitHook | None = None
        self._connect_proc: subprocess.Popen | None = None
        # a job started with start(): its thread, its error, its identity; a job of an earlier
        # try this hook waits for (attach()), which on_kill stops too
        self._job_thread: threading.Thread | None = None
        self._job_error: BaseException | None = None
        self._job_identity: dict[str, Any] | None = None
        self._attached: dict[str, Any] | None = None

    def get_conn(self) -> ConnectionSettings:
        return self.settings

    # -- configuration -------------------------------------------------------------------
    @cached_property
    def settings(self) -> ConnectionSettings:
        try:
            conn = self.get_connection(self.conn_id)
        except AirflowNotFoundException:
            if self.conn_id != DEFAULT_CONN_ID:
                raise
            self.log.info(
                "Connection %s is not defined: using the embedded default (Spark %s)", self.conn_id, DEFAULT_MASTER
            )
            return ConnectionSettings(conn_id=self.conn_id)
        if conn.conn_type == CONNECT_CONN_TYPE:  # the Spark provider's Spark Connect connection
            return ConnectionSettings.for_spark_connect(self.conn_id)
        if conn.conn_type not in (CONN_TYPE, None, ""):
            self.log.warning(
                "Connection %s has type %r, expected %r; reading it as a bucketindex connection",
                self.conn_id,
                conn.conn_type,
                CONN_TYPE,
            )
        settings = ConnectionSettings.from_connection(conn)
        if settings.spark_conn_id and self.get_connection(settings.spark_conn_id).conn_type == CONNECT_CONN_TYPE:
            return ConnectionSettings.for_spark_connect(settings.spark_conn_id, base=settings)
        return settings

    # -- testing the connection (the connection form's Test button, ``airflow connections test``) --
    def test_connection(self) -> tuple[bool, str]:
        """``(ok, message)``, as Airflow's hooks answer: whether the connection's Spark side is
        reachable and its storage side lists.

        * **Spark**: a Spark Connect server (``spark_connect`` connection, an ``sc://`` master) or a
          standalone master (``spark://``, each host of an HA list) or a Kubernetes API server
          (``k8s://``) must accept a TCP connection (:data:`TEST_CONNECT_TIMEOUT_S`): the server is
          there, nothing is submitted and no JVM starts; ``local[...]`` needs ``spark-submit`` in the
          worker's environment (:func:`~airflow_provider_bucketindex.packaging.resolve_spark_binary`),
          ``yarn`` the Hadoop configuration spark-submit reads (``HADOOP_CONF_DIR`` / ``YARN_CONF_DIR``).
        * **Storage**: the storage options are resolved (a bad key, a refused or failed ``role_arn``
          fails here, not in the first task) and, when the connection's ``location`` extra names a
          folder or a table (a local path, ``s3://bucket/prefix``), it is listed with them.

        Runs in the process that tests (the API server, or ``airflow connections test``): its
        network and files, which may differ from a worker's."""
        results: list[tuple[bool, str]] = []
        try:
            settings = self.settings
        except Exception as e:  # a missing delegated connection, a bad conf extra
            return False, f"connection {self.conn_id!r}: {_one_line(e)}"
        for check in (self._test_spark, self._test_storage):
            try:
                results.append(check(settings))
            except Exception as e:  # each check says what it tried; anything else is one line too
                results.append((False, f"{check.__name__.removeprefix('_test_')}: {_one_line(e)}"))
        return all(ok for ok, _ in results), "; ".join(message for _, message in results)

    def _test_spark(self, settings: ConnectionSettings) -> tuple[bool, str]:
        url = self.remote_url()
        if url is not None:
            host, port = _host_port(url.removeprefix("sc://").split("/", 1)[0], 15002)
            return _tcp_check(f"Spark Connect {url}", [(host, port)])
        master = self.master or settings.master
        if settings.spark_conn_id:  # the master an ordinary Spark connection resolves to, as spark-submit gets it
            master = BucketIndexSparkSubmitHook(settings=settings, master=self.master).resolved_master
        if master == "local" or master.startswith("local["):
            binary = packaging.resolve_spark_binary(settings.spark_binary)
            return True, f"Spark {master}: {binary} (a local master runs in the worker)"
        if master.startswith("spark://"):
            hosts = [_host_port(h, 7077) for h in master.removeprefix("spark://").split(",") if h]
            return _tcp_check(f"Spark master {master}", hosts, any_of=True)
        if master.startswith("k8s://"):
            from urllib.parse import urlsplit

            api = master.removeprefix("k8s://")
            parts = urlsplit(api if "://" in api else f"https://{api}")
            port = parts.port or (80 if parts.scheme == "http" else 443)
            return _tcp_check(f"Kubernetes API {api}", [(parts.hostname or "", port)])
        if master == "yarn" or master.startswith("yarn"):
            conf_dir = os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")
            if not conf_dir:
                return False, ("Spark master yarn: neither HADOOP_CONF_DIR nor YARN_CONF_DIR is set in this "
                               "process's environment; spark-submit reads the ResourceManager's address there")
            return True, f"Spark master yarn: Hadoop configuration in {conf_dir} (the ResourceManager is not contacted)"
        return True, f"Spark master {master}: not checked (no reachability test for this master)"

    def _test_storage(self, settings: ConnectionSettings) -> tuple[bool, str]:
        options = self.storage_settings()  # a bad key or a refused role fails here, in one line
        where = f"storage options from {self.storage_conn_id or settings.storage_conn_id!r}" \
            if (self.storage_conn_id or settings.storage_conn_id) else "storage"
        if not settings.location:
            return True, (f"{where}: resolved ({len(options)} options); no location to list (set the "
                          f"connection's location extra to test one)")
        from spark_jobs.io import storage as core_storage
        from spark_jobs.io.filesystem import resolve

        shown = core_storage.redact_uri(settings.location)
        with self.storage_scope():
            io, path = resolve(settings.location)
            if "://" not in settings.location and not io.exists(path):
                return False, f"storage: {shown} does not exist on this machine"
            names = io.list_names(path)
        return True, f"storage: listed {shown} ({len(names)} entries)"

    # -- storage -----------------------------------------------------------------------
    @cached_property
    def _storage(self) -> dict[str, str]:
        s = self.settings
        try:
            options = task_storage.combine(
                conn_options=task_storage.parse_options(
                    s.storage_options, where=f"connection {s.conn_id!r} extra 'storage_options'"),
                storage_conn_id=self.storage_conn_id or s.storage_conn_id,
                task_options=task_storage.parse_options(self.task_storage_options, where="storage_options"),
                get_connection=self.get_connection,
                log=self.log,
            )
        except task_storage.StorageOptionsError as e:  # bad input: no retry can fix it
            raise AirflowFailException(" ".join(str(e).split())) from None
        task_storage.mask(options)
        if options:
            from spark_jobs.io.storage import redacted

            self.log.info("Storage options: %s", redacted(options))
        return options

    def storage_settings(self) -> dict[str, str]:
        """The merged storage options of this hook's tasks (canonical keys; secrets registered with
        the masker). An unknown key or a bad value fails the task without retries
        (``AirflowFailException``), before anything runs."""
        return dict(self._storage)

    @contextmanager
    def storage_scope(self) -> Iterator[None]:
        """Run in-process work (the Arrow engine, table reads, rollback, clean) with this hook's
        storage options as the process's run options; the previous ones are restored after."""
        with task_storage.storage_scope(self.storage_settings()):
            yield

    def _child_storage_env(self) -> dict[str, str]:
        """What a child process (spark-submit, the Spark Connect client) needs in its environment
        to reach the store as this task does: ``$BUCKETINDEX_STORAGE_OPTIONS``; empty without options."""
        from spark_jobs.io.storage import OPTIONS_ENV

        options = self.storage_settings()
        if not options:
            return {}  # the child inherits the worker's own environment, as before
        try:  # the worker's own JSON stays beneath the task's, as it does for the work in the task
            own = task_storage.parse_options(os.environ.get(OPTIONS_ENV), where=f"${OPTIONS_ENV}")
        except task_storage.StorageOptionsError as e:
            raise AirflowFailException(" ".join(str(e).split())) from None
        return {OPTIONS_ENV: task_storage.env_value(task_storage.merge_levels(own, options))}

    def table_defaults(self) -> dict[str, Any]:
        """Options for tables an upsert creates (and the source format): the connection's extras
        over the ``[bucketindex]`` configuration section's (:mod:`airflow_provider_bucketindex.config`)."""
        from airflow_provider_bucketindex import config

        return {**config.table_defaults(), **self.settings.table_defaults}

    def engine_defaults(self) -> tuple[str | None, str | None]:
        """``(engine, memory_budget)`` for the operators that take an ``engine`` when the task does
        not say: the connection's ``engine`` and ``memory_budget`` extras, else ``[bucketindex] engine``
        and ``memory_budget``; None: auto, and the core's budget (``$BUCKETINDEX_ARROW_MEMORY_BUDGET``,
        else a quarter of the machine)."""
        from airflow_provider_bucketindex import config

        s = self.settings
        return (s.engine if s.engine is not None else config.option("engine"),
                s.memory_budget if s.memory_budget is not None else config.option("memory_budget"))

    def spark_conf(self) -> dict[str, str]:
        """The connection's ``conf`` extra overlaid with this hook's ``conf``; secrets masked in logs."""
        merged = dict(self.settings.conf)
        merged.update({str(k): str(v) for k, v in (self.conf or {}).items()})
        for key, value in merged.items():
            if _SENSITIVE_CONF.search(key) and value:
                _mask_secret(value, key)
        return merged

    # -- submitting ----------------------------------------------------------------------
    def spark_submit_hook(
        self, verb: str, args: Sequence[str], *, extra_conf: dict[str, Any] | None = None
    ) -> BucketIndexSparkSubmitHook:
        """A SparkSubmitHook ready to run ``spark_jobs/submit.py <verb> <args...>``; ``extra_conf``
        (Spark properties of this one submission) over the connection's and the hook's."""
        s = self.settings
        conf = self.spark_conf()
        conf.update({str(k): str(v) for k, v in (extra_conf or {}).items()})
        python = packaging.python_for_spark(s.python)
        env = dict(self.env_vars or {})
        master = self.master or s.master
        standalone_cluster = master.startswith("spark://") and s.deploy_mode == "cluster"
        if standalone_cluster:  # the Spark provider refuses env vars there: use Spark's own properties
            conf.setdefault("spark.pyspark.python", python)
            conf.setdefault("spark.pyspark.driver.python", python)
        else:
            env.setdefault("PYSPARK_PYTHON", python)
            env.setdefault("PYSPARK_DRIVER_PYTHON", python)
        kwargs: dict[str, Any] = dict(
            settings=s,
            master=self.master,
            conf=conf,
            py_files=packaging.spark_jobs_zip(),
            name=self.name or f"bucketindex-{verb}",
            application_args=[verb, *[str(a) for a in args]],
            env_vars=env,
            private_env=self._child_storage_env(),
            driver_memory=self.driver_memory or _local_driver_memory(master, conf),
            executor_memory=self.executor_memory,
            executor_cores=self.executor_cores,
            total_executor_cores=self.total_executor_cores,
            num_executors=self.num_executors,
            verbose=self.verbose,
        )
        hook = BucketIndexSparkSubmitHook(**kwargs)
        # the deploy mode is known once the adapter resolved the connection (a delegated Spark
        # connection may say cluster); a driver on the cluster inherits nothing from spark-submit
        if kwargs["private_env"] and hook.deploy_mode == "cluster":
            self._cluster_storage_env(env, standalone=hook.resolved_master.startswith("spark://"))
            hook = BucketIndexSparkSubmitHook(**{**kwargs, "env_vars": env, "private_env": None})
        return hook

    def _cluster_storage_env(self, env: dict[str, Any], *, standalone: bool) -> None:
        """Storage options for a driver that runs on the cluster (deploy mode ``cluster``): it does
        not inherit spark-submit's environment, and the only way there is Spark configuration on the
        command line (``spark.yarn.appMasterEnv.*``/``spark.kubernetes.driverEnv.*``, shown in the
        Spark UI). Options without a secret go that way (through ``env_vars``); secrets are refused
        (the cluster gets its credentials from its own roles or configuration)."""
        options = self.storage_settings()
        if task_storage.has_secrets(options):
            raise AirflowFailException(
                "storage credentials from Airflow cannot reach a driver in cluster deploy mode without being "
                "written into Spark's configuration on the command line; give the cluster its own credentials "
                "(an instance or pod role) and keep only endpoint_url/region in Airflow, or use client mode")
        if standalone:
            raise AirflowFailException(
                "storage options cannot reach a driver in standalone cluster deploy mode (spark-submit passes it no "
                "environment); configure the cluster's environment, or use client mode")
        env.update(self._child_storage_env())

    def build_command(self, verb: str, args: Sequence[str], *, extra_conf: dict[str, Any] | None = None) -> list[str]:
        """The exact command :meth:`submit` runs (for logs and tests): spark-submit, or on
        Spark Connect the local ``spark_jobs.cli`` process."""
        if self.remote_url() is not None:
            return self.connect_command(verb, args)
        return self.spark_submit_hook(verb, args, extra_conf=extra_conf).command(packaging.submit_script())

    # -- Spark Connect ---------------------------------------------------------------------
    def remote_url(self) -> str | None:
        """The Spark Connect URL jobs run on (token removed), or None for spark-submit."""
        if self.master and str(self.master).startswith("sc://"):
            return split_token(str(self.master))[0]
        return self.settings.remote

    def _remote_token(self) -> str | None:
        if self.master and str(self.master).startswith("sc://"):
            return split_token(str(self.master))[1]
        return self.settings.remote_token

    def connect_command(self, verb: str, args: Sequence[str]) -> list[str]:
        """``python -m spark_jobs.cli VERB ARGS --remote URL``: the job as a Spark Connect client."""
        url = self.remote_url()
        if url is None:
            raise ValueError(f"connection {self.conn_id!r} is not a Spark Connect connection")
        python = packaging.python_for_spark(self.settings.python)
        return [python, "-m", "spark_jobs.cli", verb, *[str(a) for a in args], "--remote", url]

    def connect_env(self) -> dict[str, str]:
        """The client process's environment: the worker's, ``env_vars``, and the token if any (masked)."""
        env = {**os.environ, **{str(k): str(v) for k, v in (self.env_vars or {}).items()},
               **self._child_storage_env()}
        token = self._remote_token()
        if token:
            _mask_secret(token, CONNECT_TOKEN_ENV)
            env[CONNECT_TOKEN_ENV] = token
        return env

    def _run_connect(self, verb: str, args: Sequence[str]) -> None:
        ignored = [n for n in ("driver_memory", "executor_memory", "executor_cores", "total_executor_cores",
                               "num_executors") if getattr(self, n) is not None]
        if ignored or self.spark_conf():
            self.log.warning("Spark Connect: %s apply to spark-submit only and are ignored (the server's "
                             "own configuration rules)", ", ".join(ignored + (["conf"] if self.spark_conf() else [])))
        cmd = self.connect_command(verb, args)
        self.log.info("Running on Spark Connect: %s", " ".join(shlex.quote(c) for c in cmd))
        tail: deque[str] = deque(maxlen=50)
        # own session, as spark-submit's: on_kill reaches the client and nothing it does reaches the task
        proc = subprocess.Popen(cmd, env=self.connect_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self._connect_proc = proc
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip()
            if line:
                self.log.info("%s", line)
                tail.append(line)
        rc = proc.wait()
        if rc != 0:
            detail = "\nLast output:\n" + "\n".join(list(tail)[-20:]) if tail else ""
            raise SparkJobFailed(verb, rc, _reason_of(list(tail)), detail)

    def submit(self, verb: str, args: Sequence[str], *, extra_conf: dict[str, Any] | None = None) -> None:
        """Run the job; raise :class:`SparkJobFailed` with the exit status if it fails.

        ``extra_conf``: Spark properties for this submission only (spark-submit; ignored on
        Spark Connect, whose server has its own configuration)."""
        if self.remote_url() is not None:
            self._run_connect(verb, args)
            return
        hook = self.spark_submit_hook(verb, args, extra_conf=extra_conf)
        self._submit_hook = hook
        try:
            hook.run(packaging.submit_script())
        except AirflowException as e:
            tail = [hook.mask(line) for line in hook.output_tail()]
            detail = "\nLast spark-submit output:\n" + "\n".join(tail) if tail else ""
            raise SparkJobFailed(verb, hook.returncode, _reason(hook), detail) from e

    # -- durable jobs: an identity that outlives this process -----------------------------------
    def start(self, verb: str, args: Sequence[str], *, extra_conf: dict[str, Any] | None = None,
              tags: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Start the job as :meth:`submit` does, in a thread of this process, and return its
        identity as soon as it is known -- before the job ends, so the operator can keep it in the
        task's state store while the job runs; :meth:`wait_started` waits for the end.

        The identity (JSON values), by where the job runs:

        * ``{"kind": "process", "host", "pid", "sid", ...}``: spark-submit in client or local
          mode (the driver runs in spark-submit's process session, which it leads:
          ``sid == pid``), or a Spark Connect client (``"remote"``; its session on the server is
          made inside the client and is not known here). The session outlives a killed worker.
        * ``{"kind": "standalone", "driver_id", "master"}``: standalone cluster deploy mode,
          whose driver runs on the cluster.

        ``tags`` (JSON values: the table and batch id whose commit is the job's outcome) go into the
        identity. None when the job ended before its identity was known (a fast failure):
        :meth:`wait_started` raises its error."""
        self._job_error = None
        self._job_identity = None

        def run() -> None:
            try:
                self.submit(verb, args, extra_conf=extra_conf)
            except BaseException as e:  # noqa: BLE001 - handed to wait_started in the task's thread
                self._job_error = e

        thread = threading.Thread(target=run, name=f"bucketindex-{verb}", daemon=True)
        self._job_thread = thread
        thread.start()
        while True:
            identity = self._started_identity(verb)
            if identity is None and thread.is_alive():
                thread.join(0.05)
                continue
            if identity is not None:
                identity = {**identity, **(tags or {})}
                self._job_identity = identity
            return identity

    def _started_identity(self, verb: str) -> dict[str, Any] | None:
        proc = self._connect_proc
        if proc is not None:
            return {"kind": "process", "verb": verb, "host": socket.gethostname(), "pid": proc.pid, "sid": proc.pid,
                    "remote": self.remote_url()}
        hook = self._submit_hook
        if hook is None or hook.process is None:
            return None
        if hook.tracks_driver:  # standalone cluster mode: the driver id comes from spark-submit's output
            driver_id = hook.driver_id
            if driver_id is None:
                return None
            return {"kind": "standalone", "verb": verb, "driver_id": driver_id, "master": hook.resolved_master}
        return {"kind": "process", "verb": verb, "host": socket.gethostname(), "pid": hook.process.pid,
                "sid": hook.process.pid, "master": hook.resolved_master}

    def owns(self, identity: Any) -> bool:
        """Whether ``identity`` is the job this hook started (its thread is in this process)."""
        return identity is not None and self._job_thread is not None and identity == self._job_identity

    def wait_started(self, timeout: float | None = None) -> bool:
        """Wait for the job :meth:`start` started; raise what :meth:`submit` raised
        (:class:`SparkJobFailed`). False when ``timeout`` passed first."""
        thread = self._job_thread
        if thread is None:
            raise RuntimeError("no job was started")
        thread.join(timeout)
        if thread.is_alive():
            return False
        if self._job_error is not None:
            raise self._job_error
        return True

    def job_state(self, identity: dict[str, Any]) -> str:
        """Where the job of ``identity`` is, as far as this worker can tell:

        ``RUNNING``; ``ENDED`` (its processes are gone: the table says how it ended);
        ``UNKNOWN`` (a process on another host: ask the table's writer heartbeat); or a
        standalone driver's own state (``FINISHED``, ``FAILED``, ``KILLED``, ``ERROR``, ...)."""
        kind = identity.get("kind")
        if kind == "process":
            if identity.get("host") != socket.gethostname():
                return "UNKNOWN"
            return "RUNNING" if _session_alive(int(identity["sid"])) else "ENDED"
        if kind == "standalone":
            return self._driver_state(identity)
        raise ValueError(f"unknown job identity {identity!r}")

    def _status_hook(self, identity: dict[str, Any]) -> "BucketIndexSparkSubmitHook":
        """A spark-submit hook on the job's master, aimed at its driver (status and kill)."""
        hook = BucketIndexSparkSubmitHook(settings=self.settings, master=identity.get("master") or self.master,
                                          deploy_mode="cluster", name=self.name or "bucketindex")
        hook.driver_id = str(identity["driver_id"])
        return hook

    def _driver_state(self, identity: dict[str, Any]) -> str:
        """One look at a standalone driver (``spark-submit --status``, or the master's REST
        endpoint), not the provider's poll loop, which gives up only after many failures."""
        cmd = self._status_hook(identity).status_command()
        out = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        found = re.search(r'"?driverState"?\s*:\s*"?([A-Z_]+)', out.stdout + out.stderr)
        return found.group(1) if found else "UNKNOWN"

    def attach(self, identity: dict[str, Any] | None) -> None:
        """Make ``identity`` (a job of an earlier try this task now waits for) what :meth:`on_kill` stops."""
        self._attached = identity

    def _kill_attached(self) -> None:
        identity = self._attached
        if not identity:
            return
        self.log.warning("Stopping the job of an earlier try: %s", identity)
        if identity.get("kind") == "process" and identity.get("host") == socket.gethostname():
            sid = int(identity["sid"])
            if sid == os.getsid(0):  # never our own session
                return
            _signal_session(sid, signal.SIGTERM)
            deadline = time.monotonic() + CONNECT_KILL_GRACE_S
            while _session_alive(sid) and time.monotonic() < deadline:
                time.sleep(0.2)
            _signal_session(sid, signal.SIGKILL)
        elif identity.get("kind") == "standalone":
            self._status_hook(identity).on_kill()

    def on_kill(self) -> None:
        """Stop a running spark-submit (and its driver on a cluster). Table state is left as is.

        On Spark Connect: SIGTERM the client process, which interrupts what its session runs
        on the server and aborts its pending instant; SIGKILL whatever remains after
        :data:`CONNECT_KILL_GRACE_S` (a pending instant is then left for rollback). A job of an
        earlier try this task reattached to (:meth:`attach`) is stopped the same way."""
        self._kill_attached()
        if self._submit_hook is not None:
            self._submit_hook.on_kill()
        proc = self._connect_proc
        if proc is not None and proc.poll() is None:
            sid = proc.pid  # the session leader (start_new_session)
            _signal_session(sid, signal.SIGTERM)
            try:
                proc.wait(CONNECT_KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            _signal_session(sid, signal.SIGKILL)

    # -- table state (pure Python, no Spark) ---------------------------------------------
    # Each method runs in storage_scope: a Table keeps the FileIO it was opened with, so a handle
    # opened here reaches the store with this hook's options even after the scope ends.
    def open_table(self, table_uri: str) -> "Table":
        """A handle on ``table_uri``; ``.exists`` is False when no table is there yet."""
        from spark_jobs.table import Table

        with self.storage_scope():
            return Table.open(table_uri)

    def load_table(self, table_uri: str) -> "Table":
        """The table at ``table_uri``; raises TableNotFoundError if there is none."""
        from spark_jobs.table import Table

        with self.storage_scope():
            return Table.load(table_uri)

    # -- reading a snapshot (pyarrow, pandas, Polars: imported by the call, never at parse) -------
    def get_dataset(self, table_uri: Any, *, as_of: Any = None) -> Any:
        """The snapshot of ``table_uri`` as of ``as_of`` (an instant, an ISO-8601 time or a
        ``datetime``; default the latest) as a ``pyarrow.dataset.Dataset``
        (:meth:`spark_jobs.api.Table.to_pyarrow_dataset`: merge-on-read logs merged, only the
        snapshot's files, fixed when this returns), reached with this hook's storage options.

        ``table_uri``: a path, a URI or an ``ObjectStoragePath`` (its connection is the storage
        connection). Reports the table as an input asset to Airflow's hook lineage. Raises the
        core's ``TableNotFoundError`` (no table there) or ``BadInputError`` (a bad ``as_of``)."""
        uri, options = self._read_target(table_uri)
        from spark_jobs.api import Table

        dataset = Table(uri, storage_options=options or None).to_pyarrow_dataset(as_of)
        self._report_read(uri)
        return dataset

    def get_df(self, table_uri: Any, *, as_of: Any = None, columns: Sequence[str] | None = None,
               df_type: str = "pandas") -> Any:
        """The snapshot of ``table_uri`` (as :meth:`get_dataset`) read whole into a frame:
        ``df_type="pandas"`` (default) or ``"polars"`` (Polars must be installed), only
        ``columns`` if given. Rows come in no particular order. Reports hook lineage as
        :meth:`get_dataset` does."""
        if df_type not in ("pandas", "polars"):
            raise ValueError(f"df_type must be 'pandas' or 'polars', got {df_type!r}")
        uri, options = self._read_target(table_uri)
        from spark_jobs.api import Table

        table = Table(uri, storage_options=options or None).read(as_of, columns=columns)
        self._report_read(uri)
        if df_type == "polars":
            import polars

            return polars.from_arrow(table)
        return table.to_pandas()

    def _read_target(self, table_uri: Any) -> tuple[str, dict[str, str]]:
        """``(location, storage options)`` of a table to read: an ``ObjectStoragePath``'s connection
        is the storage connection (under this hook's ``storage_options``); one other than the
        hook's own ``storage_conn_id`` is refused, as the operators refuse it."""
        location, conn_id = task_storage.object_storage_location(table_uri)
        location = str(location)
        if conn_id is None or conn_id == (self.storage_conn_id or self.settings.storage_conn_id):
            return location, self.storage_settings()
        if self.storage_conn_id:
            raise AirflowFailException(
                f"ObjectStoragePath connection {conn_id!r} disagrees with this hook's storage_conn_id "
                f"{self.storage_conn_id!r}")
        other = BucketIndexHook(self.conn_id, storage_conn_id=conn_id, storage_options=self.task_storage_options)
        return location, other.storage_settings()

    def _report_read(self, uri: str) -> None:
        """The table as an input of this task in Airflow's hook lineage (the ``bucketindex`` Asset
        scheme's factory names it: one asset whatever the spelling)."""
        from airflow.sdk.lineage import get_hook_lineage_collector

        if "://" not in uri and not os.path.isabs(uri):
            uri = os.path.abspath(uri)  # where this process read it (an Asset needs a definite location)
        get_hook_lineage_collector().add_input_asset(context=self, scheme="bucketindex",
                                                     asset_kwargs={"table_uri": uri})

    @task_storage.scoped
    def table_exists(self, table_uri: str) -> bool:
        return self.open_table(table_uri).exists

    @task_storage.scoped
    def timeline(self, table_uri: str) -> "Timeline":
        return self.load_table(table_uri).timeline.reload()

    @task_storage.scoped
    def pending_instants(self, table_uri: str) -> list["Instant"]:
        t = self.open_table(table_uri)
        return t.timeline.reload().pending() if t.exists else []

    @task_storage.scoped
    def last_commit(self, table_uri: str) -> dict[str, Any] | None:
        """The latest completed commit (upsert/bootstrap): instant, batch id, counts."""
        from spark_jobs.table import Action

        t = self.open_table(table_uri)
        if not t.exists:
            return None
        inst = t.timeline.reload().last_completed([Action.COMMIT, Action.BOOTSTRAP])
        return None if inst is None else _summary(t, inst)

    @task_storage.scoped
    def commit_for_batch(self, table_uri: str, batch_id: str) -> dict[str, Any] | None:
        """The completed commit that carries ``batch_id`` (instant, counts), or None."""
        t = self.open_table(table_uri)
        if not t.exists:
            return None
        inst = t.commit_for_batch(batch_id)
        return None if inst is None else _summary(t, inst)

    @task_storage.scoped
    def find_commit(self, table_uri: str, *, batch_id: str | None = None,
                    after_instant: str | None = None) -> dict[str, Any] | None:
        """:func:`spark_jobs.table.state.find_commit` with this hook's storage options: the commit
        of ``batch_id`` (or the first after ``after_instant``) as ``{"instant", "action", "seq",
        "batch_id", "counts"}`` -- its ``seq`` is its place in commit order, what an
        ``AssetWatcher``'s event carries -- or None."""
        from spark_jobs.table import state

        return state.find_commit(table_uri, batch_id=batch_id, after_instant=after_instant)

    @task_storage.scoped
    def pending_for_batch(self, table_uri: str, batch_id: str) -> "Instant | None":
        t = self.open_table(table_uri)
        return t.pending_for_batch(batch_id) if t.exists else None

    @task_storage.scoped
    def pending_batches(self, table_uri: str, match: Callable[[str | None], bool]) -> dict[str, "Instant"]:
        """``{batch_id: pending instant}`` of the pending writes whose batch id ``match`` accepts
        (every instance of a mapped upsert that left one)."""
        from spark_jobs.table import Action

        t = self.open_table(table_uri)
        if not t.exists:
            return {}
        tl = t.timeline.reload()
        found = {}
        for inst in tl.pending():
            if inst.action == Action.ROLLBACK:
                continue
            batch_id = tl.read_plan(inst).get("batch_id")
            if match(batch_id):
                found[batch_id] = inst
        return found

    @task_storage.scoped
    def batch_writers(self, table_uri: str, batch_id: str) -> list[dict[str, Any]]:
        """The live writers of ``batch_id`` (:func:`spark_jobs.table.state.pending_writes`: pid,
        host, last heartbeat): none when no table is there yet."""
        from spark_jobs.table import state

        t = self.open_table(table_uri)
        if not t.exists:
            return []
        return [w for w in state.pending_writes(table_uri) if w.get("batch_id") == batch_id]

    @task_storage.scoped
    def rollback_batch(self, table_uri: str, batch_id: str, *, force: bool = False) -> str | None:
        """Roll back the pending instant of ``batch_id`` (a failed or killed attempt).

        Returns the rolled-back instant, or None when the batch has nothing pending. Without
        ``force`` an instant whose writer still heartbeats is refused (WriterAliveError, a
        retryable condition); with it, that writer fails at its commit point, nothing visible.
        """
        from spark_jobs.table.action.rollback import rollback

        t = self.open_table(table_uri)
        if not t.exists:
            return None
        inst = t.pending_for_batch(batch_id)
        if inst is None:
            return None
        self.log.info("Rolling back %s of batch %s in %s", inst, batch_id, table_uri)
        done = rollback(t, inst.timestamp, force=force)
        return done[0] if done else None


def _local_driver_memory(master: str, conf: dict[str, str]) -> str | None:
    """A local master runs the executors inside the driver JVM, so Spark's 1 GiB default heap is
    the whole job's memory: size it to the worker machine unless the task or connection set it."""
    from airflow_provider_bucketindex import config
    from spark_jobs.resources import is_local_master, local_driver_memory

    if not is_local_master(master) or "spark.driver.memory" in conf:
        return None
    # [bucketindex] driver_memory, else the core's $BUCKETINDEX_DRIVER_MEMORY, else a third of the machine
    return local_driver_memory(config.option("driver_memory"))


def _summary(t: "Table", inst: "Instant") -> dict[str, Any]:
    meta = t.timeline.read_metadata(inst)
    counts = meta.get("counts") or {}
    engine = meta.get("engine")
    return {
        "table_uri": t.display_uri,  # XCom and lineage: no secret of the URI's query
        "instant": inst.timestamp,
        "action": inst.action,
        "batch_id": meta.get("batch_id"),
        "inserted": int(counts.get("inserted", 0)),
        "updated": int(counts.get("updated", 0)),
        "deleted": int(counts.get("deleted", 0)),
        "counts": counts,
        #: the engine that wrote the commit (``spark`` or ``arrow``), None for commits that do not say
        "engine": engine.get("name") if isinstance(engine, dict) else (engine or None),
    }


def _reason(hook: SparkSubmitAdapter) -> str:
    """The job's one-line reason: its last ``bucketindex: ...`` line, else the last output
    line that is not a Spark/JVM log line."""
    return _reason_of(hook.output_tail(), hook.mask, "spark-submit's output")


def _reason_of(output: list[str], mask: Any = None, what: str = "the job's output") -> str:
    lines = [ln.strip() for ln in output if ln.strip()]
    mask = mask or (lambda text: text)
    for text in reversed(lines):
        if text.startswith("bucketindex:"):
            return mask(text)
    for text in reversed(lines):
        if not _LOG_LINE.match(text):
            return mask(text)
    return f"see the task log for {what}"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _host_port(text: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` (``[v6]:port`` too) -> (host, port)."""
    from urllib.parse import urlsplit

    parts = urlsplit(f"//{text}")
    return parts.hostname or "", parts.port or default_port


def _tcp_check(what: str, addresses: list[tuple[str, int]], *, any_of: bool = False) -> tuple[bool, str]:
    """Whether each address (any one, with ``any_of``: a standalone HA master list) accepts a TCP
    connection within :data:`TEST_CONNECT_TIMEOUT_S`; the message names what answered or why not."""
    import socket

    failures: list[str] = []
    reached: list[str] = []
    for host, port in addresses:
        try:
            with socket.create_connection((host, port), timeout=TEST_CONNECT_TIMEOUT_S):
                reached.append(f"{host}:{port}")
        except OSError as e:
            failures.append(f"{host}:{port}: {_one_line(e)}")
    ok = bool(reached) and (any_of or not failures)
    if ok:
        return True, f"{what}: reachable ({', '.join(reached)})"
    return False, f"{what}: not reachable ({'; '.join(failures) or 'no address'})"


def _mask_secret(value: str, name: str) -> None:
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older task SDKs
        return
    mask_secret(value, name)
