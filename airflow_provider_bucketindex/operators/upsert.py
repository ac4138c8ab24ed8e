"""UpsertWithIndexOperator: one batch into a table, data + index in one commit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_bucketindex.batch import batch_id_from_context, legacy_batch_id, replay_suffix, with_source
from airflow_provider_bucketindex.hooks.bucketindex import (
    EXIT_BAD_INPUT,
    EXIT_RETRYABLE,
    SparkJobFailed,
    record_key_fields,
    whole_number,
)
from airflow_provider_bucketindex.operators.base import (
    ARROW,
    SPARK,
    BucketIndexEngineMixin,
    BucketIndexSparkOperator,
    one_line,
    storage_scoped,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["UpsertWithIndexOperator"]


class UpsertWithIndexOperator(BucketIndexEngineMixin, BucketIndexSparkOperator):
    """Upsert (and delete) the rows of ``source_uri`` into the table at ``table_uri``.

    A batch that fits the memory budget runs **inside the task** on the in-process Arrow
    engine (:func:`spark_jobs.arrow_engine.upsert.run_upsert`: no spark-submit, no JVM); a
    larger one runs ``bucketindex upsert --engine spark`` with spark-submit (see ``engine``).
    Either way data files and index entries of the batch appear in one commit, or not at all,
    and XCom, lineage, the Asset event and the failure mapping are the same.

    :param table_uri: the table (local path, ``file://``, ``s3://``, ``hdfs://``); created
        by the first upsert (templated).
    :param source_uri: a file or folder of source rows (templated).
    :param record_key: key field, or fields (list or comma-separated) (templated); needed only
        when the upsert creates the table: an existing table's key is read from its ``table.json``
        (given, it must match).
    :param precombine_field: when a key occurs more than once, the row with the largest
        value wins (templated).
    :param partition_field: partition the table by this field (templated).
    :param index: ``record``, ``bucket`` or ``global_simple`` (templated).
    :param num_buckets: index bucket count (templated).
    :param table_type: ``copy_on_write`` or ``merge_on_read`` (upserts append logs, and fold
        the due ones after their commit unless the table was created with ``--auto-compact off``),
        fixed when the table is created; None: merge_on_read, copy_on_write with a mirror (templated).
    :param source_format: ``parquet``, ``json`` or ``csv`` (templated).
    :param delete_field: rows whose field is true delete their key (templated).
    :param partial_update: the batch may lack table columns: updated rows keep their stored
        values of those, inserted rows get nulls (``--partial-update``; format.md §8).
    :param schema_evolution: what the batch may change of the table's schema
        (``--schema-evolution``): ``none`` (default), ``add-columns``, ``widen``, ``all`` or a
        comma list; format.md "Schema evolution".
    :param auto_compact: ``"on"`` or ``"off"`` (``--auto-compact``): after the commit (in the
        task or in the submitted Spark job), compact the merge-on-read file groups the batch touched that are due, and
        the record-index buckets it wrote a delta to that are due, through a
        scheduled compaction plan (format.md §5.2); default the table's setting (recorded by
        the upsert that created it with the flag; off when absent).
    :param batch_id: the batch's id; a batch id that is already committed makes the upsert
        a no-op (templated). Default ``<dag_id>/<task_id>/<data interval start>--<end>/src-<12 hex>``
        (:mod:`airflow_provider_bucketindex.batch`; the hex digits a digest of the rendered
        ``source_uri``'s normalised location): the same for every try of the task and for every
        run of the same data interval from the same source, so neither a retry nor a re-run of a
        past date applies the batch twice, while the interval read from another source is another
        batch; a run without a data interval uses ``<dag_id>/<run_id>/<task_id>/src-...``. A
        table whose commit carries the earlier form (without ``/src-...``) of the id sees the
        re-run as a no-op too.
    :param replay: apply the batch again although its interval's batch is committed (templated;
        default False): the batch id gets ``/replay/<run_id>``, new for this run (its retries
        share it). For a corrected file at the same location; a plain re-run is a no-op.
    :param skip_committed_batches: when the batch id is already committed (a retry after
        the commit), do not even start spark-submit; push the existing commit.
    :param engine: ``auto`` (default: the connection's ``engine`` extra, else auto) runs the
        batch in the task when the batch, the largest file group it may rewrite and the index
        bucket it reads fit ``memory_budget`` (:func:`spark_jobs.engines.upsert_footprint`),
        and submits it to Spark otherwise -- also when the Arrow engine finds, before writing
        anything, a rule it cannot reproduce (a JSON or CSV source into a new table, ...).
        ``spark``: always spark-submit; ``arrow``: always in the task (templated).
    :param memory_budget: what the in-task engine may hold, e.g. ``"4g"`` (templated; default:
        the connection's ``memory_budget`` extra, else ``[bucketindex] memory_budget``,
        else ``$BUCKETINDEX_ARROW_MEMORY_BUDGET``, else
        a quarter of the worker's physical memory).

    Index type, bucket count, table type and source format default to the connection's
    extras; index type, bucket count and table type only when the upsert creates the table
    (an existing table keeps its own). Pushes to XCom -- only with ``do_xcom_push`` (the
    default) -- ``instant`` (the commit), ``counts`` (inserted, updated, deleted), and as
    return value a summary of both with the ``engine`` that wrote the commit (``arrow`` in
    the task, ``spark`` submitted; None for a commit that does not record it).

    Lineage and assets: the default outlet is the alias
    :data:`~airflow_provider_bucketindex.lineage.TABLE_UPDATES`; each run (also a retry that
    finds its batch committed) records an Asset event for ``table_asset(table_uri)`` with
    extra ``{"instant", "batch_id", "inserted", "updated", "deleted"}`` (and ``engine`` when the
    commit records it), so a DAG with
    ``schedule=[table_asset(uri)]`` runs after it. OpenLineage: input the source, output
    the table with ``outputStatistics.rowCount`` = inserted + updated + deleted.

    Exit status 2 (bad input) fails the task without retries; exit status 3 (a concurrent
    commit conflicted after the job's own retries, or the table was busy) is an ordinary
    failure that the task's ``retries`` repeat under the same batch id. In the task, the
    same errors map the same way: ``BadInputError`` fails without retries,
    ``RetryableError`` (a conflict, a live writer) is retried.

    If the task is killed (``on_kill``), spark-submit is stopped and the batch's pending instant
    is left for the rollback task (:class:`RollbackBatchOperator`) or the next try, which rolls
    back a pending instant of its own batch before it starts (in-task, the writer dies with
    the task; its instant counts as abandoned once its heartbeat stops).

    If the *worker* dies instead (no ``on_kill``), a submitted job runs on: its identity is in the
    task's state store (:class:`BucketIndexSparkOperator`, ``durable``), and the retry waits for
    it and reads its commit from the timeline -- the batch is committed once, and the retry does
    not fail "still writing". A retry that finds a live writer of its batch it has no identity
    for waits for it to commit or its heartbeat to stop (``writer_wait_timeout``).

    ``env_vars``, ``conf`` and the other Spark options apply to spark-submit only; in the task
    the storage options (``storage_options``, ``storage_conn_id``, the connection's extras) over
    the worker's own environment reach the table and the source, as they do for the sensors,
    the rollback and the clean task; the Spark job gets the same storage options through its
    environment.
    """

    template_fields: Sequence[str] = (
        "table_uri",
        "source_uri",
        "record_key",
        "precombine_field",
        "partition_field",
        "index",
        "num_buckets",
        "table_type",
        "source_format",
        "delete_field",
        "batch_id",
        "replay",
        "engine",
        "memory_budget",
        "master",
        "conf",
        "name",
        "env_vars",
        "storage_conn_id",
        "storage_options",
    )
    ui_color = "#e8f0fe"
    emits_table_updates = True

    def __init__(
        self,
        *,
        table_uri: str,
        source_uri: str,
        record_key: str | list[str] | None = None,
        precombine_field: str | None = None,
        partition_field: str | None = None,
        index: str | None = None,
        num_buckets: int | str | None = None,
        table_type: str | None = None,
        source_format: str | None = None,
        delete_field: str | None = None,
        batch_id: str | None = None,
        replay: bool | str = False,
        skip_committed_batches: bool = True,
        engine: str | None = None,
        memory_budget: str | None = None,
        partial_update: bool = False,
        schema_evolution: str | None = None,
        auto_compact: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.default_outlets(kwargs)
        super().__init__(**kwargs)
        self.table_uri = table_uri
        self.source_uri = source_uri
        self.record_key = record_key
        self.precombine_field = precombine_field
        self.partition_field = partition_field
        self.index = index
        self.num_buckets = num_buckets
        self.table_type = table_type
        self.source_format = source_format
        self.delete_field = delete_field
        self.batch_id = batch_id
        self.replay = replay
        self.skip_committed_batches = skip_committed_batches
        self.engine = engine
        self.memory_budget = memory_budget
        self.partial_update = bool(partial_update)
        self.schema_evolution = schema_evolution
        self.auto_compact = auto_compact

    def _table_options(self, table_exists: bool) -> dict[str, Any]:
        """index, num_buckets, table_type and source_format: the task's, else the connection's
        (the first three only for a table the upsert creates)."""
        defaults = self.hook.table_defaults()
        index, num_buckets, table_type = self.index, self.num_buckets, self.table_type
        if not table_exists:
            index = index if index not in (None, "") else defaults.get("index")
            num_buckets = num_buckets if num_buckets not in (None, "") else defaults.get("num_buckets")
            table_type = table_type if table_type not in (None, "") else defaults.get("table_type")
        source_format = self.source_format if self.source_format not in (None, "") else defaults.get("source_format")
        return {"index": index, "num_buckets": num_buckets, "table_type": table_type, "source_format": source_format}

    def build_args(self, batch_id: str, *, table_exists: bool) -> list[str]:
        """``bucketindex upsert`` arguments of the Spark job, connection defaults filled in, with
        ``--engine spark``: the operator has decided, the submitted job does not decide again.
        The options' own :meth:`~spark_jobs.table.action.upsert.UpsertOptions.to_argv`, so the job
        parses back exactly the options an in-task run would use."""
        opts = self.upsert_options(batch_id, table_exists=table_exists, engine=SPARK)
        given = ("source_format",) if self._table_options(table_exists)["source_format"] not in (None, "") else ()
        return opts.to_argv(given=given)

    def spark_submit_command(self, batch_id: str) -> list[str]:
        """The exact spark-submit command ``execute`` runs for ``batch_id`` when the batch goes to
        Spark (templates rendered)."""
        args = self.build_args(batch_id, table_exists=self.hook.table_exists(str(self.table_uri)))
        return self.hook.build_command("upsert", args)

    def upsert_options(self, batch_id: str, *, table_exists: bool, memory_budget: str | None = None,
                       engine: str = ARROW) -> Any:
        """The :class:`~spark_jobs.table.action.upsert.UpsertOptions` of this task: connection
        defaults filled in, templated text made typed (``num_buckets="8"``), checked once by the
        options themselves (bad values raise ``BadInputError``). ``engine``: the requested one
        (``auto`` or ``arrow``) for the in-task run, ``spark`` for the submitted job's arguments
        (:meth:`build_args`)."""
        from spark_jobs.table.action.upsert import UpsertOptions

        opt = self._table_options(table_exists)

        def text(value: Any) -> str | None:
            return None if value is None or value == "" else str(value)

        return UpsertOptions(
            table=str(self.table_uri),
            source=str(self.source_uri),
            record_key=record_key_fields(self.record_key),  # None: the table's key (a new table refuses it, exit 2)
            precombine_field=text(self.precombine_field),
            partition_field=text(self.partition_field),
            index=text(opt["index"]),
            num_buckets=whole_number("num_buckets", opt["num_buckets"]),
            table_type=text(opt["table_type"]),
            source_format=text(opt["source_format"]) or "parquet",
            delete_field=text(self.delete_field),
            batch_id=batch_id,
            engine=engine,
            memory_budget=memory_budget,
            partial_update=self.partial_update,
            schema_evolution=text(self.schema_evolution),
            auto_compact=text(self.auto_compact),
        )

    @storage_scoped
    def execute(self, context: Context) -> dict[str, Any]:
        table_uri = str(self.table_uri)
        replay = _flag(self.replay)
        batch_id = str(self.batch_id) if self.batch_id else (
            with_source(batch_id_from_context(context), self.batch_source())
            + (replay_suffix(context) if replay else ""))
        hook = self.hook
        self._batch = {"table_uri": table_uri, "batch_id": batch_id}
        self.log.info("Batch %s -> %s", batch_id, table_uri)

        # a Spark job of an earlier try (the worker died) that still runs: wait for it, then read its outcome
        self.reattach_job(context)
        if self.skip_committed_batches and (done := self._committed_before(table_uri, batch_id, replay)):
            return self._publish(context, done)
        # a table written before batch ids named their source: its commit of this interval carries the
        # earlier form of the id (checked whatever skip_committed_batches says: the job knows one id only)
        if not self.batch_id and not replay and (done := self._committed_under_legacy_id(table_uri, batch_id)):
            return self._publish(context, done)

        # a live writer of this batch that no kept identity names: wait it out (it commits, or its heartbeat stops)
        rolled = self.settle_batch(table_uri, batch_id)
        if rolled:
            self.log.info("Rolled back %s left pending by an earlier attempt of batch %s", rolled, batch_id)
        elif self.skip_committed_batches and (done := self._committed_before(table_uri, batch_id, replay)):
            return self._publish(context, done)  # the writer waited for committed this batch

        table_exists = hook.table_exists(table_uri)
        engine = self._run_in_task(batch_id, table_exists=table_exists)
        if engine is None:
            self._submit(context, batch_id, table_exists=table_exists)
            engine = SPARK

        done = hook.commit_for_batch(table_uri, batch_id)
        if done is None:
            how = "bucketindex upsert exited 0" if engine == SPARK else "the upsert in the task returned"
            raise AirflowException(f"{how} but no commit of {table_uri} carries batch id {batch_id}")
        self.log.info(
            "Committed %s on %s: %d inserted, %d updated, %d deleted",
            done["instant"],
            done.get("engine") or engine,
            done["inserted"],
            done["updated"],
            done["deleted"],
        )
        return self._publish(context, {**done, "engine": done.get("engine") or engine})

    def batch_source(self) -> Any:
        """What the default batch id names as the batch's source (:func:`~airflow_provider_bucketindex.batch.
        source_identity`): the rendered ``source_uri``. The TaskFlow decorator's in-memory batch has none."""
        return self.source_uri

    def _committed_before(self, table_uri: str, batch_id: str, replay: bool) -> dict[str, Any] | None:
        done = self.hook.commit_for_batch(table_uri, batch_id)
        if done is not None:
            self.log.info("Batch %s is already committed at %s (an earlier try, or an earlier run of this data "
                          "interval from the same source): nothing to do%s", batch_id, done["instant"],
                          "" if self.batch_id or replay else "; replay=True applies it again under a new batch id")
        return done

    def _committed_under_legacy_id(self, table_uri: str, batch_id: str) -> dict[str, Any] | None:
        """The commit of this interval under the earlier form of the default id (no source part), or None."""
        legacy = legacy_batch_id(batch_id)
        done = None if legacy is None else self.hook.commit_for_batch(table_uri, legacy)
        if done is not None:
            self.log.info("Batch %s is already committed at %s under the earlier form of its id, %s (the data "
                          "interval alone, written before batch ids named their source): nothing to do; "
                          "replay=True applies it again under a new batch id", batch_id, done["instant"], legacy)
        return done

    def job_batch(self) -> dict[str, str] | None:
        return dict(self._batch)

    def before_resubmit(self, context: Context) -> None:
        rolled = self.settle_batch(self._batch["table_uri"], self._batch["batch_id"])
        if rolled:
            self.log.info("Rolled back %s left pending by the job of the earlier try", rolled)

    def _run_in_task(self, batch_id: str, *, table_exists: bool) -> str | None:
        """Decide the engine; on ``arrow`` run the batch in this process and return ``"arrow"``.
        None: the batch goes to Spark (decided so, or ``auto`` and the Arrow engine cannot run it).
        Through :meth:`~BucketIndexEngineMixin.run_in_task` (:func:`spark_jobs.engines.run`, which
        runs the CLI's pre-checks of the batch before the in-process upsert)."""
        engine, result = self.run_in_task(
            "upsert",
            lambda engine, budget: self.upsert_options(batch_id, table_exists=table_exists, memory_budget=budget,
                                                       engine=engine),
            what="this batch",
            retryable=lambda e: (f"batch {batch_id} met concurrent writers and wrote nothing ({e}); the task's "
                                 f"retries apply it under the same batch id"))
        if engine != ARROW:
            return None
        timings = result.get("timings_ms") or {}
        self.log.info("upsert in the task: instant %s%s, %s ms", result.get("instant"),
                      " (batch already committed)" if result.get("noop") else "", timings.get("total_ms", "?"))
        return ARROW

    def _submit(self, context: Context, batch_id: str, *, table_exists: bool) -> None:
        self._check_options(batch_id, table_exists=table_exists)
        args = self.build_args(batch_id, table_exists=table_exists)
        try:
            self.run_job(context, "upsert", args)
        except SparkJobFailed as e:
            if e.returncode == EXIT_BAD_INPUT:  # bad input: nothing was written, a retry cannot help
                raise AirflowFailException(str(e)) from e
            if e.returncode == EXIT_RETRYABLE:  # a conflict or a busy table: an ordinary, retryable failure
                raise AirflowException(
                    f"batch {batch_id} met concurrent writers and wrote nothing ({e.reason}); the task's retries "
                    f"apply it under the same batch id"
                ) from e
            raise

    def _check_options(self, batch_id: str, *, table_exists: bool) -> None:
        """The options against the table's ``table.json`` (and a record key for a new table), as
        the job would check them, before spark-submit starts a JVM: a contradicting option fails
        the task in a second. Only the table is read -- the worker reads it anyway; the source may
        be reachable only from the job's environment (``env_vars``), so its checks stay the job's."""
        from spark_jobs.exceptions import BadInputError
        from spark_jobs.table.action.upsert import resolve_config
        from spark_jobs.table.table import Table

        try:
            resolve_config(self.upsert_options(batch_id, table_exists=table_exists), Table.open(str(self.table_uri)))
        except BadInputError as e:  # bad input: nothing was written, a retry cannot help
            raise AirflowFailException(f"bucketindex upsert failed: {one_line(e)}") from e

    def _publish(self, context: Context, summary: dict[str, Any]) -> dict[str, Any]:
        counts = {k: summary[k] for k in ("inserted", "updated", "deleted")}
        engine = summary.get("engine")
        self.set_lineage(inputs=[str(self.source_uri)], outputs=[summary["table_uri"]],
                         output_rows=sum(counts.values()))
        self.emit_table_update(context, summary["table_uri"], instant=summary["instant"],
                               batch_id=summary["batch_id"], **counts, **({"engine": engine} if engine else {}))
        self.push_xcom(context, instant=summary["instant"], counts=counts)
        return {"table_uri": summary["table_uri"], "batch_id": summary["batch_id"], "instant": summary["instant"],
                **counts, "engine": engine}

    def on_kill(self) -> None:
        super().on_kill()
        self.log.warning(
            "upsert stopped; a pending instant of this batch, if any, is left for the rollback task or the next try"
        )


def _flag(value: Any) -> bool:
    """A templated switch: ``True``, or text a template renders (``"True"``, ``"true"``, ``"1"``)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "on")
    return bool(value)
