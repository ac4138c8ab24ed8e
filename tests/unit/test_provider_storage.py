"""Storage options in Airflow: where they come from (storage connection < the bucketindex
connection's ``storage_options`` extra < the task's ``storage_options``), how they reach
spark-submit (its environment, never its command line, on every master), the in-task work
(configured around it and restored), and the triggerer (rebuilt from connection ids, never
stored); secrets masked; bad keys fail before any work.

Argument building and hand-made state only, plus one trigger poll against the S3-compatible
test server with no ``AWS_*`` in the environment (the connection is the only way there)."""

from __future__ import annotations

import json
import sys

import pytest

from airflow_provider_bucketindex import packaging
from airflow_provider_bucketindex.demo import sandbox
from spark_jobs.io import storage

pytestmark = pytest.mark.unit

SUBMIT = packaging.submit_script()
SECRET = "wJalr/XUtnFEMI+K7MDENG%bPxRfiCY ü"  # a secret with the characters that break quoting
TOKEN = "FwoGZXIvYXdz/token+value=="
ENV = storage.OPTIONS_ENV


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    return operators


@pytest.fixture(autouse=True)
def _clean_run_options(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(ENV, raising=False)
    storage.configure(None)
    yield
    storage.configure(None)


def _conn(monkeypatch, conn_id: str, body: dict) -> None:  # type: ignore[type-arg]
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(body))


def _aws(monkeypatch, conn_id: str = "lake_s3", *, endpoint: str = "http://127.0.0.1:9000",
         extra: dict | None = None, login: str = "AKIACONN", password: str = SECRET) -> None:  # type: ignore[type-arg]
    _conn(monkeypatch, conn_id, {"conn_type": "aws", "login": login, "password": password,
                                 "extra": {"endpoint_url": endpoint, "region_name": "eu-central-1", **(extra or {})}})


def _bucketindex(monkeypatch, conn_id: str = "bucketindex_default", **extra) -> None:  # type: ignore[no-untyped-def]
    _conn(monkeypatch, conn_id, {"conn_type": "bucketindex", "host": extra.pop("host", "local[2]"), "extra": extra})


def _redact(text: str) -> str:
    from airflow.sdk._shared.secrets_masker import redact

    return str(redact(text))


def test_spark_submit_gets_the_options_in_its_environment_and_none_on_its_command(ops, monkeypatch):  # type: ignore[no-untyped-def]
    _aws(monkeypatch, extra={"aws_session_token": TOKEN})
    _bucketindex(monkeypatch, storage_conn_id="lake_s3")
    op = ops.UpsertWithIndexOperator(task_id="u", table_uri="s3://lake/orders été", source_uri="s3://lake/landing/d 1",
                                     record_key="id", engine="spark")
    sub = op.hook.spark_submit_hook("upsert", op.build_args("b-1", table_exists=False))
    cmd = sub.command(SUBMIT)

    line = " ".join(cmd)
    assert SECRET not in line and TOKEN not in line and "AKIACONN" not in line and ENV not in line
    assert cmd[-10:] == [SUBMIT, "upsert", "s3://lake/orders été", "s3://lake/landing/d 1", "--record-key", "id",
                         "--batch-id", "b-1", "--engine", "spark"]
    assert json.loads(sub.process_env[ENV]) == {
        "endpoint_url": "http://127.0.0.1:9000", "region": "eu-central-1", "access_key_id": "AKIACONN",
        "secret_access_key": SECRET, "session_token": TOKEN}
    assert sub.process_env["PYSPARK_PYTHON"] == sys.executable  # the hook's own variables are kept


def test_yarn_client_mode_keeps_secrets_off_the_command_too(ops, monkeypatch):  # type: ignore[no-untyped-def]
    # the Spark provider writes env_vars as --conf spark.yarn.appMasterEnv.* there (and as
    # spark.kubernetes.driverEnv.* on Kubernetes, whose provider is not installed here)
    _aws(monkeypatch)
    _bucketindex(monkeypatch, host="yarn", storage_conn_id="lake_s3")
    op = ops.ValidateTableOperator(task_id="v", table_uri="s3://lake/t", env_vars={"MY_VAR": "1"}, engine="spark")
    sub = op.hook.spark_submit_hook("validate", ["s3://lake/t"])
    cmd = sub.command(SUBMIT)
    assert SECRET not in " ".join(cmd) and ENV not in " ".join(cmd)
    assert any("MY_VAR=1" in c for c in cmd)  # the user's env_vars still go the provider's way
    assert json.loads(sub.process_env[ENV])["secret_access_key"] == SECRET


def test_a_driver_on_the_cluster_gets_no_secret(ops, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    _aws(monkeypatch)
    _bucketindex(monkeypatch, host="yarn", **{"deploy-mode": "cluster", "storage_conn_id": "lake_s3"})
    op = ops.ValidateTableOperator(task_id="v", table_uri="s3://lake/t", engine="spark")
    with pytest.raises(AirflowFailException, match="cluster deploy mode"):
        op.spark_submit_command()
    # the same when the deploy mode comes from a delegated Spark connection
    _conn(monkeypatch, "spark_yarn", {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}})
    _bucketindex(monkeypatch, spark_conn_id="spark_yarn", storage_conn_id="lake_s3")
    delegated = ops.ValidateTableOperator(task_id="v1", table_uri="s3://lake/t", engine="spark")
    with pytest.raises(AirflowFailException, match="cluster deploy mode"):
        delegated.spark_submit_command()
    # without a secret, the endpoint and region go the provider's way (Spark conf for the driver)
    plain = ops.ValidateTableOperator(task_id="v2", table_uri="s3://lake/t", engine="spark", storage_conn_id="",
                                      storage_options={"endpoint_url": "http://minio:9000", "region": "eu-west-1"})
    monkeypatch.setenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", json.dumps(
        {"conn_type": "bucketindex", "host": "yarn", "extra": {"deploy-mode": "cluster"}}))
    cmd = plain.spark_submit_command()
    assert f'spark.yarn.appMasterEnv.{ENV}={{"endpoint_url": "http://minio:9000", "region": "eu-west-1"}}' in cmd


def test_task_argument_over_connection_extra_over_storage_connection(ops, monkeypatch):  # type: ignore[no-untyped-def]
    _aws(monkeypatch)
    _bucketindex(monkeypatch, storage_conn_id="lake_s3",
                 storage_options={"region": "us-west-2", "addressing_style": "path"})
    op = ops.ValidateTableOperator(task_id="v", table_uri="s3://lake/t",
                                   storage_options={"region_name": "ap-south-1"})  # an alias spelling
    assert op.hook.storage_settings() == {
        "endpoint_url": "http://127.0.0.1:9000", "region": "ap-south-1", "addressing_style": "path",
        "access_key_id": "AKIACONN", "secret_access_key": SECRET}

    # credentials are one group: keys from the task replace the connection's key AND secret
    keyed = ops.ValidateTableOperator(task_id="v2", table_uri="s3://lake/t",
                                      storage_options={"access_key_id": "AKIATASK"})
    got = keyed.hook.storage_settings()
    assert got["access_key_id"] == "AKIATASK" and "secret_access_key" not in got
    # the task's storage_conn_id replaces the connection's
    _aws(monkeypatch, "other_s3", endpoint="http://10.0.0.9:9000", login="AKIAOTHER", password="other-secret")
    other = ops.ValidateTableOperator(task_id="v3", table_uri="s3://lake/t", storage_conn_id="other_s3")
    assert other.hook.storage_settings()["endpoint_url"] == "http://10.0.0.9:9000"
    assert other.hook.storage_settings()["access_key_id"] == "AKIAOTHER"


def _hide_amazon_provider(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The hand path (``storage.options_by_hand``): as without ``apache-airflow-providers-amazon``
    (tests/unit/test_provider_connections.py has the provider's path)."""
    from airflow_provider_bucketindex.storage import AMAZON_HOOK_MODULE

    monkeypatch.setitem(sys.modules, AMAZON_HOOK_MODULE, None)


def test_aws_connection_forms_the_amazon_provider_reads(ops, monkeypatch):  # type: ignore[no-untyped-def]
    _hide_amazon_provider(monkeypatch)  # the profile stays a profile (the provider would resolve it)
    _conn(monkeypatch, "aws_nested", {"conn_type": "aws", "extra": {
        "service_config": {"s3": {"endpoint_url": "http://s3.internal:9000"}},
        "config_kwargs": {"s3": {"addressing_style": "virtual"}}, "profile_name": "lake",
        "verify": False, "botocore_config": {"retries": {"max_attempts": 3}}}})  # other providers' extras: ignored
    op = ops.ValidateTableOperator(task_id="v", table_uri="s3://lake/t", storage_conn_id="aws_nested")
    assert op.hook.storage_settings() == {"endpoint_url": "http://s3.internal:9000", "addressing_style": "virtual",
                                          "profile": "lake"}


@pytest.mark.parametrize("where", ["task", "connection extra", "storage connection"])
def test_a_bad_key_fails_the_task_before_any_work(ops, monkeypatch, where):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_bucketindex.hooks import bucketindex

    kw = {}
    if where == "task":
        kw["storage_options"] = {"endpoint_urll": "http://127.0.0.1:9000"}
        _bucketindex(monkeypatch)
    elif where == "connection extra":
        _bucketindex(monkeypatch, storage_options='{"endpoint_urll": "http://127.0.0.1:9000"}')  # JSON text, as stored
    else:  # refused on the hand path (the Amazon provider's path assumes it)
        _hide_amazon_provider(monkeypatch)
        _aws(monkeypatch, extra={"role_arn": "arn:aws:iam::1:role/lake"})
        _bucketindex(monkeypatch, storage_conn_id="lake_s3")
    monkeypatch.setattr(bucketindex.BucketIndexHook, "submit", lambda *a, **k: pytest.fail("spark-submit ran"))
    monkeypatch.setattr(bucketindex.BucketIndexHook, "table_exists", lambda *a, **k: pytest.fail("table read"))
    op = ops.UpsertWithIndexOperator(task_id="u", table_uri="s3://lake/t", source_uri="s3://lake/l", record_key="id",
                                     engine="spark", **kw)
    with pytest.raises(AirflowFailException) as info:
        op.execute({})
    message = str(info.value)
    assert "\n" not in message
    assert ("role_arn" in message) if where == "storage connection" else ("endpoint_urll" in message)
    if where == "connection extra":
        assert "bucketindex_default" in message


def test_secrets_are_registered_with_the_masker(ops, monkeypatch):  # type: ignore[no-untyped-def]
    _aws(monkeypatch, extra={"aws_session_token": TOKEN})
    op = ops.ValidateTableOperator(task_id="v", table_uri="s3://lake/t", storage_conn_id="lake_s3")
    options = op.hook.storage_settings()
    logged = _redact(f"env {ENV}={json.dumps(options)} failed with key {SECRET} and {TOKEN}")
    assert SECRET not in logged and TOKEN not in logged and "***" in logged
    assert "AKIACONN" in logged  # a key id is not a secret: logs may name it


def test_spark_connect_client_gets_the_options_in_its_environment(ops, monkeypatch):  # type: ignore[no-untyped-def]
    _aws(monkeypatch)
    _bucketindex(monkeypatch, storage_conn_id="lake_s3")
    op = ops.ValidateTableOperator(task_id="v", table_uri="s3://lake/t", master="sc://127.0.0.1:15002",
                                   engine="spark")
    assert SECRET not in " ".join(op.spark_submit_command())
    assert json.loads(op.hook.connect_env()[ENV])["secret_access_key"] == SECRET


def test_no_options_no_variable(ops, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    op = ops.ValidateTableOperator(task_id="v", table_uri="/lake/t", engine="spark")
    sub = op.hook.spark_submit_hook("validate", ["/lake/t"])
    sub.command(SUBMIT)
    assert ENV not in sub.process_env and ENV not in op.hook.connect_env()


def test_in_task_work_runs_with_the_options_and_restores_the_previous_ones(ops, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException

    from spark_jobs.exceptions import RetryableError
    from spark_jobs.table.action import clean

    _aws(monkeypatch)
    _bucketindex(monkeypatch, storage_conn_id="lake_s3")
    seen: list[dict[str, str]] = []

    def fake_clean(table_uri, **kw):  # type: ignore[no-untyped-def]
        seen.append(storage.configured())
        if kw["dry_run"]:
            raise RetryableError("busy")
        return {"noop": True}

    monkeypatch.setattr(clean, "run_clean", fake_clean)
    storage.configure({"region": "before-the-task"})  # e.g. the worker's own --storage-option
    op = ops.CleanTableOperator(task_id="c", table_uri="s3://lake/t", storage_options={"region": "eu-west-3"})
    op.execute({})
    assert seen[-1] == {"endpoint_url": "http://127.0.0.1:9000", "region": "eu-west-3", "access_key_id": "AKIACONN",
                        "secret_access_key": SECRET}
    assert storage.configured() == {"region": "before-the-task"}
    failing = ops.CleanTableOperator(task_id="c2", table_uri="s3://lake/t", dry_run=True)
    with pytest.raises(AirflowException, match="busy"):
        failing.execute({})
    assert seen[-1]["region"] == "eu-central-1"
    assert storage.configured() == {"region": "before-the-task"}  # restored after a failure too


def test_deferrable_sensor_refuses_secrets_in_its_arguments_and_triggers_never_store_one(ops, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_bucketindex.sensors import TableCommitSensor
    from airflow_provider_bucketindex.storage import StorageOptionsError
    from airflow_provider_bucketindex.triggers import TableCommitTrigger

    sensor = TableCommitSensor(task_id="s", table_uri="s3://lake/t", batch_id="b", deferrable=True,
                               storage_options={"access_key_id": "AKIA", "secret_access_key": SECRET})
    with pytest.raises(AirflowFailException, match="metadata DB"):
        sensor.execute({})
    with pytest.raises(StorageOptionsError):
        TableCommitTrigger(table_uri="s3://lake/t", batch_id="b", storage_options={"secret_key": SECRET}).serialize()


def test_trigger_rebuilds_the_options_from_connections_in_the_triggerer(bucket, s3_server, monkeypatch):  # type: ignore[no-untyped-def]
    """A deferred sensor's trigger on an S3 table, serialized and re-created as the triggerer does:
    with no AWS_* in the environment, only the connections it names lead to the store."""
    from airflow_provider_bucketindex.triggers import TableCommitTrigger
    from spark_jobs.table import Table, TableConfig

    sandbox.isolate_before_import()
    table_uri = f"{bucket}/orders été/a+b%c"
    t = Table.open(table_uri)  # made as a writer with AWS_* in its environment (the s3 fixture's)
    t.create(TableConfig(record_key_fields=["id"]))
    tl = t.timeline
    inst = tl.transition_to_inflight(tl.create_requested("commit", {"batch_id": "lot 7 / Zürich"}))
    tl.complete(inst, {"batch_id": "lot 7 / Zürich", "file_groups": [], "counts": {"inserted": 0}})
    for var in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    opts = s3_server.options()
    _aws(monkeypatch, "lake_s3", endpoint=opts["endpoint_url"], login=opts["access_key_id"],
         password=opts["secret_access_key"])
    _bucketindex(monkeypatch, "lake_bi", storage_conn_id="lake_s3")

    trigger = TableCommitTrigger(table_uri=table_uri, batch_id="lot 7 / Zürich", conn_id="lake_bi",
                                 storage_options={"region": opts["region"]})
    path, kwargs = trigger.serialize()
    assert opts["secret_access_key"] not in json.dumps(kwargs)
    assert kwargs["conn_id"] == "lake_bi" and kwargs["storage_options"] == {"region": opts["region"]}
    again = TableCommitTrigger(**kwargs)
    result = again.poll()
    assert result.done and result.value["instant"] == inst.timestamp
    assert storage.configured() == {}  # the poll's scope ended


def test_the_workers_own_json_stays_beneath_the_tasks_options_in_the_child(ops, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv(ENV, json.dumps({"addressing_style": "path", "region": "worker-region",
                                        "access_key_id": "AKIAWORKER", "secret_access_key": "worker-secret"}))
    _aws(monkeypatch)
    op = ops.ValidateTableOperator(task_id="v", table_uri="s3://lake/t", storage_conn_id="lake_s3", engine="spark",
                                   storage_options={"region": "task-region"})
    sub = op.hook.spark_submit_hook("validate", ["s3://lake/t"])
    sub.command(SUBMIT)
    assert json.loads(sub.process_env[ENV]) == {  # the connection's keys replace the worker's as a group
        "addressing_style": "path", "region": "task-region", "endpoint_url": "http://127.0.0.1:9000",
        "access_key_id": "AKIACONN", "secret_access_key": SECRET}


def test_a_lone_secret_is_never_paired_with_a_lower_levels_key_id():
    """A task argument naming only a secret does not take over the connection's key id: the
    credential group comes whole from the highest level naming a key id (as the CLI's levels do)."""
    from airflow_provider_bucketindex.storage import merge_levels

    conn = {"access_key_id": "AKIA-CONN", "secret_access_key": "conn-secret", "region": "eu-west-1"}
    task = {"secret_access_key": "task-secret", "region": "us-east-2"}
    assert merge_levels(conn, task) == {"access_key_id": "AKIA-CONN", "secret_access_key": "conn-secret",
                                        "region": "us-east-2"}
    # a higher level naming a profile replaces the whole group below it
    assert merge_levels(conn, {"profile": "analytics"}) == {"profile": "analytics", "region": "eu-west-1"}
    # and one naming a key id brings its own secret, or none
    assert merge_levels(conn, {"access_key_id": "AKIA-TASK"}) == {"access_key_id": "AKIA-TASK", "region": "eu-west-1"}


@pytest.mark.parametrize("operator", ["CleanTableOperator", "RollbackBatchOperator", "ValidateTableOperator"])
@pytest.mark.parametrize("rendered", ["None", "", "  "])
def test_an_unset_storage_conn_id_template_falls_back_to_the_connections_in_every_operator(
        ops, monkeypatch, operator, rendered):  # type: ignore[no-untyped-def]
    """``storage_conn_id="{{ params.store }}"`` with the param unset renders "None" (or ""): every
    operator, in-task ones too, then uses the bucketindex connection's storage connection."""
    _aws(monkeypatch)
    _bucketindex(monkeypatch, storage_conn_id="lake_s3")
    extra = {"batch_id": "b1"} if operator == "RollbackBatchOperator" else {}
    op = getattr(ops, operator)(task_id="t", table_uri="s3://lake/t", storage_conn_id=rendered, **extra)
    settings = op.hook.storage_settings()
    assert settings["endpoint_url"] == "http://127.0.0.1:9000" and settings["access_key_id"] == "AKIACONN"


def test_an_object_storage_path_is_its_plain_location_and_its_connection_the_storage_connection(ops, monkeypatch):  # type: ignore[no-untyped-def]
    """``str(ObjectStoragePath("s3://lake/...", conn_id="lake_s3"))`` is ``s3://lake_s3@lake/...``,
    which the table layer would read as bucket ``lake_s3@lake``: the task gets ``s3://lake/...`` (the
    key as written: spaces, ``%``, non-ASCII kept) and reaches the store through ``lake_s3``, which
    the ``bucketindex`` connection does not name."""
    from airflow.sdk import ObjectStoragePath

    from spark_jobs.table.action import clean

    _aws(monkeypatch)
    _bucketindex(monkeypatch)  # no storage_conn_id: only the path's connection leads to the store
    seen: list[tuple[str, dict[str, str]]] = []
    monkeypatch.setattr(clean, "run_clean", lambda table_uri, **kw: seen.append((table_uri, storage.configured()))
                        or {"noop": True})
    path = ObjectStoragePath("s3://lake/tables/t é 100%/x", conn_id="lake_s3")
    assert "lake_s3@" in str(path)
    op = ops.CleanTableOperator(task_id="c", table_uri=path)
    op.execute({})
    assert seen == [("s3://lake/tables/t é 100%/x", {
        "endpoint_url": "http://127.0.0.1:9000", "region": "eu-central-1", "access_key_id": "AKIACONN",
        "secret_access_key": SECRET})]
    assert op.table_uri == "s3://lake/tables/t é 100%/x" and op.storage_conn_id == "lake_s3"
    local = ObjectStoragePath("file:///data/my events %41")
    assert _location(local) == ("/data/my events %41", None)


def _location(value):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.storage import object_storage_location

    return object_storage_location(value)


@pytest.mark.parametrize("table_conn,source_conn,given", [("a", "b", None), ("a", None, "b")],
                         ids=["table-and-source-disagree", "path-and-storage_conn_id-disagree"])
def test_object_storage_paths_naming_two_connections_fail_before_any_work(ops, monkeypatch, table_conn, source_conn,
                                                                           given):  # type: ignore[no-untyped-def]
    from airflow.sdk import ObjectStoragePath
    from airflow.sdk.exceptions import AirflowFailException

    _bucketindex(monkeypatch)
    op = ops.UpsertWithIndexOperator(
        task_id="u", table_uri=ObjectStoragePath("s3://lake/t", conn_id=table_conn),
        source_uri=ObjectStoragePath("s3://lake/in/x.parquet", conn_id=source_conn) if source_conn else "/in/x",
        record_key="id", storage_conn_id=given)
    monkeypatch.setattr(type(op), "_run_in_task", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(AirflowFailException, match="connections disagree"):
        op.execute({"ti": None})
    assert storage.configured() == {}


def test_get_df_and_get_dataset_read_a_snapshot_and_report_hook_lineage(ops, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    """The hook's reads: latest and ``as_of`` snapshots as pandas and Polars frames and as a
    dataset, each reported to Airflow's hook lineage as an input of the ``bucketindex`` scheme (one
    asset for the table, whatever the spelling)."""
    import pyarrow as pa
    from airflow.sdk import ObjectStoragePath
    from airflow.sdk import lineage as sdk_lineage

    from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook
    from airflow_provider_bucketindex.lineage import table_asset_uri
    from spark_jobs.api import Table

    _bucketindex(monkeypatch)
    collector = sdk_lineage.HookLineageCollector()
    monkeypatch.setattr(sdk_lineage, "get_hook_lineage_collector", lambda: collector)
    uri = str(tmp_path / "t é 1%")
    t = Table.create(uri, pa.table({"id": ["a b", "x/y"], "v": [1, None]}), record_key="id")
    first = t.history()[0].instant
    t.upsert(pa.table({"id": ["x/y", "ü"], "v": [2, 3]}))
    hook = BucketIndexHook()

    df = hook.get_df(uri)
    assert sorted(zip(df["id"], df["v"])) == [("a b", 1), ("x/y", 2), ("ü", 3)]
    old = hook.get_df(ObjectStoragePath("file://" + uri), as_of=first, df_type="polars", columns=["id"])
    assert type(old).__module__.startswith("polars") and sorted(old["id"].to_list()) == ["a b", "x/y"]
    assert old.columns == ["id"]
    assert hook.get_dataset(uri, as_of=first).to_table().num_rows == 2
    with pytest.raises(ValueError, match="df_type"):
        hook.get_df(uri, df_type="spark")

    inputs = collector.collected_assets.inputs
    assert [i.asset.uri for i in inputs] == [table_asset_uri(uri)]  # three reads, two spellings: one asset
    assert inputs[0].count == 3 and inputs[0].context is hook
