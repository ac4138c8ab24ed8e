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

from airflow_provider_bucketindex import get_provider_info
from airflow_provider_bucketindex.demo import sandbox

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
    assert {"spark_conn_id", "deploy_mode", "spark_binary", "python", "conf", "index", "num_buckets", "table_type",
            "source_format", "memory_budget", "engine", "storage_conn_id", "storage_options", "location"} <= set(fields)
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


def _classes_defined_in(package: str, base: type) -> dict[str, str]:
    """``{class name: module}`` of every subclass of ``base`` defined in a module of ``package``."""
    import importlib
    import inspect
    import pkgutil

    pkg = importlib.import_module(package)
    classes = {}
    for info in pkgutil.iter_modules(pkg.__path__, package + "."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == info.name and issubclass(obj, base):
                classes[obj] = info.name
    # a base class of others (BucketIndexSparkOperator, TableStateSensor) is not itself a task
    bases = {b for c in classes for b in c.__mro__[1:]}
    return {c.__name__: m for c, m in classes.items() if c not in bases}


def test_provider_info_lists_every_operator_sensor_trigger_and_notifier():
    """A class Airflow should know of lives in a module the provider info lists (a new
    operator module goes into ``get_provider_info()["operators"]``), every listed module
    imports, and there are no foreign integration tags."""
    import importlib

    sandbox.isolate_before_import()
    from airflow.sdk import BaseNotifier, BaseOperator, BaseSensorOperator
    from airflow.triggers.base import BaseTrigger

    info = get_provider_info()
    listed = {kind: {m for entry in info.get(kind, []) for m in entry["python-modules"]}
              for kind in ("operators", "sensors", "triggers", "hooks")}
    for modules in listed.values():
        for module in modules:
            importlib.import_module(module)

    sensors = _classes_defined_in("airflow_provider_bucketindex.sensors", BaseSensorOperator)
    operators = {n: m for n, m in _classes_defined_in("airflow_provider_bucketindex.operators", BaseOperator).items()
                 if n not in sensors}
    triggers = _classes_defined_in("airflow_provider_bucketindex.triggers", BaseTrigger)
    assert {"UpsertWithIndexOperator", "RollbackBatchOperator", "CleanTableOperator"} <= set(operators)
    for kind, classes in (("operators", operators), ("sensors", sensors), ("triggers", triggers)):
        unlisted = {name: module for name, module in classes.items() if module not in listed[kind]}
        assert not unlisted, f"add these modules to get_provider_info()[{kind!r}]: {unlisted}"

    notifiers = {f"{m}.{n}" for n, m in _classes_defined_in("airflow_provider_bucketindex", BaseNotifier).items()}
    assert notifiers <= set(info.get("notifications", [])), "add notifier classes to get_provider_info()['notifications']"
    assert all("tags" not in i or "apache" not in i["tags"] for i in info["integrations"]), "no ASF affiliation"


def test_dependencies_are_floors_without_unexplained_ceilings():
    """Airflow and the Spark provider are floors (``>=``): a ceiling blocks the next release."""
    import configparser

    from packaging.requirements import Requirement

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(os.path.dirname(__file__), "..", "..", "setup.cfg"))
    lines = [ln.split("#")[0].strip() for ln in cfg["options"]["install_requires"].splitlines()]
    reqs = {r.name: r for r in (Requirement(ln) for ln in lines if ln)}
    for name in ("apache-airflow", "apache-airflow-providers-apache-spark"):
        ops = {s.operator for s in reqs[name].specifier}
        assert ops == {">="}, f"{name}: {reqs[name].specifier}"


def test_task_decorator_is_registered_and_resolves_to_the_upsert_operator():
    """``@task.bucketindex_upsert`` is found through the provider info (``task-decorators``), as
    Airflow finds ``@task.docker``, and builds the upsert operator with the decorator's keywords;
    ``source_uri`` is the function's to give."""
    sandbox.isolate_before_import()
    import pendulum
    from airflow.sdk import DAG, task

    from airflow_provider_bucketindex.operators.upsert import UpsertWithIndexOperator

    (entry,) = get_provider_info()["task-decorators"]
    assert entry == {"name": "bucketindex_upsert",
                     "class-name": "airflow_provider_bucketindex.decorators.upsert.bucketindex_upsert_task"}
    with DAG("t", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")):

        @task.bucketindex_upsert(table_uri="/lake/t", record_key="id", engine="arrow")
        def batch():
            return None

        op = batch().operator
    assert isinstance(op, UpsertWithIndexOperator)
    assert (op.table_uri, op.record_key, op.engine, op.source_uri) == ("/lake/t", "id", "arrow", None)
    assert "source_uri" not in op.template_fields and "table_uri" in op.template_fields
    with pytest.raises(TypeError, match="source_uri"):
        with DAG("t2", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")):
            task.bucketindex_upsert(table_uri="/lake/t", source_uri="/x")(lambda: None)()
