"""The part every Spark-job operator shares: connection, master, Spark options, lazy hook,
and the OpenLineage parent-job properties the Spark provider's ``SparkSubmitOperator`` injects."""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from airflow.sdk import BaseOperator, ResumableJobMixin
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_bucketindex import DEFAULT_CONN_ID
from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook
from airflow_provider_bucketindex.storage import scoped as storage_scoped

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["BucketIndexEngineMixin", "BucketIndexSparkOperator", "BucketIndexTableMixin", "storage_scoped"]


class BucketIndexTableMixin:
    """What every operator on a bucketindex table shares, whether it runs a Spark job or not.

    * **XCom**: ``execute`` returns a small summary (flat JSON values: instant, batch id,
      counts) -- Airflow pushes it as ``return_value`` only when ``do_xcom_push`` is True.
      Any further key goes through :meth:`push_xcom`, which obeys the same switch. Never
      push a job's whole report: XCom lives in the metadata DB.
    * **Lineage**: ``execute`` calls :meth:`set_lineage` with the URIs it read and wrote
      (and the rows the commit wrote); :meth:`get_openlineage_facets_on_complete` -- called
      by the OpenLineage provider, when installed, after ``execute`` -- turns that into
      datasets named after the OpenLineage spec.
    * **Assets**: an operator that changes a table's content sets ``emits_table_updates``;
      its default outlet is the alias :data:`~airflow_provider_bucketindex.lineage.TABLE_UPDATES`
      and ``execute`` calls :meth:`emit_table_update` after its commit, so DAGs scheduled on
      ``table_asset(uri)`` run, with the instant and batch id in the event's extra.
    * **Storage**: ``execute`` runs in :meth:`storage_scope` (``@storage_scoped``): what the task
      reads and writes itself (Arrow engine, rollback, clean, table state) reaches the store with
      the task's storage options -- ``storage_options`` over its connection's ``storage_options``
      extra over its storage connection (:mod:`airflow_provider_bucketindex.storage`); a bad
      option fails the task without retries before any work. A Spark job gets the same options
      through its environment (:meth:`BucketIndexHook.spark_submit_hook`).
    """

    do_xcom_push: bool
    outlets: Any
    conn_id: str
    storage_conn_id: str | None
    storage_options: dict[str, Any] | None
    #: True for operators whose commit changes what readers of the table see (an upsert)
    emits_table_updates: bool = False

    @cached_property
    def hook(self) -> BucketIndexHook:
        """The task's storage settings (connection extras, ``storage_conn_id``, ``storage_options``),
        built on first use, after templates render. Operators that work in the task itself (clean,
        rollback) need no more; :class:`BucketIndexSparkOperator` adds the Spark options."""
        return BucketIndexHook(conn_id=self.conn_id, storage_conn_id=_text(self.storage_conn_id),
                               storage_options=self.storage_options or None)

    @classmethod
    def default_outlets(cls, kwargs: dict[str, Any]) -> None:
        """Call from ``__init__`` before ``super().__init__(**kwargs)``: add the table-updates alias
        to the task's outlets (a user's own outlets are kept)."""
        if not cls.emits_table_updates:
            return
        from airflow_provider_bucketindex.lineage import TABLE_UPDATES

        outlets = kwargs.get("outlets")
        outlets = [] if outlets is None else (list(outlets) if isinstance(outlets, (list, tuple)) else [outlets])
        if not any(getattr(o, "name", None) == TABLE_UPDATES.name and type(o) is type(TABLE_UPDATES) for o in outlets):
            outlets.append(TABLE_UPDATES)
        kwargs["outlets"] = outlets

    @contextmanager
    def storage_scope(self) -> Iterator[None]:
        """The task's storage options as the process's run options for the body (the hook's)."""
        with self.hook.storage_scope():
            yield

    def push_xcom(self, context: Context, **values: Any) -> None:
        """Push each ``key=value`` to XCom, unless the task says ``do_xcom_push=False``."""
        if not self.do_xcom_push:
            return
        ti = context["ti"]
        for key, value in values.items():
            ti.xcom_push(key=key, value=value)

    # -- assets ------------------------------------------------------------------------------
    def emit_table_update(self, context: Context, table_uri: str, **extra: Any) -> None:
        """Record an Asset event for the table (extra: small JSON values -- instant, batch id,
        counts): through the alias outlet, and on an outlet that *is* this table's Asset."""
        from airflow.sdk import Asset, AssetAlias

        from airflow_provider_bucketindex.lineage import table_asset

        events = context.get("outlet_events")
        if events is None:
            return
        if "://" not in table_uri and not os.path.isabs(table_uri):
            # a relative table is where this task wrote it: its Asset is that absolute path (a DAG
            # file's table_asset() of a relative path is refused: the DAG processor cannot know it)
            table_uri = os.path.abspath(table_uri)
        asset = table_asset(table_uri)
        uri = asset.uri
        for outlet in self.outlets or []:
            if isinstance(outlet, AssetAlias):
                events[outlet].add(asset, extra=dict(extra))
            elif isinstance(outlet, Asset) and outlet.uri == uri:
                events[outlet].extra.update(extra)

    # -- OpenLineage ---------------------------------------------------------------------------
    def set_lineage(
        self,
        *,
        inputs: Sequence[str] = (),
        outputs: Sequence[str] = (),
        output_rows: int | None = None,
        output_files: int | None = None,
        output_bytes: int | None = None,
    ) -> None:
        """What this run read and wrote (paths or URIs), for :meth:`get_openlineage_facets_on_complete`."""
        self._bi_lineage = {
            "inputs": [str(u) for u in inputs],
            "outputs": [str(u) for u in outputs],
            "stats": {"rowCount": output_rows, "fileCount": output_files, "size": output_bytes},
        }

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Inputs and outputs of the finished run as OpenLineage datasets: the source and the
        table; outputs carry ``outputStatistics`` (rows, files, bytes the commit wrote)."""
        from airflow.providers.common.compat.openlineage.facet import (
            Dataset,
            OutputStatisticsOutputDatasetFacet,
        )
        from airflow.providers.openlineage.extractors import OperatorLineage

        from airflow_provider_bucketindex.lineage import openlineage_dataset

        recorded = getattr(self, "_bi_lineage", None)
        if not recorded:
            return OperatorLineage()
        stats = {k: int(v) for k, v in recorded["stats"].items() if v is not None}
        facets = {"outputStatistics": OutputStatisticsOutputDatasetFacet(**stats)} if stats else {}
        return OperatorLineage(
            inputs=[Dataset(*openlineage_dataset(u)) for u in recorded["inputs"]],
            outputs=[Dataset(*openlineage_dataset(u), facets=dict(facets)) for u in recorded["outputs"]],
        )


#: the states :meth:`BucketIndexSparkOperator.get_job_status` answers (ResumableJobMixin's raw strings)
RUNNING, SUCCEEDED, ENDED = "RUNNING", "SUCCEEDED", "ENDED"
#: a standalone driver's states that mean it still runs (the Spark provider's list)
_DRIVER_ACTIVE = ("SUBMITTED", "RUNNING", "RELAUNCHING", "UNKNOWN")


class BucketIndexSparkOperator(BucketIndexTableMixin, ResumableJobMixin, BaseOperator):
    """Base of operators that submit a bucketindex Spark job.

    :param conn_id: a ``bucketindex`` connection (Spark master, options, table defaults).
    :param master: Spark master URL overriding the connection's (templated).
    :param conf: Spark properties over the connection's (templated).
    :param name: Spark application name (templated; default ``bucketindex-<verb>``).
    :param env_vars: extra environment for spark-submit (templated).
    :param driver_memory, executor_memory, executor_cores, total_executor_cores,
        num_executors, verbose: spark-submit options, as in the Spark provider.
    :param openlineage_inject_parent_job_info: pass this task's OpenLineage job and run as
        ``spark.openlineage.parent*`` properties, so the OpenLineage Spark listener (when the
        cluster runs it) reports the job as a child of the Airflow task. Default: the
        ``[openlineage] spark_inject_parent_job_info`` option, as ``SparkSubmitOperator``.
    :param openlineage_inject_transport_info: likewise the OpenLineage transport
        (``[openlineage] spark_inject_transport_info``).
    :param storage_conn_id: an ``aws``-style connection holding the object store's keys
        (login/password) and ``endpoint_url`` / ``region_name`` extras (templated; default: the
        connection's ``storage_conn_id`` extra).
    :param storage_options: storage options, e.g. ``{"endpoint_url": ..., "region": ...}``
        (templated; keys: :data:`spark_jobs.io.storage.KNOWN_OPTIONS` and their aliases), over
        the connection's ``storage_options`` extra and the storage connection. Secrets are
        masked in logs; the Spark job gets them in ``$BUCKETINDEX_STORAGE_OPTIONS``, not on its
        command line. Prefer a connection for credentials: a templated argument is rendered
        into the task's "Rendered template" view.

    :param durable: keep the submitted job's identity in the task's state store
        (``task_state_store``, key :attr:`external_id_key`) through Airflow's
        ``ResumableJobMixin``, so a retry after a worker crash reattaches to it (default True).
    :param job_poll_interval: seconds between two looks at a job of an earlier try, or at a live
        writer of the batch, while the task waits for it (default 10).
    :param writer_wait_timeout: seconds a try waits for a live writer of its own batch (an
        earlier try whose identity was not kept, another worker) before it fails as before,
        retryably (default 3600; None: as long as the writer heartbeats).

    Nothing happens in ``__init__``: the hook (and through it the connection) is built
    on first use in ``execute``, after templates are rendered.

    A subclass runs its job with :meth:`run_job` (not ``self.hook.submit``) so the
    lineage properties reach spark-submit and the job survives a worker crash:

    * the job starts in a thread of the task; its identity (``{"kind": "process", "host",
      "pid", "sid"}`` for spark-submit in client/local mode and for a Spark Connect client,
      which run in a process session of their own; ``{"kind": "standalone", "driver_id",
      "master"}`` in standalone cluster deploy mode), with the batch id and table of an
      operator that commits one, goes to ``task_state_store`` before the task waits for it;
    * a retry (a new try after the worker died, or the same try restarted) reads it back
      (:meth:`reattach_job`, the mixin's ``execute_resumable``): a job still running -- its
      session alive on this host, its standalone driver running, or on another host its
      batch's writer heartbeating -- is waited for, polling its liveness and the table's
      timeline, and the outcome is read from the timeline (the commit carrying the batch id)
      instead of submitting again; a job that ended without its commit is submitted again;
    * ``on_kill`` stops the job of this try and a reattached one, and ends the waits.
    """

    #: the task_state_store key of the job's identity (renaming it breaks in-flight retries)
    external_id_key = "bucketindex_job"

    def __init__(
        self,
        *,
        conn_id: str = DEFAULT_CONN_ID,
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
        openlineage_inject_parent_job_info: bool | None = None,
        openlineage_inject_transport_info: bool | None = None,
        storage_conn_id: str | None = None,
        storage_options: dict[str, Any] | None = None,
        job_poll_interval: float = 10.0,
        writer_wait_timeout: float | None = 3600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_poll_interval = float(job_poll_interval)
        self.writer_wait_timeout = None if writer_wait_timeout is None else float(writer_wait_timeout)
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
        self.openlineage_inject_parent_job_info = openlineage_inject_parent_job_info
        self.openlineage_inject_transport_info = openlineage_inject_transport_info
        self.storage_conn_id = storage_conn_id
        self.storage_options = storage_options

    @cached_property
    def hook(self) -> BucketIndexHook:
        return BucketIndexHook(
            conn_id=self.conn_id,
            master=self.master or None,
            conf=self.conf,
            name=self.name or None,
            env_vars=self.env_vars,
            driver_memory=self.driver_memory,
            executor_memory=self.executor_memory,
            executor_cores=self.executor_cores,
            total_executor_cores=self.total_executor_cores,
            num_executors=self.num_executors,
            verbose=self.verbose,
            storage_conn_id=_text(self.storage_conn_id),
            storage_options=self.storage_options or None,
        )

    def lineage_spark_conf(self, context: Context) -> dict[str, Any]:
        """The ``spark.openlineage.*`` properties this task passes its job: none unless enabled
        (argument or ``[openlineage]`` option), and none a user already set in ``conf``.

        Through the same functions ``SparkSubmitOperator`` calls (the common-compat provider's,
        which are no-ops with a warning when the OpenLineage provider is not installed)."""
        from airflow.providers.common.compat.sdk import conf as airflow_conf

        def enabled(value: bool | None, option: str) -> bool:
            if value is not None:
                return bool(value)
            return airflow_conf.getboolean("openlineage", option, fallback=False)

        parent = enabled(self.openlineage_inject_parent_job_info, "spark_inject_parent_job_info")
        transport = enabled(self.openlineage_inject_transport_info, "spark_inject_transport_info")
        if not (parent or transport):
            return {}
        from airflow.providers.common.compat.openlineage.utils.spark import (
            inject_parent_job_information_into_spark_properties,
            inject_transport_information_into_spark_properties,
        )

        user = self.hook.spark_conf()  # connection + task conf: what the user set wins
        props = dict(user)
        if parent:
            props = inject_parent_job_information_into_spark_properties(props, context)
        if transport:
            props = inject_transport_information_into_spark_properties(props, context)
        return {k: v for k, v in props.items() if k not in user}

    def run_job(self, context: Context, verb: str, args: Sequence[str]) -> None:
        """Run ``bucketindex <verb> <args>`` as a Spark job with this task's lineage properties,
        durably: through ``ResumableJobMixin.execute_resumable`` (see the class docstring).
        Raises :class:`~airflow_provider_bucketindex.hooks.bucketindex.SparkJobFailed` as
        :meth:`BucketIndexHook.submit` does when the job this try started fails."""
        self._job_request = (verb, [str(a) for a in args], self.lineage_spark_conf(context))
        self.execute_resumable(context)

    def job_batch(self) -> dict[str, str] | None:
        """``{"table_uri", "batch_id"}`` of the commit the job makes, when it makes one the
        timeline names by batch id (an upsert, a bootstrap): kept with the job's identity, it is
        how a retry reads the outcome of a job it did not start. None: the outcome is not on the
        timeline; a job of an earlier try is waited for and then run again."""
        return None

    def job_committed(self, identity: dict[str, Any]) -> dict[str, Any] | None:
        """The commit of the job of ``identity`` (its batch's), or None."""
        uri, batch_id = identity.get("table_uri"), identity.get("batch_id")
        if not uri or not batch_id:
            return None
        return self.hook.commit_for_batch(str(uri), str(batch_id))

    # -- ResumableJobMixin -----------------------------------------------------------------
    def submit_job(self, context: Context) -> Any:
        """Start the job :meth:`run_job` asked for; its identity (kept by the mixin in
        ``task_state_store``), or None when it ended before that was known."""
        verb, args, extra_conf = self._job_request
        identity = self.hook.start(verb, args, extra_conf=extra_conf, tags=self.job_batch())
        if identity is not None:
            self.log.info("Spark job started: %s", identity)
        return identity

    def get_job_status(self, external_id: Any, context: Context) -> str:
        """``RUNNING`` (its processes or driver live; on another host: its batch's writer
        heartbeats), ``SUCCEEDED`` (ended, and the table holds its batch's commit) or ``ENDED``."""
        identity = dict(external_id) if isinstance(external_id, dict) else {}
        if not identity.get("kind"):
            return ENDED
        state = self.hook.job_state(identity)
        if state == "UNKNOWN" and identity.get("kind") == "process":  # another host: the table's heartbeat
            uri, batch_id = identity.get("table_uri"), identity.get("batch_id")
            state = RUNNING if uri and batch_id and self.hook.batch_writers(str(uri), str(batch_id)) else ENDED
        if state in (RUNNING, *_DRIVER_ACTIVE):
            return RUNNING
        return SUCCEEDED if self.job_committed(identity) is not None else ENDED

    def is_job_active(self, status: str) -> bool:
        return status == RUNNING

    def is_job_succeeded(self, status: str) -> bool:
        return status == SUCCEEDED

    def poll_until_complete(self, external_id: Any, context: Context) -> None:
        """Wait for the job. This try's own: its thread (errors raised as the job's). One of an
        earlier try: poll it until it ends (:meth:`wait_for_job`); when the table then lacks its
        commit, start it again and wait for that."""
        hook = self.hook
        if external_id is None or hook.owns(external_id):
            while not hook.wait_started(timeout=self.job_poll_interval):
                self._check_cancelled()
            return
        self.wait_for_job(dict(external_id), context)
        if self.get_job_status(external_id, context) == SUCCEEDED:
            return
        self.log.warning("The job of an earlier try ended without its outcome on the table: submitting it again")
        self.before_resubmit(context)
        identity = self.submit_job(context)
        store = context.get("task_state_store")
        if store is not None and identity is not None and self.durable:
            store.set(self.external_id_key, identity)
        self.poll_until_complete(identity, context)

    def get_job_result(self, external_id: Any, context: Context) -> Any:
        return None

    def before_resubmit(self, context: Context) -> None:
        """Called before a job of an earlier try that ended without its outcome is submitted
        again (an upsert rolls back the pending instant it left)."""

    def reattach_job(self, context: Context) -> bool:
        """Before anything else: if ``task_state_store`` holds the identity of a job that still
        runs (an earlier try's, the worker crashed), wait for it to end, polling its liveness and
        the table's timeline. True when it waited. The caller then reads the outcome from the
        table (its batch's commit) as any retry does."""
        store = context.get("task_state_store")
        if not self.durable or store is None:
            return False
        identity = store.get(self.external_id_key)
        if not isinstance(identity, dict) or self.get_job_status(identity, context) != RUNNING:
            return False
        self.log.info("The job of an earlier try is still running: reattaching to %s", identity)
        self.wait_for_job(identity, context)
        return True

    def wait_for_job(self, identity: dict[str, Any], context: Context) -> None:
        """Poll a job this try did not start until it ends: its liveness (:meth:`get_job_status`)
        every ``job_poll_interval`` seconds, and the table's timeline for its batch's commit (logged
        when it appears: the job may still compact after it). ``on_kill`` stops the job and the wait."""
        self.hook.attach(identity)
        seen = None
        try:
            while self.get_job_status(identity, context) == RUNNING:
                if seen is None and (seen := self.job_committed(identity)) is not None:
                    self.log.info("The commit of batch %s is on the timeline (%s); waiting for the job to exit",
                                  identity.get("batch_id"), seen["instant"])
                self._check_cancelled()
                self._sleep(self.job_poll_interval)
            self._check_cancelled()
        finally:
            self.hook.attach(None)
        self.log.info("The job of the earlier try has ended: %s", identity)

    def settle_batch(self, table_uri: str, batch_id: str, *, what: str = "batch") -> str | None:
        """Roll back the pending instant an earlier attempt of ``batch_id`` left, waiting out a
        writer that still heartbeats (up to ``writer_wait_timeout`` seconds, polling every
        ``job_poll_interval``) instead of failing at once: it may commit (the caller then finds
        the commit) or die (its heartbeat stops and the instant is rolled back). Returns the
        rolled-back instant or None; after the timeout, a retryable failure as before."""
        from spark_jobs.table import WriterAliveError

        started = time.monotonic()
        announced = False
        while True:
            try:
                return self.hook.rollback_batch(table_uri, batch_id, force=False)
            except WriterAliveError as e:
                waited = time.monotonic() - started
                if self.writer_wait_timeout is not None and waited >= self.writer_wait_timeout:
                    raise AirflowException(f"an earlier attempt of {what} {batch_id} is still writing after "
                                           f"{waited:.0f} s of waiting: {e}") from e
                if not announced:
                    writers = self.hook.batch_writers(table_uri, batch_id)
                    self.log.info("An earlier attempt of %s %s is still writing (%s): waiting for it to commit or "
                                  "its heartbeat to stop (up to %s s)", what, batch_id,
                                  ", ".join(f"pid {w.get('pid')} on {w.get('host')}, last heartbeat "
                                            f"{w.get('last_heartbeat')}" for w in writers) or one_line(e),
                                  "unbounded" if self.writer_wait_timeout is None else f"{self.writer_wait_timeout:g}")
                    announced = True
                self._check_cancelled()
                self._sleep(self.job_poll_interval)

    # -- cooperative cancel ------------------------------------------------------------------
    def _cancel_event(self) -> threading.Event:
        event = self.__dict__.get("_bi_cancel")
        if event is None:
            event = self.__dict__.setdefault("_bi_cancel", threading.Event())
        return event

    def _sleep(self, seconds: float) -> None:
        self._cancel_event().wait(seconds)

    def _check_cancelled(self) -> None:
        if self._cancel_event().is_set():
            raise AirflowException("the task was killed while it waited for a Spark job or a writer")

    def on_kill(self) -> None:
        self._cancel_event().set()
        hook = self.__dict__.get("hook")  # never build a hook just to kill nothing
        if hook is not None:
            hook.on_kill()


#: the values of an operator's ``engine`` (``spark_jobs.table.action.engine.ENGINES``, without importing it)
AUTO, SPARK, ARROW = "auto", "spark", "arrow"
ENGINES = (AUTO, SPARK, ARROW)


class BucketIndexEngineMixin:
    """What an operator whose work can run inside the task or as a Spark job shares: the
    ``engine`` and ``memory_budget`` arguments, their connection defaults, and the decision.

    * ``engine="auto"`` (the default, unless the connection's ``engine`` extra says otherwise):
      the work runs **in the task**, on the in-process Arrow engine (no spark-submit, no JVM,
      no ``pyspark``), when what it holds in memory fits ``memory_budget``; otherwise it is
      submitted to Spark as before. The connection's master does not change that: a small
      batch runs in the task even when the connection names a cluster.
    * ``engine="spark"``: always spark-submit (or Spark Connect), as before.
    * ``engine="arrow"``: always in the task (a batch the Arrow engine cannot run fails as bad
      input, without retries).

    ``memory_budget`` (e.g. ``"4g"``; default: the connection's ``memory_budget`` extra, else the
    ``[bucketindex] memory_budget`` option, else ``$BUCKETINDEX_ARROW_MEMORY_BUDGET``, else a quarter
    of the worker's physical memory); the engine's default likewise (``[bucketindex] engine``).
    """

    engine: Any
    memory_budget: Any
    hook: BucketIndexHook
    log: Any

    def requested_engine(self) -> tuple[str, str | None]:
        """``(engine, memory_budget)`` this task asks for: its own arguments (templates rendered),
        else the connection's ``engine`` / ``memory_budget`` extras, else the ``[bucketindex]``
        options (:meth:`BucketIndexHook.engine_defaults`), else ``auto`` and the
        machine's budget. An unknown engine fails the task without retries."""
        from airflow.sdk.exceptions import AirflowFailException

        engine, budget = _text(self.engine), _text(self.memory_budget)
        if engine is None or budget is None:
            conn_engine, conn_budget = self.hook.engine_defaults()
            engine = engine if engine is not None else conn_engine
            budget = budget if budget is not None else conn_budget
        engine = (engine or AUTO).lower()
        if engine not in ENGINES:
            raise AirflowFailException(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        return engine, budget

    def decide_engine(self, verb: str, needed_bytes: Any) -> tuple[str, Any]:
        """``(requested, EngineChoice)`` for this run: ``auto`` sizes the work with ``needed_bytes()``
        (bytes the Arrow engine would hold) against the memory budget, through the core's
        :func:`~spark_jobs.table.action.engine.choose_engine`. Logged with its reason.

        Raises the core's BadInputError for a budget that is not a size, and whatever sizing
        raises (a damaged table): the caller maps them as it maps the work's own errors."""
        from spark_jobs.table.action.engine import EngineChoice, choose_engine, memory_budget

        requested, budget = self.requested_engine()
        if requested == SPARK:
            choice = EngineChoice(SPARK, "engine='spark': submitted to Spark")
        elif requested == ARROW:
            choice = EngineChoice(ARROW, "engine='arrow': in the Airflow task")
        else:
            limit = memory_budget(budget)
            # announce=False: the line below is the choice's one log line
            auto = choose_engine(requested=AUTO, needed_bytes=int(needed_bytes()), budget=limit, announce=False)
            where = "in the Airflow task" if auto.engine == ARROW else "submitted to Spark"
            # the budget goes with the choice: the in-task engine checks the batch's exact size against it
            choice = EngineChoice(auto.engine, f"engine='auto': {auto.reason}; {where}", budget=auto.budget)
        self.log.info("%s: engine %s (%s)", verb, choice.engine, choice.reason)
        return requested, choice

    def run_in_task(
        self,
        verb: str,
        options: Callable[[str, str | None], Any],
        *,
        retryable: Callable[[str], str],
        label: str | None = None,
        what: str = "it",
        corrupt: Callable[[str], BaseException] | None = None,
    ) -> tuple[str, Any]:
        """Decide the engine of ``verb`` and, on ``arrow``, run it in this process; the one path of
        every operator's in-task work: :func:`spark_jobs.engines.run` with :meth:`decide_engine` as
        its ``decide``, so the verb's own sizing and in-process run are the CLI's, while the choice
        (this task's engine and memory budget, in the task's words, logged once) is the task's.
        ``engines.run`` never starts Spark here: a Spark choice comes back and the operator submits.

        :param verb: the ``engines.run`` verb (``upsert``, ``bootstrap``, ``rehash``, ``compact``,
            ``validate``); also the ``bucketindex <verb>`` of error messages
        :param options: ``options(engine, memory_budget)``: the verb's options dataclass for the
            requested engine (``auto`` or ``arrow``) and the task's budget -- not built for
            ``engine='spark'``, which needs no sizing and reads nothing here
        :param retryable: the message of a conflict or a busy table (an ordinary, retried failure)
        :param label: the verb in the engine's log line (default ``verb``)
        :param what: what ``engine='arrow'`` cannot run, when the Arrow engine refuses it
        :param corrupt: the exception for a damaged table (default: an ordinary failure)
        :returns: ``("arrow", result)`` run here, or ``("spark", None)``: submit it

        Errors map as the CLI's exit statuses do on the Spark path: bad input (2) fails without
        retries, a conflict or a busy table (3) is retried, a damaged table (1) is an ordinary
        failure unless ``corrupt`` says otherwise.
        """
        from spark_jobs.engines import SubmitToSpark, run
        from spark_jobs.exceptions import BadInputError, EngineUnsupportedError, RetryableError, TableCorruptError

        label = label or verb
        try:
            requested, budget = self.requested_engine()
            if requested == SPARK:
                self.decide_engine(label, lambda: 0)
                return SPARK, None
            opts = options(requested, budget)
            try:
                result = run(verb, opts, decide=lambda needed: self.decide_engine(label, needed)[1])
            except EngineUnsupportedError as e:  # engine='arrow' asked for explicitly: bad input, as the CLI's
                raise EngineUnsupportedError(f"engine='arrow' cannot run {what}: {one_line(e)}; "
                                             f"use engine='spark'") from e
        except TableCorruptError as e:  # the CLI's exit status 1
            if corrupt is not None:
                raise corrupt(one_line(e)) from e
            raise AirflowException(f"bucketindex {verb} failed: {one_line(e)}; nothing was committed") from e
        except BadInputError as e:  # bad input: nothing was written, a retry cannot help
            raise AirflowFailException(f"bucketindex {verb} failed: {one_line(e)}") from e
        except RetryableError as e:  # a conflict or a busy table: an ordinary, retryable failure
            raise AirflowException(retryable(one_line(e))) from e
        if isinstance(result, SubmitToSpark):
            if result.unsupported is not None:  # auto chose Arrow, which refused before writing anything
                self.log.info("%s: engine spark (engine='auto': %s, nothing was written; submitted to Spark)",
                              label, result.choice.reason)
            return SPARK, None
        return ARROW, result


def _text(value: Any) -> str | None:
    """A rendered template value as text; None or "" (an unset param) is None."""
    if value is None:
        return None
    text = str(value).strip()
    return None if text in ("", "None") else text


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
