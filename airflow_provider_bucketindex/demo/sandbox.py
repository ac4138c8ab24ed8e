"""A self-contained Airflow installation in one folder: home, SQLite DB, DAG folder, connection.

Airflow reads its configuration when it is first imported, so :func:`airflow_env` must
be applied to ``os.environ`` before anything imports ``airflow``. Used by
``bucketindex demo`` and by the Airflow end-to-end tests. Imports no Airflow itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from airflow_provider_bucketindex import DEFAULT_CONN_ID

__all__ = [
    "LOCAL_TEST_CONF",
    "RunReport",
    "airflow_env",
    "connection_json",
    "ensure_migrated",
    "example_dags_folder",
    "isolate_before_import",
    "load_dag",
    "migrate_db",
    "run_dag",
    "run_report",
    "session_env_for_tests",
    "WARM_UP_DAG_ID",
    "demo_dags_folder",
    "unpause",
]

#: Spark properties that suit small local runs: no UI, few shuffle partitions.
LOCAL_TEST_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}


def example_dags_folder() -> str:
    """The installed example DAGs, :mod:`airflow_provider_bucketindex.dags` (``dags/`` in the
    repository links to these files)."""
    from airflow_provider_bucketindex import dags

    return os.path.dirname(os.path.abspath(dags.__file__))


def connection_json(
    master: str = "local[2]", conf: dict[str, str] | None = None, *, port: int | None = None, **extra: Any
) -> str:
    """A ``bucketindex`` connection as the JSON an ``AIRFLOW_CONN_<ID>`` variable takes
    (``extra`` keys as in the connection form: ``python``, ``deploy_mode``, ``index`` ...)."""
    body: dict[str, Any] = {"conn_type": "bucketindex", "host": master}
    if port is not None:
        body["port"] = port
    ex = dict(extra)
    if conf:
        ex["conf"] = conf
    if ex:
        body["extra"] = ex
    return json.dumps(body)


def airflow_env(
    home: str,
    dags_folder: str,
    *,
    connection: str | None = None,
    conn_id: str = DEFAULT_CONN_ID,
) -> dict[str, str]:
    """Environment for an isolated Airflow: its own home, SQLite DB, DAG folder, no examples."""
    home = os.path.abspath(home)
    env = {
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": os.path.abspath(dags_folder),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{os.path.join(home, 'airflow.db')}",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": os.path.join(home, "logs"),
    }
    if connection is not None:
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = connection
    return env


def migrate_db(env: dict[str, str], *, log_file: str | None = None) -> None:
    """``airflow db migrate`` in a subprocess with ``env`` (creates the SQLite schema)."""
    os.makedirs(env["AIRFLOW_HOME"], exist_ok=True)
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT if log_file else subprocess.PIPE,
            check=False,
        )
    finally:
        if log_file:
            out.close()  # type: ignore[union-attr]
    if proc.returncode != 0:
        detail = f"; see {log_file}" if log_file else f": {(proc.stderr or b'').decode(errors='replace')[-2000:]}"
        raise RuntimeError(f"airflow db migrate failed (exit status {proc.returncode}){detail}")


def isolate_before_import(root: str | None = None) -> dict[str, str]:
    """Point a not-yet-imported Airflow at a private home (setdefault: never overrides a
    home the caller chose). For tests that only construct operators and hooks: no DB is
    created. Returns the variables now in effect."""
    import tempfile

    if "AIRFLOW_HOME" not in os.environ:
        if root is None:
            root = tempfile.mkdtemp(prefix="bucketindex-airflow-")
            _remove_at_exit(root)
        home = os.path.join(root, "airflow")
        os.makedirs(home, exist_ok=True)
        os.environ["AIRFLOW_HOME"] = home
    home = os.environ["AIRFLOW_HOME"]
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{os.path.join(home, 'airflow.db')}")
    return {k: v for k, v in os.environ.items() if k == "AIRFLOW_HOME" or k.startswith("AIRFLOW__")}


#: set once a process has its test Airflow (see :func:`session_env_for_tests`)
SESSION_ROOT_VAR = "BUCKETINDEX_TEST_AIRFLOW_ROOT"


def session_env_for_tests(dag_sources: list[str], *, connection: str | None = None) -> dict[str, str]:
    """One private Airflow per test process, shared by every conftest that asks for it.

    The first call creates a temp root with an Airflow home, a SQLite DB path and a DAG
    folder, and sets the environment (``AIRFLOW_CONN_BUCKETINDEX_DEFAULT``: local Spark);
    later calls reuse it. Every ``*.py`` file of each folder in ``dag_sources`` is linked
    into the DAG folder. Must run before anything imports ``airflow``.
    """
    import tempfile

    root = os.environ.get(SESSION_ROOT_VAR)
    if root is None:
        if "airflow" in sys.modules:
            raise RuntimeError(
                "airflow was imported before the test Airflow environment was set up; its "
                "configuration would point elsewhere. Run the airflow/cluster tiers in their own pytest run."
            )
        root = tempfile.mkdtemp(prefix="bucketindex-airflow-tests-")
        _remove_at_exit(root)
        os.makedirs(os.path.join(root, "dags"))
        env = airflow_env(
            os.path.join(root, "airflow"),
            os.path.join(root, "dags"),
            connection=connection or connection_json("local[2]", conf=LOCAL_TEST_CONF),
        )
        os.environ.update(env)
        os.environ[SESSION_ROOT_VAR] = root
    dags = os.environ["AIRFLOW__CORE__DAGS_FOLDER"]
    for src in dag_sources:
        for name in sorted(os.listdir(src)):
            if name.endswith(".py") and not name.startswith("_"):
                link = os.path.join(dags, name)
                if not os.path.lexists(link):
                    os.symlink(os.path.abspath(os.path.join(src, name)), link)
    return {k: v for k, v in os.environ.items() if k.startswith("AIRFLOW") or k == SESSION_ROOT_VAR}


def ensure_migrated() -> None:
    """``airflow db migrate`` once per test root (a marker file remembers it)."""
    home = os.environ["AIRFLOW_HOME"]
    marker = os.path.join(home, ".migrated")
    if os.path.exists(marker):
        return
    env = {k: v for k, v in os.environ.items() if k.startswith("AIRFLOW")}
    migrate_db(env, log_file=os.path.join(home, "migrate.log"))
    open(marker, "w").close()


# -- running DAGs (imports Airflow: call only after the environment is set) -------------


def load_dag(dag_id: str, dags_folder: str | None = None):  # type: ignore[no-untyped-def]
    """Parse the DAG folder (default: the configured one) and return ``dag_id``; any import
    error in the folder is raised."""
    from airflow.dag_processing.dagbag import DagBag

    folder = dags_folder or os.environ["AIRFLOW__CORE__DAGS_FOLDER"]
    bag = DagBag(dag_folder=folder)
    if bag.import_errors:
        raise RuntimeError(f"DAG import errors in {folder}: {bag.import_errors}")
    if dag_id not in bag.dags:
        raise KeyError(f"no DAG {dag_id!r} in {folder} (found {sorted(bag.dags)})")
    return bag.dags[dag_id]


def unpause(dag_id: str) -> None:
    """Write the configured DAG folder's DAGs to the metadata DB (as ``dag.test()`` does) and
    unpause ``dag_id``, as a user does in the UI: the scheduler queues runs of an
    Asset-scheduled DAG only while it is unpaused (DAGs are paused at creation)."""
    from pathlib import Path

    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    manager = DagBundlesManager()
    manager.sync_bundles_to_db()
    for bundle in manager.get_all_dag_bundles():
        if not bundle.is_initialized:
            bundle.initialize()
        bag = BundleDagBag(dag_folder=bundle.path, bundle_path=Path(bundle.path), bundle_name=bundle.name)
        if dag_id in bag.dags:
            sync_bag_to_db(bag, bundle.name, bundle.version)
            break
    else:
        raise KeyError(f"no DAG {dag_id!r} in any DAG bundle")
    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=False))


class RunReport:
    """What a ``dag.test()`` run did, read back from the metadata DB. ``tasks`` has one entry
    per task (the last instance of a mapped task); ``mapped_states`` every map index's state."""

    def __init__(self, dag_id: str, run_id: str, state: str, tasks: dict[str, dict[str, Any]],
                 mapped: dict[str, dict[int, str | None]] | None = None) -> None:
        self.dag_id, self.run_id, self.state, self.tasks = dag_id, run_id, state, tasks
        self.mapped = mapped or {}

    def task_state(self, task_id: str) -> str | None:
        return self.tasks.get(task_id, {}).get("state")

    def batch_id(self, task_id: str, map_index: int = -1, *, source: Any = None) -> str:
        """The default batch id of ``task_id`` in this run (:func:`airflow_provider_bucketindex.batch.batch_base`:
        by the run's data interval, else its run id, read from the run's row in the metadata DB),
        with the part naming ``source`` (the upsert's rendered source; None: an in-memory batch,
        which has none: :func:`airflow_provider_bucketindex.batch.with_source`)."""
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select

        from airflow_provider_bucketindex.batch import default_batch_id, interval_batch_id, with_source

        with create_session() as session:
            dr = session.scalars(select(DagRun).where(DagRun.dag_id == self.dag_id,
                                                      DagRun.run_id == self.run_id)).one()
            start, end = dr.data_interval_start, dr.data_interval_end
        if start is not None and end is not None:
            return with_source(interval_batch_id(self.dag_id, task_id, start, end, map_index), source)
        return with_source(default_batch_id(self.dag_id, self.run_id, task_id, map_index), source)

    def mapped_states(self, task_id: str) -> dict[int, str | None]:
        """``{map_index: state}`` of a mapped task's instances."""
        return dict(self.mapped.get(task_id, {}))

    def xcom(self, task_id: str, key: str = "return_value", *, map_index: int | None = None) -> Any:
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        with create_session() as session:
            query = XComModel.get_many(run_id=self.run_id, key=key, task_ids=task_id, dag_ids=self.dag_id,
                                       map_indexes=map_index)
            row = session.scalars(query).first()
            # Values pushed by tasks arrive through the execution API already as JSON values;
            # XComModel.deserialize_value would json-decode a string again ("2026..." -> int).
            return None if row is None else row.value

    def __repr__(self) -> str:
        return f"RunReport({self.dag_id}, {self.run_id}, {self.state}, {self.tasks}, mapped={self.mapped})"


#: the demo's one-task DAG, run once before the real ones (see :func:`demo_dags_folder`)
WARM_UP_DAG_ID = "bucketindex_demo_warm_up"
_WARM_UP_DAG = f'''"""Run once by `bucketindex demo` before the example DAGs: a one-task DAG whose run starts
dag.test()'s in-process Execution API, so that start-up (seconds) is not counted in the first
real task's duration. A deployment's API server is running already."""

import pendulum
from airflow.sdk import DAG, task

with DAG("{WARM_UP_DAG_ID}", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
         tags=["bucketindex", "demo"]):

    @task
    def warm_up() -> dict:
        return {{"warm": True}}  # an XCom, as the real tasks push

    warm_up()
'''


def demo_dags_folder(path: str) -> str:
    """A DAG folder for the demo at ``path``: links to the installed example DAGs (they run from
    the package) and the warm-up DAG :data:`WARM_UP_DAG_ID`. Returns ``path``."""
    os.makedirs(path, exist_ok=True)
    src = example_dags_folder()
    for name in sorted(os.listdir(src)):
        if name.endswith(".py") and not name.startswith("_"):
            link = os.path.join(path, name)
            if not os.path.lexists(link):
                os.symlink(os.path.join(src, name), link)
    with open(os.path.join(path, f"{WARM_UP_DAG_ID}.py"), "w") as f:
        f.write(_WARM_UP_DAG)
    return path


def run_dag(dag: Any, logical_date: Any = None, conf: dict[str, Any] | None = None, *,
            named_after_date: bool = False) -> RunReport:
    """``dag.test()`` one run and report its state and task instances (``dag.test`` itself
    swallows task failures: look at :attr:`RunReport.state`).

    ``named_after_date``: the run's id (``manual__<logical date>``, hence its batch ids) names
    the data it processes rather than the wall-clock time it ran (``dag.test`` names a run after
    ``run_after``, default now), as a scheduled run's would; a rerun of the same date then has
    the same batch ids, so its upserts are no-ops. Off by default: tests that run one date twice
    on purpose need two runs.
    """
    if named_after_date and logical_date is not None:
        dr = dag.test(run_after=logical_date, logical_date=logical_date, run_conf=conf)
    else:
        dr = dag.test(logical_date=logical_date, run_conf=conf)
    return run_report(dr)


def run_report(dr: Any) -> RunReport:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    def _s(v: Any) -> str | None:
        return None if v is None else str(getattr(v, "value", v))

    with create_session() as session:
        tis = session.query(TaskInstance).filter(TaskInstance.dag_id == dr.dag_id, TaskInstance.run_id == dr.run_id)
        ordered = sorted(tis, key=lambda t: (t.start_date is None, t.start_date or 0))
        tasks = {
            ti.task_id: {"state": _s(ti.state), "try_number": ti.try_number, "duration": ti.duration}
            for ti in ordered
        }
        mapped: dict[str, dict[int, str | None]] = {}
        for ti in ordered:
            if ti.map_index is not None and ti.map_index >= 0:
                mapped.setdefault(ti.task_id, {})[ti.map_index] = _s(ti.state)
    return RunReport(dr.dag_id, dr.run_id, _s(dr.state) or "", tasks, mapped)


def _remove_at_exit(path: str) -> None:
    import atexit
    import shutil

    atexit.register(shutil.rmtree, path, ignore_errors=True)
