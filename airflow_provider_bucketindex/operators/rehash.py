"""RehashOperator: change a table's bucket count, by hand, after looking at ``bucketindex show``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk.exceptions import AirflowFailException

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

__all__ = ["RehashOperator"]


class RehashOperator(BucketIndexEngineMixin, BucketIndexSparkOperator):
    """Rehash the table to ``num_buckets`` (``bucketindex rehash TABLE --num-buckets M``).

    The count must be a multiple of the count in force (each bucket splits into its
    children in one Spark task, no shuffle) or a divisor of it (buckets merge), at most
    65,536; the table must be bucketed (``record`` or ``bucket`` index) and no other rehash
    may be running (format.md §3.4). All of that is checked **in the task, before anything
    is submitted** (pure Python, table metadata only): a wrong count fails the task without
    a retry and without starting a Spark job, with the reason as its error. The count in
    force already: nothing to do, the task succeeds (a cleared or retried task is a no-op).

    A write that completes while the rehash runs makes the rehash fail with a conflict and
    write nothing (it rewrote what it read); that is retryable, so Airflow's retries apply.
    Put a :class:`~airflow_provider_bucketindex.sensors.NoPendingWritesSensor` before it to
    start when no upsert is in flight, as ``dags/bucketindex_rehash.py`` does.

    :param table_uri: the table (templated).
    :param num_buckets: the new count (templated: ``"{{ params.num_buckets }}"``; a rendered
        string is accepted).
    :param heartbeat_timeout_s: seconds without a heartbeat after which a pending rehash
        counts as abandoned (and is rolled back rather than refused); default the table's.
    :param engine: ``auto`` (default: the connection's ``engine`` extra, else auto) rehashes
        **in the task** on the in-process Arrow engine when what it holds
        (:func:`spark_jobs.arrow_engine.rehash.needed_bytes`: the largest file groups or index
        buckets it rewrites at once) fits ``memory_budget``, and submits
        ``bucketindex rehash`` to Spark otherwise; ``spark``: always spark-submit; ``arrow``:
        always in the task.
    :param memory_budget: what the in-task rehash may hold, e.g. ``"4g"`` (templated; default:
        the connection's ``memory_budget`` extra, else ``[bucketindex] memory_budget``, else the machine's).

    Returns ``{"table_uri", "instant", "num_buckets", "previous_num_buckets", "noop",
    "counts", "engine"}`` (XCom, when ``do_xcom_push``; ``engine`` None for a no-op).
    """

    template_fields: Sequence[str] = ("table_uri", "num_buckets", "engine", "memory_budget", "master", "conf", "name",
                                      "env_vars", "storage_conn_id", "storage_options")
    ui_color = "#e8f0fe"

    def __init__(self, *, table_uri: str, num_buckets: int | str, heartbeat_timeout_s: float | None = None,
                 engine: str | None = None, memory_budget: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.table_uri = table_uri
        self.num_buckets = num_buckets
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.engine = engine
        self.memory_budget = memory_budget

    def spark_submit_command(self) -> list[str]:
        """The exact spark-submit command this task runs (templates rendered)."""
        return self.hook.build_command("rehash", self._args(str(self.table_uri), self._count()))

    @storage_scoped
    def execute(self, context: Context) -> dict[str, Any]:
        from spark_jobs.exceptions import BadInputError
        from spark_jobs.table.action.rehash import validate_rehash

        table_uri = str(self.table_uri)
        count = self._count()
        try:
            check = validate_rehash(table_uri, count, heartbeat_timeout_s=self.heartbeat_timeout_s)
        except BadInputError as e:  # a wrong count, no table, a rehash running: no job, no retry
            raise AirflowFailException(f"rehash of {table_uri} refused: {e}") from e
        result: dict[str, Any] = {"table_uri": redact_uri(table_uri), "num_buckets": count,
                                  "previous_num_buckets": check["previous_num_buckets"], "noop": check["noop"],
                                  "instant": None, "counts": {}, "engine": None}
        if check["noop"]:
            self.log.info("%s already has %s: nothing to do", table_uri, plural(count, "bucket"))
            self.set_lineage(inputs=[table_uri])
            return result
        self.log.info("rehashing %s (%s index, %s): %d -> %s", table_uri, check["index_type"],
                      plural(check["rows"], "row"), check["previous_num_buckets"], plural(count, "bucket"))
        engine = self._run_in_task(table_uri, count)
        if engine is None:
            engine = SPARK
            try:
                self.run_job(context, "rehash", self._args(table_uri, count))
            except SparkJobFailed as e:
                if e.returncode == EXIT_BAD_INPUT:  # refused by the job after all (e.g. index and data disagree)
                    raise AirflowFailException(str(e)) from e
                raise
        result.update(self._committed(table_uri, count), engine=engine)
        # a bucket-index rehash rewrites every row; a record-index one only the index
        self.set_lineage(inputs=[table_uri], outputs=[table_uri],
                         output_rows=result["counts"].get("rows") if check["index_type"] == "bucket" else 0)
        return result

    def _run_in_task(self, table_uri: str, count: int) -> str | None:
        """Decide the engine; on ``arrow`` rehash in this process and return ``"arrow"`` (None: the
        rehash goes to Spark), through :meth:`~BucketIndexEngineMixin.run_in_task`. Failures map
        as the CLI's exit statuses do: bad input (2) fails without retries, a conflict or a busy
        table (3) and a damaged table (1) are retried."""
        engine, done = self.run_in_task(
            "rehash", lambda engine, budget: self._options(table_uri, count, engine=engine, memory_budget=budget),
            retryable=lambda e: f"bucketindex rehash {table_uri}: {e}")
        if engine != ARROW:
            return None
        self.log.info("rehash in the task: instant %s, %s ms", done.get("instant"),
                      (done.get("timings_ms") or {}).get("total_ms", "?"))
        return ARROW

    def _count(self) -> int:
        try:
            return int(str(self.num_buckets).strip())
        except ValueError:
            raise AirflowFailException(f"num_buckets must be a whole number, got {self.num_buckets!r}") from None

    def _args(self, table_uri: str, count: int) -> list[str]:
        """The job's arguments, by :class:`~spark_jobs.table.action.rehash.RehashOptions` (the CLI's form)."""
        from spark_jobs.exceptions import BadInputError

        try:
            return self._options(table_uri, count).to_argv()
        except BadInputError as e:  # the CLI would refuse it (exit 2): no job, no retry
            raise AirflowFailException(f"rehash of {redact_uri(table_uri)} refused: {e}") from e

    def _options(self, table_uri: str, count: int, *, engine: str | None = None,
                 memory_budget: str | None = None) -> Any:
        """The :class:`~spark_jobs.table.action.rehash.RehashOptions` of this task: the job's (no
        engine: under spark-submit the job runs on Spark), or the in-task run's."""
        from spark_jobs.table.action.rehash import RehashOptions

        return RehashOptions(table=table_uri, num_buckets=count, heartbeat_timeout_s=self.heartbeat_timeout_s,
                             engine=engine, memory_budget=memory_budget)

    @staticmethod
    def _committed(table_uri: str, count: int) -> dict[str, Any]:
        """The rehash the job committed, read back from the timeline (the job's stdout is its log)."""
        from spark_jobs.table import Table
        from spark_jobs.table.timeline import Action

        tl = Table.load(table_uri).timeline.reload()
        done = tl.last_completed([Action.REHASH])
        meta = tl.read_metadata(done) if done is not None else {}
        if meta.get("num_buckets") != count:
            raise AirflowFailException(f"the rehash job ended but {table_uri} has no completed rehash to {count} buckets")
        return {"instant": done.timestamp if done else None, "counts": dict(meta.get("counts") or {})}
