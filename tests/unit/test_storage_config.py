"""One storage configuration for every client of a store (spark_jobs/io/storage.py).

Where each setting comes from (URI query > run options > ``$BUCKETINDEX_STORAGE_OPTIONS`` >
``AWS_*`` environment), credentials as one group from one level, profiles, aliases, bad
options, secrets kept out of ``repr``, the CLI's ``--storage-option``, one boto3 client per
FileIO, an endpoint given only in the URI reaching the commit client, and the options a Spark
task receives. Most tests resolve with an explicit environment and need no server; the ones
that commit use the S3 test server (``bucket`` fixture).
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.cli import main as cli
from spark_jobs.exceptions import BadInputError
from spark_jobs.io import storage
from spark_jobs.io.filesystem import S3FileIO, resolve
from spark_jobs.io.storage import OPTIONS_ENV, StorageConfig
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.harness.cli import run_cli as _run_cli
from tests.oracle import reduce_batches, rows_by_identity

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_run_options(monkeypatch):  # type: ignore[no-untyped-def]
    """No test sees another's run options or this machine's AWS settings."""
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", OPTIONS_ENV):
        monkeypatch.delenv(var, raising=False)
    storage.configure(None)
    yield
    storage.configure(None)


def signing_keys(config: StorageConfig) -> tuple[str, str]:
    """(pyarrow's access key, boto3's access key): what each client of the store signs with."""
    fs_kwargs = config.s3_filesystem().__reduce__()[1][0]
    client = config.s3_client()
    return fs_kwargs["access_key"], client._request_signer._credentials.access_key


# -- precedence ---------------------------------------------------------------------------
def test_each_level_overrides_the_ones_below():
    env = {"AWS_ENDPOINT_URL": "http://env:1", "AWS_REGION": "env-region",
           OPTIONS_ENV: json.dumps({"endpoint_url": "http://json:2", "region": "json-region",
                                    "addressing_style": "virtual"})}
    # every level names the endpoint: the URI's wins; the region only below it
    got = StorageConfig.resolve(uri_options={"endpoint_url": "http://uri:4"},
                                options={"endpoint_url": "http://opt:3", "region": "opt-region"}, env=env)
    assert got.values == {"endpoint_url": "http://uri:4", "region": "opt-region", "addressing_style": "virtual"}
    # without the URI's and the run's, $BUCKETINDEX_STORAGE_OPTIONS is over AWS_*
    got = StorageConfig.resolve(options={}, env=env)
    assert got.values == {"endpoint_url": "http://json:2", "region": "json-region", "addressing_style": "virtual"}
    # and AWS_* alone (AWS_ENDPOINT_URL_S3 over AWS_ENDPOINT_URL, AWS_REGION over AWS_DEFAULT_REGION)
    got = StorageConfig.resolve(options={}, env={"AWS_ENDPOINT_URL": "http://generic:1",
                                                 "AWS_ENDPOINT_URL_S3": "http://s3only:1",
                                                 "AWS_DEFAULT_REGION": "default-region", "AWS_REGION": "region"})
    assert got.values == {"endpoint_url": "http://s3only:1", "region": "region"}


def test_run_options_come_from_configure_unless_given(monkeypatch):
    monkeypatch.setenv("AWS_REGION", "env-region")
    storage.configure({"region": "configured-region"})
    assert StorageConfig.resolve().get("region") == "configured-region"
    storage.configure(None)
    assert StorageConfig.resolve().get("region") == "env-region"


def test_the_uri_query_is_read_through_resolve(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    io, path = resolve("s3://lake/t?endpoint_url=http://127.0.0.1:2&region=eu-west-3")
    assert path == "lake/t"
    assert isinstance(io, S3FileIO)
    assert io.config.values == {"endpoint_url": "http://127.0.0.1:2", "region": "eu-west-3"}
    kwargs = io.fs.__reduce__()[1][0]
    assert (kwargs["endpoint_override"], kwargs["scheme"], kwargs["region"]) == ("127.0.0.1:2", "http", "eu-west-3")
    assert io.client.meta.endpoint_url == "http://127.0.0.1:2"
    assert io.client.meta.region_name == "eu-west-3"


# -- credentials: one group, one level ------------------------------------------------------
def test_credentials_come_as_one_group_from_the_highest_level_naming_a_key_id():
    env = {"AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": "ENVSECRET", "AWS_SESSION_TOKEN": "ENVTOKEN",
           OPTIONS_ENV: json.dumps({"access_key_id": "JSONKEY", "secret_access_key": "JSONSECRET",
                                    "session_token": "JSONTOKEN"})}
    # a key id without a secret on the command line: never paired with a lower level's secret or token
    got = StorageConfig.resolve(options={"access_key_id": "OPTKEY"}, env=env)
    assert {k: v for k, v in got.values.items() if k != "region"} == {"access_key_id": "OPTKEY"}
    # the JSON level's group, whole, over the environment's
    got = StorageConfig.resolve(options={}, env=env)
    assert got.values == {"access_key_id": "JSONKEY", "secret_access_key": "JSONSECRET", "session_token": "JSONTOKEN"}
    # a secret alone names no credentials: the level below, which names a key id, gives the group
    got = StorageConfig.resolve(uri_options={"secret_access_key": "URISECRET"},
                                options={"access_key_id": "OPTKEY", "secret_access_key": "OPTSECRET"}, env=env)
    assert got.values == {"access_key_id": "OPTKEY", "secret_access_key": "OPTSECRET"}
    # the environment's own group when nothing above names a key id
    got = StorageConfig.resolve(options={}, env={k: v for k, v in env.items() if k != OPTIONS_ENV})
    assert got.values == {"access_key_id": "ENVKEY", "secret_access_key": "ENVSECRET", "session_token": "ENVTOKEN"}


@pytest.fixture
def profile_files(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """Shared AWS config files with a profile ``lake`` (keys and a region of its own)."""
    config, credentials = tmp_path / "config", tmp_path / "credentials"
    config.write_text("[profile lake]\nregion = eu-central-1\n")
    credentials.write_text("[lake]\naws_access_key_id = PROFILEKEY\naws_secret_access_key = PROFILESECRET\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_a_profile_gives_both_clients_its_keys_over_lower_levels_keys(profile_files, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET")
    config = StorageConfig.resolve(options={"profile": "lake"})
    assert config.values == {"profile": "lake"}  # the environment's keys are a lower level's group
    assert signing_keys(config) == ("PROFILEKEY", "PROFILEKEY")
    assert config.s3_client().meta.region_name == "eu-central-1"
    assert config.s3_filesystem().region == "eu-central-1"
    # AWS_PROFILE is the environment's level: the environment's key id, at the same level, wins
    monkeypatch.setenv("AWS_PROFILE", "lake")
    config = StorageConfig.resolve()
    assert config.get("profile") is None and signing_keys(config) == ("ENVKEY", "ENVKEY")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert signing_keys(StorageConfig.resolve()) == ("PROFILEKEY", "PROFILEKEY")


def test_a_profile_is_ignored_when_a_key_id_is_given_at_its_level_or_above(profile_files):
    # a key id above the profile
    config = StorageConfig.resolve(uri_options={"access_key_id": "URIKEY", "secret_access_key": "URISECRET"},
                                   options={"profile": "lake"}, env={})
    assert "profile" not in config.values and signing_keys(config) == ("URIKEY", "URIKEY")
    # at the same level
    config = StorageConfig.resolve(options={"profile": "lake", "access_key_id": "OPTKEY",
                                            "secret_access_key": "OPTSECRET"}, env={})
    assert "profile" not in config.values and signing_keys(config) == ("OPTKEY", "OPTKEY")
    # a profile above a key id wins
    config = StorageConfig.resolve(uri_options={"profile": "lake"},
                                   options={"access_key_id": "OPTKEY", "secret_access_key": "OPTSECRET"}, env={})
    assert config.values == {"profile": "lake"} and signing_keys(config) == ("PROFILEKEY", "PROFILEKEY")


def test_a_profile_without_credentials_is_bad_input(profile_files):
    with pytest.raises(BadInputError, match="nowhere"):
        StorageConfig.resolve(options={"profile": "nowhere"}, env={}).s3_client()


# -- aliases --------------------------------------------------------------------------------
def test_s3a_and_s3n_uris_resolve_to_the_same_cached_fileio(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    io, path = resolve("s3://lake/orders")
    for alias in ("s3a://lake/orders", "s3n://lake/orders/", "S3A://lake/orders"):
        other, other_path = resolve(alias)
        assert other is io and other_path == path == "lake/orders"
    # other settings: another FileIO (and so another client)
    assert resolve("s3a://lake/orders?region=eu-west-3")[0] is not io


@pytest.mark.parametrize("key", ["endpoint_url", "endpoint", "endpoint_override", "fs.s3a.endpoint",
                                 "s3.endpoint", "AWS_ENDPOINT_URL", "aws_endpoint_url_s3"])
def test_endpoint_option_aliases(key):
    assert storage.normalise_options({key: "http://127.0.0.1:9000"}) == {"endpoint_url": "http://127.0.0.1:9000"}


def test_other_option_aliases_in_a_uri_query():
    uri, options = storage.split_uri_options(
        "s3://lake/t?fs.s3a.access.key=AK&fs.s3a.secret.key=SK&region_name=eu-west-1&fs.s3a.endpoint=minio:9000"
        "&aws_session_token=TOK&profile_name=p")
    assert uri == "s3://lake/t"
    assert options == {"access_key_id": "AK", "secret_access_key": "SK", "region": "eu-west-1",
                       "endpoint_url": "https://minio:9000", "session_token": "TOK", "profile": "p"}
    # a local path may hold a '?' literally: no options read from it
    assert storage.split_uri_options("/data/what?region=x") == ("/data/what?region=x", {})


@pytest.mark.parametrize("raw, why", [("{endpoint_url: x}", "is not a JSON object of storage options"),
                                      ('["endpoint_url"]', "must be a JSON object of storage options, got list"),
                                      ('{"endpoint": "http://h:1", "colour": "red"}', "unknown storage option 'colour'")])
def test_a_malformed_options_variable_is_bad_input_naming_it(raw, why):
    """What an operator hands its children, or a user sets, is checked as the other levels are."""
    with pytest.raises(BadInputError) as e:
        StorageConfig.resolve(options={}, env={OPTIONS_ENV: raw})
    assert str(e.value).startswith(f"${OPTIONS_ENV}") and why in str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_option_is_bad_input_naming_the_known_ones():
    with pytest.raises(BadInputError) as e:
        storage.normalise_options({"endpoitn_url": "http://x"})
    message = str(e.value)
    assert "endpoitn_url" in message
    for known in storage.KNOWN_OPTIONS:
        assert known in message
    with pytest.raises(BadInputError, match="endpoitn"):
        resolve("s3://lake/t?endpoitn=http://x")
    with pytest.raises(BadInputError, match="addressing_style"):
        storage.normalise_options({"addressing_style": "sideways"})
    with pytest.raises(BadInputError, match=OPTIONS_ENV):
        StorageConfig.resolve(options={}, env={OPTIONS_ENV: "[1, 2]"})
    with pytest.raises(BadInputError, match="KEY=VALUE"):
        storage.parse_option("nonsense")


def test_repr_never_shows_a_secret():
    config = StorageConfig.resolve(options={"access_key_id": "AKIDVISIBLE", "secret_access_key": "s3cr3t-value",
                                            "session_token": "t0ken-value"}, env={})
    for text in (repr(config), str(config), repr([config]), f"{config!r}"):
        assert "s3cr3t-value" not in text and "t0ken-value" not in text
        assert "AKIDVISIBLE" in text and "***" in text
    assert storage.redacted(config.values)["secret_access_key"] == "***"
    io = S3FileIO(config.s3_filesystem(), config)
    assert "s3cr3t-value" not in repr(io.config)


# -- the CLI ----------------------------------------------------------------------------------
def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return _run_cli(*args, timeout=120, cwd=ROOT, env={**os.environ, **(env or {})})


def test_cli_storage_option_without_a_value_is_one_line_exit_2():
    p = run_cli("show", "s3://lake/orders", "--storage-option", "nonsense")
    assert p.returncode == 2, p.stderr
    error_lines = [line for line in p.stderr.splitlines() if "error" in line]
    assert len(error_lines) == 1 and "KEY=VALUE" in error_lines[0] and "endpoint_url" in error_lines[0]
    assert "Traceback" not in p.stderr
    p = run_cli("show", "s3://lake/orders", "--storage-option", "colour=blue")
    assert p.returncode == 2 and "unknown storage option 'colour'" in p.stderr and "Traceback" not in p.stderr


def test_cli_storage_option_reaching_a_closed_port_is_not_bad_input():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = run_cli("show", "s3://lake/orders", "--storage-option", f"endpoint_url=http://127.0.0.1:{port}",
                "--storage-option", "access_key_id=a", "--storage-option", "secret_access_key=b",
                env={"AWS_EC2_METADATA_DISABLED": "true"})
    # an unreachable store is the store's state, not the input's: retryable (exit 3), one line, never exit 2
    assert p.returncode == 3, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("bucketindex:")]
    assert len(lines) == 1 and "did not answer" in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_cli_storage_options_reach_the_store(bucket, s3, monkeypatch, tmp_path, capsys):
    """The same settings given only as ``--storage-option`` (no AWS_* variables) write and read a table."""
    for var in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    rows = [{"id": "a /%+é", "ts": 1, "v": 1.0}, {"id": "b", "ts": 2, "v": None}]
    src = tmp_path / "b.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    opts = [x for k, v in s3.options().items() for x in ("--storage-option", f"{k}={v}")]
    assert cli(["upsert", f"{bucket}/t", str(src), "--record-key", "id", "--precombine-field", "ts",
                "--engine", "arrow", *opts]) == 0
    capsys.readouterr()
    assert cli(["validate", f"{bucket}/t", "--engine", "arrow", *opts]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 2


# -- one client per FileIO; the endpoint in the URI reaches the commit client --------------------
def write_source(path: Path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_one_client_per_fileio_reused_across_commits(bucket, monkeypatch, tmp_path):
    from spark_jobs.arrow_engine.upsert import run_upsert
    from spark_jobs.table.action.upsert import UpsertOptions

    built = []
    real = StorageConfig.s3_client

    def counting(self):  # type: ignore[no-untyped-def]
        built.append(self)
        return real(self)

    monkeypatch.setattr(StorageConfig, "s3_client", counting)
    uri = f"{bucket}/orders"
    b1 = [{"id": f"k{i}", "ts": i, "v": float(i)} for i in range(5)]
    b2 = [{"id": f"k{i}", "ts": 10 + i, "v": -1.0} for i in range(3, 8)]
    for n, batch in enumerate((b1, b2)):
        run_upsert(UpsertOptions(table=uri, source=write_source(tmp_path / f"b{n}.parquet", batch),
                                 record_key=["id"], precombine_field="ts", batch_id=f"b{n}"))
    one, two = Table.open(uri), Table.open(uri)
    assert isinstance(one.io, S3FileIO)
    assert one.io.client is two.io.client
    assert len(built) == 1, "every commit, rollback and delete of the run must share one client"
    assert len(Table.load(uri).timeline.completed(["commit"])) == 2
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches([b1, b2], delete_field=None)


def test_an_endpoint_given_only_in_the_uri_reaches_the_commit(s3, monkeypatch, tmp_path):
    """Before: boto3's default client went to AWS (``https://<bucket>.s3.amazonaws.com``) for the
    conditional put while pyarrow wrote the data to the URI's endpoint."""
    from spark_jobs.arrow_engine.upsert import run_upsert
    from spark_jobs.table.action.upsert import UpsertOptions

    name = s3.create_bucket(f"uri-only-{os.getpid()}-{tmp_path.name[-6:].lower().replace('_', '-')}")
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # credentials from the environment, the endpoint from the URI only
    uri = f"s3://{name}/orders?endpoint_url={s3.endpoint}"
    rows = [{"id": "x y", "ts": 1, "v": 1.0}, {"id": "ü+%", "ts": 1, "v": 2.0}]
    s3.reset_counts()
    res = run_upsert(UpsertOptions(table=uri, source=write_source(tmp_path / "b.parquet", rows), record_key=["id"],
                                   precombine_field="ts"))
    assert not res["noop"]
    keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket=name).get("Contents", [])}
    assert any("/.bucketindex/" in f"/{k}" for k in keys)
    conditional = [q for m, path, q in s3.requests()["log"] if m == "PUT" and "/.bucketindex/" in path]
    assert conditional, "the commit's puts went to the URI's endpoint"
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches([rows], delete_field=None)


# -- what a Spark task receives -----------------------------------------------------------------
def test_carried_and_adopted_options_equal_the_drivers_resolved_ones(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")  # env-only settings travel too
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET")
    monkeypatch.setenv(OPTIONS_ENV, json.dumps({"addressing_style": "path"}))
    storage.configure({"region": "eu-west-3"})
    driver = StorageConfig.resolve()
    uri_driver = StorageConfig.resolve(uri_options={"region": "ap-south-1"})
    shipped = pickle.loads(pickle.dumps(storage.carried()))  # inside the task's pickled closure
    assert storage.SECRET_OPTIONS & set(shipped)  # the secret travels in the closure, not on a command line

    # an executor elsewhere: none of the driver's environment, a stale option of an earlier task
    for var in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", OPTIONS_ENV):
        monkeypatch.delenv(var)
    storage.configure({"region": "stale"})
    storage.adopt(shipped)
    assert StorageConfig.resolve() == driver
    assert StorageConfig.resolve(uri_options={"region": "ap-south-1"}) == uri_driver
    assert driver.values == {"endpoint_url": "http://127.0.0.1:9000", "region": "eu-west-3",
                             "addressing_style": "path", "access_key_id": "ENVKEY",
                             "secret_access_key": "ENVSECRET"}
    # a driver with nothing to carry leaves a reused worker with nothing
    storage.configure(None)
    assert storage.carried() is None
    storage.configure({"region": "stale"})
    storage.adopt(None)
    assert storage.configured() == {}


def test_a_task_bound_by_the_jobs_adopts_the_drivers_options(monkeypatch):
    """``spark_jobs.kernels.tasks.bind_batches``, the wrapper every ``mapInArrow`` task runs in."""
    from spark_jobs.kernels import tasks

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    storage.configure({"region": "eu-west-3"})
    driver = StorageConfig.resolve()

    def task(batches):  # type: ignore[no-untyped-def]
        return iter([StorageConfig.resolve()])  # what the task's FileIO is built with

    from pyspark import cloudpickle  # how PySpark ships the closure to its Python workers

    mapped = cloudpickle.loads(cloudpickle.dumps(tasks.bind_batches(task)))
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    storage.configure(None)
    assert list(mapped(iter([]))) == [driver]
