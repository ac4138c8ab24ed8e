"""DAGs of the TaskFlow tests (``tests/airflow/test_taskflow_e2e.py``): ``@task.bucketindex_upsert``
and ``BucketIndexHook.get_df`` / ``get_dataset``.

* ``bucketindex_test_taskflow``: an upsert of the batch a function builds from ``rows`` in the
  run's conf, as the frame type the conf names (``arrow``, ``pandas``, ``polars``, or ``path``: the
  function writes a Parquet file and returns its path), then a task that reads the table back with
  ``get_df`` (pandas or Polars) -- latest and, when the conf gives ``as_of``, as of that instant --
  and counts the rows of ``get_dataset``.
* ``bucketindex_test_taskflow_spark``: an in-memory batch routed to a Spark cluster master: it
  must fail in the task, before any spark-submit (the cluster cannot read the worker's temporary file).
* ``bucketindex_test_taskflow_s3``: a function that returns an ``ObjectStoragePath`` of a Parquet
  file on the S3 test server, with the ``aws`` connection id in the path; the ``bucketindex``
  connection names no storage connection, so the path's connection is the only way to the
  store; the read task reads through ``get_df`` of an ``ObjectStoragePath`` table. Beside it,
  ``classic``: an ``UpsertWithIndexOperator`` whose ``source_uri`` is an ``ObjectStoragePath``
  an upstream task returns (through XCom), into a second table.

Only the function bodies import pyarrow, pandas, Polars (this file is parsed with the others).
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook
from airflow_provider_bucketindex.operators import UpsertWithIndexOperator

#: the batches' columns, in order; ``is_deleted`` marks deletes
COLUMNS = (("id", "string"), ("name", "string"), ("amount", "float64"), ("ts", "int64"), ("is_deleted", "bool_"))


def _arrow(rows: list[dict]):  # type: ignore[no-untyped-def, type-arg]
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=pa.schema([(n, getattr(pa, t)()) for n, t in COLUMNS]))


def _batch(rows: list[dict], kind: str, scratch: str):  # type: ignore[no-untyped-def, type-arg]
    table = _arrow(rows)
    if kind == "pandas":
        return table.to_pandas()
    if kind == "polars":
        import polars

        return polars.from_arrow(table)
    if kind == "path":
        import os

        import pyarrow.parquet as pq

        os.makedirs(scratch, exist_ok=True)
        path = os.path.join(scratch, "batch 1 é%.parquet")
        pq.write_table(table, path)
        return path
    return table


def _rows(frame, df_type: str) -> list[dict]:  # type: ignore[no-untyped-def, type-arg]
    """A frame's rows as JSON values, sorted by key (NaN: None, as the table's nulls)."""
    if df_type == "polars":
        rows = frame.to_dicts()
    else:
        rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return sorted(rows, key=lambda r: r["id"])


_START = pendulum.datetime(2024, 1, 1, tz="UTC")
_PARAMS = {"table_uri": Param("", type="string"), "rows": Param([], type="array"), "kind": Param("arrow", type="string"),
           "df_type": Param("pandas", type="string"), "as_of": Param("", type="string"),
           "scratch": Param("", type="string")}

with DAG(dag_id="bucketindex_test_taskflow", schedule=None, start_date=_START, params=_PARAMS,
         render_template_as_native_obj=True):

    # a retry allowed: bad input must fail without using it
    @task.bucketindex_upsert(table_uri="{{ params.table_uri }}", record_key="id", precombine_field="ts",
                             delete_field="is_deleted", engine="arrow", retries=1, retry_delay=timedelta(0))
    def upsert(params=None):  # type: ignore[no-untyped-def]
        return _batch(params["rows"], params["kind"], params["scratch"])

    @task
    def read(params=None):  # type: ignore[no-untyped-def]
        hook = BucketIndexHook()
        uri, df_type = params["table_uri"], params["df_type"]
        out = {"latest": _rows(hook.get_df(uri, df_type=df_type), df_type),
               "dataset_rows": hook.get_dataset(uri).count_rows(),
               "type": type(hook.get_df(uri, df_type=df_type, columns=["id"])).__module__.split(".")[0]}
        if params["as_of"]:
            out["as_of"] = _rows(hook.get_df(uri, as_of=params["as_of"], df_type=df_type), df_type)
        return out

    upsert() >> read()


with DAG(dag_id="bucketindex_test_taskflow_spark", schedule=None, start_date=_START, params=_PARAMS,
         render_template_as_native_obj=True):

    @task.bucketindex_upsert(table_uri="{{ params.table_uri }}", record_key="id", engine="spark",
                             master="spark://nowhere.invalid:7077", retries=0)
    def upsert_on_a_cluster(params=None):  # type: ignore[no-untyped-def]
        return _arrow(params["rows"])

    upsert_on_a_cluster()


with DAG(dag_id="bucketindex_test_taskflow_s3", schedule=None, start_date=_START,
         params={"table_uri": Param("", type="string"), "table2_uri": Param("", type="string"),
                 "source_uri": Param("", type="string"), "conn_id": Param("", type="string")},
         render_template_as_native_obj=True):

    @task.bucketindex_upsert(table_uri="{{ params.table_uri }}", record_key="id", precombine_field="ts",
                             delete_field="is_deleted", engine="arrow", retries=0)
    def landed(params=None):  # type: ignore[no-untyped-def]
        from airflow.sdk import ObjectStoragePath

        return ObjectStoragePath(params["source_uri"], conn_id=params["conn_id"])

    @task
    def read_back(params=None):  # type: ignore[no-untyped-def]
        from airflow.sdk import ObjectStoragePath

        table = ObjectStoragePath(params["table_uri"], conn_id=params["conn_id"])
        return _rows(BucketIndexHook().get_df(table), "pandas")

    @task
    def landing_path(params=None):  # type: ignore[no-untyped-def]
        from airflow.sdk import ObjectStoragePath

        return ObjectStoragePath(params["source_uri"], conn_id=params["conn_id"])

    # the classic operator, its source an ObjectStoragePath handed over through XCom
    UpsertWithIndexOperator(task_id="classic", table_uri="{{ params.table2_uri }}", source_uri=landing_path(),
                            record_key="id", precombine_field="ts", delete_field="is_deleted", engine="arrow",
                            retries=0)

    landed() >> read_back()
