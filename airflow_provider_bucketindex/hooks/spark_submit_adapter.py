"""The one place where bucketindex touches internals of the Spark provider's ``SparkSubmitHook``.

Why an adapter at all: the Spark provider's public API (``SparkSubmitHook(...)``,
``submit(application)``, ``on_kill()``) reads its master from an Airflow connection of
type ``spark`` and finds ``spark-submit`` on PATH only. A bucketindex job needs three
things that API has no seam for:

* the master from a ``bucketindex`` connection (or the embedded ``local[*]`` default when
  there is none) -- :meth:`SparkSubmitAdapter._resolve_connection`;
* ``spark-submit`` from the worker's own environment ``bin/`` (a pip-installed pyspark
  puts it there, and the provider only searches PATH) -- ``_get_spark_binary_path``;
* the job's exit status and last output lines (the CLI contract: 2 bad input, 3 retryable),
  the exact command (asserted by tests, logged), its process (``on_kill`` stops the whole
  process session), and a standalone-cluster driver that is waited for until it ends.

Everything else -- command building, log streaming, secret masking, YARN/Kubernetes
tracking, kill -- stays the provider's. Every internal member used is listed in
:data:`REQUIRED_METHODS` / :data:`REQUIRED_ATTRIBUTES` and checked by
:func:`check_compatibility` the first time an adapter is built, so a provider release that
renames one fails at once with a message naming it, before any job starts -- not with an
``AttributeError`` halfway through a task. ``tests/unit/test_provider_spark_adapter.py``
pins the behaviour of each member against the installed release (it runs a real
``spark-submit`` stand-in process); run it before widening :data:`TESTED_RANGE`.

The distribution keeps a floor only (``apache-airflow-providers-apache-spark>=6.3``): a
release outside :data:`TESTED_RANGE` whose members still check out is used with a warning.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from typing import Any, Callable

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

__all__ = [
    "REQUIRED_ATTRIBUTES",
    "REQUIRED_METHODS",
    "TESTED_RANGE",
    "IncompatibleSparkProviderError",
    "SparkSubmitAdapter",
    "check_compatibility",
    "spark_provider_version",
]

log = logging.getLogger(__name__)

#: the Spark provider releases this adapter is tested against (PEP 440 specifier)
TESTED_RANGE = ">=6.3,<7"

#: internal methods used, with the parameter names (after ``self``) they must take
REQUIRED_METHODS: dict[str, tuple[str, ...]] = {
    "_resolve_connection": (),
    "_get_spark_binary_path": (),
    "_build_spark_submit_command": ("application",),
    "_mask_cmd": ("connection_cmd",),
    "_start_driver_status_tracking": (),
    "_build_track_driver_status_command": (),  # one look at a standalone driver (a reattaching retry)
    "_run_post_submit_commands": (),
}
#: internal attributes a constructed hook must have
REQUIRED_ATTRIBUTES: tuple[str, ...] = (
    "_submit_sp",  # the spark-submit Popen: exit status, process session for on_kill
    "_last_submit_log_lines",  # the tail of spark-submit's output: the job's one-line reason
    "_connection",  # the resolved connection (spark_binary)
    "_env",  # the environment spark-submit's process gets (decided while the command is built)
    "_should_track_driver_status",  # standalone cluster mode: the driver runs on after spark-submit exits
    "_driver_id",
    "_driver_status",
)


class IncompatibleSparkProviderError(RuntimeError):
    """The installed Spark provider lacks (or changed) an internal member the adapter needs."""


def spark_provider_version() -> str:
    import importlib.metadata as md

    try:
        return md.version("apache-airflow-providers-apache-spark")
    except md.PackageNotFoundError:  # pragma: no cover - a source checkout of the provider
        from airflow.providers.apache.spark import __version__

        return str(__version__)


_checked: set[type] = set()


def check_compatibility(hook_class: type = SparkSubmitHook, *, version: str | None = None) -> None:
    """Raise :class:`IncompatibleSparkProviderError` unless ``hook_class`` has every internal
    method of :data:`REQUIRED_METHODS` with those parameters; warn when ``version`` (default:
    the installed provider's) is outside :data:`TESTED_RANGE`."""
    from packaging.specifiers import SpecifierSet

    version = version or spark_provider_version()
    problems = []
    for name, params in REQUIRED_METHODS.items():
        member = getattr(hook_class, name, None)
        if not callable(member):
            problems.append(f"{name}() is missing")
            continue
        got = tuple(p for p in inspect.signature(member).parameters if p != "self")
        if got[: len(params)] != params or any(
            inspect.signature(member).parameters[p].default is inspect.Parameter.empty for p in got[len(params):]
        ):
            problems.append(f"{name}{tuple(got)} no longer takes {params}")
    if problems:
        raise IncompatibleSparkProviderError(
            f"apache-airflow-providers-apache-spark {version} is not compatible with airflow-provider-bucketindex "
            f"(tested with {TESTED_RANGE}): SparkSubmitHook." + "; SparkSubmitHook.".join(problems)
            + ". Install a provider release in the tested range."
        )
    if version not in SpecifierSet(TESTED_RANGE, prereleases=True):
        warnings.warn(
            f"apache-airflow-providers-apache-spark {version} is outside the range bucketindex is tested with "
            f"({TESTED_RANGE}); the internal members it uses are present, so it goes on",
            RuntimeWarning,
            stacklevel=3,
        )


class SparkSubmitAdapter(SparkSubmitHook):
    """A ``SparkSubmitHook`` with an explicit master and an absolute ``spark-submit``.

    :param master: the Spark master (``local[*]``, ``spark://...``, ``yarn``, ``k8s://...``),
        or None to take master, queue, Kerberos settings from the ``spark`` connection
        ``conn_id`` as the Spark provider does.
    :param spark_binary_resolver: turns the binary name into the command's first element(s).
    :param allowed_binaries: binary names accepted (the Spark provider's list).
    :param private_env: variables for spark-submit's own process environment only. Unlike
        ``env_vars`` -- which the provider writes on the command line as
        ``--conf spark.yarn.appMasterEnv.K=V`` / ``spark.kubernetes.driverEnv.K=V`` on YARN and
        Kubernetes, where ``ps`` and the task log show them -- these never reach the command:
        for values that are secrets (the storage options' credentials). A driver in client
        mode is spark-submit's child and inherits them.
    Other keyword arguments are ``SparkSubmitHook``'s.
    """

    def __init__(
        self,
        *,
        master: str | None,
        spark_binary_resolver: Callable[[str], str],
        allowed_binaries: tuple[str, ...] | list[str],
        spark_conn_id: str | None = None,
        private_env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        if type(self) not in _checked:
            check_compatibility(SparkSubmitHook)
            _checked.add(type(self))
        # SparkSubmitHook resolves its connection inside __init__: set ours first.
        self._bi_master = master
        self._bi_spark_conn_id = spark_conn_id
        self._bi_resolver = spark_binary_resolver
        self._bi_allowed = tuple(allowed_binaries)
        self._bi_conf = dict(kwargs.get("conf") or {})
        self._bi_deploy_mode = kwargs.get("deploy_mode")
        self._bi_binary = kwargs.get("spark_binary")
        self._bi_private_env = {str(k): str(v) for k, v in (private_env or {}).items()}
        if spark_conn_id:
            kwargs["conn_id"] = spark_conn_id
        super().__init__(**kwargs)
        missing = [a for a in REQUIRED_ATTRIBUTES if not hasattr(self, a)]
        if missing:
            raise IncompatibleSparkProviderError(
                f"apache-airflow-providers-apache-spark {spark_provider_version()} is not compatible with "
                f"airflow-provider-bucketindex (tested with {TESTED_RANGE}): SparkSubmitHook has no "
                f"{', '.join(missing)}"
            )

    # -- the internal seams ---------------------------------------------------------------
    def _resolve_connection(self) -> dict[str, Any]:
        if self._bi_spark_conn_id:
            data = super()._resolve_connection()  # an ordinary Spark connection, read by the provider
            if self._bi_master:
                data["master"] = self._bi_master
        else:
            data = {
                "master": self._bi_master,
                "queue": None,
                "deploy_mode": self._bi_deploy_mode,
                "spark_binary": self._bi_binary or "spark-submit",
                "namespace": self._bi_conf.get("spark.kubernetes.namespace"),
                "principal": None,
                "keytab": None,
                "rest_scheme": "http",
                "rest_port": 6066,
                "rest_endpoint": None,
            }
        if data["spark_binary"] not in self._bi_allowed:
            raise ValueError(
                f"spark binary must be one of {', '.join(self._bi_allowed)}, got {data['spark_binary']!r}"
            )
        return data

    def _get_spark_binary_path(self) -> list[str]:
        return [self._bi_resolver(self._connection["spark_binary"])]

    def _build_spark_submit_command(self, application: str) -> list[str]:
        # The provider decides ``_env`` (spark-submit's process environment) while it builds the
        # command; ``submit`` then runs Popen with os.environ + ``_env``. The private variables are
        # added there, after the command exists, so no code path can put them on it.
        command = super()._build_spark_submit_command(application)
        if self._bi_private_env:
            self._env = {**(self._env or {}), **self._bi_private_env}
        return command

    # -- what the bucketindex hook reads ------------------------------------------------------
    def command(self, application: str) -> list[str]:
        """The exact command :meth:`submit` runs for ``application``."""
        return self._build_spark_submit_command(application)

    def mask(self, text: str) -> str:
        """``text`` with the values of secret-looking ``key=value`` pairs masked, as the provider logs it."""
        return self._mask_cmd([text])

    @property
    def deploy_mode(self) -> str | None:
        """The deploy mode in force (the task's, the connection's, or the delegated Spark connection's)."""
        return self._connection.get("deploy_mode")

    @property
    def resolved_master(self) -> str:
        """The master in force (the task's, the connection's, or the delegated Spark connection's)."""
        return str(self._connection.get("master") or "")

    @property
    def process(self) -> Any:
        """The spark-submit process of the last :meth:`submit` (None before)."""
        return self._submit_sp

    @property
    def process_env(self) -> dict[str, Any] | None:
        """What the provider adds to spark-submit's environment (known once :meth:`command` ran):
        None where it passes ``env_vars`` as Spark properties or refuses them."""
        return self._env

    @property
    def tracks_driver(self) -> bool:
        """Standalone cluster deploy mode: spark-submit returns once the driver is accepted and
        the driver, known by its id, runs on the cluster."""
        return bool(self._should_track_driver_status)

    @property
    def driver_id(self) -> str | None:
        """The standalone driver's id (read from spark-submit's output), or None."""
        return self._driver_id

    @driver_id.setter
    def driver_id(self, value: str | None) -> None:
        self._driver_id = value

    def status_command(self) -> list[str]:
        """The provider's one-shot status command for :attr:`driver_id` (``spark-submit --status``
        or the master's REST endpoint)."""
        return self._build_track_driver_status_command()

    @property
    def returncode(self) -> int | None:
        proc = self._submit_sp
        return None if proc is None else proc.returncode

    def output_tail(self) -> list[str]:
        """The last lines spark-submit printed (unmasked: mask before logging)."""
        return list(self._last_submit_log_lines)

    def run(self, application: str, **popen_kwargs: Any) -> None:
        """``submit`` and, in standalone cluster mode -- where spark-submit returns once the
        driver is accepted -- wait until the driver ends; raise when it did not finish."""
        from airflow.sdk.exceptions import AirflowException

        driver_id = self.submit(application, **popen_kwargs)
        if not self._should_track_driver_status:
            return
        try:
            self._driver_id = driver_id or self._driver_id
            self._start_driver_status_tracking()
            if self._driver_status != "FINISHED":
                raise AirflowException(f"driver {self._driver_id} ended in state {self._driver_status}")
        finally:
            self._run_post_submit_commands()
