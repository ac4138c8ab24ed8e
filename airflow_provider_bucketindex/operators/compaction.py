"""AsyncIndexCompactionOperator: compaction off the write path, scheduled and executed as separate tasks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_provider_bucketindex.hooks.bucketindex import EXIT_BAD_INPUT, SparkJobFailed
from airflow_provider_bucketindex.operators.base import (
    ARROW,
    SPARK,
    BucketIndexEngineMixin,
    BucketIndexSparkOperator,
    storage_scoped,
)
from spark_jobs.io.storage import redact_uri
from spark_jobs.text import plural

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["AsyncIndexCompactionOperator", "MODES"]

MODES = ("schedule", "execute", "both")


class AsyncIndexCompactionOperator(BucketIndexEngineMixin, BucketIndexSparkOperator):
    """Fold record-index deltas (and merge-on-read logs) into new bases, beside ingestion.

    "Async" in Apache Hudi's sense: compaction runs off the write path, in its own tasks,
    while upserts keep committing (format.md §4.5: compaction never conflicts with them). It
    is **not** Airflow's older ``*Async`` naming for deferrable operators; the waiting in the
    nightly DAG is done by the deferrable :class:`~airflow_provider_bucketindex.sensors.CompactionDueSensor`.

    ``mode``:

    * ``schedule`` -- plan in this task (pure Python, reading table metadata only: no Spark
      job) and write the plan as a ``compaction`` requested instant; returns
      ``{"instant", "file_groups", "logs", "index_buckets", "deltas"}`` to XCom, each key also
      as an XCom of its own (``multiple_outputs`` defaults to True in this mode and ``both``), so
      ``schedule.output["instant"]`` names the plan. Nothing due: the task is **skipped**, not
      failed (and nothing is written);
    * ``execute`` -- run the scheduled plan ``instant`` (templated; e.g.
      ``instant=schedule.output["instant"]``, which also sets ``schedule >> execute``): in the task on
      the in-process Arrow engine when ``engine`` allows it, else as a Spark job
      (``bucketindex compact TABLE --execute INSTANT``: one task per planned bucket or file
      group, no shuffle). Executing a completed plan is a no-op, and after a crash it
      resumes; a failed attempt keeps the plan for the next try;
    * ``both`` -- schedule, then execute, in one task.

    :param table_uri: the table (templated).
    :param instant: the plan to execute (``mode="execute"``; templated).
    :param min_deltas, delta_ratio: when a record-index bucket is due (templated; defaults as
        ``bucketindex compact``: 10 deltas, or deltas of half the base's bytes).
    :param min_logs, log_ratio: when a merge-on-read file group is due (templated; 4, 0.2).
    :param only: ``"index"`` or ``"data"`` to plan one kind only (default both).
    :param engine: where the plan executes. ``auto`` (default: the connection's ``engine``
        extra, else auto): in the task (no spark-submit, no JVM) when what it holds
        (:func:`spark_jobs.arrow_engine.compact.needed_bytes`: the largest file groups and index
        buckets it folds at once) fits ``memory_budget``, spark-submit otherwise; ``spark``:
        always spark-submit; ``arrow``: always in the task.
    :param memory_budget: what the in-task compaction may hold, e.g. ``"4g"`` (templated;
        default: the connection's ``memory_budget`` extra, else ``[bucketindex] memory_budget``, else the machine's).

    Returns (execute, both) also ``"counts"`` and ``"engine"`` (``arrow`` or ``spark``).
    """

    template_fields: Sequence[str] = ("table_uri", "instant", "min_deltas", "delta_ratio", "min_logs", "log_ratio",
                                      "engine", "memory_budget", "master", "conf", "name", "env_vars",
                                      "storage_conn_id", "storage_options")
    ui_color = "#fef7e0"

    def __init__(
        self,
        *,
        table_uri: str,
        mode: str = "both",
        instant: str | None = None,
        min_deltas: int = 10,
        delta_ratio: float = 0.5,
        min_logs: int = 4,
        log_ratio: float = 0.2,
        only: str | None = None,
        engine: str | None = None,
        memory_budget: str | None = None,
        **kwargs: Any,
    ) -> None:
        # a plan's keys as XComs of their own: ``schedule.output["instant"]`` (an XComArg) names the
        # plan, where a Jinja ``ti.xcom_pull(...)['instant']`` string and a hand-made edge were needed
        kwargs.setdefault("multiple_outputs", mode in ("schedule", "both"))
        super().__init__(**kwargs)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if only not in (None, "index", "data"):
            raise ValueError(f"only must be 'index', 'data' or None, got {only!r}")
        self.table_uri = table_uri
        self.mode = mode
        self.instant = instant
        self.min_deltas = min_deltas
        self.delta_ratio = delta_ratio
        self.min_logs = min_logs
        self.log_ratio = log_ratio
        self.only = only
        self.engine = engine
        self.memory_budget = memory_budget

    def spark_submit_command(self, instant: str) -> list[str]:
        """The exact spark-submit command the execute step runs (templates rendered)."""
        return self.hook.build_command("compact", _execute_args(str(self.table_uri), str(instant)))

    @storage_scoped
    def execute(self, context: Context) -> dict[str, Any]:
        table_uri = str(self.table_uri)
        result: dict[str, Any] = {"table_uri": redact_uri(table_uri)}
        if self.mode in ("schedule", "both"):
            planned = self._schedule(table_uri)
            if planned is None:
                raise AirflowSkipException(f"nothing is due for compaction in {table_uri}")
            self.log.info("compaction %s scheduled: %s (%s), %s (%s)", planned["instant"],
                          plural(planned["index_buckets"], "index bucket"), plural(planned["deltas"], "delta"),
                          plural(planned["file_groups"], "file group"), plural(planned["logs"], "log"))
            result.update(planned)
            if self.mode == "schedule":
                self.set_lineage(inputs=[table_uri])  # a plan: metadata read, no data written
                return result
            instant = planned["instant"]
        else:
            instant = str(self.instant or "").strip()
            if not instant:
                raise AirflowFailException("mode='execute' needs the instant of a scheduled compaction "
                                           "(the schedule task's XCom)")
            result["instant"] = instant
        engine = self._run_in_task(table_uri, instant)
        if engine is None:
            engine = SPARK
            try:
                self.run_job(context, "compact", _execute_args(table_uri, instant))
            except SparkJobFailed as e:
                if e.returncode == EXIT_BAD_INPUT:  # no such plan, cancelled, or stale: a retry cannot help
                    raise AirflowFailException(str(e)) from e
                raise
        result["counts"] = self._counts(table_uri, instant)
        result["engine"] = engine
        self.set_lineage(inputs=[table_uri], outputs=[table_uri], output_rows=result["counts"].get("rows"))
        return result

    def _run_in_task(self, table_uri: str, instant: str) -> str | None:
        """Decide the engine; on ``arrow`` execute the plan in this process and return ``"arrow"``
        (None: it goes to Spark), through :meth:`~BucketIndexEngineMixin.run_in_task`. Failures map
        as the CLI's exit statuses do: bad input (2: no such plan, cancelled, stale) fails without
        retries; a conflict or a busy table (3) and a damaged table (1) are retried (the plan stays
        for the next try)."""
        from spark_jobs.table.action.compact import CompactOptions

        engine, done = self.run_in_task(
            "compact", lambda engine, budget: CompactOptions(table=table_uri, execute=instant, engine=engine,
                                                             memory_budget=budget),
            label="compaction", retryable=lambda e: f"bucketindex compact {table_uri} --execute {instant}: {e}")
        if engine != ARROW:
            return None
        self.log.info("compaction %s in the task%s, %s ms", instant, " (already completed)" if done.get("noop") else "",
                      done.get("total_ms", "?"))
        return ARROW

    def _schedule(self, table_uri: str) -> dict[str, Any] | None:
        from spark_jobs.exceptions import BadInputError
        from spark_jobs.table import Table
        from spark_jobs.table.action.compact import CompactionPolicy, schedule_compaction

        try:
            policy = CompactionPolicy(min_deltas=int(self.min_deltas), delta_ratio=float(self.delta_ratio),
                                      min_logs=int(self.min_logs), log_ratio=float(self.log_ratio),
                                      data=self.only in (None, "data"), index=self.only in (None, "index"))
            return schedule_compaction(Table.load(table_uri), policy)
        except BadInputError as e:  # no table, a policy out of range, nothing of that kind to compact
            raise AirflowFailException(str(e)) from e

    @staticmethod
    def _counts(table_uri: str, instant: str) -> dict[str, Any]:
        from spark_jobs.table import Table

        t = Table.load(table_uri)
        done = t.timeline.reload().find(instant)
        if done is None or not done.is_completed:
            raise AirflowFailException(f"compaction {instant} did not complete in {table_uri}")
        return dict(t.timeline.read_metadata(done).get("counts") or {})


def _execute_args(table_uri: str, instant: str) -> list[str]:
    """``compact TABLE --execute INSTANT``, by :class:`~spark_jobs.table.action.compact.CompactOptions`."""
    from spark_jobs.table.action.compact import CompactOptions

    return CompactOptions(table=table_uri, execute=instant).to_argv()
