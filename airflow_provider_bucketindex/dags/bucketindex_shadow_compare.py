"""bucketindex_shadow_compare: every hour, compare the index with the data for the commits
since the last successful run, and alert when they disagree.

RFC-08's rollout keeps a background comparison running until users trust the index::

    shadow_compare

* ``shadow_compare`` (:class:`IndexShadowCompareOperator`, ``since_last_good=True``) runs
  ``bucketindex shadow-compare`` with ``--since`` the ``instant`` of the last successful
  comparison of *this table* by this task, kept in the table Asset's state store (Airflow
  3.3's ``asset_state_store``, key ``bucketindex_shadow_compare_since:<dag_id>.<task_id>``);
  where the table's Asset is not registered in Airflow (no DAG names it, no task wrote it
  through Airflow), from this task's last successful run's XCom summary on the same table. The
  first run on a table compares every key. A failed run records nothing, so the next run
  compares everything since the last good one again.
* The full report goes to ``<reports_dir>/<dag_id>/<run_id>/shadow_compare.json``
  (``reports_dir`` param; empty: ``_bucketindex_reports/<table name>`` beside the table);
  the XCom holds a summary (counts, instant, report location, a few sample keys).
* A mismatch fails the task without a retry (``retries=0``: a retry cannot fix an index) and
  the run fails; ``on_failure_callback`` is an :class:`IndexMismatchNotifier`, whose message
  names the counts and the report location. It logs the alert; give it ``notifiers=[...]``
  (``SmtpNotifier``, ``SlackNotifier``, ...) to send it -- see ``docs/airflow.md``.

:func:`build_dag` makes the DAG (tests pass their own ``notifiers``). Parsing this file does
no I/O beyond reading environment variables.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_bucketindex.notifications import IndexMismatchNotifier
from airflow_provider_bucketindex.operators import IndexShadowCompareOperator

__all__ = ["DAG_ID", "build_dag"]

DAG_ID = "bucketindex_shadow_compare"
TASK_ID = "shadow_compare"


def build_dag(dag_id: str = DAG_ID, *, schedule: Any = "@hourly", notifiers: Sequence[Any] | None = None) -> DAG:
    with DAG(
        dag_id=dag_id,
        doc_md=__doc__,  # the module's docstring: what the DAG does, shown in the UI
        description="Compare a bucketindex table's index with its data for the commits since the last good run",
        schedule=schedule,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,  # each run starts where the last good one ended
        default_args={"retries": 0},
        params={
            "table_uri": Param(
                os.environ.get("BUCKETINDEX_TABLE_URI", "/tmp/bucketindex/tables/events"),
                type="string",
                minLength=1,
                description="The table (path or file://, s3://, hdfs:// URI)",
            ),
            "against": Param("scan", enum=["scan", "global_simple", "bucket"],
                             description="The truth: a key scan, or another index type computed on the fly"),
            "sample_fraction": Param(1.0, type="number", exclusiveMinimum=0, maximum=1,
                                     description="Compare a deterministic sample of the keys (1: all)"),
            "max_mismatches": Param(0, type="integer", minimum=0,
                                    description="Mismatches tolerated before the run fails"),
            "reports_dir": Param(os.environ.get("BUCKETINDEX_REPORTS_DIR", ""), type="string",
                                 description="Where the JSON reports go (empty: _bucketindex_reports/<table> "
                                             "beside the table)"),
        },
        tags=["bucketindex", "example"],
        auto_register=False,
    ) as dag:
        IndexShadowCompareOperator(
            task_id=TASK_ID,
            table_uri="{{ params.table_uri }}",
            since_last_good=True,  # since: the last good comparison of this table (asset state store)
            against="{{ params.against }}",
            sample_fraction="{{ params.sample_fraction }}",
            max_mismatches="{{ params.max_mismatches }}",
            reports_dir="{{ params.reports_dir }}",
            on_failure_callback=IndexMismatchNotifier(notifiers=list(notifiers or [])),
        )
    return dag


dag = build_dag()
