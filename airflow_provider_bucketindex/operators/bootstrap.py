"""BootstrapTableOperator: make a new bucketindex table from an existing Parquet dataset (a migration)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_bucketindex.hooks.bucketindex import EXIT_BAD_INPUT, EXIT_RETRYABLE, SparkJobFailed
from airflow_provider_bucketindex.operators.base import (
    ARROW,
    SPARK,
    BucketIndexEngineMixin,
    BucketIndexSparkOperator,
    one_line,
    storage_scoped,
)
from spark_jobs.io.storage import redact_uri

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["BootstrapTableOperator"]

#: the counts of a bootstrap's result (the CLI's JSON line; the commit metadata's ``bootstrap.counts``)
BOOTSTRAP_COUNTS = ("rows", "files_referenced", "files_rewritten", "duplicate_keys", "rows_dropped")
_UNSET = ("", "none", "null")


class BootstrapTableOperator(BucketIndexEngineMixin, BucketIndexSparkOperator):
    """Make a new table at ``table_uri`` from the Parquet dataset at ``source_uri``
    (``bucketindex bootstrap TABLE SOURCE --record-key K ...``): in the task on the in-process
    Arrow engine when the dataset fits the memory budget (``engine="auto"``, the default; no
    spark-submit, no JVM), else with spark-submit (``bucketindex bootstrap --engine spark``).

    The source is Hive-style (``P=value`` directories) or flat Parquet files. Two modes:

    * ``reference`` (the default for the ``record`` index): the source's files stay where
      they are and become the table's first file slices -- a metadata-only migration; only
      file groups holding losing duplicate rows are rewritten. The record index is built
      from one scan of the key columns. The referenced files stay the user's: bucketindex
      never deletes a file outside the table root (``clean`` included).
    * ``rewrite``: every row is rewritten into the table's own layout. The ``bucket`` and
      ``global_simple`` indexes require it (and it is their default).

    **Checked in the task before anything is submitted** (pure Python): ``index`` is one of
    :class:`~spark_jobs.table.action.bootstrap.BootstrapOptions`' (``record``, ``bucket``,
    ``global_simple``), ``mode`` is None, ``reference`` or ``rewrite``, only ``record`` with
    ``reference``, the record key names at least one field, ``num_buckets`` is a whole
    number of at least 1, ``table_type`` is known. A wrong value fails the task without a
    retry and without a Spark job.

    :param table_uri: where the new table goes (templated).
    :param source_uri: the existing Parquet dataset (templated).
    :param record_key: key field, or fields (list or comma-separated).
    :param partition_field: the Hive-style partition column of the source (templated).
    :param precombine_field: when a key occurs more than once in the source, the row with the
        largest value wins; without it duplicate keys fail the task (exit status 2, with
        counts and sample keys).
    :param index: ``record`` (default), ``bucket`` or ``global_simple`` (the CLI's ``--index``).
    :param mode: ``reference``, ``rewrite`` or None -- the CLI's default, ``reference`` for the
        record index and ``rewrite`` for the others (templated; a rendered ``""`` or
        ``"None"`` means None).
    :param num_buckets: index buckets (record) or buckets per partition (bucket) (templated;
        a rendered string is accepted). None: the CLI's default.
    :param table_type: ``copy_on_write`` or ``merge_on_read``; None: the CLI's default.
    :param batch_id: the bootstrap's id (templated). Default: the CLI's, derived from
        ``source_uri`` -- the same for every try and every run of the migration, so a retry,
        a cleared task or a second DAG run after the bootstrap completed is a no-op (it does
        not even start spark-submit).
    :param heartbeat_timeout_s: seconds without a heartbeat after which a pending write
        counts as abandoned; default the CLI's (60).
    :param engine: ``auto`` (default: the connection's ``engine`` extra, else auto) runs the
        bootstrap in the task when the dataset, decoded, fits ``memory_budget``
        (:func:`spark_jobs.table.action.bootstrap.footprint`), and submits it to Spark
        otherwise -- also when the Arrow engine finds, before writing anything, that it cannot
        run it; ``spark``: always spark-submit; ``arrow``: always in the task (templated).
    :param memory_budget: what the in-task engine may hold, e.g. ``"4g"`` (templated; default:
        the connection's ``memory_budget`` extra, else ``[bucketindex] memory_budget``, else the machine's).

    Connection table defaults (``index``, ``num_buckets``, ``table_type`` extras) do not
    apply: a bootstrap says what it builds, or takes the CLI's defaults.

    Exit status 2 (bad input: no source, duplicate keys without ``precombine_field``, a table
    that already holds other data, ``bucket`` with ``reference``; nothing written) fails the
    task without retries, with the job's error line; 3 (a conflict: nothing written) is an
    ordinary failure the task's ``retries`` repeat under the same batch id.

    Returns ``{"table_uri", "batch_id", "instant", "noop", "mode", "index_type", "counts"}``
    with ``counts`` = ``{"rows", "files_referenced", "files_rewritten", "duplicate_keys",
    "rows_dropped"}`` as the commit metadata records them (read back from the timeline; a count
    it does not record is left out) (XCom ``return_value``, and ``instant`` and ``counts`` as keys of their
    own as an upsert pushes them -- all only with ``do_xcom_push``). Lineage: input the
    source, output the table; the table's Asset gets an event through the
    :data:`~airflow_provider_bucketindex.lineage.TABLE_UPDATES` alias (extra ``{"instant",
    "batch_id", "action": "bootstrap", "mode", "inserted": rows, "updated": 0, "deleted": 0}``),
    as an upsert's does.
    """

    template_fields: Sequence[str] = (
        "table_uri",
        "source_uri",
        "batch_id",
        "mode",
        "num_buckets",
        "partition_field",
        "master",
        "conf",
        "name",
        "env_vars",
        "storage_conn_id",
        "storage_options",
        "engine",
        "memory_budget",
    )
    ui_color = "#e8f0fe"
    emits_table_updates = True

    def __init__(
        self,
        *,
        table_uri: str,
        source_uri: str,
        record_key: str | list[str],
        partition_field: str | None = None,
        precombine_field: str | None = None,
        index: str = "record",
        mode: str | None = None,
        num_buckets: int | str | None = None,
        table_type: str | None = None,
        batch_id: str | None = None,
        heartbeat_timeout_s: float | None = None,
        engine: str | None = None,
        memory_budget: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.default_outlets(kwargs)
        super().__init__(**kwargs)
        self.table_uri = table_uri
        self.source_uri = source_uri
        self.record_key = record_key
        self.partition_field = partition_field
        self.precombine_field = precombine_field
        self.index = index
        self.mode = mode
        self.num_buckets = num_buckets
        self.table_type = table_type
        self.batch_id = batch_id
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.engine = engine
        self.memory_budget = memory_budget

    # -- the command ---------------------------------------------------------------------------
    def build_args(self, batch_id: str) -> list[str]:
        """``bucketindex bootstrap`` arguments, checked (AirflowFailException for a bad combination):
        :meth:`BootstrapOptions.to_argv` of the job's options, ``--index`` always written and
        ``--engine spark`` -- the operator has decided the engine: the submitted job does not
        decide again."""
        return self._options(batch_id, engine=SPARK).to_argv(given=("index",))

    def _options(self, batch_id: str, *, engine: str, memory_budget: str | None = None) -> Any:
        """The operator's arguments checked (AirflowFailException, in the operator's words) and
        made the :class:`~spark_jobs.table.action.bootstrap.BootstrapOptions` the job runs."""
        from spark_jobs.exceptions import BadInputError
        # the index types and modes are the options' own, so the task accepts what the CLI does
        # (imported here, as the options are: a DAG file that imports the operator stays light)
        from spark_jobs.table.action.bootstrap import (
            BOOTSTRAP_INDEXES,
            MODE_REFERENCE,
            BootstrapOptions,
            refuse_reference,
        )

        index = str(self.index if self.index is not None else "").strip()
        if index not in BOOTSTRAP_INDEXES:
            raise AirflowFailException(f"index must be one of {', '.join(BOOTSTRAP_INDEXES)}, got {self.index!r}")
        mode = self._mode()
        if mode == MODE_REFERENCE:
            try:
                refuse_reference(index)
            except BadInputError as e:
                raise AirflowFailException(
                    f"the {index} index needs mode='rewrite'; mode='reference' keeps the source's files and works "
                    f"with the record index only ({one_line(e)})") from None
        key = self._record_key()
        timeout: float | None = None
        if self.heartbeat_timeout_s is not None:
            try:
                timeout = float(self.heartbeat_timeout_s)
            except (TypeError, ValueError):
                raise AirflowFailException(
                    f"heartbeat_timeout_s must be a number, got {self.heartbeat_timeout_s!r}") from None
            if not timeout > 0:
                raise AirflowFailException(f"heartbeat_timeout_s must be positive, got {self.heartbeat_timeout_s!r}")
            if timeout.is_integer():  # 120 stays "--heartbeat-timeout 120" on the command line
                timeout = int(timeout)

        def text(value: Any) -> str | None:
            return None if value is None or str(value).strip() == "" else str(value).strip()

        try:
            return BootstrapOptions(
                table=str(self.table_uri), source=str(self.source_uri), record_key=key.split(","),
                partition_field=text(self.partition_field), precombine_field=text(self.precombine_field),
                index=index, mode=mode, num_buckets=self._num_buckets(), table_type=self._table_type(),
                batch_id=str(batch_id), heartbeat_timeout_s=timeout, engine=engine, memory_budget=memory_budget)
        except BadInputError as e:  # a check only the options make: no job, no retry
            raise AirflowFailException(f"bucketindex bootstrap: {one_line(e)}") from e

    def spark_submit_command(self, batch_id: str) -> list[str]:
        """The exact spark-submit command ``execute`` runs for ``batch_id`` (templates rendered)."""
        return self.hook.build_command("bootstrap", self.build_args(batch_id))

    # -- running it ----------------------------------------------------------------------------
    @storage_scoped
    def execute(self, context: Context) -> dict[str, Any]:
        table_uri, source_uri = str(self.table_uri), str(self.source_uri)
        from spark_jobs.table.action.bootstrap import default_batch_id  # pure Python

        batch_id = str(self.batch_id) if self.batch_id else default_batch_id(source_uri)
        args = self.build_args(batch_id)  # a bad combination fails here: no job, no retry
        hook = self.hook

        self._batch = {"table_uri": table_uri, "batch_id": batch_id}
        self.reattach_job(context)  # a Spark job of an earlier try (the worker died) that still runs
        done = self._completed(table_uri, batch_id)
        if done is not None:
            self.log.info("%s was bootstrapped by batch %s at %s (an earlier try): nothing to do",
                          table_uri, batch_id, done["instant"])
            return self._publish(context, done, noop=True)

        rolled = self.settle_batch(table_uri, batch_id, what="bootstrap")
        if rolled:
            self.log.info("Rolled back %s left pending by an earlier attempt of bootstrap %s", rolled, batch_id)
        elif (done := self._completed(table_uri, batch_id)) is not None:  # the writer waited for finished it
            self.log.info("%s was bootstrapped by batch %s at %s (an earlier try): nothing to do",
                          table_uri, batch_id, done["instant"])
            return self._publish(context, done, noop=True)

        self.log.info("Bootstrapping %s from %s (batch %s)", table_uri, source_uri, batch_id)
        in_task = self._run_in_task(batch_id)
        try:
            if not in_task:
                self.run_job(context, "bootstrap", args)
        except SparkJobFailed as e:
            if e.returncode == EXIT_BAD_INPUT:  # bad input: nothing was written, a retry cannot help
                raise AirflowFailException(str(e)) from e
            if e.returncode == EXIT_RETRYABLE:  # a conflict: nothing was written
                raise AirflowException(
                    f"bootstrap {batch_id} of {table_uri} met a concurrent writer and wrote nothing ({e.reason}); "
                    f"the task's retries run it again under the same batch id"
                ) from e
            raise

        done = self._completed(table_uri, batch_id)
        if done is None:
            how = "the bootstrap in the task returned" if in_task else "bucketindex bootstrap exited 0"
            raise AirflowException(f"{how} but no bootstrap of {table_uri} carries batch id {batch_id}")
        counts = done["counts"]
        self.log.info("Bootstrapped %s at %s (%s mode, %s index): %s", table_uri, done["instant"], done["mode"],
                      done["index_type"], ", ".join(f"{k} {v}" for k, v in counts.items()))
        return self._publish(context, done, noop=False)

    def options(self, batch_id: str, *, memory_budget: str | None = None) -> Any:
        """The :class:`~spark_jobs.table.action.bootstrap.BootstrapOptions` of the in-task run:
        the ones :meth:`build_args` passes the CLI, with ``engine`` ``arrow``: the operator has decided."""
        return self._options(batch_id, engine=ARROW, memory_budget=memory_budget)

    def _run_in_task(self, batch_id: str) -> bool:
        """Decide the engine; on ``arrow`` bootstrap in this process and return True. False: the
        bootstrap goes to Spark (decided so, or ``auto`` and the Arrow engine cannot run it).

        Through :meth:`~BucketIndexEngineMixin.run_in_task` (:func:`spark_jobs.engines.run`): the
        dataset is listed and checked (the core's checks, before anything is written), then sized."""
        table_uri = self.table_uri
        engine, result = self.run_in_task(
            "bootstrap", lambda engine, budget: self._options(batch_id, engine=engine, memory_budget=budget),
            what="this bootstrap",
            retryable=lambda e: (f"bootstrap {batch_id} of {table_uri} met a concurrent writer and wrote nothing "
                                 f"({e}); the task's retries run it again under the same batch id"))
        if engine != ARROW:
            return False
        self.log.info("bootstrap in the task: instant %s, %s ms", result.get("instant"),
                      (result.get("timings_ms") or {}).get("total_ms", "?"))
        return True

    def _publish(self, context: Context, done: dict[str, Any], *, noop: bool) -> dict[str, Any]:
        table_uri = str(self.table_uri)
        counts = done["counts"]
        self.set_lineage(inputs=[str(self.source_uri)], outputs=[table_uri], output_rows=counts.get("rows"))
        rows = int(counts.get("rows") or 0)
        self.emit_table_update(context, table_uri, instant=done["instant"], batch_id=done["batch_id"],
                               action="bootstrap", mode=done["mode"], inserted=rows, updated=0, deleted=0)
        self.push_xcom(context, instant=done["instant"], counts=counts)
        return {"table_uri": redact_uri(table_uri), "batch_id": done["batch_id"], "instant": done["instant"], "noop": noop,
                "mode": done["mode"], "index_type": done["index_type"], "counts": counts}

    def job_batch(self) -> dict[str, str] | None:
        return dict(self._batch)

    def before_resubmit(self, context: Context) -> None:
        rolled = self.settle_batch(self._batch["table_uri"], self._batch["batch_id"], what="bootstrap")
        if rolled:
            self.log.info("Rolled back %s left pending by the job of the earlier try", rolled)

    def _completed(self, table_uri: str, batch_id: str) -> dict[str, Any] | None:
        """The completed bootstrap of ``batch_id`` read from the timeline (the job's stdout is its
        log): instant, mode, index type, counts; None when there is none. A completed *upsert*
        carrying that batch id means the table already holds other data: no job, no retry."""
        from spark_jobs.table.timeline import Action

        t = self.hook.open_table(table_uri)
        if not t.exists:
            return None
        inst = t.commit_for_batch(batch_id)
        if inst is None:
            return None
        if inst.action != Action.BOOTSTRAP:
            raise AirflowFailException(f"{table_uri} already holds data: batch id {batch_id} is its {inst.action} "
                                       f"{inst.timestamp}, not a bootstrap")
        meta = t.timeline.read_metadata(inst)  # an archived entry is read from the archive
        # the bootstrap's own summary; the entry's ``counts`` are a commit's (inserted = the table's rows)
        summary = meta.get("bootstrap") or {}
        raw = dict(summary.get("counts") or {})
        if raw.get("rows") is None and (meta.get("counts") or {}).get("inserted") is not None:
            raw["rows"] = meta["counts"]["inserted"]
        config = t.config
        mode = summary.get("mode") or meta.get("mode") or (
            "reference" if getattr(config, "reference", None) else "rewrite")
        return {
            "instant": inst.timestamp,
            "batch_id": batch_id,
            "mode": mode,
            "index_type": meta.get("index_type") or (config.index_type if config is not None else None),
            "counts": {k: int(raw[k]) for k in BOOTSTRAP_COUNTS if raw.get(k) is not None},
        }

    # -- argument checks (pure Python) -----------------------------------------------------------
    def _mode(self) -> str | None:
        from spark_jobs.table.action.bootstrap import MODES

        if self.mode is None or str(self.mode).strip().lower() in _UNSET:
            return None
        mode = str(self.mode).strip()
        if mode not in MODES:
            raise AirflowFailException(f"mode must be one of {', '.join(MODES)} or None, got {self.mode!r}")
        return mode

    def _record_key(self) -> str:
        raw = self.record_key
        parts = str(raw).split(",") if isinstance(raw, str) else [str(p) for p in (raw or [])]
        fields = [p.strip() for p in parts]
        if not fields or any(not f for f in fields):
            raise AirflowFailException(f"record_key must name at least one field (and no empty one), got {raw!r}")
        return ",".join(fields)

    def _num_buckets(self) -> int | None:
        if self.num_buckets is None or str(self.num_buckets).strip().lower() in _UNSET:
            return None
        try:
            count = int(str(self.num_buckets).strip())
        except ValueError:
            raise AirflowFailException(f"num_buckets must be a whole number, got {self.num_buckets!r}") from None
        if count < 1:
            raise AirflowFailException(f"num_buckets must be at least 1, got {count}")
        return count

    def _table_type(self) -> str | None:
        from spark_jobs.table.config import TABLE_TYPES  # pure Python

        if self.table_type is None or str(self.table_type).strip() == "":
            return None
        table_type = str(self.table_type).strip()
        if table_type not in TABLE_TYPES:
            raise AirflowFailException(f"table_type must be one of {', '.join(TABLE_TYPES)}, got {self.table_type!r}")
        return table_type

    def on_kill(self) -> None:
        super().on_kill()
        self.log.warning("spark-submit stopped; a pending bootstrap instant, if any, is rolled back by the next try")
