"""bucketindex_ingest: scheduled ingest of a landing folder into a bucketindex table.

Each logical date has its own batch under the landing folder, ``<landing_uri>/<ds>``:
one file, or one folder of files (Parquet unless ``source_format`` says otherwise).
Every run::

    upsert ──> validate
       └─────> rollback_failed_upsert     (trigger rule one_failed)

* ``upsert`` applies the batch (data + index in one commit): inside the task when it fits
  the memory budget (``engine`` ``auto``, the default), else as a Spark job. Its batch id is
  derived from the DAG id, the task id, the run's data interval and the source's location
  (``<landing_uri>/<ds>``, as a short digest), so neither a retry nor a re-run of a past date
  (``airflow dags test bucketindex_ingest 2024-01-01`` after 2024-01-02) applies the batch
  twice: the re-run logs that the batch is committed and does nothing. The same date from
  another ``landing_uri`` is another batch and is applied. The ``replay`` param applies it
  again on purpose, under a new batch id.
* ``validate`` runs the full index <-> data check (in the task or as a Spark job, as
  ``upsert``) and fails the run on a mismatch.
* ``rollback_failed_upsert`` runs only when ``upsert`` failed: it rolls back the pending
  instant the failed attempt left, or does nothing if it left none. The run still ends
  failed (``validate`` is then upstream_failed), so the failure is visible and alerts.

Where Spark runs, for the work that goes to Spark, comes from the ``bucketindex_default``
connection (Spark master, conf; without it: local Spark in the worker); the ``engine`` param
(``auto``, ``spark``, ``arrow``) picks where the work runs. Table and landing locations are DAG params,
defaulting to the ``BUCKETINDEX_TABLE_URI`` / ``BUCKETINDEX_LANDING_URI`` environment
variables; trigger with a config to override them per run.

Parsing this file does no I/O beyond reading two environment variables.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_bucketindex.operators import (
    RollbackBatchOperator,
    UpsertWithIndexOperator,
    ValidateTableOperator,
)

_NULLABLE_STR = ["null", "string"]

with DAG(
    dag_id="bucketindex_ingest",
    doc_md=__doc__,  # the module's docstring: what the DAG does, shown in the UI
    description="Upsert each day's landing batch into a bucketindex table, validate, roll back on failure",
    schedule="@daily",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one writer per table: runs apply their batches in order
    render_template_as_native_obj=True,  # an unset param stays None, not the string "None"
    default_args={"retries": 2, "retry_delay": timedelta(minutes=2)},
    params={
        "table_uri": Param(
            os.environ.get("BUCKETINDEX_TABLE_URI", "/tmp/bucketindex/tables/events"),
            type="string",
            description="The table (path or file://, s3://, hdfs:// URI)",
        ),
        "landing_uri": Param(
            os.environ.get("BUCKETINDEX_LANDING_URI", "/tmp/bucketindex/landing/events"),
            type="string",
            description="Folder holding one batch (file or folder) per logical date, named YYYY-MM-DD",
        ),
        "record_key": Param("id", type="string", description="Record key field(s), comma-separated"),
        "precombine_field": Param("ts", type=_NULLABLE_STR, description="Largest value wins per key"),
        "partition_field": Param(None, type=_NULLABLE_STR),
        "delete_field": Param("is_deleted", type=_NULLABLE_STR, description="Rows where true are deletes"),
        "index": Param(None, type=["null", "string"], enum=[None, "record", "bucket", "global_simple"]),
        "num_buckets": Param(None, type=["null", "integer"], minimum=1),
        "source_format": Param("parquet", type="string", enum=["parquet", "json", "csv"]),
        "engine": Param(
            "auto",
            type="string",
            enum=["auto", "spark", "arrow"],
            description="auto: in the task when the batch fits the memory budget, else Spark; spark: spark-submit",
        ),
        "replay": Param(
            False,
            type="boolean",
            description=(
                "Apply this date's batch again although it is committed (a corrected landing file): a re-run of a "
                "date is otherwise a no-op, its batch id being the data interval's and the landing folder's"
            ),
        ),
    },
    tags=["bucketindex", "example"],
) as dag:
    upsert = UpsertWithIndexOperator(
        task_id="upsert",
        table_uri="{{ params.table_uri }}",
        source_uri="{{ params.landing_uri }}/{{ ds }}",
        record_key="{{ params.record_key }}",
        precombine_field="{{ params.precombine_field }}",
        partition_field="{{ params.partition_field }}",
        delete_field="{{ params.delete_field }}",
        index="{{ params.index }}",
        num_buckets="{{ params.num_buckets }}",
        source_format="{{ params.source_format }}",
        engine="{{ params.engine }}",
        replay="{{ params.replay }}",
    )
    validate = ValidateTableOperator(
        task_id="validate",
        table_uri="{{ params.table_uri }}",
        engine="{{ params.engine }}",
        retries=0,  # a failed check does not heal by itself
    )
    rollback = RollbackBatchOperator(
        task_id="rollback_failed_upsert",
        table_uri="{{ params.table_uri }}",
        upsert_task_id="upsert",
    )

    upsert >> validate
    upsert >> rollback
