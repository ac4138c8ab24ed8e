"""bucketindex_nightly_compaction: the table services of a bucketindex table, once a night.

Beside the ingest DAG (which keeps committing upserts while this one runs), every night::

    compaction_due ──> schedule_compaction ──> execute_compaction ──> clean ──> validate
                                                      └──> cancel_failed_compaction   (trigger rule one_failed)

* ``compaction_due`` (:class:`CompactionDueSensor`) waits, up to ``timeout``, until a
  compaction with this DAG's policy would fold something: record-index buckets with
  ``min_deltas`` deltas (or deltas of ``delta_ratio`` x their base), merge-on-read file
  groups with ``min_logs`` logs (or ``log_ratio``). ``soft_fail=True``: a night with nothing
  due **skips** the rest of the run instead of failing it. It is deferrable per
  ``[operators] default_deferrable`` (then it waits in the triggerer, not in a worker slot).
* ``schedule_compaction`` writes the compaction plan (pure Python, table metadata only) and
  pushes its instant (XCom key ``instant``, which ``execute_compaction`` and
  ``cancel_failed_compaction`` take as ``schedule_compaction.output["instant"]``);
  ``execute_compaction`` runs that plan in the task on the in-process
  Arrow engine when it fits the memory budget (``engine`` auto: no spark-submit, no JVM;
  the choice and its reason are logged and recorded in the commit), and as a Spark job
  otherwise or with ``engine="spark"`` on the task. Upserts that
  commit between the two (the ingest DAG does not wait for this one) are not in the plan:
  their index deltas and logs stay on top of the new bases (format.md §6.1).
* ``cancel_failed_compaction`` runs only when ``execute_compaction`` failed for good: it
  rolls the plan back (cancels it), so its buckets are planned again the next night. The
  run still ends failed (``clean`` and ``validate`` are then upstream_failed), so the
  failure alerts.
* ``clean`` deletes the files no retained snapshot references any more (what upserts and
  this compaction replaced), in the task itself through the pure-Python core. It runs on
  nights with nothing to compact too (trigger rule ``none_failed``): copy-on-write upserts
  leave old file versions every night. ``validate`` runs the full index <-> data check
  (in the task or as a Spark job, by the same rule) after a compaction (skipped with it).

Where Spark runs comes from the ``bucketindex_default`` connection, as for the ingest DAG;
its ``engine`` and ``memory_budget`` extras set the default engine of both tasks.
The table is the ``table_uri`` param, defaulting to ``BUCKETINDEX_TABLE_URI`` (the same
variable the ingest DAG reads, so both DAGs work on one table); trigger with a config to
override it, the compaction policy or the clean retention per run.

:func:`build_dag` makes the DAG; ``between_schedule_and_execute`` inserts tasks between
the schedule and execute tasks (the end-to-end test puts a real upsert there, standing in
for an ingest run that commits while a compaction is scheduled). Parsing this file does no
I/O beyond reading one environment variable.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable

import pendulum
from airflow.sdk import DAG, Param, TriggerRule

from airflow_provider_bucketindex.operators import (
    AsyncIndexCompactionOperator,
    CleanTableOperator,
    RollbackBatchOperator,
    ValidateTableOperator,
)
from airflow_provider_bucketindex.sensors import CompactionDueSensor

__all__ = ["DAG_ID", "build_dag"]

DAG_ID = "bucketindex_nightly_compaction"
_NULLABLE_INT = ["null", "integer"]


def build_dag(
    dag_id: str = DAG_ID,
    *,
    schedule: Any = "@daily",
    between_schedule_and_execute: Callable[[], Any] | None = None,
) -> DAG:
    """The nightly table-services DAG. ``between_schedule_and_execute``, if given, is called
    inside the DAG context and returns the task (or list of tasks) to run between
    ``schedule_compaction`` and ``execute_compaction``."""
    with DAG(
        dag_id=dag_id,
        doc_md=__doc__,  # the module's docstring: what the DAG does, shown in the UI
        description="Compact index deltas and merge-on-read logs when due, clean replaced files, validate",
        schedule=schedule,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,  # one compaction plan in flight per table
        render_template_as_native_obj=True,  # an unset param stays None, not the string "None"
        default_args={"retries": 1, "retry_delay": timedelta(minutes=5)},
        params={
            "table_uri": Param(
                os.environ.get("BUCKETINDEX_TABLE_URI", "/tmp/bucketindex/tables/events"),
                type="string",
                description="The table (path or file://, s3://, hdfs:// URI)",
            ),
            "min_deltas": Param(10, type="integer", minimum=1,
                                description="A record-index bucket is due with this many deltas"),
            "delta_ratio": Param(0.5, type="number", exclusiveMinimum=0,
                                 description="... or with deltas of this fraction of its base's bytes"),
            "min_logs": Param(4, type="integer", minimum=1,
                              description="A merge-on-read file group is due with this many logs"),
            "log_ratio": Param(0.2, type="number", exclusiveMinimum=0,
                               description="... or with logs of this fraction of its base's bytes"),
            "retain_commits": Param(None, type=_NULLABLE_INT, minimum=1,
                                    description="clean: keep what the latest N commits read (default: the core's)"),
        },
        tags=["bucketindex", "example"],
        # importing build_dag elsewhere (a test variant) must not register this module's DAG a second time
        auto_register=False,
    ) as dag:
        policy = {
            "min_deltas": "{{ params.min_deltas }}",
            "delta_ratio": "{{ params.delta_ratio }}",
            "min_logs": "{{ params.min_logs }}",
            "log_ratio": "{{ params.log_ratio }}",
        }
        due = CompactionDueSensor(
            task_id="compaction_due",
            table_uri="{{ params.table_uri }}",
            **policy,
            soft_fail=True,  # nothing due tonight: skip the run's services, do not fail it
            timeout=timedelta(hours=1).total_seconds(),
            poke_interval=300,
            mode="reschedule",  # an hour of waiting holds no worker slot between pokes
        )
        schedule_compaction = AsyncIndexCompactionOperator(
            task_id="schedule_compaction",
            table_uri="{{ params.table_uri }}",
            mode="schedule",
            multiple_outputs=True,  # the plan's keys as XComs of their own: .output["instant"] below
            **policy,
        )
        # the plan's instant as an XComArg (the schedule task's XCom key "instant"): resolved when the
        # task runs, None when no plan was pushed; it also makes schedule_compaction upstream of its users
        planned_instant = schedule_compaction.output["instant"]
        execute = AsyncIndexCompactionOperator(
            task_id="execute_compaction",
            table_uri="{{ params.table_uri }}",
            mode="execute",
            instant=planned_instant,
        )
        cancel = RollbackBatchOperator(
            task_id="cancel_failed_compaction",
            table_uri="{{ params.table_uri }}",
            instant=planned_instant,  # None (nothing pushed) -> nothing to cancel
        )
        clean = CleanTableOperator(
            task_id="clean",
            table_uri="{{ params.table_uri }}",
            retain_commits="{{ params.retain_commits }}",
            # also on a night with nothing to compact: copy-on-write upserts leave old file
            # versions every night (a bucket-index table never has anything to compact)
            trigger_rule=TriggerRule.NONE_FAILED,
        )
        validate = ValidateTableOperator(
            task_id="validate",
            table_uri="{{ params.table_uri }}",
            retries=0,  # a failed check does not heal by itself
        )

        due >> schedule_compaction
        if between_schedule_and_execute is None:
            schedule_compaction >> execute
        else:
            extra = between_schedule_and_execute()
            schedule_compaction >> extra >> execute
        execute >> [clean, cancel]
        [execute, clean] >> validate  # validate after a compaction rewrote index bases
    return dag


dag = build_dag()
