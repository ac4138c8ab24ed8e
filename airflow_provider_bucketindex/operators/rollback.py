"""RollbackBatchOperator: the failure branch of an ingest DAG."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk import BaseOperator, TriggerRule
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_bucketindex import DEFAULT_CONN_ID
from airflow_provider_bucketindex.batch import upstream_batches
from airflow_provider_bucketindex.operators.base import BucketIndexTableMixin, storage_scoped

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["RollbackBatchOperator"]


class RollbackBatchOperator(BucketIndexTableMixin, BaseOperator):
    """Roll back the pending instant a failed upsert (or compaction) left behind; a no-op when there is none.

    Pure Python (no Spark): it finds the pending instant whose plan carries the batch id
    (or the instant named by ``instant``) and deletes exactly the files its markers list,
    then records a rollback instant. Committed data is never touched.

    :param table_uri: the table (templated).
    :param batch_id: the failed batch's id (templated), or
    :param upsert_task_id: the upsert task whose default batch id (``<dag>/<task>/<interval>``,
        with or without its ``/src-<hex>`` source part and this run's ``/replay/<run_id>``:
        :func:`~airflow_provider_bucketindex.batch.upstream_batches`) to roll back (templated).
        A **mapped** upsert (``.expand()`` over landing files) has
        one batch per map index (``<dag>/<task>/<interval>/<i>/src-<hex>``): a rollback in the same mapped
        task group as the upsert (``upsert >> rollback`` inside ``@task_group(...).expand``)
        rolls back the batch of the instance it depends on -- its own map index; an unmapped
        rollback downstream of the mapped upsert rolls back every instance that left a
        pending write. Or
    :param instant: a pending instant to roll back by its time (templated), e.g. a scheduled
        compaction whose execute task failed: ``instant=schedule.output["instant"]`` (the
        schedule task's XCom key ``instant``; resolves to None when it pushed no plan).
        Rolling back a scheduled table-service plan **cancels** it (it is never executed).
        A no-op when that instant completed meanwhile, was rolled back already, or the
        value renders empty or None (the schedule task pushed no plan); a time that names no
        instant of the table fails the task without retries.
    :param force: roll back even if the instant's writer still heartbeats (default False).
        The task runs after the upsert task has ended, so its writer is normally gone; a
        writer that still beats (a spark-submit that outlived its task) makes this task fail
        retryably until the heartbeat expires, instead of pulling files from under it.

    :param conn_id: the ``bucketindex`` connection whose storage settings (``storage_options`` and
        ``storage_conn_id`` extras) this task uses (default ``bucketindex_default``; undefined: none).
    :param storage_conn_id: an ``aws``-style connection with the store's keys and endpoint
        (templated; default: the connection's ``storage_conn_id`` extra).
    :param storage_options: storage options over the connection's (templated; see
        :class:`~airflow_provider_bucketindex.operators.base.BucketIndexSparkOperator`).

    ``trigger_rule`` defaults to ``one_failed``: place it downstream of the upsert (or
    compaction execute) task.
    Returns ``{"batch_id", "rolled_back"}`` (``rolled_back`` is None when nothing was pending);
    with ``instant``: ``{"instant", "rolled_back"}``; for every instance of a mapped upsert:
    ``{"batch_id": None, "batches": [...], "rolled_back": [...]}``.
    """

    template_fields: Sequence[str] = ("table_uri", "batch_id", "upsert_task_id", "instant", "storage_conn_id",
                                      "storage_options")
    ui_color = "#fce8e6"

    def __init__(
        self,
        *,
        table_uri: str,
        batch_id: str | None = None,
        upsert_task_id: str | None = None,
        instant: str | None = None,
        force: bool = False,
        conn_id: str = DEFAULT_CONN_ID,
        storage_conn_id: str | None = None,
        storage_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("trigger_rule", TriggerRule.ONE_FAILED)
        super().__init__(**kwargs)
        self.table_uri = table_uri
        self.batch_id = batch_id
        self.upsert_task_id = upsert_task_id
        self.instant = instant
        self._by_instant = instant is not None  # set, even if it renders empty (no plan was scheduled)
        self.force = force
        self.conn_id = conn_id
        self.storage_conn_id = storage_conn_id
        self.storage_options = storage_options


    @storage_scoped
    def execute(self, context: Context) -> dict[str, Any]:
        instant = "" if self.instant is None else str(self.instant).strip()
        if instant == "None":  # None rendered as text (a DAG without render_template_as_native_obj)
            instant = ""
        if instant and (self.batch_id or self.upsert_task_id):
            raise AirflowFailException("RollbackBatchOperator takes instant or a batch (batch_id, upsert_task_id), not both")
        if instant:
            return self._rollback_instant(str(self.table_uri), instant)
        if self._by_instant and not (self.batch_id or self.upsert_task_id):
            self.log.info("instant rendered empty (nothing was scheduled): nothing to roll back")
            return {"instant": None, "rolled_back": None}
        if not self.batch_id and not self.upsert_task_id:
            raise AirflowFailException("RollbackBatchOperator needs batch_id, upsert_task_id or instant")
        table_uri = str(self.table_uri)
        if self.batch_id:
            return self._rollback_batch(table_uri, str(self.batch_id))
        found = upstream_batches(context, str(self.upsert_task_id))
        self.log.info("Upsert task %s: every batch matching %s", self.upsert_task_id, found.pattern.pattern)
        # by pattern: the upsert's id names its source (``/src-<hex>``, which this task cannot know),
        # or not (an in-memory batch, a table written before ids named sources), and replay=True adds
        # this run's suffix (module doc of airflow_provider_bucketindex.batch)
        pending = sorted(self.hook.pending_batches(table_uri, found.matches))
        if found.batch_id is not None and len(pending) <= 1:  # an unmapped upsert, or our own instance of a mapped one
            if not pending:
                self.log.info("Batch %s left nothing pending in %s: nothing to roll back", found.batch_id, table_uri)
                return {"batch_id": found.batch_id, "rolled_back": None}
            return self._rollback_batch(table_uri, pending[0])
        # a mapped upsert and an unmapped rollback: every instance that left a pending write (or one
        # instance that left two, under two sources)
        if not pending:
            self.log.info("No instance of %s left anything pending in %s: nothing to roll back",
                          self.upsert_task_id, table_uri)
        rolled = [self._rollback_batch(table_uri, b)["rolled_back"] for b in pending]
        return {"batch_id": found.batch_id, "batches": pending, "rolled_back": [r for r in rolled if r]}

    def _rollback_batch(self, table_uri: str, batch_id: str) -> dict[str, Any]:
        from spark_jobs.table import WriterAliveError

        try:
            rolled = self.hook.rollback_batch(table_uri, batch_id, force=self.force)
        except WriterAliveError as e:  # retryable: the writer may still finish or its heartbeat expire
            raise AirflowException(f"batch {batch_id}: {e}") from e
        if rolled is None:
            self.log.info("Batch %s left nothing pending in %s: nothing to roll back", batch_id, table_uri)
        else:
            self.set_lineage(outputs=[table_uri])
            self.log.info("Rolled back instant %s of batch %s in %s", rolled, batch_id, table_uri)
        return {"batch_id": batch_id, "rolled_back": rolled}

    def _rollback_instant(self, table_uri: str, instant: str) -> dict[str, Any]:
        from spark_jobs.exceptions import BadInputError
        from spark_jobs.table import WriterAliveError
        from spark_jobs.table.action.rollback import rollback

        t = self.hook.open_table(table_uri)
        if not t.exists:
            raise AirflowFailException(f"no bucketindex table at {table_uri}: instant {instant} cannot be rolled back")
        tl = t.timeline.reload()
        if tl.is_completed(instant):  # its execution finished after all: nothing to cancel
            self.log.info("Instant %s completed in %s: nothing to roll back", instant, table_uri)
            return {"instant": instant, "rolled_back": None}
        try:
            done = rollback(t, instant, force=self.force)
        except WriterAliveError as e:  # retryable: the writer may still finish or its heartbeat expire
            raise AirflowException(f"instant {instant}: {e}") from e
        except BadInputError as e:  # no such instant (or it completed just now)
            if t.timeline.reload().is_completed(instant):
                self.log.info("Instant %s completed in %s: nothing to roll back", instant, table_uri)
                return {"instant": instant, "rolled_back": None}
            raise AirflowFailException(str(e)) from e
        rolled = done[0] if done else None
        if rolled is not None:
            self.set_lineage(outputs=[table_uri])
        if rolled is None:
            self.log.info("Instant %s was rolled back already in %s: nothing to do", instant, table_uri)
        else:
            self.log.info("Rolled back instant %s in %s", rolled, table_uri)
        return {"instant": instant, "rolled_back": rolled}
