"""CleanTableOperator: delete the files no retained snapshot references (the ``clean`` table service)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_bucketindex import DEFAULT_CONN_ID
from airflow_provider_bucketindex.operators.base import BucketIndexTableMixin, storage_scoped
from spark_jobs.io.storage import redact_uri
from spark_jobs.text import plural

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["CleanTableOperator"]


class CleanTableOperator(BucketIndexTableMixin, BaseOperator):
    """Run the table's ``clean`` action: delete data and index files that no retained
    snapshot references any more (file versions replaced by upserts and compactions).

    Runs **in the task itself, through the pure-Python core**
    (:func:`spark_jobs.table.action.clean.run_clean`), as :class:`RollbackBatchOperator`
    does, not as a Spark job: clean reads the timeline and the file-system view (small
    metadata files) and deletes whole files. No row is read or written, so Spark would
    add a JVM start (10-30 s) and nothing else. The Airflow worker must therefore reach the
    table's storage, as the sensors and the rollback task already do. It is the same code as
    ``bucketindex clean TABLE [--retain-commits N | --retain-hours H] [--dry-run]``.

    :param table_uri: the table (templated).
    :param retain_commits: keep the snapshots of the last ``retain_commits`` snapshot-changing
        commits (upserts, compactions) readable, time travel included (templated; at most
        one of the two retentions; neither: the table's default from ``table.json``).
    :param retain_hours: ... or the snapshots of the last ``retain_hours`` hours (templated).
    :param dry_run: report what would be deleted (``files``, ``bytes``), delete nothing.

    Files a live writer's snapshot or a scheduled compaction plan still reads are never
    deleted (the core holds the retained window back for them), so clean runs beside
    ingestion and compaction.
    :param heartbeat_timeout_s: seconds without a heartbeat after which a pending write
        counts as abandoned (templated; default None: the table's 60 s).

    :param conn_id: the ``bucketindex`` connection whose storage settings (``storage_options`` and
        ``storage_conn_id`` extras) this task uses (default ``bucketindex_default``; undefined: none).
    :param storage_conn_id: an ``aws``-style connection with the store's keys and endpoint
        (templated; default: the connection's ``storage_conn_id`` extra).
    :param storage_options: storage options over the connection's (templated; see
        :class:`~airflow_provider_bucketindex.operators.base.BucketIndexSparkOperator`).

    Bad input (no table there, both retentions given, a value out of range) fails the task
    **without retries** (``AirflowFailException``); a busy table (``RetryableError``: a
    concurrent clean, a live writer it must wait for) is an ordinary failure, retried per
    ``retries``. Returns ``{"table_uri", "instant", "noop", "files", "bytes",
    "earliest_retained", "dry_run"}``; ``instant`` is None and ``noop`` True when there was
    nothing to delete. Nothing happens in ``__init__``.
    """

    template_fields: Sequence[str] = ("table_uri", "retain_commits", "retain_hours", "heartbeat_timeout_s",
                                      "storage_conn_id", "storage_options")
    ui_color = "#f1f3f4"

    def __init__(
        self,
        *,
        table_uri: str,
        retain_commits: int | str | None = None,
        retain_hours: float | str | None = None,
        dry_run: bool = False,
        heartbeat_timeout_s: float | str | None = None,
        conn_id: str = DEFAULT_CONN_ID,
        storage_conn_id: str | None = None,
        storage_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.table_uri = table_uri
        self.retain_commits = retain_commits
        self.retain_hours = retain_hours
        self.dry_run = dry_run
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.conn_id = conn_id
        self.storage_conn_id = storage_conn_id
        self.storage_options = storage_options


    def clean_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``run_clean`` (templates rendered; unset values None)."""
        return {
            "retain_commits": _number(self.retain_commits, int, "retain_commits"),
            "retain_hours": _number(self.retain_hours, float, "retain_hours"),
            "dry_run": bool(self.dry_run),
            "heartbeat_timeout_s": _number(self.heartbeat_timeout_s, float, "heartbeat_timeout_s"),
        }

    @storage_scoped
    def execute(self, context: Context) -> dict[str, Any]:
        table_uri = str(self.table_uri)
        kwargs = self.clean_kwargs()
        from spark_jobs.exceptions import BadInputError, RetryableError
        from spark_jobs.table.action.clean import run_clean  # pure Python: no pyspark

        try:
            out = run_clean(table_uri, **kwargs)
        except BadInputError as e:  # no table, contradicting retentions: a retry cannot help
            raise AirflowFailException(f"clean {table_uri}: {_one_line(e)}") from e
        except RetryableError as e:  # busy: the task's retries try again
            raise AirflowException(f"clean {table_uri}: {_one_line(e)}") from e
        result = {
            "table_uri": redact_uri(table_uri),
            "instant": out.get("instant"),
            "noop": bool(out.get("noop")),
            "files": int(out.get("files") or 0),
            "bytes": int(out.get("bytes") or 0),
            "earliest_retained": out.get("earliest_retained"),
            "dry_run": kwargs["dry_run"],
        }
        deleted = not (result["noop"] or result["dry_run"])
        self.set_lineage(inputs=[table_uri], outputs=[table_uri] if deleted else [])
        if result["noop"]:
            self.log.info("clean %s: nothing to delete (earliest retained %s)", table_uri, result["earliest_retained"])
        else:
            self.log.info("clean %s %s: %s %s, %d bytes (earliest retained %s)", table_uri, result["instant"],
                          "would delete" if result["dry_run"] else "deleted", plural(result["files"], "file"),
                          result["bytes"],
                          result["earliest_retained"])
        return result


def _number(value: Any, kind: type, name: str) -> Any:
    """A rendered template value as ``kind``; None or "" (an unset param) is None."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "None")):
        return None
    if isinstance(value, bool):
        raise AirflowFailException(f"{name} must be a number, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise AirflowFailException(f"{name} must be a number, got {value!r}") from None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
