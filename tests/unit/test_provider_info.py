"""Registration: the ``apache_airflow_provider`` entry point, ``get_provider_info()``, and the
connection type Airflow builds its form from."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from airflow_provider_bucketindex import get_provider_info, sandbox

pytestmark = pytest.mark.unit

DIST = "airflow-provider-bucketindex"


def test_entry_point_names_get_provider_info():
    eps = [ep for ep in md.entry_points(group="apache_airflow_provider") if ep.dist and ep.dist.name == DIST]
    assert len(eps) == 1
    assert eps[0].value == "airflow_provider_bucketindex:get_provider_info"
    assert eps[0].load() is get_provider_info


def test_package_name_is_the_distribution_name():
    info = get_provider_info()
    assert info["package-name"] == md.distribution(DIST).metadata["Name"] == DIST
    assert info["versions"][0] == md.version(DIST)


def test_provider_info_matches_airflows_schema():
    import jsonschema

    spec = importlib.util.find_spec("airflow")
    schema_path = os.path.join(list(spec.submodule_search_locations)[0], "provider_info.schema.json")
    with open(schema_path) as f:
        jsonschema.validate(get_provider_info(), json.load(f))


def test_connection_type_and_form_fields():
    (conn,) = get_provider_info()["connection-types"]
    assert conn["connection-type"] == "bucketindex"
    assert conn["hook-class-name"] == "airflow_provider_bucketindex.hooks.bucketindex.BucketIndexHook"
    fields = conn["conn-fields"]
    assert {"spark_conn_id", "deploy-mode", "spark-binary", "python", "conf", "index", "num-buckets", "table-type", "source-format"} <= set(
        fields)
    assert conn["ui-field-behaviour"]["relabeling"]["host"] == "Spark master"
    assert {"login", "password", "schema"} <= set(conn["ui-field-behaviour"]["hidden-fields"])


def test_importing_the_package_imports_no_airflow():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, airflow_provider_bucketindex as p; p.get_provider_info(); "
         "print(any(m == 'airflow' or m.startswith('airflow.') for m in sys.modules))"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.stdout.strip() == "False", out.stderr


def test_providers_manager_registers_hook_and_form():
    sandbox.isolate_before_import()
    from airflow.providers_manager import ProvidersManager

    from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook

    pm = ProvidersManager()
    assert DIST in pm.providers
    hook = pm.hooks["bucketindex"]
    assert hook is not None and hook.hook_class_name.endswith("BucketIndexHook")
    assert BucketIndexHook.conn_type == "bucketindex" and BucketIndexHook.default_conn_name == "bucketindex_default"
    widgets = pm.connection_form_widgets
    assert "extra__bucketindex__spark_conn_id" in widgets
    assert pm.field_behaviours["bucketindex"]["relabeling"]["host"] == "Spark master"


def test_airflow_providers_list_shows_the_provider(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    out = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "list", "--output", "json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    listed = {p["package_name"]: p for p in json.loads(out.stdout[out.stdout.index("[") :])}
    assert listed[DIST]["version"] == md.version(DIST)
