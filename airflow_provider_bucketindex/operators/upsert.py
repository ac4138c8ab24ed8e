"""UpsertWithIndexOperator: one batch into a table, data + index in one commit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_bucketindex.batch import batch_id_from_context
from airflow_provider_bucketindex.hooks.bucketindex import (
    EXIT_BAD_INPUT,
    EXIT_RETRYABLE,
    SparkJobFailed,
    upsert_args,
)
from airflow_provider_bucketindex.operators.base import BucketIndexSparkOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["UpsertWithIndexOperator"]


class UpsertWithIndexOperator(BucketIndexSparkOperator):
    """Upsert (and delete) the rows of ``source_uri`` into the table at ``table_uri``.

    Runs ``bucketindex upsert`` with spark-submit. Data files and index entries of the
    batch appear in one commit, or not at all.

    :param table_uri: the table (local path, ``file://``, ``s3://``, ``hdfs://``); created
        by the first upsert (templated).
    :param source_uri: a file or folder of source rows (templated).
    :param record_key: key field, or fields (list or comma-separated) (templated).
    :param precombine_field: when a key occurs more than once, the row with the largest
        value wins (templated).
    :param partition_field: partition the table by this field (templated).
    :param index: ``record``, ``bucket`` or ``global_simple`` (templated).
    :param num_buckets: index bucket count (templated).
    :param table_type: ``copy_on_write`` or ``merge_on_read`` (upserts append logs that
        ``bucketindex compact`` folds later), fixed when the table is created (templated).
    :param source_format: ``parquet``, ``json`` or ``csv`` (templated).
    :param delete_field: rows whose field is true delete their key (templated).
    :param batch_id: the batch's id; a batch id that is already committed makes the upsert
        a no-op (templated). Default ``<dag_id>/<run_id>/<task_id>``: the same for every
        try of the task, so a retry never applies the batch twice.
    :param skip_committed_batches: when the batch id is already committed (a retry after
        the commit), do not even start spark-submit; push the existing commit.

    Index type, bucket count, table type and source format default to the connection's
    extras; index type, bucket count and table type only when the upsert creates the table
    (an existing table keeps its own). Pushes to XCom -- only with ``do_xcom_push`` (the
    default) -- ``instant`` (the commit), ``counts`` (inserted, updated, deleted), and as
    return value a summary of both.

    Lineage and assets: the default outlet is the alias
    :data:`~airflow_provider_bucketindex.lineage.TABLE_UPDATES`; each run (also a retry that
    finds its batch committed) records an Asset event for ``table_asset(table_uri)`` with
    extra ``{"instant", "batch_id", "inserted", "updated", "deleted"}``, so a DAG with
    ``schedule=[table_asset(uri)]`` runs after it. OpenLineage: input the source, output
    the table with ``outputStatistics.rowCount`` = inserted + updated + deleted.

    Exit status 2 (bad input) fails the task without retries; exit status 3 (a concurrent
    commit conflicted after the job's own retries, or the table was busy) is an ordinary
    failure that the task's ``retries`` repeat under the same batch id.

    If the task is killed, spark-submit is stopped and the batch's pending instant is left
    for the rollback task (:class:`RollbackBatchOperator`) or the next try, which rolls
    back a pending instant of its own batch before it starts.
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
        "master",
        "conf",
        "name",
        "env_vars",
    )
    ui_color = "#e8f0fe"
    emits_table_updates = True

    def __init__(
        self,
        *,
        table_uri: str,
        source_uri: str,
        record_key: str | list[str],
        precombine_field: str | None = None,
        partition_field: str | None = None,
        index: str | None = None,
        num_buckets: int | str | None = None,
        table_type: str | None = None,
        source_format: str | None = None,
        delete_field: str | None = None,
        batch_id: str | None = None,
        skip_committed_batches: bool = True,
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
        self.skip_committed_batches = skip_committed_batches

    def build_args(self, batch_id: str, *, table_exists: bool) -> list[str]:
        """``bucketindex upsert`` arguments, connection defaults filled in."""
        defaults = self.hook.table_defaults()
        index, num_buckets, table_type = self.index, self.num_buckets, self.table_type
        if not table_exists:
            index = index if index not in (None, "") else defaults.get("index")
            num_buckets = num_buckets if num_buckets not in (None, "") else defaults.get("num_buckets")
            table_type = table_type if table_type not in (None, "") else defaults.get("table_type")
        source_format = self.source_format if self.source_format not in (None, "") else defaults.get("source_format")
        return upsert_args(
            self.table_uri,
            self.source_uri,
            record_key=self.record_key,
            precombine_field=self.precombine_field,
            partition_field=self.partition_field,
            index=index,
            num_buckets=num_buckets,
            table_type=table_type,
            source_format=source_format,
            delete_field=self.delete_field,
            batch_id=batch_id,
        )

    def spark_submit_command(self, batch_id: str) -> list[str]:
        """The exact spark-submit command ``execute`` runs for ``batch_id`` (templates rendered)."""
        args = self.build_args(batch_id, table_exists=self.hook.table_exists(str(self.table_uri)))
        return self.hook.build_command("upsert", args)

    def execute(self, context: Context) -> dict[str, Any]:
        table_uri = str(self.table_uri)
        batch_id = str(self.batch_id) if self.batch_id else batch_id_from_context(context)
        hook = self.hook
        self.log.info("Batch %s -> %s", batch_id, table_uri)

        if self.skip_committed_batches:
            done = hook.commit_for_batch(table_uri, batch_id)
            if done is not None:
                self.log.info("Batch %s is already committed at %s (an earlier try): nothing to do", batch_id, done["instant"])
                return self._publish(context, done)

        from spark_jobs.table import WriterAliveError

        try:
            rolled = hook.rollback_batch(table_uri, batch_id, force=False)
        except WriterAliveError as e:
            raise AirflowException(f"an earlier attempt of batch {batch_id} is still writing: {e}") from e
        if rolled:
            self.log.info("Rolled back %s left pending by an earlier attempt of batch %s", rolled, batch_id)

        args = self.build_args(batch_id, table_exists=hook.table_exists(table_uri))
        try:
            self.submit_job(context, "upsert", args)
        except SparkJobFailed as e:
            if e.returncode == EXIT_BAD_INPUT:  # bad input: nothing was written, a retry cannot help
                raise AirflowFailException(str(e)) from e
            if e.returncode == EXIT_RETRYABLE:  # a conflict or a busy table: an ordinary, retryable failure
                raise AirflowException(
                    f"batch {batch_id} met concurrent writers and wrote nothing ({e.reason}); the task's retries "
                    f"apply it under the same batch id"
                ) from e
            raise

        done = hook.commit_for_batch(table_uri, batch_id)
        if done is None:
            raise AirflowException(f"bucketindex upsert exited 0 but no commit of {table_uri} carries batch id {batch_id}")
        self.log.info(
            "Committed %s: %d inserted, %d updated, %d deleted",
            done["instant"],
            done["inserted"],
            done["updated"],
            done["deleted"],
        )
        return self._publish(context, done)

    def _publish(self, context: Context, summary: dict[str, Any]) -> dict[str, Any]:
        counts = {k: summary[k] for k in ("inserted", "updated", "deleted")}
        self.set_lineage(inputs=[str(self.source_uri)], outputs=[summary["table_uri"]],
                         output_rows=sum(counts.values()))
        self.emit_table_update(context, summary["table_uri"], instant=summary["instant"],
                               batch_id=summary["batch_id"], **counts)
        self.push_xcom(context, instant=summary["instant"], counts=counts)
        return {"table_uri": summary["table_uri"], "batch_id": summary["batch_id"], "instant": summary["instant"], **counts}

    def on_kill(self) -> None:
        super().on_kill()
        self.log.warning(
            "spark-submit stopped; a pending instant of this batch, if any, is left for the rollback task or the next try"
        )
