"""ValidateTableOperator: the full index <-> data check, failing the task on a mismatch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_bucketindex.hooks.bucketindex import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, SparkJobFailed
from airflow_provider_bucketindex.operators.base import (
    ARROW,
    SPARK,
    BucketIndexEngineMixin,
    BucketIndexSparkOperator,
    storage_scoped,
)
from spark_jobs.io.storage import redact_uri

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["ValidateTableOperator"]


class ValidateTableOperator(BucketIndexEngineMixin, BucketIndexSparkOperator):
    """The full index <-> data check of ``bucketindex validate TABLE``; fail (without
    retrying) when the check finds a problem (exit status 1) or the table is unusable (2).

    A table whose keys (and, for the record index, its live index entries) fit the memory
    budget is checked **inside the task** on the in-process Arrow engine
    (:func:`spark_jobs.arrow_engine.validate.run_validate`: the same report, no spark-submit);
    a larger one runs ``bucketindex validate`` with spark-submit.

    :param table_uri: the table (templated).
    :param engine: ``auto`` (default: the connection's ``engine`` extra, else auto): in the task
        when :func:`spark_jobs.arrow_engine.validate.needed_bytes` of the latest snapshot fits
        ``memory_budget``, spark-submit otherwise; ``spark``: always spark-submit; ``arrow``:
        always in the task (templated).
    :param memory_budget: what the in-task check may hold, e.g. ``"4g"`` (templated; default:
        the connection's ``memory_budget`` extra, else ``[bucketindex] memory_budget``,
        else ``$BUCKETINDEX_ARROW_MEMORY_BUDGET``, else a
        quarter of the worker's physical memory).

    Returns ``{"table_uri", "valid", "instant", "engine"}`` (``instant``: the latest commit
    checked). A problem found, a damaged table (``TableCorruptError``, the CLI's exit 1) or
    bad input (no table there) fails without retries on both paths; a busy table is retried.
    """

    template_fields: Sequence[str] = ("table_uri", "engine", "memory_budget", "master", "conf", "name", "env_vars",
                                      "storage_conn_id", "storage_options")
    ui_color = "#e6f4ea"

    def __init__(
        self, *, table_uri: str, engine: str | None = None, memory_budget: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.table_uri = table_uri
        self.engine = engine
        self.memory_budget = memory_budget

    def spark_submit_command(self) -> list[str]:
        """The exact spark-submit command ``execute`` runs when the check goes to Spark (templates rendered)."""
        return self.hook.build_command("validate", _args(str(self.table_uri)))

    @storage_scoped
    def execute(self, context: Context) -> dict[str, Any]:
        table_uri = str(self.table_uri)
        engine = self._run_in_task(table_uri)
        if engine is None:
            engine = SPARK
            try:
                self.run_job(context, "validate", _args(table_uri))
            except SparkJobFailed as e:
                if e.returncode == EXIT_CHECK_FAILED:
                    raise AirflowFailException(f"validate found a problem in {table_uri}: {e.reason}") from e
                if e.returncode == EXIT_BAD_INPUT:
                    raise AirflowFailException(str(e)) from e
                raise
        self.set_lineage(inputs=[table_uri])
        last = self.hook.last_commit(table_uri)
        return {"table_uri": redact_uri(table_uri), "valid": True, "instant": last["instant"] if last else None, "engine": engine}

    def _run_in_task(self, table_uri: str) -> str | None:
        """Decide the engine; on ``arrow`` check the table in this process and return ``"arrow"``
        (None: the check goes to Spark), through :meth:`~BucketIndexEngineMixin.run_in_task`.
        Failures map as the CLI's exit statuses do; a damaged table is a finding (no retry)."""
        from spark_jobs.table.action.validate import ValidateOptions

        engine, report = self.run_in_task(
            "validate", lambda engine, budget: ValidateOptions(table=table_uri, engine=engine, memory_budget=budget),
            retryable=lambda e: f"bucketindex validate {table_uri}: {e}",
            corrupt=lambda e: AirflowFailException(f"validate found a problem in {table_uri}: {e}"))
        if engine != ARROW:
            return None
        if not report.get("ok"):
            problems = report.get("problems") or {}
            missing = problems.get("data_files_missing") if isinstance(problems, dict) else None
            files = (f" ({missing['count']} data files missing, e.g. {', '.join(missing['samples'][:3])})"
                     if isinstance(missing, dict) and missing.get("samples") else "")
            self.log.error("validate report: %s", report)
            raise AirflowFailException(
                f"validate found a problem in {table_uri}: bucketindex: validate found problems: "
                f"{', '.join(problems)}{files}")
        self.log.info("validate in the task: %s rows, no problem", report.get("rows"))
        return ARROW


def _args(table_uri: str) -> list[str]:
    """The job's arguments, by :class:`~spark_jobs.table.action.validate.ValidateOptions` (the
    CLI's form): the table only -- under spark-submit the job runs on Spark without being told."""
    from spark_jobs.table.action.validate import ValidateOptions

    return ValidateOptions(table=table_uri).to_argv()
