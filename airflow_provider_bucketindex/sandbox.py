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

__all__ = ["airflow_env", "connection_json", "migrate_db", "example_dags_folder", "LOCAL_TEST_CONF"]

#: Spark properties that suit small local runs: no UI, few shuffle partitions.
LOCAL_TEST_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}


def example_dags_folder() -> str:
    """The installed example DAGs (``dags/`` in the repository links to these files)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "example_dags")


def connection_json(master: str = "local[2]", conf: dict[str, str] | None = None, **extra: Any) -> str:
    """A ``bucketindex`` connection as the JSON an ``AIRFLOW_CONN_<ID>`` variable takes."""
    body: dict[str, Any] = {"conn_type": "bucketindex", "host": master}
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
