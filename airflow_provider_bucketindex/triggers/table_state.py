"""Triggers that wait on a bucketindex table's state in the triggerer, for the deferrable sensors.

Each trigger polls one function of :mod:`spark_jobs.table.state` (pure Python: it reads the
table's small metadata files, never Spark) in a worker thread every ``poke_interval``
seconds, so the triggerer's event loop never blocks on storage, and fires exactly one
event::

    {"status": "success", "table_uri", "value", "message"}   the condition holds; value -> XCom
    {"status": "error", "table_uri", "message", "bad_input"} the check raised (e.g. no table there)
    {"status": "timeout", "table_uri", "message"}            only with timeout_s, see below

Constructor arguments are JSON values only (str, int, float, None): Airflow stores
``serialize()`` in its database and re-creates the trigger from it in the triggerer.

Storage settings travel as connection ids (``conn_id``, ``storage_conn_id``) and options without
secrets (``storage_options``): the triggerer rebuilds the options from the connections each time
it starts the trigger (:func:`airflow_provider_bucketindex.storage.resolve_options`), so no key
is ever stored in the trigger table; :meth:`TableStateTrigger.serialize` refuses a secret.

``timeout_s`` is optional and the sensors do not pass it: their ``defer(timeout=...)`` is
enforced by Airflow from the moment of deferral, while a trigger's own clock starts again
whenever a triggerer restarts or hands the trigger to another triggerer.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, NamedTuple

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_bucketindex import DEFAULT_CONN_ID

if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "TableStateTrigger",
    "CompactionDueTrigger",
    "NoPendingWritesTrigger",
    "TableCommitTrigger",
    "Poll",
]


class Poll(NamedTuple):
    """One look at the table: whether the condition holds, the XCom value if so, a log line."""

    done: bool
    value: Any
    note: str


class TableStateTrigger(BaseTrigger):
    """Base of the table-state triggers: the poll loop, the events, serialisation.

    A subclass names its own arguments (:meth:`_arguments`) and answers one question
    (:meth:`_check`); the sensors call the same :meth:`poll` in poke and reschedule mode,
    so a condition means the same thing whether the task waits in a worker or deferred.

    :param table_uri: the table.
    :param poke_interval: seconds between two looks at the table.
    :param timeout_s: give up after this many seconds with a ``timeout`` event (None: never;
        Airflow's deferral timeout still applies).
    :param conn_id: the ``bucketindex`` connection whose ``storage_options`` / ``storage_conn_id``
        extras apply (default ``bucketindex_default``, none when undefined; None: no connection).
    :param storage_conn_id: an ``aws``-style connection with the store's keys and endpoint.
    :param storage_options: further options, over the connections' (no secrets: they would be
        stored with the trigger).
    """

    def __init__(self, *, table_uri: str, poke_interval: float = 60.0, timeout_s: float | None = None,
                 conn_id: str | None = DEFAULT_CONN_ID, storage_conn_id: str | None = None,
                 storage_options: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.table_uri = table_uri
        self.poke_interval = float(poke_interval)
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self.conn_id = conn_id or None
        self.storage_conn_id = storage_conn_id or None
        self.storage_options = dict(storage_options) if storage_options else None
        self._resolved_storage: dict[str, str] | None = None

    def _arguments(self) -> dict[str, Any]:
        """The subclass's own constructor arguments (JSON values)."""
        return {}

    def _check(self, state: ModuleType) -> Poll:
        raise NotImplementedError

    def serialize(self) -> tuple[str, dict[str, Any]]:
        from airflow_provider_bucketindex.storage import check_no_secrets, check_uri_no_secrets, parse_options
        from spark_jobs.io.storage import redact_uri

        what = f"{type(self).__name__} of {redact_uri(self.table_uri)}"
        check_no_secrets(parse_options(self.storage_options, where="storage_options"), what=what)
        check_uri_no_secrets(self.table_uri, what=what)
        cls = type(self)
        # only what differs from the defaults: a trigger stored before these arguments existed
        # (no storage keys) re-creates as it was, reading bucketindex_default's extras
        storage: dict[str, Any] = {} if self.conn_id == DEFAULT_CONN_ID else {"conn_id": self.conn_id}
        storage.update({k: v for k, v in (("storage_conn_id", self.storage_conn_id),
                                          ("storage_options", self.storage_options)) if v})
        return (
            f"{cls.__module__}.{cls.__qualname__}",
            {"table_uri": self.table_uri, **self._arguments(), "poke_interval": self.poke_interval,
             "timeout_s": self.timeout_s, **storage},
        )

    def storage_settings(self) -> dict[str, str]:
        """The storage options, rebuilt from the connections once per trigger instance (the
        triggerer's, or the sensor's in poke mode); secrets registered with the masker."""
        if self._resolved_storage is None:
            from airflow_provider_bucketindex.storage import mask, resolve_options

            options = resolve_options(conn_id=self.conn_id, storage_conn_id=self.storage_conn_id,
                                      storage_options=self.storage_options, default_conn_id=DEFAULT_CONN_ID)
            mask(options)
            self._resolved_storage = options
        return self._resolved_storage

    def poll(self) -> Poll:
        """Look at the table once (blocking: storage reads), with the trigger's storage options.
        Raises BadInputError when no table is there (or a storage option is not one)."""
        from airflow_provider_bucketindex.storage import storage_scope
        from spark_jobs.table import state  # pyarrow, numpy: imported where it runs, not at DAG parse

        with storage_scope(self.storage_settings()):
            return self._check(state)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = time.monotonic()
        while True:
            try:
                result = await asyncio.to_thread(self.poll)
            except Exception as e:  # reported to the task, which fails (or skips with soft_fail)
                yield TriggerEvent(self._event("error", message=_one_line(e), bad_input=_is_bad_input(e)))
                return
            if result.done:
                self.log.info("%s: %s", self.table_uri, result.note)
                yield TriggerEvent(self._event("success", value=result.value, message=result.note))
                return
            wait = self.poke_interval
            if self.timeout_s is not None:
                left = self.timeout_s - (time.monotonic() - started)
                if left <= 0:
                    yield TriggerEvent(self._event(
                        "timeout", message=f"still waiting after {self.timeout_s:g} s: {result.note}"))
                    return
                wait = min(wait, left)
            self.log.info("%s: %s; next look in %g s", self.table_uri, result.note, wait)
            await asyncio.sleep(wait)

    def _event(self, status: str, **payload: Any) -> dict[str, Any]:
        return {"status": status, "table_uri": self.table_uri, **payload}


class CompactionDueTrigger(TableStateTrigger):
    """Fires when a compaction would fold file groups or index buckets (:func:`spark_jobs.table.state.compaction_due`).

    :param min_logs: a file group is due with at least this many logs, or
    :param log_ratio: with logs of at least this fraction of its base's bytes.
    :param min_deltas: a record-index bucket is due with at least this many deltas, or
    :param delta_ratio: with deltas of at least this fraction of its base's bytes.
    """

    def __init__(self, *, table_uri: str, min_logs: int = 4, log_ratio: float = 0.2, min_deltas: int = 10,
                 delta_ratio: float = 0.5, poke_interval: float = 60.0, timeout_s: float | None = None,
                 **storage: Any) -> None:
        super().__init__(table_uri=table_uri, poke_interval=poke_interval, timeout_s=timeout_s, **storage)
        self.min_logs = int(min_logs)
        self.log_ratio = float(log_ratio)
        self.min_deltas = int(min_deltas)
        self.delta_ratio = float(delta_ratio)

    def _arguments(self) -> dict[str, Any]:
        return {"min_logs": self.min_logs, "log_ratio": self.log_ratio, "min_deltas": self.min_deltas,
                "delta_ratio": self.delta_ratio}

    def _check(self, state: ModuleType) -> Poll:
        summary = state.compaction_due(self.table_uri, min_logs=self.min_logs, log_ratio=self.log_ratio,
                                       min_deltas=self.min_deltas, delta_ratio=self.delta_ratio)
        return Poll(summary["due"], summary, summary["reason"])


class NoPendingWritesTrigger(TableStateTrigger):
    """Fires when no write is in progress (:func:`spark_jobs.table.state.pending_writes` is empty).

    :param heartbeat_timeout_s: seconds without a heartbeat after which a pending write counts
        as abandoned and is not waited for (None: the table's default, 60 s).
    """

    def __init__(self, *, table_uri: str, heartbeat_timeout_s: float | None = None, poke_interval: float = 60.0,
                 timeout_s: float | None = None, **storage: Any) -> None:
        super().__init__(table_uri=table_uri, poke_interval=poke_interval, timeout_s=timeout_s, **storage)
        self.heartbeat_timeout_s = None if heartbeat_timeout_s is None else float(heartbeat_timeout_s)

    def _arguments(self) -> dict[str, Any]:
        return {"heartbeat_timeout_s": self.heartbeat_timeout_s}

    def _check(self, state: ModuleType) -> Poll:
        writes = state.pending_writes(self.table_uri, heartbeat_timeout_s=self.heartbeat_timeout_s)
        if not writes:
            return Poll(True, None, "no write in progress")
        listed = ", ".join(
            f"{w['instant']}.{w['action']} ({w['state']}, batch {w['batch_id']!r}, pid {w['pid']} on {w['host']})"
            for w in writes
        )
        return Poll(False, None, f"{len(writes)} write(s) in progress: {listed}")


class TableCommitTrigger(TableStateTrigger):
    """Fires when a commit is there (:func:`spark_jobs.table.state.find_commit`).

    :param batch_id: the commit carrying this batch id, or
    :param after_instant: the first commit after this instant time (exactly one of the two).
    """

    def __init__(self, *, table_uri: str, batch_id: str | None = None, after_instant: str | None = None,
                 poke_interval: float = 60.0, timeout_s: float | None = None, **storage: Any) -> None:
        super().__init__(table_uri=table_uri, poke_interval=poke_interval, timeout_s=timeout_s, **storage)
        self.batch_id = None if batch_id is None else str(batch_id)
        self.after_instant = None if after_instant is None else str(after_instant)

    def _arguments(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "after_instant": self.after_instant}

    def _check(self, state: ModuleType) -> Poll:
        commit = state.find_commit(self.table_uri, batch_id=self.batch_id, after_instant=self.after_instant)
        if self.batch_id is not None:
            waiting, found = f"no commit of batch {self.batch_id!r} yet", f"batch {self.batch_id!r} committed"
        else:
            waiting, found = f"no commit after {self.after_instant} yet", f"first commit after {self.after_instant}"
        if commit is None:
            return Poll(False, None, waiting)
        return Poll(True, commit, f"{found}: instant {commit['instant']} (seq {commit['seq']})")


def _one_line(e: BaseException) -> str:
    text = str(e) if _is_bad_input(e) else f"{type(e).__name__}: {e}"
    return " ".join(text.split())


def _is_bad_input(e: BaseException) -> bool:
    """Bad input (no table, arguments out of range) fails the task for good; anything else may be retried."""
    try:
        from spark_jobs.exceptions import BadInputError
    except ImportError:  # the failure was the import itself
        return False
    return isinstance(e, BadInputError)
