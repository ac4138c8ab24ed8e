"""Sensors on a bucketindex table's state: compaction due, no write in progress, a commit there.

They read the table's metadata through the pure-Python core (:mod:`spark_jobs.table.state`:
config, commit sequence, plans, heartbeats): no Spark, nothing written; a connection only for
the store's settings (``storage_options``, as the operators). Each
works in ``poke`` and ``reschedule`` mode and is deferrable: with ``deferrable=True`` the
task looks once and, if the condition does not hold yet, hands the waiting to a trigger in
the triggerer (:mod:`airflow_provider_bucketindex.triggers.table_state`) and frees its
worker slot. The condition and the XCom value are the same in every mode: the sensor and
its trigger call the same ``poll``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
)

from airflow_provider_bucketindex import DEFAULT_CONN_ID
from airflow_provider_bucketindex.triggers.table_state import (
    CompactionDueTrigger,
    NoPendingWritesTrigger,
    TableCommitTrigger,
    TableStateTrigger,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["TableStateSensor", "CompactionDueSensor", "NoPendingWritesSensor", "TableCommitSensor"]


class TableStateSensor(BaseSensorOperator):
    """Base of the table-state sensors: poke through the trigger's ``poll``, defer, resume.

    :param table_uri: the table (templated); an ``ObjectStoragePath`` is read at its own location,
        its ``conn_id`` the storage connection (also for the trigger, which stores connection ids only).
    :param deferrable: wait in the triggerer instead of a worker slot (default: the
        ``[operators] default_deferrable`` option). The deferral's timeout is the sensor's
        ``timeout``; Airflow turns it into ``AirflowSensorTimeout`` (a skip with ``soft_fail``).
    :param conn_id: the ``bucketindex`` connection whose ``storage_options`` / ``storage_conn_id``
        extras give the store's settings (default ``bucketindex_default``; undefined: none).
    :param storage_conn_id: an ``aws``-style connection with the store's keys and endpoint (templated).
    :param storage_options: storage options over the connections' (templated). A deferrable
        sensor refuses secrets here (the trigger's arguments are stored in the metadata DB): put
        them in a connection, which the triggerer reads itself.

    A missing table (or arguments the table rejects) fails the task without retries
    (``AirflowFailException``) in every mode, since waiting cannot fix it; with
    ``soft_fail=True`` the task is skipped instead, as Airflow does for every sensor failure.
    Nothing happens in ``__init__``: the table is first read in ``execute``.
    """

    template_fields: Sequence[str] = ("table_uri", "storage_conn_id", "storage_options")
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        table_uri: str,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        conn_id: str = DEFAULT_CONN_ID,
        storage_conn_id: str | None = None,
        storage_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.table_uri = table_uri
        self.deferrable = deferrable
        self.conn_id = conn_id
        self.storage_conn_id = storage_conn_id
        self.storage_options = storage_options

    def storage_kwargs(self) -> dict[str, Any]:
        """The trigger's storage arguments: connection ids and the (rendered) options."""
        conn = None if self.storage_conn_id in (None, "") else str(self.storage_conn_id)
        return {"conn_id": self.conn_id, "storage_conn_id": conn, "storage_options": self.storage_options or None}

    def trigger(self) -> TableStateTrigger:
        """The trigger for the rendered arguments (also what ``poke`` polls)."""
        raise NotImplementedError

    def poke(self, context: Context) -> PokeReturnValue:
        from spark_jobs.exceptions import BadInputError

        try:
            result = self.trigger().poll()
        except BadInputError as e:  # no table, or arguments it rejects: waiting will not help
            raise AirflowFailException(str(e)) from e
        self.log.info("%s: %s", self.table_uri, result.note)
        return PokeReturnValue(is_done=result.done, xcom_value=result.value if result.done else None)

    def execute(self, context: Context) -> Any:
        from airflow_provider_bucketindex.storage import (
            StorageOptionsError,
            check_no_secrets,
            check_uri_no_secrets,
            mask_uris,
            parse_options,
            use_object_storage_paths,
        )

        use_object_storage_paths(self, fields=("table_uri",))  # its location, its connection the storage one
        mask_uris(self.table_uri)
        if not self.deferrable:
            # blocks (poke) or raises to be rescheduled (reschedule) until poke succeeds
            return super().execute(context)
        try:  # before any work: a secret in the trigger's arguments would be stored in the metadata DB
            check_no_secrets(parse_options(self.storage_options, where="storage_options"), what=self.task_id)
            check_uri_no_secrets(self.table_uri, what=self.task_id)
        except StorageOptionsError as e:
            raise AirflowFailException(str(e)) from None
        first = self._poke_once(context)
        if first:
            return first.xcom_value
        self.defer(
            trigger=self.trigger(),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def _poke_once(self, context: Context) -> PokeReturnValue | bool:
        """One poke before deferring, with the failure handling of ``BaseSensorOperator.execute``
        (``soft_fail``/``never_fail`` skip, ``silent_fail`` logs and waits), which does not run here."""
        try:
            return self.poke(context)
        except (AirflowSensorTimeout, AirflowFailException) as e:
            if self.soft_fail or self.never_fail:
                raise AirflowSkipException(f"Skipping due to {'soft_fail' if self.soft_fail else 'never_fail'} "
                                           f"is set to True: {e}") from e
            raise
        except AirflowSkipException:
            raise
        except Exception as e:
            if self.silent_fail:
                self.log.exception("Sensor poke failed; deferring anyway (silent_fail)")
                return False
            if self.never_fail:
                raise AirflowSkipException(f"Skipping due to never_fail is set to True: {e}") from e
            raise

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Resume from the trigger's event: its value on success, else fail.

        Raised exceptions pass through ``BaseSensorOperator.resume_execution``, which turns
        them into a skip when ``soft_fail`` (or ``never_fail``) is set; a timeout of the
        deferral itself arrives there as ``TaskDeferralTimeout`` -> ``AirflowSensorTimeout``.
        """
        if not isinstance(event, dict):
            raise AirflowException(f"{self.task_id}: the trigger sent no event ({event!r})")
        status, message = event.get("status"), event.get("message", "")
        if status == "success":
            self.log.info("%s: %s", event.get("table_uri", self.table_uri), message)
            return event.get("value")
        if status == "timeout":
            raise AirflowSensorTimeout(f"{self.task_id}: {message}")
        if status == "error":
            if event.get("bad_input"):
                raise AirflowFailException(message)
            raise AirflowException(message)
        raise AirflowException(f"{self.task_id}: unknown trigger event {event!r}")


class CompactionDueSensor(TableStateSensor):
    """Wait until a data compaction of a merge-on-read table has file groups to fold.

    The gate of a nightly table-services DAG: compaction is a Spark job, worth starting only
    when some file group has enough logs that reads pay for merging them. "Due" is exactly
    what ``bucketindex compact`` would plan (the same policy; groups already in a pending
    compaction plan are not counted twice), data (merge-on-read logs) and index (record-index
    deltas). A copy-on-write table without the record index is never due.

    Most nights nothing may be due: set ``soft_fail=True`` so the sensor's timeout (or a
    short ``timeout``) **skips** the compaction instead of failing the run, e.g.
    ``CompactionDueSensor(task_id="compaction_due", table_uri=..., soft_fail=True,
    timeout=600, deferrable=True)``.

    :param table_uri: the table (templated).
    :param min_logs: a file group is due with at least this many logs (templated; default 4,
        as ``bucketindex compact``).
    :param log_ratio: ... or with logs of at least this fraction of its base's bytes
        (templated; default 0.2).
    :param min_deltas: a record-index bucket is due with at least this many deltas
        (templated; default 10, as ``bucketindex compact``).
    :param delta_ratio: ... or with deltas of at least this fraction of its base's bytes
        (templated; default 0.5).

    XCom (return value): ``{"due", "file_groups", "logs", "log_bytes", "index_buckets",
    "index_deltas", "reason", "pending_plans"}``.
    """

    template_fields: Sequence[str] = ("table_uri", "min_logs", "log_ratio", "min_deltas", "delta_ratio",
                                      "storage_conn_id", "storage_options")

    def __init__(self, *, table_uri: str, min_logs: int = 4, log_ratio: float = 0.2, min_deltas: int = 10,
                 delta_ratio: float = 0.5, **kwargs: Any) -> None:
        super().__init__(table_uri=table_uri, **kwargs)
        self.min_logs = min_logs
        self.log_ratio = log_ratio
        self.min_deltas = min_deltas
        self.delta_ratio = delta_ratio

    def trigger(self) -> CompactionDueTrigger:
        return CompactionDueTrigger(table_uri=str(self.table_uri), min_logs=int(self.min_logs),
                                    log_ratio=float(self.log_ratio), min_deltas=int(self.min_deltas),
                                    delta_ratio=float(self.delta_ratio), poke_interval=self.poke_interval,
                                    **self.storage_kwargs())


class NoPendingWritesSensor(TableStateSensor):
    """Wait until no write is in progress on the table.

    Put it before work that should not race live writers (a rehash, a validation, an
    export of a consistent snapshot). A write counts while its writer heartbeats; one whose
    writer died is abandoned, so it is not waited for (the ingest DAG's rollback task or
    ``bucketindex rollback`` removes it). A scheduled compaction plan counts only while a
    live process executes it. See :func:`spark_jobs.table.state.pending_writes`.

    :param table_uri: the table (templated).
    :param heartbeat_timeout_s: seconds without a heartbeat after which a write counts as
        abandoned (templated; default None: the table's 60 s, or ``BUCKETINDEX_HEARTBEAT_TIMEOUT_S``).

    No XCom value.
    """

    template_fields: Sequence[str] = ("table_uri", "heartbeat_timeout_s", "storage_conn_id", "storage_options")

    def __init__(self, *, table_uri: str, heartbeat_timeout_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(table_uri=table_uri, **kwargs)
        self.heartbeat_timeout_s = heartbeat_timeout_s

    def trigger(self) -> NoPendingWritesTrigger:
        hb = self.heartbeat_timeout_s
        return NoPendingWritesTrigger(table_uri=str(self.table_uri),
                                      heartbeat_timeout_s=None if hb in (None, "") else float(hb),
                                      poke_interval=self.poke_interval, **self.storage_kwargs())


class TableCommitSensor(TableStateSensor):
    """Wait until a commit is on the table: the one of a batch, or any one after an instant.

    For DAGs downstream of an ingest DAG they do not control: wait for the batch they need
    (``batch_id``, e.g. ``"ingest/{{ run_id }}/upsert"``), or for fresh data since the last
    run (``after_instant``, e.g. an instant pulled from XCom). Only upserts and bootstraps
    count as commits (compactions and rehashes change no rows).

    :param table_uri: the table (templated).
    :param batch_id: the batch to wait for (templated), or
    :param after_instant: an instant time (``yyyyMMddHHmmssSSS``, templated): wait for the
        first commit after it. Exactly one of the two, else ``ValueError`` at construction
        (and at execute, if a template rendered empty).

    XCom (return value): ``{"instant", "action", "seq", "batch_id", "counts"}`` of the commit.
    """

    template_fields: Sequence[str] = ("table_uri", "batch_id", "after_instant", "storage_conn_id", "storage_options")

    def __init__(self, *, table_uri: str, batch_id: str | None = None, after_instant: str | None = None,
                 **kwargs: Any) -> None:
        _exactly_one(batch_id, after_instant)
        super().__init__(table_uri=table_uri, **kwargs)
        self.batch_id = batch_id
        self.after_instant = after_instant

    def execute(self, context: Context) -> Any:
        _exactly_one(self._rendered(self.batch_id), self._rendered(self.after_instant))
        return super().execute(context)

    def trigger(self) -> TableCommitTrigger:
        return TableCommitTrigger(table_uri=str(self.table_uri), batch_id=self._rendered(self.batch_id),
                                  after_instant=self._rendered(self.after_instant), poke_interval=self.poke_interval,
                                  **self.storage_kwargs())

    @staticmethod
    def _rendered(value: Any) -> str | None:
        return None if value is None or str(value) == "" else str(value)


def _exactly_one(batch_id: Any, after_instant: Any) -> None:
    if (batch_id is None) == (after_instant is None):
        given = "both" if batch_id is not None else "neither"
        raise ValueError(f"TableCommitSensor needs exactly one of batch_id and after_instant ({given} given)")
