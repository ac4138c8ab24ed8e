"""Connections and configuration (issue 40, item 5), in-process with connections from ``AIRFLOW_CONN_*``:

* an ``aws`` storage connection goes through the Amazon provider's ``AwsBaseHook`` when the provider
  is installed -- a ``role_arn`` assumed through STS on the moto server (loopback), a profile read
  from the AWS files -- and is read by hand without it (the module hidden: only which path runs
  is asserted), where ``role_arn`` is refused with the way to get it;
* the provider's ``[bucketindex]`` configuration section: declared in the provider info, loaded by
  Airflow's configuration, and read under the task's arguments and the connection's extras and over
  the core's environment variables, which still work when the section is empty;
* the connection's extras spelled one way (``num_buckets``), the earlier hyphenated spellings
  still read.
"""

from __future__ import annotations

import json
import os

import pytest

from airflow_provider_bucketindex.demo import sandbox
from spark_jobs.io import storage

pytestmark = pytest.mark.unit

CONN = "AIRFLOW_CONN_BUCKETINDEX_DEFAULT"
AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_STS", "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE")
ROLE = "arn:aws:iam::123456789012:role/lake writer+ü"


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    return operators


@pytest.fixture(autouse=True)
def _clean(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(storage.OPTIONS_ENV, raising=False)
    monkeypatch.delenv("BUCKETINDEX_ARROW_MEMORY_BUDGET", raising=False)
    monkeypatch.delenv("BUCKETINDEX_DRIVER_MEMORY", raising=False)
    for name in ("ENGINE", "MEMORY_BUDGET", "DRIVER_MEMORY", "INDEX", "NUM_BUCKETS", "TABLE_TYPE", "SOURCE_FORMAT"):
        monkeypatch.delenv(f"AIRFLOW__BUCKETINDEX__{name}", raising=False)
    storage.configure(None)
    yield
    storage.configure(None)


def _conn(monkeypatch, conn_id: str, body: dict) -> None:  # type: ignore[type-arg]
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(body))


def _no_aws_env(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Nothing but the connection leads to the store: no AWS_* variable, no AWS files."""
    for var in AWS_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _hide_amazon_provider(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """As if ``apache-airflow-providers-amazon`` were not installed: its hook module cannot be imported."""
    import sys

    from airflow_provider_bucketindex.storage import AMAZON_HOOK_MODULE

    monkeypatch.setitem(sys.modules, AMAZON_HOOK_MODULE, None)


def _settings(ops, storage_conn_id: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return ops.ValidateTableOperator(task_id="v", table_uri="s3://lake/t", storage_conn_id=storage_conn_id
                                     ).hook.storage_settings()


# -- the Amazon provider's credentials -----------------------------------------------------------
def test_role_arn_is_assumed_through_the_amazon_provider_and_reaches_the_store(ops, s3_server, monkeypatch,
                                                                                tmp_path):  # type: ignore[no-untyped-def]
    """A real ``aws`` connection with base keys and a ``role_arn``: AwsBaseHook assumes the role
    through STS on the moto server; the task's options carry the role's temporary keys (STS names
    them the assumed role), not the connection's, and the in-task work reaches a table with them."""
    import boto3

    from airflow_provider_bucketindex.storage import amazon_base_hook
    from spark_jobs.table import Table, TableConfig

    assert amazon_base_hook() is not None, "the amazon extra is part of the test extra"
    bucket = s3_server.create_bucket(f"role-{os.getpid()}-{tmp_path.name[-6:].lower().replace('_', '-')}")
    _no_aws_env(monkeypatch, tmp_path)
    _conn(monkeypatch, "lake_role", {"conn_type": "aws", "login": "AKIABASE", "password": "base secret/+%", "extra": {
        "endpoint_url": s3_server.endpoint, "region_name": s3_server.region, "role_arn": ROLE,
        "service_config": {"sts": {"endpoint_url": s3_server.endpoint}},
        "config_kwargs": {"s3": {"addressing_style": "path"}}}})
    options = _settings(ops, "lake_role")

    assert options["endpoint_url"] == s3_server.endpoint and options["region"] == s3_server.region
    assert options["addressing_style"] == "path"
    assert options["access_key_id"] != "AKIABASE" and options["access_key_id"].startswith("ASIA")
    assert options["secret_access_key"] != "base secret/+%" and options["session_token"]
    sts = boto3.client("sts", endpoint_url=s3_server.endpoint, region_name=s3_server.region,
                       aws_access_key_id=options["access_key_id"], aws_secret_access_key=options["secret_access_key"],
                       aws_session_token=options["session_token"])
    assert sts.get_caller_identity()["Arn"].startswith("arn:aws:sts::123456789012:assumed-role/lake writer+ü/")

    table_uri = f"s3://{bucket}/t é 100%/a+b"
    storage.configure(options)
    try:
        Table.open(table_uri).create(TableConfig(record_key_fields=["id"]))
    finally:
        storage.configure(None)
    hook = ops.ValidateTableOperator(task_id="v", table_uri=table_uri, storage_conn_id="lake_role").hook
    assert hook.table_exists(table_uri) is True
    assert storage.configured() == {}


def test_a_profile_is_read_by_the_amazon_provider(ops, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    _no_aws_env(monkeypatch, tmp_path)
    creds = tmp_path / "credentials"
    creds.write_text("[lake]\naws_access_key_id = AKIAPROFILE\naws_secret_access_key = profile secret ü\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    _conn(monkeypatch, "lake_profile", {"conn_type": "aws", "extra": {
        "profile_name": "lake", "service_config": {"s3": {"endpoint_url": "http://s3.internal:9000"}},
        "region_name": "eu-west-1"}})
    assert _settings(ops, "lake_profile") == {
        "endpoint_url": "http://s3.internal:9000", "region": "eu-west-1", "access_key_id": "AKIAPROFILE",
        "secret_access_key": "profile secret ü"}
    # a profile that does not exist: the provider's error, one line, an ordinary (retried) failure
    _conn(monkeypatch, "lake_nope", {"conn_type": "aws", "extra": {"profile_name": "nope"}})
    from airflow_provider_bucketindex.storage import StorageCredentialsError

    with pytest.raises(StorageCredentialsError, match="'lake_nope': the Amazon provider could not .*nope"):
        _settings(ops, "lake_nope")


def test_without_a_credential_source_the_default_chain_stays_in_charge(ops, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    """Only an endpoint and a region: nothing is frozen into options (each process's own chain --
    an instance role -- signs, as without a connection), whichever path reads the connection."""
    _no_aws_env(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWORKER")  # the worker's own: must not be copied
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-secret")
    _conn(monkeypatch, "lake_plain", {"conn_type": "aws", "extra": {"endpoint_url": "http://minio:9000",
                                                                    "region_name": "eu-west-3"}})
    expected = {"endpoint_url": "http://minio:9000", "region": "eu-west-3"}
    assert _settings(ops, "lake_plain") == expected
    _hide_amazon_provider(monkeypatch)
    assert _settings(ops, "lake_plain") == expected


def test_without_the_amazon_provider_the_connection_is_read_by_hand(ops, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    """The hand path: a profile stays a profile option (each process reads its AWS files; the
    provider path resolves it to keys), and a ``role_arn`` fails before any work, saying how to get it."""
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_bucketindex.storage import amazon_base_hook

    _no_aws_env(monkeypatch, tmp_path)
    _hide_amazon_provider(monkeypatch)
    assert amazon_base_hook() is None
    _conn(monkeypatch, "lake_hand", {"conn_type": "aws", "extra": {"endpoint_url": "http://minio:9000",
                                                                   "profile_name": "lake"}})
    assert _settings(ops, "lake_hand") == {"endpoint_url": "http://minio:9000", "profile": "lake"}
    _conn(monkeypatch, "lake_keys", {"conn_type": "aws", "login": "AKIAHAND", "password": "hand secret", "extra": {
        "aws_session_token": "tok+/="}})
    assert _settings(ops, "lake_keys") == {"access_key_id": "AKIAHAND", "secret_access_key": "hand secret",
                                           "session_token": "tok+/="}
    _conn(monkeypatch, "lake_role", {"conn_type": "aws", "extra": {"role_arn": ROLE}})
    with pytest.raises(AirflowFailException) as info:
        _settings(ops, "lake_role")
    message = str(info.value)
    assert "\n" not in message and "role_arn" in message and "airflow-provider-bucketindex[amazon]" in message


# -- the [bucketindex] configuration section -----------------------------------------------------
def test_the_section_is_declared_and_airflow_loads_its_defaults() -> None:
    """The provider info's ``config`` is what Airflow's configuration loads for providers: every
    option exists, empty by default (an empty option changes nothing)."""
    sandbox.isolate_before_import()
    from airflow.configuration import conf
    from airflow.providers_manager import ProvidersManager

    from airflow_provider_bucketindex import get_provider_info
    from airflow_provider_bucketindex.config import OPTIONS

    declared = get_provider_info()["config"]["bucketindex"]["options"]
    assert set(declared) == set(OPTIONS) >= {"engine", "memory_budget", "driver_memory", "index", "num_buckets",
                                             "table_type", "source_format"}
    configs = dict(ProvidersManager().provider_configs)  # what Airflow read of the providers' sections
    assert set(configs["airflow-provider-bucketindex"]["bucketindex"]["options"]) == set(OPTIONS)
    conf.load_providers_configuration()
    assert all(conf.get("bucketindex", name) == "" for name in OPTIONS)


@pytest.mark.parametrize("conn_extra,section,env,expected", [
    ({}, {"ENGINE": "spark"}, {}, "spark"),  # the section's engine
    ({"engine": "auto"}, {"ENGINE": "spark"}, {}, "arrow"),  # the connection's beats the section's
    ({}, {"MEMORY_BUDGET": "1k"}, {}, "spark"),  # the section's budget
    ({"memory_budget": "4g"}, {"MEMORY_BUDGET": "1k"}, {}, "arrow"),  # the connection's beats the section's
    ({}, {"MEMORY_BUDGET": "4g"}, {"BUCKETINDEX_ARROW_MEMORY_BUDGET": "1k"}, "arrow"),  # the section beats the env
    ({}, {}, {"BUCKETINDEX_ARROW_MEMORY_BUDGET": "1k"}, "spark"),  # the documented variable still works
    ({}, {"MEMORY_BUDGET": " "}, {"BUCKETINDEX_ARROW_MEMORY_BUDGET": "1k"}, "spark"),  # empty: not set
])  # fmt: skip
def test_engine_and_budget_from_the_section(ops, monkeypatch, tmp_path, conn_extra, section, env, expected):  # type: ignore[no-untyped-def]
    _conn(monkeypatch, "bucketindex_default", {"conn_type": "bucketindex", "host": "local[2]", "extra": conn_extra})
    for name, value in section.items():
        monkeypatch.setenv(f"AIRFLOW__BUCKETINDEX__{name}", value)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    op = ops.UpsertWithIndexOperator(task_id="u", table_uri=str(tmp_path / "t"), source_uri=str(tmp_path / "in"),
                                     record_key="id")
    _, choice = op.decide_engine("upsert", lambda: 10_000)  # 10 kB: over 1k, under 4g
    assert choice.engine == expected


def test_table_defaults_and_driver_memory_from_the_section(ops, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    """The section's table defaults fill in what the connection does not set (the connection's win),
    for a table the upsert creates; its driver memory sizes a local spark-submit over
    ``$BUCKETINDEX_DRIVER_MEMORY``, which applies when the section is empty."""
    from spark_jobs.table import Table, TableConfig

    monkeypatch.setenv("AIRFLOW__BUCKETINDEX__INDEX", "bucket")
    monkeypatch.setenv("AIRFLOW__BUCKETINDEX__NUM_BUCKETS", "8")
    monkeypatch.setenv("AIRFLOW__BUCKETINDEX__TABLE_TYPE", "copy_on_write")
    monkeypatch.setenv("AIRFLOW__BUCKETINDEX__SOURCE_FORMAT", "json")
    monkeypatch.setenv("AIRFLOW__BUCKETINDEX__DRIVER_MEMORY", "3g")
    monkeypatch.setenv("BUCKETINDEX_DRIVER_MEMORY", "5g")
    _conn(monkeypatch, "bucketindex_default", {"conn_type": "bucketindex", "host": "local[2]",
                                               "extra": {"num_buckets": 4}})
    table = str(tmp_path / "t é")
    op = ops.UpsertWithIndexOperator(task_id="u", table_uri=table, source_uri="/landing/d 1", record_key="id",
                                     engine="spark")
    cmd = op.spark_submit_command("b")
    assert cmd[cmd.index("--driver-memory") + 1] == "3g"
    assert cmd[cmd.index("upsert"):] == [
        "upsert", table, "/landing/d 1", "--record-key", "id", "--index", "bucket", "--num-buckets", "4",
        "--table-type", "copy_on_write", "--source-format", "json", "--batch-id", "b", "--engine", "spark"]
    Table.open(table).create(TableConfig(record_key_fields=["id"], index_type="record"))
    cmd = op.spark_submit_command("b")  # an existing table keeps its own; the source format still applies
    assert cmd[cmd.index("upsert"):] == ["upsert", table, "/landing/d 1", "--record-key", "id", "--source-format",
                                         "json", "--batch-id", "b", "--engine", "spark"]
    monkeypatch.setenv("AIRFLOW__BUCKETINDEX__DRIVER_MEMORY", "")
    cmd = op.spark_submit_command("b")
    assert cmd[cmd.index("--driver-memory") + 1] == "5g"


# -- extras spelled one way ----------------------------------------------------------------------
def test_extras_are_spelled_one_way_and_the_old_spellings_still_read(ops, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex import get_provider_info
    from airflow_provider_bucketindex.hooks.bucketindex import EXTRA_ALIASES, BucketIndexHook

    fields = get_provider_info()["connection-types"][0]["conn-fields"]
    assert not [k for k in fields if "-" in k], "the connection form spells every extra with underscores"
    assert set(EXTRA_ALIASES.values()) <= set(fields)
    new = {"deploy_mode": "cluster", "spark_binary": "spark3-submit", "num_buckets": 4, "table_type": "merge_on_read",
           "source_format": "json", "memory_budget": "2g", "index": "bucket"}
    old = {("index" if k == "index" else next(o for o, n in EXTRA_ALIASES.items() if n == k)): v for k, v in new.items()}
    seen = []
    for extra in (new, old):
        _conn(monkeypatch, "bucketindex_default", {"conn_type": "bucketindex", "host": "spark://10.0.0.5:7077",
                                                   "extra": extra})
        s = BucketIndexHook().settings
        seen.append((s.deploy_mode, s.spark_binary, s.table_defaults, s.memory_budget))
    assert seen[0] == seen[1] == ("cluster", "spark3-submit", {"index": "bucket", "num_buckets": 4,
                                                               "table_type": "merge_on_read", "source_format": "json"},
                                  "2g")
    _conn(monkeypatch, "bucketindex_default", {"conn_type": "bucketindex", "extra": {"num_buckets": 4,
                                                                                     "num-buckets": 8}})
    with pytest.raises(ValueError, match="'num_buckets' \\(4\\) and 'num-buckets' \\(8\\) disagree"):
        BucketIndexHook().settings
