"""DAGs used only by the Airflow end-to-end tests (linked into the test DAG folder).

* ``bucketindex_test_retry``: an upsert whose first try fails *after* its commit (as when
  a worker dies between the commit and reporting success); the retry must find the batch
  already applied. ``skip_committed_batches=False`` makes the retry run spark-submit again,
  so the job's own batch-id idempotence is exercised too.
* ``bucketindex_test_rollback``: a stand-in writer that leaves a pending instant (as a
  killed spark-submit does) and fails; the rollback branch must remove it. No Spark.
* ``bucketindex_test_nightly``: the example nightly compaction DAG (built by its own
  factory, so every task is the example's) with one more task between
  ``schedule_compaction`` and ``execute_compaction``: a real upsert of the batch in
  ``dag_run.conf["concurrent_source_uri"]``, committing while the compaction is scheduled,
  as an ingest run beside the nightly DAG does. A dependency orders it, so the interleaving
  is the same in every run.
* ``bucketindex_test_lineage_injection``: validate tasks whose hook records the spark-submit
  command instead of running it, with OpenLineage parent-job injection on (argument, or
  the ``[openlineage]`` option), overridden by the user's conf, and off.
* ``bucketindex_test_mapped``: a mapped task group over the landing files, each instance an
  upsert and its rollback (one_failed); the writer that runs *last* is killed before its
  commit, and only that instance's rollback has something to do. (Not a fixed file:
  ``dag.test()`` runs mapped instances in no fixed order, and an upsert that starts after
  a dead writer rolls back its abandoned instant itself -- the core's safety net -- which
  would leave the rollback task nothing to do.)
* ``bucketindex_test_asset_producer``: an upsert of a batch that is already committed: it
  publishes (XCom, Asset event, lineage) without a Spark job.
"""

from __future__ import annotations

from datetime import timedelta
from functools import cached_property

import pendulum
from airflow.sdk import DAG, Param, task, task_group

from airflow_provider_bucketindex.dags.bucketindex_nightly_compaction import build_dag
from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook
from airflow_provider_bucketindex.operators import (
    RollbackBatchOperator,
    UpsertWithIndexOperator,
    ValidateTableOperator,
)


class FailAfterCommitOnFirstTry(UpsertWithIndexOperator):
    def execute(self, context):  # type: ignore[no-untyped-def]
        result = super().execute(context)
        if context["ti"].try_number == 1:
            raise RuntimeError("injected: the worker died after the commit, before reporting success")
        return result


class KilledIfLast(UpsertWithIndexOperator):
    """An upsert whose writer is killed before its commit when the other ``others`` files
    are committed already: the last instance of the mapped upsert to run dies, whatever
    order ``dag.test()`` picks. (``others`` is a template field so that the mapped
    argument is resolved for each instance.)"""

    template_fields = (*UpsertWithIndexOperator.template_fields, "others")

    def __init__(self, *, others: int, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.others = others

    def execute(self, context):  # type: ignore[no-untyped-def]
        from spark_jobs.table import Action, Table

        t = Table.open(str(self.table_uri))
        committed = len(t.timeline.reload().completed([Action.COMMIT])) if t.exists else 0
        if committed == int(self.others):
            self.env_vars = {**(self.env_vars or {}), "BUCKETINDEX_FAULT": "before_complete"}
        return super().execute(context)


with DAG(
    dag_id="bucketindex_test_retry",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    render_template_as_native_obj=True,
    params={"table_uri": Param("", type="string"), "source_uri": Param("", type="string")},
) as retry_dag:
    @task(task_id="consume")
    def consume(**context) -> None:  # type: ignore[no-untyped-def]
        """What a downstream task gets from the upsert's XComs."""
        ti = context["ti"]
        instant = ti.xcom_pull(task_ids="upsert", key="instant")
        summary = ti.xcom_pull(task_ids="upsert")
        assert isinstance(instant, str) and instant == summary["instant"], (instant, summary)
        assert set(ti.xcom_pull(task_ids="upsert", key="counts")) == {"inserted", "updated", "deleted"}

    FailAfterCommitOnFirstTry(
        task_id="upsert",
        table_uri="{{ params.table_uri }}",
        source_uri="{{ params.source_uri }}",
        record_key="id",
        precombine_field="ts",
        delete_field="is_deleted",
        skip_committed_batches=False,
        retries=1,
        retry_delay=timedelta(seconds=0),
    ) >> consume()


with DAG(
    dag_id="bucketindex_test_rollback",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    render_template_as_native_obj=True,
    params={"table_uri": Param("", type="string"), "leave_pending": Param(True, type="boolean")},
) as rollback_dag:

    @task(task_id="upsert")
    def crashing_writer(table_uri: str, leave_pending: bool, **context) -> None:  # type: ignore[no-untyped-def]
        from airflow_provider_bucketindex.batch import batch_id_from_context
        from spark_jobs.table import Action, Table, TableConfig

        t = Table.open(table_uri)
        if not t.exists:
            t.create(TableConfig(record_key_fields=["id"]))
        if leave_pending:
            tl = t.timeline
            inst = tl.create_requested(Action.COMMIT, {"batch_id": batch_id_from_context(context), "operation": "upsert"})
            tl.transition_to_inflight(inst)
            rel = f"f-{inst.timestamp}_0-0_{inst.timestamp}.parquet"
            t.create_marker(inst.timestamp, rel)
            t.io.write_bytes(t.abs(rel), b"half-written")
        raise RuntimeError("injected: the writer crashed")

    @task(task_id="validate")
    def normal_path() -> None:
        """A leaf on the success path (as validate is in the ingest DAG): when the writer
        fails it is upstream_failed, so the run fails although the rollback succeeds."""

    upsert = crashing_writer("{{ params.table_uri }}", "{{ params.leave_pending }}")
    upsert >> normal_path()
    upsert >> RollbackBatchOperator(
        task_id="rollback_failed_upsert", table_uri="{{ params.table_uri }}", upsert_task_id="upsert"
    )


def _upsert_while_compaction_is_scheduled() -> UpsertWithIndexOperator:
    return UpsertWithIndexOperator(
        task_id="concurrent_upsert",
        table_uri="{{ params.table_uri }}",
        source_uri="{{ dag_run.conf['concurrent_source_uri'] }}",
        record_key="id",
        precombine_field="ts",
        delete_field="is_deleted",
        retries=0,
    )


nightly_dag = build_dag("bucketindex_test_nightly", schedule=None,
                        between_schedule_and_execute=_upsert_while_compaction_is_scheduled)


class _RecordingHook(BucketIndexHook):
    """Records the command ``submit`` would run instead of running it (argument building only)."""

    def submit(self, verb, args, *, extra_conf=None):  # type: ignore[no-untyped-def]
        self.recorded = self.build_command(verb, args, extra_conf=extra_conf)


class RecordingValidate(ValidateTableOperator):
    def __init__(self, **kwargs):  # type: ignore[no-untyped-def]
        kwargs.setdefault("engine", "spark")  # the spark-submit command is what these tasks record
        super().__init__(**kwargs)

    @cached_property
    def hook(self) -> BucketIndexHook:
        return _RecordingHook(conn_id=self.conn_id, conf=self.conf)

    def execute(self, context):  # type: ignore[no-untyped-def]
        super().execute(context)
        return self.hook.recorded


with DAG(
    dag_id="bucketindex_test_lineage_injection",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    params={"table_uri": Param("", type="string")},
) as lineage_injection_dag:
    RecordingValidate(task_id="explicit", table_uri="{{ params.table_uri }}", openlineage_inject_parent_job_info=True)
    RecordingValidate(task_id="from_config", table_uri="{{ params.table_uri }}")
    RecordingValidate(task_id="user_set", table_uri="{{ params.table_uri }}", openlineage_inject_parent_job_info=True,
                      conf={"spark.openlineage.parentJobName": "mine"})
    RecordingValidate(task_id="off", table_uri="{{ params.table_uri }}", openlineage_inject_parent_job_info=False)


with DAG(
    dag_id="bucketindex_test_mapped",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    render_template_as_native_obj=True,
    params={"table_uri": Param("", type="string"), "landing_uri": Param("", type="string")},
) as mapped_dag:

    @task
    def landing_files(landing_uri: str) -> list[dict]:
        """One mapped instance per landing file."""
        import os

        names = sorted(os.listdir(landing_uri))
        return [{"source_uri": os.path.join(landing_uri, name), "others": len(names) - 1} for name in names]

    @task_group(group_id="ingest_file")
    def ingest_file(source_uri: str, others: int) -> None:
        upsert = KilledIfLast(
            task_id="upsert",
            table_uri="{{ params.table_uri }}",
            source_uri=source_uri,
            others=others,
            engine="spark",  # the fault kills spark-submit's session; in the task it would kill the task
            record_key="id",
            precombine_field="ts",
            delete_field="is_deleted",
            retries=0,
        )
        upsert >> RollbackBatchOperator(
            task_id="rollback", table_uri="{{ params.table_uri }}", upsert_task_id="ingest_file.upsert"
        )
        upsert >> committed()

    @task
    def committed() -> None:
        """The success path's leaf (as validate is in the ingest DAG): upstream_failed for the
        failed instance, so the run fails although that instance's rollback succeeds."""

    ingest_file.expand_kwargs(landing_files("{{ params.landing_uri }}"))


with DAG(
    dag_id="bucketindex_test_asset_producer",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    params={"table_uri": Param("", type="string"), "batch_id": Param("", type="string")},
) as asset_producer_dag:
    # the batch is committed already (the test writes it with the core), so the upsert finds
    # it and publishes without a Spark job -- as the retry of a task that died after its commit
    UpsertWithIndexOperator(task_id="upsert", table_uri="{{ params.table_uri }}", source_uri="/landing/unused",
                            record_key="id", batch_id="{{ params.batch_id }}")
