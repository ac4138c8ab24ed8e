"""Every DAG in ``dags/`` imports under Airflow 3.3 with no errors, uses only ``airflow.sdk``
for authoring, does no work at parse time, and has the shape the product promises."""

from __future__ import annotations

import ast
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"


@pytest.fixture(scope="module")
def dagbag():  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_airflow_is_3_3():
    import airflow

    assert airflow.__version__.startswith("3.3."), airflow.__version__


def test_every_dag_file_imports_without_errors(dagbag):  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}
    files = sorted(p.name for p in DAGS.glob("*.py"))
    assert files, "dags/ holds the example DAGs"
    loaded_from = {os.path.basename(d.fileloc) for d in dagbag.dags.values()}
    assert set(files) <= loaded_from, f"every file in dags/ defines a DAG: {files} vs {loaded_from}"


def test_every_dag_validates_and_serializes(dagbag):  # type: ignore[no-untyped-def]
    from airflow.serialization.serialized_objects import DagSerialization

    for dag_id, dag in dagbag.dags.items():
        dag.validate()
        assert DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag)).dag_id == dag_id
        assert dag.tags, f"{dag_id} has tags"


def test_dag_files_use_only_the_sdk_for_airflow_imports():
    for path in DAGS.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name == "airflow" or name.startswith("airflow."):
                    assert name == "airflow.sdk" or name.startswith("airflow.sdk."), f"{path.name} imports {name}"


def test_dag_files_pass_xcoms_as_xcomargs_not_jinja_pulls():
    """A value from another task arrives as ``task.output[...]`` (an XComArg: typed, and the
    dependency is drawn by it), never as a ``ti.xcom_pull`` template string."""
    files = sorted(DAGS.glob("*.py"))
    assert files
    for path in files:
        assert "xcom_pull" not in path.read_text(), f"{path.name} pulls an XCom through a template"


def test_dags_folder_links_the_packaged_examples():
    from airflow_provider_bucketindex.demo import sandbox

    for path in DAGS.glob("*.py"):
        packaged = Path(sandbox.example_dags_folder()) / path.name
        assert packaged.is_file(), f"{path.name} ships in the package (the demo runs it from there)"
        assert path.read_bytes() == packaged.read_bytes()


def test_ingest_dag_shape(dagbag):  # type: ignore[no-untyped-def]
    dag = dagbag.dags["bucketindex_ingest"]
    upsert, validate, rollback = (dag.get_task(t) for t in ("upsert", "validate", "rollback_failed_upsert"))
    assert type(upsert).__name__ == "UpsertWithIndexOperator"
    assert upsert.downstream_task_ids == {"validate", "rollback_failed_upsert"}
    assert validate.upstream_task_ids == {"upsert"} and not validate.downstream_task_ids
    assert rollback.upstream_task_ids == {"upsert"} and not rollback.downstream_task_ids
    assert rollback.trigger_rule == "one_failed"
    assert upsert.source_uri == "{{ params.landing_uri }}/{{ ds }}"
    assert dag.max_active_runs == 1
    assert upsert.batch_id is None  # default: derived from the dag id, task id, data interval and source


def test_nightly_compaction_dag_shape(dagbag):  # type: ignore[no-untyped-def]
    from airflow.sdk import XComArg

    dag = dagbag.dags["bucketindex_nightly_compaction"]
    assert dag.schedule == "@daily" and dag.catchup is False and dag.max_active_runs == 1
    ids = {"compaction_due", "schedule_compaction", "execute_compaction", "cancel_failed_compaction", "clean",
           "validate"}
    assert set(dag.task_ids) == ids
    due, schedule, execute, cancel, clean, validate = (dag.get_task(t) for t in (
        "compaction_due", "schedule_compaction", "execute_compaction", "cancel_failed_compaction", "clean", "validate"))
    assert type(due).__name__ == "CompactionDueSensor" and due.soft_fail is True and not due.upstream_task_ids
    assert due.deferrable is False  # not forced either way: [operators] default_deferrable decides
    assert (type(schedule).__name__, schedule.mode) == ("AsyncIndexCompactionOperator", "schedule")
    assert (type(execute).__name__, execute.mode) == ("AsyncIndexCompactionOperator", "execute")
    assert schedule.upstream_task_ids == {"compaction_due"} and execute.upstream_task_ids == {"schedule_compaction"}
    # the plan's instant as an XComArg (schedule's XCom key "instant"), not a Jinja xcom_pull
    assert isinstance(execute.instant, XComArg) and isinstance(cancel.instant, XComArg)
    assert (execute.instant.operator, execute.instant.key) == (schedule, "instant") == \
        (cancel.instant.operator, cancel.instant.key)
    assert schedule.multiple_outputs is True  # each key of the plan pushed on its own
    assert type(cancel).__name__ == "RollbackBatchOperator" and cancel.trigger_rule == "one_failed"
    assert cancel.upstream_task_ids == {"execute_compaction", "schedule_compaction"}
    assert type(clean).__name__ == "CleanTableOperator" and clean.upstream_task_ids == {"execute_compaction"}
    assert clean.trigger_rule == "none_failed"  # every night, not only after a compaction
    assert type(validate).__name__ == "ValidateTableOperator"
    assert validate.upstream_task_ids == {"clean", "execute_compaction"} and validate.trigger_rule == "all_success"
    assert not validate.downstream_task_ids and not cancel.downstream_task_ids
    # the policy and the table come from params (the table from the ingest DAG's variable)
    assert schedule.min_deltas == due.min_deltas == "{{ params.min_deltas }}"
    assert {t.table_uri for t in dag.tasks} == {"{{ params.table_uri }}"}
    assert set(dag.params) >= {"table_uri", "min_deltas", "delta_ratio", "min_logs", "log_ratio", "retain_commits"}
    assert dagbag.dags["bucketindex_ingest"].params["table_uri"] == dag.params["table_uri"]


def test_parsing_does_no_work(tmp_path):
    """Parse the DAG folder in a fresh interpreter, with table and landing locations that do
    not exist: parsing must not touch them, start Spark, build a hook or import pyspark, pyarrow,
    numpy or pandas (issue 40: the DAG processor pays each import on every parse of a file)."""
    code = (
        "import sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "assert not bag.import_errors, bag.import_errors\n"
        "heavy = [m for m in ('pyarrow', 'numpy', 'pandas', 'pyspark') if m in sys.modules]\n"
        "assert not heavy, f'parsing imported {heavy}'\n"
        "for d in bag.dags.values():\n"
        "    for t in d.tasks:\n"
        "        assert 'hook' not in vars(t), f'{t} built its hook at parse time'\n"
        "print(len(bag.dags))\n"
    )
    env = {
        **os.environ,
        "BUCKETINDEX_TABLE_URI": str(tmp_path / "no" / "table"),
        "BUCKETINDEX_LANDING_URI": str(tmp_path / "no" / "landing"),
    }
    # CPU seconds of the parse, not wall-clock: alone it takes ~6 s either way, but at load 13-16
    # (session 48) the wall clock reached 85 s while the work did not change.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not (tmp_path / "no").exists()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 30, f"parsing the example DAGs took {cpu:.1f} CPU seconds"


def test_load_examples_does_not_load_the_packaged_dags_beside_the_users_copies(monkeypatch):  # type: ignore[no-untyped-def]
    """With ``[core] load_examples`` on (Airflow's default), Airflow adds each installed provider's
    ``example_dags`` folder as a DAG bundle; the packaged DAGs live in ``airflow_provider_bucketindex/dags``,
    so no bundle holds them and a user's (edited) copy in the DAG folder is the only one parsed."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    import airflow_provider_bucketindex

    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "True")
    manager = DagBundlesManager()
    monkeypatch.setattr(manager, "_bundle_config", {})
    manager.parse_config()
    paths = {name: str(getattr(b, "path", "")) for name, b in ((b.name, b) for b in manager.get_all_dag_bundles())}
    assert "example_dags" in paths, "load_examples took effect (Airflow's own examples are a bundle)"
    package = str(Path(airflow_provider_bucketindex.__file__).resolve().parent)
    assert not [n for n, p in paths.items() if p and str(Path(p).resolve()).startswith(package)], paths
    assert not (Path(package) / "example_dags").exists()
    assert {p.name for p in (Path(package) / "dags").glob("bucketindex_*.py")} == {p.name for p in DAGS.glob("*.py")}


def test_a_users_edited_copy_is_the_dag_airflow_runs_with_load_examples_on(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    """A user copies ``bucketindex_ingest.py`` into their DAG folder and edits it. With
    ``load_examples`` on, Airflow parses every configured bundle (their DAG folder, Airflow's
    examples and each provider's ``example_dags``): the dag id ``bucketindex_ingest`` is found
    exactly once, in the user's file, with the user's edit -- nothing shadows it or is shadowed."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag

    folder = tmp_path / "dags"
    folder.mkdir()
    marker = "EDITED BY THE USER: landing bucket moved"
    copy = folder / "bucketindex_ingest.py"
    copy.write_text((DAGS / "bucketindex_ingest.py").read_text() + f"\ndag.doc_md = {marker!r}\n")
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "True")
    # the DAG-folder bundle as a deployment configures it (the session's AIRFLOW_HOME fixed the default's path)
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([
        {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
         "kwargs": {"path": str(folder)}}]))
    manager = DagBundlesManager()
    monkeypatch.setattr(manager, "_bundle_config", {})
    manager.parse_config()
    bundles = {b.name: Path(b.path) for b in manager.get_all_dag_bundles() if getattr(b, "path", None)}
    assert "example_dags" in bundles and folder in bundles.values(), bundles
    found = []
    for name, path in bundles.items():
        bag = DagBag(dag_folder=str(path), bundle_name=name)
        found += [(name, Path(d.fileloc), d.doc_md) for i, d in bag.dags.items() if i == "bucketindex_ingest"]
    assert len(found) == 1, found
    (bundle, fileloc, doc) = found[0]
    assert fileloc == copy and doc == marker, found[0]


def test_every_example_dag_documents_itself_and_waits_without_holding_a_slot(dagbag):  # type: ignore[no-untyped-def]
    """``doc_md`` on every example DAG (its module docstring, shown in the UI), and every sensor
    that may wait long (a timeout over ten minutes) in ``reschedule`` mode: no worker slot held."""
    from airflow.sdk import BaseSensorOperator

    assert len(dagbag.dags) == len(list(DAGS.glob("*.py"))) >= 6
    for dag_id, dag in dagbag.dags.items():
        assert dag.doc_md and len(dag.doc_md.strip()) > 200, f"{dag_id} has no doc_md"
        for task in dag.tasks:
            if isinstance(task, BaseSensorOperator) and task.timeout > 600:
                assert task.mode == "reschedule", f"{dag_id}.{task.task_id} waits {task.timeout} s in {task.mode}"
