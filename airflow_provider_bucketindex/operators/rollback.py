"""RollbackBatchOperator: the failure branch of an ingest DAG."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk import BaseOperator, TriggerRule
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_bucketindex import DEFAULT_CONN_ID
from airflow_provider_bucketindex.batch import batch_id_from_context
from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["RollbackBatchOperator"]


class RollbackBatchOperator(BaseOperator):
    """Roll back the pending instant a failed upsert left behind; a no-op when there is none.

    Pure Python (no Spark): it finds the pending instant whose plan carries the batch id
    and deletes exactly the files its markers list, then records a rollback instant.
    Committed data is never touched.

    :param table_uri: the table (templated).
    :param batch_id: the failed batch's id (templated), or
    :param upsert_task_id: the upsert task whose default batch id (``<dag>/<run>/<task>``)
        to roll back (templated).
    :param force: roll back even if the instant's writer still heartbeats (default False).
        The task runs after the upsert task has ended, so its writer is normally gone; a
        writer that still beats (a spark-submit that outlived its task) makes this task fail
        retryably until the heartbeat expires, instead of pulling files from under it.

    ``trigger_rule`` defaults to ``one_failed``: place it downstream of the upsert task.
    Returns ``{"batch_id", "rolled_back"}`` (``rolled_back`` is None when nothing was pending).
    """

    template_fields: Sequence[str] = ("table_uri", "batch_id", "upsert_task_id")
    ui_color = "#fce8e6"

    def __init__(
        self,
        *,
        table_uri: str,
        batch_id: str | None = None,
        upsert_task_id: str | None = None,
        force: bool = False,
        conn_id: str = DEFAULT_CONN_ID,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("trigger_rule", TriggerRule.ONE_FAILED)
        super().__init__(**kwargs)
        self.table_uri = table_uri
        self.batch_id = batch_id
        self.upsert_task_id = upsert_task_id
        self.force = force
        self.conn_id = conn_id

    @cached_property
    def hook(self) -> BucketIndexHook:
        return BucketIndexHook(conn_id=self.conn_id)

    def execute(self, context: Context) -> dict[str, Any]:
        if not self.batch_id and not self.upsert_task_id:
            raise AirflowFailException("RollbackBatchOperator needs batch_id or upsert_task_id")
        batch_id = str(self.batch_id) if self.batch_id else batch_id_from_context(context, str(self.upsert_task_id))
        table_uri = str(self.table_uri)
        from spark_jobs.table import WriterAliveError

        try:
            rolled = self.hook.rollback_batch(table_uri, batch_id, force=self.force)
        except WriterAliveError as e:  # retryable: the writer may still finish or its heartbeat expire
            raise AirflowException(f"batch {batch_id}: {e}") from e
        if rolled is None:
            self.log.info("Batch %s left nothing pending in %s: nothing to roll back", batch_id, table_uri)
        else:
            self.log.info("Rolled back instant %s of batch %s in %s", rolled, batch_id, table_uri)
        return {"batch_id": batch_id, "rolled_back": rolled}
