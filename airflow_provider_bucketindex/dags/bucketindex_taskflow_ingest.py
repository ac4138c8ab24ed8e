"""bucketindex_taskflow_ingest: the TaskFlow way to ingest -- a Python function cleans each day's
landing batch and ``@task.bucketindex_upsert`` upserts what it returns.

Every run::

    clean_batch (@task.bucketindex_upsert) ──> report (@task: BucketIndexHook.get_df)

* ``clean_batch`` reads ``<landing_uri>/<ds>`` (one Parquet file or a folder of them), drops the
  rows without a key and trims the keys' surrounding spaces, and returns a ``pyarrow.Table``; the
  decorator upserts it (record key ``id``, the largest ``ts`` wins, ``is_deleted`` rows delete
  their key) -- in the task when it fits the memory budget, as ``UpsertWithIndexOperator`` does
  -- and returns the commit's summary (instant, batch id, counts) as the task's XCom. Its batch
  id is the data interval's alone (an in-memory batch has no location to name): a retry or a
  re-run of a date applies nothing twice; the ``replay`` param applies the date's batch again on
  purpose.
* ``report`` reads the table back with ``BucketIndexHook().get_df`` (the connection's storage
  settings; reported to Airflow's hook lineage) and logs the rows and the commit's counts.

The table and the landing folder are DAG params, defaulting to ``$BUCKETINDEX_TABLE_URI`` with
``_taskflow`` appended (not the ``bucketindex_ingest`` table: two DAGs writing one table's days
would apply each batch twice, under two batch ids) and ``$BUCKETINDEX_LANDING_URI``.

Parsing this file imports neither pyarrow nor pandas: the functions import them when they run.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

with DAG(
    dag_id="bucketindex_taskflow_ingest",
    description="Clean each day's landing batch in Python and upsert what the function returns",
    doc_md=__doc__,
    schedule="@daily",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one writer per table: runs apply their batches in order
    render_template_as_native_obj=True,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=2)},
    params={
        "table_uri": Param(os.environ.get("BUCKETINDEX_TABLE_URI", "/tmp/bucketindex/tables/events") + "_taskflow",
                           type="string", description="The table (path or file://, s3:// URI)"),
        "landing_uri": Param(os.environ.get("BUCKETINDEX_LANDING_URI", "/tmp/bucketindex/landing/events"),
                             type="string", description="Folder holding one batch per logical date, named YYYY-MM-DD"),
        "replay": Param(False, type="boolean",
                        description="Apply this date's batch again although it is committed (a re-run is a no-op)"),
    },
    tags=["bucketindex", "example"],
) as dag:

    @task.bucketindex_upsert(table_uri="{{ params.table_uri }}", record_key="id", precombine_field="ts",
                             delete_field="is_deleted", replay="{{ params.replay }}")
    def clean_batch(params=None, ds=None):  # type: ignore[no-untyped-def]
        """The day's batch without keyless rows, keys trimmed."""
        import pyarrow.compute as pc
        import pyarrow.dataset as ds_

        source = f"{params['landing_uri']}/{ds}"
        batch = ds_.dataset(source, format="parquet").to_table()
        keys = pc.utf8_trim_whitespace(batch["id"])
        batch = batch.set_column(batch.schema.get_field_index("id"), "id", keys)
        return batch.filter(pc.and_(pc.is_valid(keys), pc.not_equal(keys, "")))

    @task
    def report(summary: dict, params=None) -> dict:  # type: ignore[no-untyped-def, type-arg]
        """What the table holds after the commit (rows, and the commit's counts)."""
        from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook

        frame = BucketIndexHook().get_df(params["table_uri"], columns=["id"])
        counts = {k: summary[k] for k in ("inserted", "updated", "deleted")}
        print(f"{params['table_uri']}: {len(frame)} rows after {summary['instant']} (batch {summary['batch_id']}: {counts})")
        return {"rows": int(len(frame)), "instant": summary["instant"], "batch_id": summary["batch_id"], **counts}

    report(clean_batch())
