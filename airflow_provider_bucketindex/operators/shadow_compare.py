"""IndexShadowCompareOperator: the index's answer per key against the data, failing the task
(without a retry) on a mismatch -- the background comparison of RFC-08's rollout."""

from __future__ import annotations

import json
import posixpath
import re
from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_bucketindex.hooks.bucketindex import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, SparkJobFailed
from airflow_provider_bucketindex.operators.base import BucketIndexSparkOperator, one_line, storage_scoped
from spark_jobs.io.storage import redact_uri
from spark_jobs.text import plural

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["IndexMismatchError", "IndexShadowCompareOperator", "MISMATCH_KINDS", "SINCE_KEY_PREFIX",
           "SUMMARY_XCOM_KEY", "default_report_uri", "since_key", "summarize"]

#: the report's per-kind counts (spark_jobs.table.shadow.KINDS, repeated: no table code at import)
MISMATCH_KINDS = ("missing", "wrong_location", "extra", "duplicated")
#: the table Asset's state store key (prefix) of a task's last successfully compared instant
SINCE_KEY_PREFIX = "bucketindex_shadow_compare_since"
#: XCom key of the summary pushed when the task fails on a mismatch (a success returns it instead)
SUMMARY_XCOM_KEY = "shadow_compare_summary"
#: sample keys per kind kept in the XCom summary (the report file keeps up to 10)
XCOM_SAMPLES = 3
#: a sample key longer than this is cut in the summary
XCOM_SAMPLE_CHARS = 120


class IndexMismatchError(AirflowFailException):
    """The index disagrees with the data: more mismatches than allowed. A retry cannot fix it.

    :ivar summary: the size-limited summary (as pushed to XCom): counts, ``ok``, ``instant``,
        ``report_uri``, a few sample keys.
    """

    def __init__(self, summary: dict[str, Any]) -> None:
        self.summary = dict(summary)
        self.table_uri = summary.get("table_uri")
        self.report_uri = summary.get("report_uri")
        self.mismatches = int(summary.get("mismatches") or 0)
        self.counts = {k: int(summary.get(k) or 0) for k in MISMATCH_KINDS}
        kinds = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v) or "none"
        super().__init__(
            f"shadow-compare of {self.table_uri} found {plural(self.mismatches, 'mismatch')} "
            f"(more than {summary.get('max_mismatches')}): {kinds}; report: {self.report_uri}")

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (and copies) with its summary, not its message
        return (type(self), (self.summary,))


def _safe(part: str) -> str:
    return re.sub(r"[^\w.=-]+", "_", part).strip("_") or "_"


def since_key(dag_id: str, task_id: str) -> str:
    """The asset state store key of ``dag_id.task_id``'s last good instant (one per task: two
    comparisons of one table -- against a scan, against ``bucket`` -- keep their own)."""
    return f"{SINCE_KEY_PREFIX}:{dag_id}.{task_id}"


def default_report_uri(table_uri: str, reports_dir: str | None, dag_id: str, run_id: str, task_id: str,
                       map_index: int | None = None) -> str:
    """``<reports_dir>/<dag_id>/<run_id>/<task_id>[-<map_index>].json`` (unsafe characters as ``_``).

    ``reports_dir`` defaults to ``_bucketindex_reports/<table name>`` beside the table (never
    inside it: the table's directory holds only what its commits list)."""
    table = table_uri.rstrip("/")
    if not reports_dir:
        parent, name = posixpath.split(table)
        reports_dir = posixpath.join(parent or ".", "_bucketindex_reports", _safe(name))
    leaf = _safe(task_id) + (f"-{map_index}" if map_index is not None and map_index >= 0 else "")
    return posixpath.join(reports_dir.rstrip("/"), _safe(dag_id), _safe(run_id), leaf + ".json")


def summarize(report: dict[str, Any], table_uri: str, report_uri: str) -> dict[str, Any]:
    """The part of a report that goes to XCom: counts, ``ok``, ``instant``, where the report is,
    at most :data:`XCOM_SAMPLES` sample keys per kind (each cut to :data:`XCOM_SAMPLE_CHARS`)."""
    samples = {
        kind: [str(k)[:XCOM_SAMPLE_CHARS] for k in list((report.get("samples") or {}).get(kind) or [])[:XCOM_SAMPLES]]
        for kind in MISMATCH_KINDS
    }
    out: dict[str, Any] = {"table_uri": redact_uri(table_uri), "report_uri": redact_uri(report_uri) if report_uri else report_uri}
    for k in ("ok", "instant", "against", "since", "sample_fraction", "index_type", "keys_checked", "mismatches",
              "max_mismatches", *MISMATCH_KINDS, "commits_since", "elapsed_ms"):
        out[k] = report.get(k)
    out["samples"] = {k: v for k, v in samples.items() if v}
    return out


class IndexShadowCompareOperator(BucketIndexSparkOperator):
    """Run ``bucketindex shadow-compare TABLE`` with spark-submit: the index's answer for each key
    (a location or absent) against a scan of the data (or another index type computed on the fly).

    :param table_uri: the table (templated).
    :param since: compare only the keys touched by write actions after this instant, or not yet
        completed at this ISO-8601 time (``"{{ data_interval_start }}"``; no zone means UTC:
        ``spark_jobs.table.timeline.resolve_as_of``) (templated; empty or None: every key). Pass
        the ``instant`` of the previous successful run's summary to compare the commits since
        then -- or leave it empty and set ``since_last_good``.
    :param since_last_good: when ``since`` is empty, compare the commits since this task's last
        successful comparison *of this table* (``dags/bucketindex_shadow_compare.py`` does):
        its ``instant`` is kept in the table Asset's state store (Airflow 3.3's
        ``asset_state_store``; key :func:`since_key`, on ``bucketindex:<table location>``, so
        every spelling of the table shares it), read before the job and written after a
        success only. Where no store answers -- the table's Asset is not registered in Airflow
        (no DAG names it and no task wrote it through Airflow yet), no task runner -- the
        ``instant`` of this task's last successful run's XCom summary on the same table
        (``xcom_pull(include_prior_dates=True)``) is used instead, and the log says which.
        Nothing either way: every key.
    :param sample_fraction: compare a deterministic sample of the keys, ``0 < F <= 1``
        (templated; a rendered string is accepted; None or empty: all keys).
    :param against: ``scan`` (default), ``global_simple`` or ``bucket`` (templated).
    :param max_mismatches: mismatches tolerated before the task fails (templated; default 0).
    :param report_uri: where the full JSON report is written (templated; a path or URI).
        Default: :func:`default_report_uri` -- ``<reports_dir>/<dag_id>/<run_id>/<task_id>.json``,
        one file per run, never inside the table.
    :param reports_dir: the directory of the default ``report_uri`` (templated). Default:
        ``_bucketindex_reports/<table name>`` beside the table.

    Outcome:

    * no more mismatches than allowed: the task succeeds and returns the summary (XCom
      ``return_value``, when ``do_xcom_push``): ``table_uri``, ``report_uri``, ``ok``,
      ``instant`` (the latest instant compared at: the next run's ``since``), ``keys_checked``,
      ``mismatches``, the count per kind (``missing``, ``wrong_location``, ``extra``,
      ``duplicated``) and at most three sample keys per kind. Never the whole report.
    * more: the summary is pushed under the key ``shadow_compare_summary`` (when
      ``do_xcom_push``) and :class:`IndexMismatchError` -- an ``AirflowFailException`` -- fails
      the task without a retry, carrying the counts and the report location, so the run
      fails and its ``on_failure_callback`` (e.g. :class:`IndexMismatchNotifier`) fires.
    * bad input (no table, a comparison refused for the table's index type; exit 2): fails
      without a retry. Any other job failure (including exit 1 without a report: the CLI also
      exits 1 on a resource failure) is an ordinary failure, retried per ``retries``.
    """

    template_fields: Sequence[str] = ("table_uri", "since", "sample_fraction", "against", "max_mismatches",
                                      "report_uri", "reports_dir", "master", "conf", "name", "env_vars",
                                      "storage_conn_id", "storage_options")
    ui_color = "#fef7e0"

    def __init__(self, *, table_uri: str, since: str | None = None, since_last_good: bool = False,
                 sample_fraction: float | str | None = None,
                 against: str = "scan", max_mismatches: int | str = 0, report_uri: str | None = None,
                 reports_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.table_uri = table_uri
        self.since = since
        self.since_last_good = bool(since_last_good)
        self.sample_fraction = sample_fraction
        self.against = against
        self.max_mismatches = max_mismatches
        self.report_uri = report_uri
        self.reports_dir = reports_dir

    # -- the command ---------------------------------------------------------------------------
    def _args(self, table_uri: str, report_uri: str) -> list[str]:
        """The job's arguments: the task's templated values made typed, then
        :meth:`ShadowCompareOptions.to_argv <spark_jobs.table.action.shadow_compare.ShadowCompareOptions>`
        (``--against`` and ``--max-mismatches`` always written: the command says what it checks)."""
        from spark_jobs.exceptions import BadInputError
        from spark_jobs.table.action.shadow_compare import ShadowCompareOptions

        since = "" if self.since is None else str(self.since).strip()
        fraction = "" if self.sample_fraction is None else str(self.sample_fraction).strip()
        value = 1.0
        if fraction and fraction.lower() not in ("none", "null"):
            try:
                value = float(fraction)
            except ValueError:
                raise AirflowFailException(f"sample_fraction must be a number, got {self.sample_fraction!r}") from None
            if not 0 < value <= 1:
                raise AirflowFailException(f"sample_fraction must be in (0, 1], got {value}")
        try:
            limit = int(str(self.max_mismatches if self.max_mismatches is not None else 0).strip() or 0)
        except ValueError:
            raise AirflowFailException(f"max_mismatches must be a whole number, got {self.max_mismatches!r}") from None
        if limit < 0:
            raise AirflowFailException(f"max_mismatches must be at least 0, got {limit}")
        try:
            opts = ShadowCompareOptions(
                table=table_uri, against=str(self.against or "scan").strip(),
                since=since if since and since.lower() not in ("none", "null") else None,
                sample_fraction=value, max_mismatches=limit, report=report_uri)
        except BadInputError as e:  # the CLI would refuse it (exit 2): no job, no retry
            raise AirflowFailException(f"bucketindex shadow-compare refused: {one_line(e)}") from e
        return opts.to_argv(given=("against", "max_mismatches"))

    def _report_uri(self, context: Context | None) -> str:
        if self.report_uri:
            return str(self.report_uri)
        ctx: Any = context or {}
        ti = ctx.get("ti")
        dag_run = ctx.get("dag_run")
        run_id = ctx.get("run_id") or getattr(dag_run, "run_id", None) or "manual"
        dag_id = getattr(ti, "dag_id", None) or getattr(self, "dag_id", None) or "no_dag"
        return default_report_uri(str(self.table_uri), self.reports_dir or None, dag_id, run_id, self.task_id,
                                  getattr(ti, "map_index", None))

    def spark_submit_command(self, context: Context | None = None) -> list[str]:
        """The exact spark-submit command ``execute`` runs (templates rendered)."""
        table_uri = str(self.table_uri)
        return self.hook.build_command("shadow-compare", self._args(table_uri, self._report_uri(context)))

    # -- since the last good run ---------------------------------------------------------------
    def _since_store(self, table_uri: str) -> Any:
        """The table Asset's state store accessor (by its normalised URI), or None outside a task runner."""
        from airflow_provider_bucketindex.assets import asset_uri

        try:
            from airflow.sdk.execution_time.context import AssetStateStoreAccessor
            from airflow.sdk.execution_time.task_runner import SUPERVISOR_COMMS  # noqa: F401 -- set by a task runner
        except ImportError:  # Airflow before 3.3, or no task runner in this process
            return None
        return AssetStateStoreAccessor(uri=asset_uri(table_uri))

    def _key(self, context: Context | None) -> str:
        ti = (context or {}).get("ti")
        return since_key(getattr(ti, "dag_id", None) or getattr(self, "dag_id", None) or "no_dag", self.task_id)

    def last_good_since(self, context: Context, table_uri: str) -> tuple[str | None, str]:
        """``(instant, where it came from)`` of this task's last good comparison of the table."""
        store = self._since_store(table_uri)
        if store is not None:
            try:
                value = store.get(self._key(context))
            except Exception as e:  # no store answered: say so, use the XCom
                self.log.info("no asset state store for %s (%s); using the last good run's XCom",
                              redact_uri(table_uri), one_line(e))
            else:
                if isinstance(value, str) and value:
                    return value, "the table Asset's state store"
        ti = (context or {}).get("ti")
        prev = None
        if ti is not None:
            try:
                prev = ti.xcom_pull(task_ids=self.task_id, include_prior_dates=True)
            except Exception as e:
                self.log.info("no previous XCom summary (%s)", one_line(e))
        if isinstance(prev, dict) and prev.get("instant") and prev.get("table_uri") == redact_uri(table_uri):
            return str(prev["instant"]), "the last good run's XCom summary"
        return None, "nothing: no earlier good comparison of this table"

    def remember_since(self, context: Context, table_uri: str, instant: str | None) -> None:
        """Keep ``instant`` as the next run's ``since`` in the table Asset's state store; a store
        that refuses (the Asset is not registered in Airflow) leaves the XCom as the record."""
        store = self._since_store(table_uri)
        if store is None or not instant:
            return
        try:
            store.set(self._key(context), str(instant))
        except Exception as e:
            self.log.warning("the compared instant of %s is not kept in the asset state store (%s); the "
                             "next run reads it from this run's XCom", redact_uri(table_uri), one_line(e))

    # -- running it ----------------------------------------------------------------------------
    @storage_scoped
    def execute(self, context: Context) -> dict[str, Any]:
        table_uri = str(self.table_uri)
        if self.since_last_good and not str(self.since or "").strip():
            self.since, source = self.last_good_since(context, table_uri)
            self.log.info("since %s (from %s)", self.since or "the start: every key", source)
        report_uri = self._report_uri(context)
        args = self._args(table_uri, report_uri)
        _delete_report(report_uri)  # a report left by an earlier try must not pass for this one's
        self.log.info("shadow-compare of %s (report: %s)", table_uri, report_uri)
        failure: SparkJobFailed | None = None
        try:
            self.run_job(context, "shadow-compare", args)
        except SparkJobFailed as e:
            if e.returncode == EXIT_BAD_INPUT:
                raise AirflowFailException(str(e)) from e
            if e.returncode != EXIT_CHECK_FAILED:
                raise
            failure = e
        self.set_lineage(inputs=[table_uri])
        report = _read_report(report_uri)
        if report is None:  # exit 1 without a report: the job failed, it did not compare
            if failure is not None:
                raise failure
            raise SparkJobFailed("shadow-compare", 0, f"the job ended but wrote no report to {report_uri}")
        summary = summarize(report, table_uri, report_uri)
        self.log.info("shadow-compare of %s: %s, %s (%s)", table_uri, plural(summary["keys_checked"], "key"),
                      plural(summary["mismatches"], "mismatch"), ", ".join(f"{k} {summary[k]}" for k in MISMATCH_KINDS))
        if not report.get("ok"):
            self.push_xcom(context, **{SUMMARY_XCOM_KEY: summary})
            raise IndexMismatchError(summary)
        if failure is not None:  # exit 1 yet the report says ok: not a mismatch -- a failure
            raise failure
        if self.since_last_good:
            self.remember_since(context, table_uri, summary.get("instant"))
        return summary


def _delete_report(uri: str) -> None:
    from spark_jobs.io.filesystem import resolve

    io, path = resolve(uri)
    if io.exists(path):
        io.delete(path)


def _read_report(uri: str) -> dict[str, Any] | None:
    """The JSON report at ``uri``, or None when there is none (or it is not a complete report)."""
    from spark_jobs.io.filesystem import resolve

    io, path = resolve(uri)
    if not io.exists(path):
        return None
    try:
        report = json.loads(io.read_bytes(path))
    except ValueError:
        return None
    return report if isinstance(report, dict) and "ok" in report else None
