"""The contract between bucketindex and the Spark provider's ``SparkSubmitHook`` internals.

``hooks/spark_submit_adapter.py`` is the only module that touches them. These tests pin what
each internal member must do on the *installed* provider release, with a real process as
``spark-submit`` (a shell script: no JVM, so they take about a second). A provider release
that renames or changes one of them fails here, loudly and by name; so does a release
outside the tested range, until someone runs this file against it and widens the range.
"""

from __future__ import annotations

import json
import stat
import warnings

import pytest

from airflow_provider_bucketindex import packaging
from airflow_provider_bucketindex.demo import sandbox

pytestmark = pytest.mark.unit

STAND_IN = """#!/bin/sh
echo "26/01/01 10:00:00 INFO SparkContext: Running Spark version 4.2.0"
echo "args: $*"
echo "bucketindex: bad input: the source has no column id (password=hunter2)"
echo "26/01/01 10:00:01 INFO ShutdownHookManager: Shutdown hook called"
exit "${STAND_IN_EXIT:-3}"
"""


@pytest.fixture(scope="module")
def adapter_mod():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex.hooks import spark_submit_adapter

    return spark_submit_adapter


@pytest.fixture()
def stand_in(tmp_path) -> str:  # type: ignore[no-untyped-def]
    path = tmp_path / "spark-submit"
    path.write_text(STAND_IN)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _adapter(mod, binary: str, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("master", "local[1]")
    kw.setdefault("conn_id", "bucketindex_default")
    return mod.SparkSubmitAdapter(
        spark_binary_resolver=lambda name: binary,
        allowed_binaries=packaging.ALLOWED_SPARK_BINARIES,
        **kw,
    )


def test_installed_spark_provider_is_in_the_tested_range_and_compatible(adapter_mod):  # type: ignore[no-untyped-def]
    from packaging.specifiers import SpecifierSet

    version = adapter_mod.spark_provider_version()
    assert version in SpecifierSet(adapter_mod.TESTED_RANGE), (
        f"apache-airflow-providers-apache-spark {version} is outside the adapter's tested range "
        f"{adapter_mod.TESTED_RANGE}: run this file against it, then widen TESTED_RANGE"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adapter_mod.check_compatibility()


def test_a_release_without_a_member_fails_loudly_by_name(adapter_mod):  # type: ignore[no-untyped-def]
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    class Renamed(SparkSubmitHook):
        _build_spark_submit_command = None  # as if a release renamed it

    with pytest.raises(adapter_mod.IncompatibleSparkProviderError, match=r"_build_spark_submit_command\(\) is missing"):
        adapter_mod.check_compatibility(Renamed, version="7.0.0")

    class Changed(SparkSubmitHook):
        def _mask_cmd(self, cmd, redact_all):  # type: ignore[no-untyped-def, override]
            return ""

    with pytest.raises(adapter_mod.IncompatibleSparkProviderError, match=r"_mask_cmd.*no longer takes"):
        adapter_mod.check_compatibility(Changed, version="6.9.0")


def test_a_compatible_release_outside_the_range_warns(adapter_mod):  # type: ignore[no-untyped-def]
    with pytest.warns(RuntimeWarning, match="outside the range"):
        adapter_mod.check_compatibility(version="7.1.0")


def test_command_env_exit_status_and_output_of_a_real_process(adapter_mod, stand_in):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException

    hook = _adapter(adapter_mod, stand_in, conf={"spark.ui.enabled": "false"}, name="bucketindex-upsert",
                    application_args=["upsert", "/t"], env_vars={"PYSPARK_PYTHON": "/py", "STAND_IN_EXIT": "3"})
    assert hook.command("/app/submit.py") == [
        stand_in, "--master", "local[1]", "--conf", "spark.ui.enabled=false", "--name", "bucketindex-upsert",
        "/app/submit.py", "upsert", "/t",
    ]  # fmt: skip
    assert hook.process_env == {"PYSPARK_PYTHON": "/py", "STAND_IN_EXIT": "3"}

    with pytest.raises(AirflowException):
        hook.run("/app/submit.py", start_new_session=True)

    assert hook.returncode == 3
    assert hook.process.pid > 0 and hook.process.poll() == 3
    tail = hook.output_tail()
    assert "args: --master local[1] --conf spark.ui.enabled=false --name bucketindex-upsert /app/submit.py upsert /t" in tail
    assert any(line.startswith("bucketindex: bad input") for line in tail)
    masked = hook.mask("bucketindex: bad input (password=hunter2)")
    assert "hunter2" not in masked and "******" in masked


def test_exit_zero_returns_and_keeps_the_status(adapter_mod, stand_in):  # type: ignore[no-untyped-def]
    hook = _adapter(adapter_mod, stand_in, env_vars={"STAND_IN_EXIT": "0"})
    hook.run("/app/submit.py")
    assert hook.returncode == 0


def test_our_connection_dict_has_every_key_the_provider_reads(adapter_mod, stand_in, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_X", json.dumps({"conn_type": "spark", "host": "yarn"}))
    provider_keys = set(SparkSubmitHook(conn_id="spark_x")._resolve_connection())
    ours = _adapter(adapter_mod, stand_in, master="spark://h:7077", deploy_mode="client")
    assert provider_keys <= set(ours._connection), provider_keys - set(ours._connection)
    assert ours._connection["master"] == "spark://h:7077" and ours._connection["deploy_mode"] == "client"
    delegated = _adapter(adapter_mod, stand_in, master=None, spark_conn_id="spark_x")
    assert delegated._connection["master"] == "yarn"  # read by the provider from the spark connection


def test_bucketindex_hook_reports_the_jobs_exit_status_and_reason(adapter_mod, stand_in, monkeypatch):  # type: ignore[no-untyped-def]
    """Through the public hook: exit status 3 and the job's ``bucketindex:`` line, masked."""
    from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook, SparkJobFailed

    monkeypatch.setattr(packaging, "resolve_spark_binary", lambda name: stand_in)
    monkeypatch.setenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", sandbox.connection_json("local[1]"))
    hook = BucketIndexHook(env_vars={"STAND_IN_EXIT": "2"})
    with pytest.raises(SparkJobFailed) as err:
        hook.submit("upsert", ["/t", "/src", "--record-key", "id"])
    assert err.value.returncode == 2
    assert err.value.reason.startswith("bucketindex: bad input: the source has no column id")
    assert "hunter2" not in str(err.value)
