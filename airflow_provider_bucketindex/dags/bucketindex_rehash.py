"""bucketindex_rehash: change a table's bucket count, triggered by hand with parameters.

Tables grow past the bucket count they were created with. When ``bucketindex show`` reports
big buckets (its ``buckets`` block suggests a count; ``show --plot`` draws the sizes),
trigger this DAG with the table and the new count::

    wait_for_no_pending_writes ──> rehash ──> validate

* ``wait_for_no_pending_writes`` (:class:`NoPendingWritesSensor`) waits, up to an hour,
  until no upsert is in flight: a rehash rewrites what it read, so a write completing
  meanwhile would make it fail (and retry). Writers that start later are safe: they
  re-plan under the new count (format.md §4.5). Deferrable per ``[operators]
  default_deferrable``.
* ``rehash`` (:class:`RehashOperator`) checks the count in the task first -- a multiple or a
  divisor of the count in force, at most 65,536, a bucketed table, no rehash running -- and
  fails without a retry and without a Spark job when it is wrong; then submits
  ``bucketindex rehash`` (a split reads each old bucket once: no shuffle).
* ``validate`` runs the full index <-> data check afterwards.

``schedule=None``: it runs only when triggered. The ``params`` are ``Param`` objects, so the
UI's Trigger DAG form validates them (``num_buckets`` is an integer of at least 1) before a
run is created. From the CLI::

    airflow dags trigger bucketindex_rehash --conf '{"table_uri": "s3://lake/events", "num_buckets": 64}'

:func:`build_dag` makes the DAG (tests build variants). Parsing this file does no I/O beyond
reading one environment variable.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_bucketindex.operators import RehashOperator, ValidateTableOperator
from airflow_provider_bucketindex.sensors import NoPendingWritesSensor

__all__ = ["DAG_ID", "build_dag"]

DAG_ID = "bucketindex_rehash"
#: spark_jobs.table.config.MAX_NUM_BUCKETS, repeated so parsing this file imports no table code
MAX_NUM_BUCKETS = 65_536


def build_dag(dag_id: str = DAG_ID, *, schedule: Any = None) -> DAG:
    with DAG(
        dag_id=dag_id,
        doc_md=__doc__,  # the module's docstring: what the DAG does, shown in the UI
        description="Change a bucketindex table's bucket count (a multiple or a divisor), then validate",
        schedule=schedule,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,  # one rehash at a time
        render_template_as_native_obj=True,  # num_buckets reaches the operator as an int
        default_args={"retries": 1, "retry_delay": timedelta(minutes=5)},
        params={
            "table_uri": Param(
                os.environ.get("BUCKETINDEX_TABLE_URI", "/tmp/bucketindex/tables/events"),
                type="string",
                minLength=1,
                description="The table (path or file://, s3://, hdfs:// URI)",
            ),
            "num_buckets": Param(
                32,
                type="integer",
                minimum=1,
                maximum=MAX_NUM_BUCKETS,
                description="The new bucket count: a multiple of the current count (split, no shuffle) or a "
                            "divisor (merge). `bucketindex show` prints the current count and a suggestion.",
            ),
        },
        tags=["bucketindex", "example"],
        auto_register=False,
    ) as dag:
        wait = NoPendingWritesSensor(
            task_id="wait_for_no_pending_writes",
            table_uri="{{ params.table_uri }}",
            timeout=timedelta(hours=1).total_seconds(),
            poke_interval=60,
            mode="reschedule",  # up to an hour of waiting holds no worker slot between pokes
        )
        rehash = RehashOperator(
            task_id="rehash",
            table_uri="{{ params.table_uri }}",
            num_buckets="{{ params.num_buckets }}",
        )
        validate = ValidateTableOperator(
            task_id="validate",
            table_uri="{{ params.table_uri }}",
            retries=0,  # a failed check does not heal by itself
        )
        wait >> rehash >> validate
    return dag


dag = build_dag()
