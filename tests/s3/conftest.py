"""The ``s3`` tier: tables and sources on an S3-compatible server on loopback.

The fixtures (``s3_server``, ``s3``, ``bucket``) live in ``tests/conftest.py``, so the Airflow
tier can put a DAG's table on the same server.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    for item in items:
        if "/tests/s3/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.s3)
