"""``@task.bucketindex_upsert``: upsert what a TaskFlow function returns.

::

    from airflow.sdk import task

    @task.bucketindex_upsert(table_uri="s3://lake/orders", record_key="id", precombine_field="ts")
    def orders(ds=None):
        return fetch_orders(ds)   # a pyarrow.Table, a pandas or Polars frame, a path, an ObjectStoragePath

The decorated task *is* an :class:`~airflow_provider_bucketindex.operators.upsert.UpsertWithIndexOperator`
whose source is the function's return value: the decorator's keywords are the operator's (its
table, key, engine, storage and Spark options), so the options are checked, defaulted from the
connection and turned into :class:`~spark_jobs.table.action.upsert.UpsertOptions` by the same code
as the operator's -- no rule is repeated here -- and the run pushes the operator's summary
(instant, batch id, counts, engine), emits the table's Asset event and reports lineage as the
operator does. The batch id is the operator's default (:mod:`airflow_provider_bucketindex.batch`):
the task and the run's data interval, plus the source's location when the function returned a
path or an ``ObjectStoragePath`` (``/src-<12 hex>``); an in-memory batch has no location, so its
id is the interval's alone -- the same for every try and every re-run of the date: a retry after
the commit, or a re-run whose function fetches other rows for that date, runs the function again
but writes nothing twice (``replay=True`` applies it again on purpose).

What the function may return:

* a path or URI (``str``, ``os.PathLike``): a file, folder or glob of source rows, as
  ``source_uri`` takes it;
* an ``ObjectStoragePath``: its plain location, its connection the task's storage connection
  (:func:`airflow_provider_bucketindex.storage.use_object_storage_paths`);
* an in-memory batch (a ``pyarrow.Table`` or ``RecordBatchReader``, a pandas or Polars frame):
  written to a temporary local Parquet file for the run, as the Python API's ``Table.upsert``
  does (:func:`spark_jobs.api.batch_source`, which says why a file). A batch the in-task engine
  cannot take goes to Spark only when Spark runs on this worker (a ``local`` master in client
  mode): a cluster or a Spark Connect server cannot read the worker's temporary file, and the
  task fails without retries saying so.

Imports neither pyarrow, numpy, pandas nor pyspark at module level (the DAG processor imports
this module with every DAG file that uses the decorator); ``execute`` imports what the returned
value needs.
"""

from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Collection, Iterator, Mapping, Sequence

from airflow.sdk.bases.decorator import DecoratedOperator, TaskDecorator, determine_kwargs, task_decorator_factory
from airflow.sdk.definitions.context import context_merge
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_bucketindex.operators.upsert import UpsertWithIndexOperator
from airflow_provider_bucketindex.storage import is_object_storage_path

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["bucketindex_upsert_task"]


class _BucketIndexUpsertDecoratedOperator(DecoratedOperator, UpsertWithIndexOperator):
    """An upsert whose source is what ``python_callable`` returns (module docstring)."""

    custom_operator_name: str = "@task.bucketindex_upsert"
    # the function's arguments and the operator's fields, but not source_uri: it is the function's
    # return value, taken as it is (not rendered as a template)
    template_fields: Sequence[str] = (*DecoratedOperator.template_fields,
                                      *(f for f in UpsertWithIndexOperator.template_fields if f != "source_uri"))
    template_fields_renderers: ClassVar[dict[str, str]] = dict(DecoratedOperator.template_fields_renderers)

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if "source_uri" in kwargs:
            raise TypeError("@task.bucketindex_upsert takes its source from the function's return value, "
                            "not from source_uri")
        super().__init__(python_callable=python_callable, op_args=op_args, op_kwargs=op_kwargs,
                         source_uri=None, **kwargs)
        #: True while the source is a temporary file holding the function's in-memory batch
        self._in_memory_batch = False

    def execute(self, context: Context) -> Any:
        context_merge(context, self.op_kwargs)
        kwargs = determine_kwargs(self.python_callable, self.op_args, context)
        returned = self.python_callable(*self.op_args, **kwargs)
        with self._source(returned) as (source, label):
            self.source_uri = source
            try:
                return super().execute(context)
            except AirflowException as e:  # name what the function returned, not its temporary file
                if not self._in_memory_batch or source not in str(e):
                    raise
                raise type(e)(str(e).replace(source, label)) from e

    @contextmanager
    def _source(self, returned: Any) -> Iterator[tuple[Any, str]]:
        """``(source, label)`` of the upsert for the function's return value (module docstring)."""
        if returned is None:
            raise AirflowFailException(
                "the @task.bucketindex_upsert function returned None: return the batch (a pyarrow.Table, a pandas "
                "or Polars frame), a path or an ObjectStoragePath")
        if isinstance(returned, (str, os.PathLike)) or is_object_storage_path(returned):
            if isinstance(returned, str) and not returned.strip():
                raise AirflowFailException("the @task.bucketindex_upsert function returned an empty path")
            source = returned if is_object_storage_path(returned) else os.fspath(returned)
            yield source, str(source)
            return
        from spark_jobs.api import batch_source
        from spark_jobs.exceptions import BadInputError

        with ExitStack() as stack:
            try:  # only writing the batch: the upsert's own errors are mapped by the operator
                path, label = stack.enter_context(batch_source(returned))
            except BadInputError as e:  # not a batch, or one the table cannot hold: no retry can fix it
                raise AirflowFailException(f"@task.bucketindex_upsert: {' '.join(str(e).split())}") from e
            self.log.info("Upserting %s returned by the function (a temporary Parquet file)", label)
            self._in_memory_batch = True
            try:
                yield path, label
            finally:
                self._in_memory_batch = False

    def batch_source(self) -> Any:
        # an in-memory batch's temporary file is new on every run: no location names it (module docstring)
        return None if self._in_memory_batch else self.source_uri

    def _submit(self, context: Context, batch_id: str, *, table_exists: bool) -> None:
        if self._in_memory_batch:
            from spark_jobs.resources import is_local_master

            hook = self.hook
            master = hook.master or hook.settings.master
            if hook.remote_url() is not None or not is_local_master(master) or hook.settings.deploy_mode == "cluster":
                raise AirflowFailException(
                    f"batch {batch_id} goes to Spark ({master if hook.remote_url() is None else hook.remote_url()}), "
                    f"which cannot read the function's in-memory batch from this worker's temporary file: return a "
                    f"path on shared storage (or an ObjectStoragePath), or use engine='arrow' with a larger "
                    f"memory_budget")
        super()._submit(context, batch_id, table_exists=table_exists)

    def set_lineage(self, *, inputs: Sequence[str] = (), **kwargs: Any) -> None:
        # an in-memory batch was made by this task: its temporary file is no dataset anyone can read
        super().set_lineage(inputs=() if self._in_memory_batch else inputs, **kwargs)


def bucketindex_upsert_task(
    python_callable: Callable[..., Any] | None = None,
    multiple_outputs: bool | None = False,
    **kwargs: Any,
) -> TaskDecorator:
    """Wrap a function into an upsert of what it returns (module docstring); registered as
    ``@task.bucketindex_upsert``. ``kwargs`` are
    :class:`~airflow_provider_bucketindex.operators.upsert.UpsertWithIndexOperator`'s (``table_uri``,
    ``record_key``, ``precombine_field``, ``engine``, ...) and ``BaseOperator``'s, without
    ``source_uri``. The task's return value is the operator's summary, one XCom
    (``multiple_outputs`` False unless given)."""
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_BucketIndexUpsertDecoratedOperator,
        **kwargs,
    )
