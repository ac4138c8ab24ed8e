"""Airflow end-to-end tier: one private Airflow (SQLite) per pytest process.

Airflow reads its configuration when first imported, so the environment is set here at
conftest import -- before any test module imports ``airflow`` -- and the DB is migrated
once per session. The DAG folder holds the repository's ``dags/`` plus ``tests/airflow/dags/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_bucketindex.demo import sandbox

REPO = Path(__file__).resolve().parents[2]
sandbox.session_env_for_tests([str(REPO / "dags"), str(Path(__file__).parent / "dags")])


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """A migrated SQLite metadata DB; returns AIRFLOW_HOME."""
    sandbox.ensure_migrated()
    return os.environ["AIRFLOW_HOME"]
